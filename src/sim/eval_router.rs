//! What the router knows in the offline evaluator, kept exactly as the gateway would keep it.
//!
//! [`RouterSideState`] holds only router-side knowledge, updated on the events the gateway
//! observes: a request is dispatched ([`RouterSideState::on_dispatch`]), its first token
//! streams back ([`RouterSideState::on_first_token`]), its stream ends
//! ([`RouterSideState::on_finish`]). From these it builds the [`BackendView`]s of a
//! [`Snapshot`](crate::routing::Snapshot) for `Policy::select()` — never from engine internals
//! (that is what the evaluator-only `oracle` does). This is the seam where a prefix index and
//! a TTFT predictor plug in later: they observe the same events and fill more view fields.

use std::sync::Arc;
use std::time::Instant;

use crate::request::RequestFeatures;
use crate::routing::BackendView;

/// Router-side state of a pool of backends.
#[derive(Debug, Clone)]
pub struct RouterSideState {
    views: Vec<BackendView>,
}

impl RouterSideState {
    /// Idle, healthy backends with these names, in pool order.
    pub fn new<S: AsRef<str>>(names: &[S]) -> RouterSideState {
        RouterSideState {
            views: names
                .iter()
                .map(|n| BackendView::idle(n.as_ref()))
                .collect(),
        }
    }

    /// Number of backends.
    pub fn len(&self) -> usize {
        self.views.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// Backend names, in pool order.
    pub fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.views.iter().map(|v| &v.name)
    }

    /// A request of `prompt_tokens` tokens was sent to `backend`.
    pub fn on_dispatch(&mut self, backend: usize, prompt_tokens: u32) {
        let v = &mut self.views[backend];
        v.inflight += 1;
        v.outstanding_prefill_tokens += u64::from(prompt_tokens);
    }

    /// The first token of a request of `prompt_tokens` tokens came back from `backend`.
    pub fn on_first_token(&mut self, backend: usize, prompt_tokens: u32) {
        let v = &mut self.views[backend];
        v.outstanding_prefill_tokens = v
            .outstanding_prefill_tokens
            .saturating_sub(u64::from(prompt_tokens));
        v.running_decodes += 1;
    }

    /// A request's stream on `backend` ended; `prompt_tokens` is still outstanding if no
    /// first token was seen (`saw_first_token == false`).
    pub fn on_finish(&mut self, backend: usize, prompt_tokens: u32, saw_first_token: bool) {
        let v = &mut self.views[backend];
        v.inflight = v.inflight.saturating_sub(1);
        if saw_first_token {
            v.running_decodes = v.running_decodes.saturating_sub(1);
        } else {
            v.outstanding_prefill_tokens = v
                .outstanding_prefill_tokens
                .saturating_sub(u64::from(prompt_tokens));
        }
    }

    /// The views for a decision on `features` at `now` (no per-request fields yet:
    /// `cached_tokens` stays 0 until a prefix index is added).
    pub fn views(&mut self, _features: &RequestFeatures, _now: Instant) -> &[BackendView] {
        &self.views
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_request_lifecycle() {
        let mut s = RouterSideState::new(&["a", "b"]);
        s.on_dispatch(1, 100);
        s.on_dispatch(1, 50);
        let f = RequestFeatures::synthetic("m", "x".into(), None);
        let v = s.views(&f, Instant::now())[1].clone();
        assert_eq!((v.inflight, v.outstanding_prefill_tokens), (2, 150));
        s.on_first_token(1, 100);
        s.on_finish(1, 50, false);
        let v = s.views(&f, Instant::now())[1].clone();
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (1, 0, 1)
        );
        s.on_finish(1, 100, true);
        assert_eq!(s.views(&f, Instant::now())[1], BackendView::idle("b"));
    }
}
