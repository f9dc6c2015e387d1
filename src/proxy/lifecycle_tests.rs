//! Tests of [`super`]'s pure parts.

use super::*;
use pronto_core::routing::{BackendView, Decision, EngineLoad, Reason};
use std::time::Duration;

fn routed(view: BackendView, predicted: f64) -> Routed {
    Routed {
        decision: Decision {
            index: 0,
            predicted_ttft_s: Some(predicted),
            reason: Reason::PredictedBest,
        },
        chosen: view,
        held_blocks: 0,
        others_left: false,
        runner_up: None,
    }
}

#[test]
fn only_an_idle_fast_backend_that_says_nothing_is_at_fault() {
    let deadline = Duration::from_secs(10);
    let idle = BackendView::idle("b");
    assert!(timeout_is_backend_fault(true, &routed(idle, 0.2), deadline));
    // A non-streamed answer is a whole generation.
    assert!(!timeout_is_backend_fault(
        false,
        &routed(idle, 0.2),
        deadline
    ));
    // Queued work ahead: the overload explains the wait.
    let busy = BackendView {
        outstanding_prefill_tokens: 50_000,
        ..idle
    };
    assert!(!timeout_is_backend_fault(
        true,
        &routed(busy, 0.2),
        deadline
    ));
    let queued = BackendView {
        engine: Some(EngineLoad {
            waiting: 12.0,
            ..EngineLoad::default()
        }),
        ..idle
    };
    assert!(!timeout_is_backend_fault(
        true,
        &routed(queued, 0.2),
        deadline
    ));
    // Predicted to take most of the deadline anyway.
    assert!(!timeout_is_backend_fault(
        true,
        &routed(idle, 6.0),
        deadline
    ));
}
