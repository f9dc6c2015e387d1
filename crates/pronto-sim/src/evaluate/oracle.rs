//! The evaluator's oracle (module docs of [`super`], *The `oracle` policy*): it reads the
//! engines' true state.

use std::sync::Arc;

use super::{Backend, Engine, EngineEvent, StepWork, TraceRequest};
use pronto_core::tokens::BlockHash;

/// The backend with the smallest true TTFT for this request (see the module docs), or with
/// `thinking` given (`--objective ttfa`), the smallest true TTFA: the request generates
/// `thinking[b]` reasoning tokens on backend `b` before its answer, and the clone steps until
/// the first answer token.
///
/// Backends are tried in order of a lower bound — the rest of the step in flight plus this
/// request's uncached prefill run as one step with nothing else (real chunks and co-scheduled
/// work only add time) — and a backend whose bound is not below the best time found so far is
/// not simulated at all.
pub(super) fn oracle_pick(
    backends: &[Backend],
    ids: &[u32],
    id: u64,
    r: &TraceRequest,
    now: f64,
    thinking: Option<&[u32]>,
) -> usize {
    let len = ids.len() as u32;
    let mut hashes: Option<(usize, Arc<[BlockHash]>)> = None;
    let mut hashes_for = |e: &Engine| {
        let bs = e.config().block_size;
        match &hashes {
            Some((b, h)) if *b == bs => Arc::clone(h),
            _ => {
                let h = e.prompt_hashes(ids);
                hashes = Some((bs, Arc::clone(&h)));
                h
            }
        }
    };
    let mut order: Vec<(f64, usize)> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let busy = b.busy_until.map_or(0.0, |end| end - now);
            let h = hashes_for(&b.engine);
            let cached = f64::from(b.engine.cached_prefix_tokens_hashed(len, &h));
            let n = ids.len() as f64 - cached;
            let own = StepWork {
                prefill_tokens: n as u64,
                prefill_pairs: n * (cached + n / 2.0),
                ..StepWork::default()
            };
            (busy + b.engine.config().profile.step_seconds(&own), i)
        })
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut best = (f64::INFINITY, order[0].1);
    for (bound, i) in order {
        if bound >= best.0 {
            break;
        }
        let b = &backends[i];
        let mut t = b.busy_until.map_or(0.0, |end| end - now);
        let mut e = b.engine.clone();
        // Tokens before the one timed: the reasoning, with the TTFA objective.
        let before = thinking.map_or(0, |th| th[i]);
        let generated = r.output_tokens.saturating_add(before);
        e.add_hashed(id, len, hashes_for(&b.engine), generated);
        let mut produced = 0u32;
        'steps: while let Some(s) = e.step() {
            t += s.duration_s;
            if t >= best.0 {
                break;
            }
            for ev in s.events {
                match ev {
                    EngineEvent::FirstToken { id: x, .. } | EngineEvent::Token { id: x }
                        if x == id =>
                    {
                        produced += 1;
                        if produced > before {
                            best = (t, i);
                            break 'steps;
                        }
                    }
                    EngineEvent::Finished { id: x, .. } if x == id => break 'steps,
                    _ => {}
                }
            }
        }
    }
    best.1
}
