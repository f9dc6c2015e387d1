//! The scheduler replay: what the simulator does with one measured shape, as linear forms.
//!
//! For a shape the replay runs the simulator's own [`Engine`] (FCFS, chunked prefill under the
//! per-step token budget, whole-block prefix hits capped at `len − 1`, preemption) on a virtual
//! clock whose time is a [`Lin`] over θ, exactly as the live fleet would run the batch:
//!
//! 1. A prefix-hit shape first runs each of its prompts alone to completion (the untimed fill).
//! 2. The batch is sent at time 0. The front end serves the requests one at a time, so request
//!    `i` reaches the engine at `(i + 1) · (request_ms + ms_per_prompt_token · n)`.
//! 3. An idle engine starts a step when a request reaches it; a request that arrives during a
//!    step joins the next one. Each step adds [`Lin::step`] of its work to the clock.
//! 4. A token is seen `latency_ms` after the step that produced it ends.
//!
//! Which requests share a step depends on θ (when arrivals fall relative to step ends), so the
//! replay takes the current θ to decide the schedule; for that schedule every time is linear
//! in θ. [`super::fit`] iterates: replay at θ, fit θ, replay again.

use std::collections::VecDeque;

use super::params::{Lin, Param, Theta};
use super::shapes::{Kind, Shape};
use crate::engine::{Engine, EngineConfig, EngineEvent, SimRequest};
use pronto_core::tokens::TokenId;

/// Steps after which a replay gives up (a schedule that never finishes is a bug).
const MAX_STEPS: usize = 1_000_000;

/// Why a shape could not be replayed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    /// The engine rejected the prompt (it can never fit in the KV pool).
    #[error("{shape}: a request of {tokens} tokens does not fit in the KV pool")]
    TooLarge {
        /// Shape label.
        shape: String,
        /// Prompt tokens.
        tokens: usize,
    },
    /// The schedule did not finish.
    #[error("{0}: the replay did not finish")]
    Stuck(String),
}

/// A distinct prompt of `n` tokens for request `i` of a shape: its first token differs from
/// every other request's, so no two share a block.
fn prompt(i: usize, n: usize) -> Vec<TokenId> {
    (0..n)
        .map(|j| {
            if j == 0 {
                1_000_000 + i as TokenId
            } else {
                (j % 997) as TokenId + 1
            }
        })
        .collect()
}

/// Per request of the timed batch: when its first and its last token are seen.
pub fn replay(
    shape: &Shape,
    prompt_tokens: usize,
    cfg: &EngineConfig,
    theta: &Theta,
) -> Result<Vec<(Lin, Lin)>, ReplayError> {
    let n = prompt_tokens.max(1);
    let mut engine = Engine::new(cfg.clone());
    let prompts: Vec<Vec<TokenId>> = (0..shape.conc).map(|i| prompt(i, n)).collect();
    let stuck = || ReplayError::Stuck(shape.label());
    if shape.kind == Kind::PrefixHit {
        for (i, p) in prompts.iter().enumerate() {
            engine.add_request(SimRequest {
                id: (shape.conc + i) as u64,
                prompt: p.clone(),
                max_tokens: shape.max_tokens,
            });
            let mut steps = 0;
            while engine.step().is_some() {
                steps += 1;
                if steps > MAX_STEPS {
                    return Err(stuck());
                }
            }
        }
    }
    let latency = Lin::unit(Param::Latency, 1.0);
    let mut pending: VecDeque<(Lin, usize)> = (0..shape.conc)
        .map(|i| (Lin::frontend(n).scale((i + 1) as f64), i))
        .collect();
    let mut first: Vec<Option<Lin>> = vec![None; shape.conc];
    let mut last: Vec<Option<Lin>> = vec![None; shape.conc];
    let mut now = Lin::ZERO;
    let mut steps = 0;
    while last.iter().any(Option::is_none) {
        let t = now.at(theta);
        while let Some(&(at, i)) = pending.front() {
            if at.at(theta) > t + 1e-9 {
                break;
            }
            pending.pop_front();
            engine.add_request(SimRequest {
                id: i as u64,
                prompt: prompts[i].clone(),
                max_tokens: shape.max_tokens,
            });
        }
        if !engine.has_work() {
            match pending.front() {
                Some(&(at, _)) => {
                    now = at;
                    continue;
                }
                None => return Err(stuck()),
            }
        }
        let step = engine.step().ok_or_else(stuck)?;
        steps += 1;
        if steps > MAX_STEPS {
            return Err(stuck());
        }
        if step.duration_s > 0.0 {
            now = now + Lin::step(&step.work);
        }
        for ev in step.events {
            match ev {
                EngineEvent::FirstToken { id, .. } => first[id as usize] = Some(now + latency),
                EngineEvent::Finished { id, output_tokens } => {
                    if output_tokens == 0 {
                        return Err(ReplayError::TooLarge {
                            shape: shape.label(),
                            tokens: n,
                        });
                    }
                    last[id as usize] = Some(now + latency);
                }
                EngineEvent::Token { .. } => {}
            }
        }
    }
    Ok(first
        .into_iter()
        .zip(last)
        .map(|(f, l)| {
            let f = f.expect("finished requests had a first token");
            (f, l.expect("every request finished"))
        })
        .collect())
}

/// The shape's statistic as a linear form: the median over the batch (the mean of the middle
/// two when even) of each request's TTFT, or for decode shapes of its mean inter-token
/// latency `(last − first) / (tokens − 1)`. The order is decided at θ.
pub fn shape_row(
    shape: &Shape,
    prompt_tokens: usize,
    cfg: &EngineConfig,
    theta: &Theta,
) -> Result<Lin, ReplayError> {
    let per = replay(shape, prompt_tokens, cfg, theta)?;
    let k = f64::from(shape.max_tokens.saturating_sub(1).max(1));
    let mut vals: Vec<Lin> = per
        .into_iter()
        .map(|(f, l)| match shape.kind {
            Kind::Decode => (l - f).scale(1.0 / k),
            _ => f,
        })
        .collect();
    vals.sort_by(|a, b| a.at(theta).total_cmp(&b.at(theta)));
    let m = vals.len();
    Ok(if m % 2 == 1 {
        vals[m / 2]
    } else {
        (vals[m / 2 - 1] + vals[m / 2]).scale(0.5)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::params::theta_of;
    use crate::profile::Profile;

    fn cfg() -> EngineConfig {
        EngineConfig::from_profile(Profile::builtin("cpu-tiny").unwrap())
    }

    fn theta() -> Theta {
        // floor, prefill step, per token, attention, per seq, per kctx, front end, per token,
        // latency
        [3.0, 2.0, 0.01, 3.0, 0.1, 0.0, 6.0, 0.005, 8.0]
    }

    fn shape(kind: Kind, conc: usize, tokens: usize, max_tokens: u32) -> Shape {
        Shape {
            kind,
            conc,
            tokens,
            max_tokens,
        }
    }

    #[test]
    fn a_lone_cold_request_is_front_end_one_step_and_latency() {
        let th = theta();
        let s = shape(Kind::Cold, 1, 1000, 4);
        let row = shape_row(&s, 1000, &cfg(), &th).unwrap();
        // 6 + 0.005·1000 front end; one step: 3 + 2 + 0.01·1000 + 3·0.5; latency 8.
        let want = 6.0 + 5.0 + 3.0 + 2.0 + 10.0 + 1.5 + 8.0;
        assert!((row.at(&th) - want).abs() < 1e-9, "{}", row.at(&th));
    }

    #[test]
    fn long_prompts_are_chunked_and_hits_compute_the_last_block() {
        let th = theta();
        let c = cfg();
        // 4000 tokens under a 2048-token budget: two prefill steps.
        let cold = shape_row(&shape(Kind::Cold, 1, 4000, 4), 4000, &c, &th).unwrap();
        assert_eq!(cold.0[Param::Floor.index()], 2.0);
        assert_eq!(cold.0[Param::PrefillPerToken.index()], 4000.0);
        let pairs = 2048.0 * 1024.0 + 1952.0 * (2048.0 + 976.0);
        assert!((cold.0[Param::AttnPerMpair.index()] - pairs / 1e6).abs() < 1e-12);
        // A hit: 31 blocks of 128 cached, 32 tokens computed after 3968.
        let hit = shape_row(&shape(Kind::PrefixHit, 1, 4000, 4), 4000, &c, &th).unwrap();
        assert_eq!(hit.0[Param::PrefillPerToken.index()], 32.0);
        assert_eq!(hit.0[Param::FrontendPerToken.index()], 4000.0);
        assert_eq!(hit.0[Param::Floor.index()], 1.0);
    }

    #[test]
    fn a_concurrent_batch_is_serialised_by_the_front_end() {
        let th = theta();
        let per = replay(&shape(Kind::Cold, 8, 128, 4), 128, &cfg(), &th).unwrap();
        let ttft: Vec<f64> = per.iter().map(|(f, _)| f.at(&th)).collect();
        // Front end 6.64 ms per request: they reach the engine one by one, and the first is
        // served as if it were alone.
        for (i, t) in ttft.iter().enumerate() {
            assert!(i == 0 || *t > ttft[i - 1], "{ttft:?}");
        }
        let alone = shape_row(&shape(Kind::Cold, 1, 128, 4), 128, &cfg(), &th).unwrap();
        assert!((ttft[0] - alone.at(&th)).abs() < 1e-9, "{ttft:?}");
        // Without a front end the batch arrives at once: one step prefills all eight.
        let mut no_fe = th;
        no_fe[Param::FrontendRequest.index()] = 0.0;
        no_fe[Param::FrontendPerToken.index()] = 0.0;
        let per = replay(&shape(Kind::Cold, 8, 128, 4), 128, &cfg(), &no_fe).unwrap();
        let first: Vec<f64> = per.iter().map(|(f, _)| f.at(&no_fe)).collect();
        assert!(
            first.iter().all(|t| (t - first[0]).abs() < 1e-9),
            "{first:?}"
        );
    }

    #[test]
    fn decode_rows_are_the_inter_token_gap() {
        let th = theta();
        let row = shape_row(&shape(Kind::Decode, 1, 128, 32), 128, &cfg(), &th).unwrap();
        // 31 decode steps of floor + per-seq over 31 gaps; latency cancels.
        assert!((row.at(&th) - 3.1).abs() < 1e-9, "{}", row.at(&th));
        assert_eq!(row.0[Param::Latency.index()], 0.0);
        // The replay's values are the live profile's: evaluate at the profile's own θ.
        let p = Profile::builtin("cpu-tiny").unwrap();
        let own = theta_of(&p);
        let r = shape_row(&shape(Kind::Decode, 1, 128, 32), 128, &cfg(), &own).unwrap();
        assert!((r.at(&own) - (p.step.floor_ms + p.step.decode_ms_per_seq)).abs() < 1e-6);
    }

    #[test]
    fn oversized_prompts_are_an_error() {
        let mut c = cfg();
        c.num_kv_blocks = 2;
        let e = replay(&shape(Kind::Cold, 1, 1000, 4), 1000, &c, &theta()).unwrap_err();
        assert!(matches!(e, ReplayError::TooLarge { .. }), "{e}");
    }
}
