//! Collision repair: the rule for a request routed before a booking it could not see.
//!
//! Replicas hear of each other's dispatches a sync delay late ([`super::unseen`]). Two
//! requests routed by different replicas within that delay can both pick the backend that
//! looked best, and the second then queues behind the first while another backend idles —
//! the one loss of a replicated router a single router does not have. When the late booking
//! arrives, the replica that routed the second request can take its decision again:
//! [`relocation`] says whether the request, still waiting for its first token, should go
//! elsewhere.
//!
//! The rule: the views are built without the request's own booking (as if it had not been
//! sent) and with the late booking; the policy decides over them; the request moves when the
//! decision is another backend and the policy's prediction for staying exceeds that
//! decision's by more than `margin` (a fraction: 0.2 is 20 %). The margin pays for what a
//! move costs and a prediction cannot see: the prefill already done where it is, and the
//! error of two predictions.
//!
//! Pure and synchronous. The offline evaluator applies it (`pronto evaluate
//! --collision-repair MARGIN`) to measure what a replicated gateway repairing collisions
//! would get; the gateway does not apply it yet.

use std::time::Instant;

use crate::request::RequestFeatures;
use crate::routing::{decide, BackendView, Decision, Policy};

/// Where a request sent to `views[stay]` should go instead (see the module docs), or `None`
/// to stay. `views` must not hold the request's own booking.
pub fn relocation(
    policy: &dyn Policy,
    features: &RequestFeatures,
    views: &[BackendView],
    stay: usize,
    now: Instant,
    margin: f64,
) -> Option<Decision> {
    let moved = decide(policy, features, views, now)
        .ok()
        .filter(|d| d.index != stay)?;
    let there = moved.predicted_ttft_s?;
    // The policy's own prediction for `stay`: its decision with no other backend to choose.
    let here = decide(policy, features, std::slice::from_ref(&views[stay]), now)
        .ok()?
        .predicted_ttft_s?;
    (here > there * (1.0 + margin)).then_some(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::{Coefficients, Quality};
    use crate::routing::{PolicyKind, TtftModelView};

    /// A backend with `queued` prefill tokens booked ahead, 0.1 ms per token, a trusted model.
    fn view(name: &str, queued: u64) -> BackendView {
        let mut v = BackendView::idle(name);
        v.outstanding_prefill_tokens = queued;
        v.inflight = u32::from(queued > 0);
        v.ttft_model = Some(TtftModelView {
            coefficients: Coefficients {
                base_s: 0.02,
                s_per_token: 1e-4,
                s_per_token_sq: 0.0,
                s_per_decode: 0.0,
                s_per_waiting: 0.0,
            },
            quality: Quality {
                samples: 100,
                rel_error: 0.05,
            },
            since_last_observation_s: 1.0,
        });
        v
    }

    #[test]
    fn a_request_behind_a_late_booking_moves_only_past_the_margin() {
        let policy = PolicyKind::parse("predicted_ttft").unwrap().build();
        let now = Instant::now();
        let mut f = RequestFeatures::synthetic("m", String::new(), Some(16));
        f.prompt_tokens = 2_000;
        // Backend a got a 30k-token prefill the request could not see; b is idle.
        let behind = [view("a", 30_000), view("b", 0)];
        let d = relocation(&*policy, &f, &behind, 0, now, 0.2).expect("moves");
        assert_eq!(d.index, 1);
        assert!(d.predicted_ttft_s.is_some());
        // Already where the decision goes: it stays.
        assert!(relocation(&*policy, &f, &behind, 1, now, 0.2).is_none());
        // 500 tokens ahead: staying predicts 0.27 s against 0.22 s, 23 % more. A 20 % margin
        // moves it, a 30 % margin does not.
        let close = [view("a", 500), view("b", 0)];
        assert!(relocation(&*policy, &f, &close, 0, now, 0.2).is_some());
        assert!(relocation(&*policy, &f, &close, 0, now, 0.3).is_none());
    }
}
