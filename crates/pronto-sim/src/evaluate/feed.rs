//! Feeding the simulated engines: a routed request into its backend's engine, and the
//! backend's next step.

use super::Backend;
use crate::engine::SimRequest;
use crate::workload::TraceRequest;
use pronto_core::request::RequestFeatures;
use pronto_core::tokens::BLOCK_TOKENS;

/// Add request `id` (`r`, with `features` and prompt `ids`, generating `generated` tokens) to
/// backend `b`'s engine at `t`, and start a step if it was idle.
pub(super) fn submit(
    b: &mut Backend,
    id: u64,
    r: &TraceRequest,
    features: &mut RequestFeatures,
    ids: &mut Vec<u32>,
    generated: u32,
    t: f64,
) {
    // Block hashes at the gateway's block size, reused by engines of that size (an engine
    // that publishes KV events needs the token ids its events carry).
    let hashes = std::mem::take(&mut features.block_hashes);
    if b.engine.config().block_size == BLOCK_TOKENS && !b.engine.logs_kv_events() {
        b.engine
            .add_hashed(id, r.input_tokens, hashes.into(), generated);
    } else {
        b.engine.add_request(SimRequest {
            id,
            prompt: std::mem::take(ids),
            max_tokens: generated,
        });
    }
    if b.busy_until.is_none() {
        start_step(b, t);
    }
}

/// Start `b`'s next engine step at `now`, when it has work; the step's events are delivered
/// when it ends (`busy_until`).
///
/// A wedged engine runs no step: it wakes (with no events) when its wedge ends, or never.
pub(super) fn start_step(b: &mut Backend, now: f64) {
    if let Some(end) = b.wedge.and_then(|w| w.holds_at(now)) {
        b.busy_until = end.is_finite().then_some(end);
        b.pending.clear();
        return;
    }
    match b.engine.step() {
        Some(s) => {
            b.busy_until = Some(now + s.duration_s);
            b.pending = s.events;
        }
        None => b.busy_until = None,
    }
}
