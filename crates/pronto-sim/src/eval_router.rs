//! What the router knows in the offline evaluator, kept exactly as the gateway would keep it.
//!
//! [`RouterSideState`] holds only router-side knowledge, updated on the events the gateway
//! observes: a request is dispatched ([`RouterSideState::on_dispatch`]), its first token
//! streams back ([`RouterSideState::on_first_token`]), its stream ends
//! ([`RouterSideState::on_finish`]). From these it builds the [`BackendView`]s of a
//! [`Snapshot`](pronto_core::routing::Snapshot) for `Policy::select()` — never from engine internals
//! (that is what the evaluator-only `oracle` does). This is the seam where a prefix index and
//! a TTFT predictor plug in later: they observe the same events and fill more view fields.

use std::sync::Arc;
use std::time::Instant;

use pronto_core::affinity::{IndexConfig, PrefixIndex, Residency};
use pronto_core::predict::{Coefficients, TtftEstimator, TtftInputs};
use pronto_core::request::RequestFeatures;
use pronto_core::routing::{
    apply_prefix_matches, limit_to_resident, BackendView, EngineLoad, TtftModelView,
};
use pronto_core::tokens::BLOCK_TOKENS;

/// Attention work of a prefill of `tokens` uncached tokens, in (thousands of tokens)².
fn sq(tokens: u32) -> f64 {
    let k = f64::from(tokens) / 1000.0;
    k * k
}

/// What the router remembers about one dispatched request until its first token.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Dispatch {
    /// Prediction inputs as they were when the request was routed.
    pub inputs: TtftInputs,
    /// Prefill tokens charged to the backend's queue (the prompt's expected uncached part).
    pub prefill_tokens: u32,
    /// KV-cache tokens reserved on the backend until the request finishes.
    pub kv_tokens: u64,
}

/// Router-side state of a pool of backends.
#[derive(Debug)]
pub struct RouterSideState {
    views: Vec<BackendView>,
    estimators: Vec<TtftEstimator>,
    last_observation: Vec<Option<Instant>>,
    index: PrefixIndex,
    matched: Vec<u32>,
    residency: Vec<Residency>,
    scraped: Vec<Option<(Instant, EngineLoad)>>,
}

impl RouterSideState {
    /// Idle, healthy backends with these names, in pool order.
    pub fn new<S: AsRef<str>>(names: &[S]) -> RouterSideState {
        RouterSideState {
            views: names
                .iter()
                .map(|n| BackendView::idle(n.as_ref()))
                .collect(),
            estimators: vec![TtftEstimator::new(Coefficients::default(), 1.0); names.len()],
            last_observation: vec![None; names.len()],
            index: PrefixIndex::new(IndexConfig {
                max_backends: names.len().max(1),
                ..IndexConfig::default()
            }),
            matched: vec![0; names.len()],
            residency: vec![Residency::default(); names.len()],
            scraped: vec![None; names.len()],
        }
    }

    /// Tell the router each backend's KV-cache capacity in tokens (as a scrape of the engine's
    /// `cache_config_info` would), so prefix credit expires with the engine's LRU residency.
    pub fn with_kv_capacities(mut self, capacities: &[Option<f64>]) -> RouterSideState {
        for (v, &c) in self.views.iter_mut().zip(capacities) {
            v.kv_capacity_tokens = c.map(|c| c as u64);
        }
        self
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

    /// A scrape of `backend`'s engine metrics at `at` read `load` (its `age_s` is ignored:
    /// views compute the age at decision time).
    pub fn on_scrape(&mut self, backend: usize, load: EngineLoad, at: Instant) {
        self.scraped[backend] = Some((at, load));
    }

    /// A request was routed to `backend` (whose view, as the policy saw it, is in the last
    /// [`RouterSideState::views`]): charge its expected uncached prefill to the backend and
    /// remember that the backend now holds its prefix.
    pub fn on_dispatch(
        &mut self,
        backend: usize,
        features: &RequestFeatures,
        now: Instant,
    ) -> Dispatch {
        self.index.record(backend, &features.block_hashes, now);
        let v = &mut self.views[backend];
        let inputs = v.ttft_inputs(features);
        let prefill_tokens = inputs.uncached_tokens as u32;
        let kv_tokens = v.kv_need(features);
        self.residency[backend].on_alloc(kv_tokens as f64, now);
        v.inflight += 1;
        v.outstanding_prefill_tokens += u64::from(prefill_tokens);
        v.outstanding_prefill_sq += sq(prefill_tokens);
        v.kv_reserved_tokens += kv_tokens;
        Dispatch {
            inputs,
            prefill_tokens,
            kv_tokens,
        }
    }

    /// The first token of a request came back from `backend`, `ttft_s` after dispatch.
    /// Returns the prediction the model had made for it (before learning from it).
    pub fn on_first_token(
        &mut self,
        backend: usize,
        d: &Dispatch,
        ttft_s: f64,
        now: Instant,
    ) -> f64 {
        let v = &mut self.views[backend];
        v.outstanding_prefill_tokens = v
            .outstanding_prefill_tokens
            .saturating_sub(u64::from(d.prefill_tokens));
        v.outstanding_prefill_sq = (v.outstanding_prefill_sq - sq(d.prefill_tokens)).max(0.0);
        v.running_decodes += 1;
        self.last_observation[backend] = Some(now);
        self.estimators[backend].observe(&d.inputs, ttft_s, now)
    }

    /// A request's stream on `backend` ended; its prefill charge is still outstanding if no
    /// first token was seen (`saw_first_token == false`).
    pub fn on_finish(&mut self, backend: usize, d: &Dispatch, saw_first_token: bool) {
        let v = &mut self.views[backend];
        v.inflight = v.inflight.saturating_sub(1);
        v.kv_reserved_tokens = v.kv_reserved_tokens.saturating_sub(d.kv_tokens);
        if saw_first_token {
            v.running_decodes = v.running_decodes.saturating_sub(1);
        } else {
            v.outstanding_prefill_tokens = v
                .outstanding_prefill_tokens
                .saturating_sub(u64::from(d.prefill_tokens));
            v.outstanding_prefill_sq = (v.outstanding_prefill_sq - sq(d.prefill_tokens)).max(0.0);
        }
    }

    /// The views for a decision on `features` at `now`: load counters, each backend's expected
    /// prefix-cache hit for this prompt (expiring with cache residency when `residency`, see
    /// [`pronto_core::routing::Policy::limits_prefix_credit_to_residency`]), and its current TTFT
    /// model.
    pub fn views(
        &mut self,
        features: &RequestFeatures,
        now: Instant,
        residency: bool,
    ) -> &[BackendView] {
        self.index
            .match_lengths(&features.block_hashes, now, &mut self.matched);
        for (v, r) in self.views.iter_mut().zip(&self.residency) {
            v.kv_alloc_rate = r.rate(now);
        }
        if residency {
            limit_to_resident(&self.index, &self.views, features, now, &mut self.matched);
        }
        apply_prefix_matches(
            &mut self.views,
            &self.matched,
            BLOCK_TOKENS as f64,
            features.prompt_tokens,
        );
        for (i, v) in self.views.iter_mut().enumerate() {
            v.engine = self.scraped[i].map(|(at, load)| EngineLoad {
                age_s: now.saturating_duration_since(at).as_secs_f64(),
                ..load
            });
            let e = &self.estimators[i];
            v.ttft_model = Some(TtftModelView {
                coefficients: e.coefficients(),
                quality: e.quality(),
                since_last_observation_s: self.last_observation[i].map_or(f64::INFINITY, |t| {
                    now.saturating_duration_since(t).as_secs_f64()
                }),
            });
        }
        &self.views
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_request_lifecycle_and_the_model_learns() {
        let mut s = RouterSideState::new(&["a", "b"]);
        let mut f = RequestFeatures::synthetic("m", "x".into(), None);
        let now = Instant::now();
        f.prompt_tokens = 100;
        s.views(&f, now, true);
        let d1 = s.on_dispatch(1, &f, now);
        f.prompt_tokens = 50;
        let d2 = s.on_dispatch(1, &f, now);
        let v = s.views(&f, now, true)[1].clone();
        assert_eq!((v.inflight, v.outstanding_prefill_tokens), (2, 150));
        assert_eq!(d1.inputs.uncached_tokens, 100.0);
        assert_eq!(d2.inputs.queued_prefill_tokens, 100.0);
        s.on_first_token(1, &d1, 0.2, now);
        s.on_finish(1, &d2, false);
        let v = s.views(&f, now, true)[1].clone();
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (1, 0, 1)
        );
        assert_eq!(v.ttft_model.unwrap().quality.samples, 1);
        s.on_finish(1, &d1, true);
        let v = s.views(&f, now, true)[1].clone();
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (0, 0, 0)
        );
    }
}
