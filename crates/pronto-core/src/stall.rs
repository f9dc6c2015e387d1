//! Progress-based exclusion: a backend that holds streams but produces no token is taken out
//! of routing for new requests until it produces again.
//!
//! A wedged engine answers its health checks and accepts requests, but makes no progress
//! while its queue grows; the connection-level signals (connect errors, resets, 5xx) never
//! fire. What the router does see is silence: the ledger counts the streams in flight on each
//! backend and how long they have gone without a token on any of them
//! ([`crate::load::LoadView::silent_s`]: since the last token, or since the first stream was
//! booked on a backend that held none). The rule:
//!
//! ```text
//! stalled  ⇔  silent_s ≥ bound,   bound = max(floor, factor × booked_prefill_s)
//! ```
//!
//! `booked_prefill_s` is what the backend's own TTFT model predicts for the work the ledger
//! has booked on it: a request with no prompt queued behind its outstanding prefill, running
//! decodes and engine queue (`booked_prefill_s`). A backend with a long prefill queue is
//! given that long (times `factor`) before its silence counts; an idle-looking one only
//! `floor`.
//!
//! What follows (the view builder, [`crate::routing::views::build`], applies it for the gateway
//! and the evaluator alike):
//! - the backend is *marked* ([`crate::load::Ledger::mark_stalled`]) and stays marked until a
//!   token arrives from it ([`crate::load::Ledger::progressed`]) — not until its requests
//!   drain: a race that cancels its stuck requests does not readmit it;
//! - a marked backend is not eligible while it holds requests, nor until `bound` has passed
//!   since it was marked or last sent a request; then, holding none, it takes one request (a
//!   probe: its first token ends the stall), so a wedged backend sees at most one request per
//!   bound;
//! - it is never ejected: its prefix index entries and learned model are kept;
//! - exclusion needs somewhere else to go: when no other backend would be eligible, none is
//!   excluded for stalling (a whole fleet gone quiet is more likely saturated than wedged).
//!
//! Its requests still waiting for a first token are not moved here: the route's
//! first-token deadline races them elsewhere as for any late first token.

use std::time::Duration;

use crate::predict::TtftInputs;
use crate::routing::BackendView;

/// Default [`StallRule::floor`].
pub const DEFAULT_FLOOR: Duration = Duration::from_secs(10);
/// Default [`StallRule::factor`].
pub const DEFAULT_FACTOR: f64 = 4.0;

/// When a silent backend counts as stalled (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StallRule {
    /// The shortest silence that counts, whatever the booked work.
    pub floor: Duration,
    /// Multiple of the predicted time of the booked prefill work the silence must reach.
    pub factor: f64,
}

impl Default for StallRule {
    fn default() -> StallRule {
        StallRule {
            floor: DEFAULT_FLOOR,
            factor: DEFAULT_FACTOR,
        }
    }
}

impl StallRule {
    /// How long `v` may stay silent: `max(floor, factor × booked_prefill_s(v))`, seconds.
    pub fn bound_s(&self, v: &BackendView) -> f64 {
        self.floor
            .as_secs_f64()
            .max(self.factor * booked_prefill_s(v))
    }

    /// Whether `v`'s silence has reached its bound (a backend holding no stream never has).
    pub(crate) fn fires(&self, v: &BackendView) -> bool {
        v.silent_s > 0.0 && v.silent_s >= self.bound_s(v)
    }
}

/// Predicted seconds for the work booked on `v`: its TTFT model's prediction for a request
/// with no uncached prompt behind its outstanding prefill, running decodes and engine queue
/// (0 without a model).
pub(crate) fn booked_prefill_s(v: &BackendView) -> f64 {
    let Some(m) = v.ttft_model else {
        return 0.0;
    };
    let x = TtftInputs {
        queued_prefill_tokens: v.outstanding_prefill_tokens as f64,
        queued_prefill_sq: v.outstanding_prefill_sq,
        uncached_tokens: 0.0,
        running_decodes: f64::from(v.running_decodes),
        engine_waiting: v.engine.map_or(0.0, |e| e.waiting),
    };
    m.coefficients.predict(&x)
}

/// Apply `rule` to `views` (one pool, in order; `mark(i)` marks backend `i` in its ledger and
/// says whether it was newly marked, each newly marked index is pushed to `newly`): see the
/// module docs. Views come in with `stalled` as their ledger's mark.
pub fn apply(
    rule: &StallRule,
    views: &mut [BackendView],
    mut mark: impl FnMut(usize) -> bool,
    newly: &mut Vec<usize>,
) {
    for (i, v) in views.iter_mut().enumerate() {
        if !v.stalled && rule.fires(v) {
            if mark(i) {
                newly.push(i);
            }
            v.stalled = true;
        }
        // Nothing in flight and a bound since the mark or the last probe: a probe may go.
        let probe = v.inflight == 0 && v.since_probe_s >= rule.bound_s(v);
        v.stalled &= !probe;
    }
    if views.iter().any(|v| v.stalled) && !views.iter().any(BackendView::eligible) {
        for v in views.iter_mut() {
            v.stalled = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::Coefficients;
    use crate::routing::TtftModelView;

    fn view(silent_s: f64, queued: u64) -> BackendView {
        BackendView {
            silent_s,
            inflight: 1,
            outstanding_prefill_tokens: queued,
            ttft_model: Some(TtftModelView {
                coefficients: Coefficients {
                    base_s: 0.0,
                    s_per_token: 1e-3,
                    ..Coefficients::default()
                },
                quality: Default::default(),
                since_last_observation_s: 0.0,
            }),
            ..BackendView::idle("b")
        }
    }

    fn rule() -> StallRule {
        StallRule {
            floor: Duration::from_secs(2),
            factor: 3.0,
        }
    }

    #[test]
    fn the_bound_grows_with_the_booked_prefill() {
        let r = rule();
        // Nothing booked: the floor.
        let idle = BackendView {
            ttft_model: None,
            ..view(0.0, 0)
        };
        assert_eq!(r.bound_s(&idle), 2.0);
        let small = r.bound_s(&view(0.0, 100));
        let big = r.bound_s(&view(0.0, 10_000));
        assert_eq!(small, 2.0, "3 × 0.1 s is under the floor");
        assert!(big > small, "{big} vs {small}");
        // 10k tokens at 1 ms each, base 0 + the prior's other terms, times 3.
        assert!(big >= 30.0, "{big}");
        for q in [0u64, 10, 1000, 5000, 20_000] {
            assert!(r.bound_s(&view(0.0, q)) <= r.bound_s(&view(0.0, q + 1000)));
        }
    }

    #[test]
    fn silence_fires_only_at_the_bound_and_only_with_streams() {
        let r = rule();
        assert!(!r.fires(&view(0.0, 0)), "no stream in flight");
        assert!(!r.fires(&view(1.9, 0)));
        assert!(r.fires(&view(2.0, 0)));
        assert!(
            !r.fires(&view(20.0, 10_000)),
            "a long queue is given its time"
        );
        assert!(r.fires(&view(1000.0, 10_000)));
    }

    #[test]
    fn a_stalled_backend_is_excluded_while_another_is_eligible() {
        let r = rule();
        let mut v = [view(5.0, 0), view(0.5, 0), view(0.0, 0)];
        let mut marked = Vec::new();
        let mut newly = Vec::new();
        apply(
            &r,
            &mut v,
            |i| {
                marked.push(i);
                true
            },
            &mut newly,
        );
        assert_eq!((marked, newly.clone()), (vec![0], vec![0]));
        assert!(v[0].stalled && !v[0].eligible());
        assert!(v[1].eligible() && v[2].eligible());
        // Marked already (the ledger's flag): stays out, not marked again, even when its
        // silence is short (a probe that has not answered yet).
        let mut v = [
            BackendView {
                stalled: true,
                ..view(0.1, 0)
            },
            view(0.0, 0),
        ];
        newly.clear();
        apply(&r, &mut v, |_| panic!("not marked twice"), &mut newly);
        assert!(v[0].stalled && newly.is_empty());
        // With nothing in flight, the marked backend takes one probe — a bound after it was
        // marked or last probed.
        v[0].inflight = 0;
        v[0].stalled = true;
        v[0].since_probe_s = 1.0;
        apply(&r, &mut v, |_| true, &mut newly);
        assert!(v[0].stalled, "too soon");
        v[0].since_probe_s = 2.0;
        apply(&r, &mut v, |_| true, &mut newly);
        assert!(!v[0].stalled && v[0].eligible());
        // Everything else gone: nobody is excluded for stalling.
        let mut v = [
            BackendView {
                stalled: true,
                ..view(5.0, 0)
            },
            BackendView {
                healthy: false,
                ..view(0.0, 0)
            },
        ];
        apply(&r, &mut v, |_| true, &mut newly);
        assert!(!v[0].stalled && v[0].eligible());
    }
}
