//! `predicted_ttft`: send each request where its first token is predicted to come soonest.
//!
//! For every eligible backend the policy evaluates the backend's learned model
//! ([`crate::predict`]) on this request: its queued prefill, this prompt's *uncached* tokens
//! (prompt tokens minus the prefix-cache hit expected on that backend), its running decodes and
//! the engine's scraped queue. One cost unit throughout — predicted seconds — so prefix affinity
//! is not a magic weight: a cache hit is worth exactly the prefill time it saves on that
//! backend, and a hot cache-affine backend loses to an idle one when its queue costs more.
//!
//! ```text
//! cost(b) = model_b(inputs) × distrust_b + kv_wait_b
//! distrust_b = (1 + e_b) / (1 + poor_error)  when b is calibrated and its error e_b > poor_error, else 1
//! kv_wait_b  = overflow_b / kv_alloc_rate_b  (0 when the request fits; see BackendView::kv_wait_s)
//! ```
//! The decision reports `model_b(inputs) + kv_wait_b` of the chosen backend as its prediction
//! (the distrust factor only ranks).
//!
//! **The stall a prefill imposes (with a TPOT objective).** A prefill runs in the same engine
//! steps as the streams decoding on that backend (chunked prefill), so each of them waits out
//! roughly the prefill's time. A request whose route sets `tpot_slo` is charged, for ranking
//! only, the TPOT it takes from the streams beside it:
//! ```text
//! stall_b   = decode_stall_weight × running_decodes_b × prefill_b × risk_b
//! prefill_b = model_b(inputs) − model_b(inputs without this prompt's uncached tokens)
//! risk_b    = min(1, tpot_b / tpot_slo)      tpot_b = BackendView::predicted_tpot_s (1 if unknown)
//! ```
//! So a cache hit is worth the prefill it saves for everyone decoding there, not only for
//! this request, and a long uncached prompt goes where fewer streams wait on it; `risk_b`
//! fades the charge where decoding is far inside the objective. Under overload this is what
//! keeps TPOT within the objective (goodput); without a TPOT objective nothing changes.
//!
//! **Objective `ttfa`.** When the request's route minimises the time to first *answer*
//! ([`Objective::Ttfa`](crate::slo::Objective), with `R` reasoning tokens expected before the
//! answer, [`crate::predict::reasoning`]), every cost above — argmin, objectives and probes —
//! adds the reasoning at the backend's predicted time per output token:
//! ```text
//! cost_ttfa(b) = cost(b) + R × tpot_b      tpot_b = BackendView::predicted_tpot_s (inflight + 1)
//! ```
//! A backend whose TPOT model does not predict yet is charged the largest TPOT predicted among
//! the eligible backends (the safe side: an unknown decoder does not attract long reasoning),
//! and with none predicted the term is 0 everywhere. The decision still reports the TTFT
//! prediction (it is what the TTFT model is scored and deadlines are set on).
//!
//! Rules, in order:
//! 1. **Distrust, then fallback.** A calibrated model whose recent relative error exceeds
//!    `poor_error` is scaled up as above, so a poorly predicted backend wins only when it is
//!    clearly better. Only when no candidate has a trusted model (every one is calibrated and
//!    poor), or some eligible backend has no model, is the prediction abandoned: the backend
//!    with the least queued prefill work (router-side queued prefill plus this prompt's
//!    uncached tokens, per unit weight; ties to fewer in flight) gets the request (reason
//!    `fallback`).
//! 2. **Bounded exploration.** A backend that is *cold* (fewer than `min_samples`
//!    observations) or *stale* (none for `explore_after_s`) is probed — given this request —
//!    when it has no probe outstanding (no prefill in flight) and its prediction is within
//!    `explore_margin` × the best. So a new or recovered backend is calibrated with at most one
//!    request at a time, and never at a cost beyond the margin (reason `explore`).
//! 3. Otherwise the argmin (reason `predicted_best`); ties go to fewer in-flight requests.
//!    When the request carries a TPOT objective (its route's `tpot_slo`), the argmin is taken
//!    over the backends with KV room for it now that are predicted to meet *both* objectives
//!    — TPOT from the decode load it
//!    would join ([`cautious_tpot_s`](super::BackendView::cautious_tpot_s)), TTFT (`ttft_slo`, when set) from the
//!    prediction above ([`meets_slo`](super::BackendView::meets_slo)) — whenever at least one does; only when
//!    none can — or the best that can costs more than `explore_margin` × the best cost, the
//!    bound a probe gets — does the plain argmin decide. A backend that would break
//!    `tpot_slo` is thus avoided while another can meet both at a bounded TTFT price.
//!
//! **Cold start.** For the exploration test only, an uncalibrated backend is judged on the more
//! optimistic of its own model (the configured or generic prior) and its best-calibrated
//! trusted peer's, evaluated on its own inputs, so a prior far too pessimistic cannot keep it
//! out of the margin forever. It never wins the argmin on a borrowed model.
//!
//! **Waiting for KV room.** A backend the request does not *fit* on (its uncached prompt plus
//! expected output beyond the KV capacity left by what in-flight requests will hold) has the
//! expected wait for room added: the overflow over the rate at which its cache turns over. A
//! backend whose wait is unknown (capacity known, no turnover measured) is skipped while
//! another's is known.
//!
//! Why each rule is what it is — the alternatives tried and what they measured — is in
//! `docs/design/predicted-ttft.md`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{Decision, NoBackend, Policy, Reason, Snapshot};
use crate::predict::TtftInputs;
use crate::request::RequestFeatures;

/// The predicted-TTFT policy and its knobs.
#[derive(Debug)]
pub(crate) struct PredictedTtft {
    /// Relative error above which a calibrated model is distrusted (its prediction scaled up).
    pub poor_error: f64,
    /// Observations before a model counts as calibrated.
    pub min_samples: u32,
    /// Seconds without an observation after which a backend is re-probed.
    pub explore_after_s: f64,
    /// A probe is allowed when its prediction ≤ this × the best prediction.
    pub explore_margin: f64,
    /// Seconds of cost per second of decode stall imposed on another stream, for requests
    /// with a TPOT objective (module docs); 0 turns the charge off.
    pub decode_stall_weight: f64,
    /// Rotating start of the fallback's scan, so exact ties share the load.
    tiebreak: AtomicU64,
}

impl Default for PredictedTtft {
    fn default() -> Self {
        PredictedTtft {
            poor_error: 1.0,
            min_samples: 3,
            explore_after_s: 30.0,
            explore_margin: 2.0,
            decode_stall_weight: DEFAULT_DECODE_STALL_WEIGHT,
            tiebreak: AtomicU64::new(0),
        }
    }
}

/// Default [`PredictedTtft::decode_stall_weight`]: a second of stall on another stream costs
/// 0.2 s of this request's TTFT. Chosen on the offline matrix at 95 % load
/// (`docs/design/predicted-ttft.md`, *Overload and goodput*).
pub(crate) const DEFAULT_DECODE_STALL_WEIGHT: f64 = 0.2;

impl Policy for PredictedTtft {
    fn name(&self) -> &'static str {
        "predicted_ttft"
    }

    fn select(
        &self,
        features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        _now: Instant,
    ) -> Result<Decision, NoBackend> {
        let mut best: Option<(usize, f64, f64)> = None;
        // The argmin over backends predicted to meet the request's objectives (rule 3).
        let mut best_met: Option<(usize, f64, f64)> = None;
        let tpot_slo = features.slo.tpot_s;
        let stall_weight = if tpot_slo.is_some() {
            self.decode_stall_weight
        } else {
            0.0
        };
        // The `ttfa` objective's reasoning tokens, and the TPOT charged where none is
        // predicted (module docs).
        let reasoning = features.objective.reasoning_tokens();
        let unknown_tpot = if reasoning > 0.0 {
            snapshot
                .eligible()
                .filter_map(|(_, b)| b.predicted_tpot_s())
                .fold(0.0, f64::max)
        } else {
            0.0
        };
        let mut probe: Option<(usize, f64, f64)> = None;
        let mut trusted = false;
        // Computed at the first uncalibrated backend: the peer model it may borrow.
        let mut reference: Option<Option<crate::predict::Coefficients>> = None;
        // Waits for KV room count only if some backend's wait is known (module docs).
        let kv_known = snapshot
            .eligible()
            .any(|(_, b)| b.kv_wait_s(features).is_finite());
        for (i, b) in snapshot.eligible() {
            let wait = if kv_known { b.kv_wait_s(features) } else { 0.0 };
            if wait.is_infinite() {
                continue;
            }
            let Some(model) = b.ttft_model else {
                return self.fallback(features, snapshot);
            };
            let calibrated = model.quality.samples >= self.min_samples;
            let inputs = b.ttft_inputs(features);
            let m = model.coefficients.predict(&inputs);
            let p = m + wait;
            // Cost: the prediction, scaled up when the model is distrusted (module docs).
            let poor = calibrated && model.quality.rel_error > self.poor_error;
            trusted |= !poor;
            let answer = if reasoning > 0.0 {
                reasoning * b.predicted_tpot_s().unwrap_or(unknown_tpot)
            } else {
                0.0
            };
            let stall = if stall_weight > 0.0 && b.running_decodes > 0 {
                let without = TtftInputs {
                    uncached_tokens: 0.0,
                    ..inputs
                };
                let prefill = (m - model.coefficients.predict(&without)).max(0.0);
                let risk = match (tpot_slo, b.predicted_tpot_s()) {
                    (Some(slo), Some(t)) if slo > 0.0 => (t / slo).min(1.0),
                    _ => 1.0,
                };
                stall_weight * f64::from(b.running_decodes) * prefill * risk
            } else {
                0.0
            };
            let cost = answer
                + stall
                + if poor {
                    m * (1.0 + model.quality.rel_error) / (1.0 + self.poor_error) + wait
                } else {
                    p
                };
            // (index, cost, prediction): lower cost wins, ties to fewer in flight.
            let beats = |cost: f64, cur: Option<(usize, f64, f64)>| {
                cur.is_none_or(|(j, c, _)| {
                    cost < c || (cost == c && b.inflight < snapshot.backends[j].inflight)
                })
            };
            if beats(cost, best) {
                best = Some((i, cost, p));
            }
            // Only a backend with KV room now: one without cannot promise a steady decode
            // (it queues or preempts), and under overload the few that seem to meet the
            // objectives would take everything.
            if tpot_slo.is_some()
                && wait == 0.0
                && b.meets_slo(features, p)
                && beats(cost, best_met)
            {
                best_met = Some((i, cost, p));
            }
            let cold = !calibrated || model.since_last_observation_s > self.explore_after_s;
            if cold && b.outstanding_prefill_tokens == 0 {
                // As a probe, an uncalibrated backend may be judged on its peer's model.
                let (mut q_cost, mut q) = (cost, p);
                if !calibrated {
                    let peer = *reference.get_or_insert_with(|| self.reference_model(snapshot));
                    if let Some(borrowed) = peer.map(|c| c.predict(&inputs) + wait) {
                        if borrowed + answer < q_cost {
                            (q_cost, q) = (borrowed + answer, borrowed);
                        }
                    }
                }
                if beats(q_cost, probe) {
                    probe = Some((i, q_cost, q));
                }
            }
        }
        // Meeting the objectives may cost at most what a probe may (explore_margin × the best).
        let met =
            best_met.filter(|m| best.is_some_and(|b| m.1 <= self.explore_margin * b.1.max(1e-3)));
        let (index, cost, p) = met.or(best).ok_or(NoBackend)?;
        if !trusted {
            return self.fallback(features, snapshot);
        }
        if let Some((j, probe_cost, q)) = probe {
            if j != index && probe_cost <= self.explore_margin * cost.max(1e-3) {
                return Ok(Decision {
                    index: j,
                    predicted_ttft_s: Some(q),
                    reason: Reason::Explore,
                });
            }
        }
        Ok(Decision {
            index,
            predicted_ttft_s: Some(p),
            reason: Reason::PredictedBest,
        })
    }
}

impl PredictedTtft {
    /// A policy with the given knobs (see the module docs).
    pub(crate) fn new(
        poor_error: f64,
        min_samples: u32,
        explore_after_s: f64,
        explore_margin: f64,
        decode_stall_weight: f64,
    ) -> PredictedTtft {
        PredictedTtft {
            poor_error,
            min_samples,
            explore_after_s,
            explore_margin,
            decode_stall_weight,
            tiebreak: AtomicU64::new(0),
        }
    }

    /// The model an uncalibrated backend may borrow: the trusted calibrated model with the
    /// most observations among the eligible backends (module docs, *Cold start*).
    fn reference_model(&self, snapshot: &Snapshot<'_>) -> Option<crate::predict::Coefficients> {
        snapshot
            .eligible()
            .filter_map(|(_, b)| b.ttft_model)
            .filter(|m| {
                m.quality.samples >= self.min_samples && m.quality.rel_error <= self.poor_error
            })
            .max_by_key(|m| m.quality.samples)
            .map(|m| m.coefficients)
    }

    /// Least queued prefill work: the eligible backend (among those the request fits on, if
    /// any) with the fewest router-side queued prefill tokens plus this prompt's uncached
    /// tokens there, per unit weight; ties to fewer in flight, then to the scan's rotating start.
    /// Needs no model: the queue counts are the router's own and exact.
    fn fallback(
        &self,
        features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
    ) -> Result<Decision, NoBackend> {
        let n = snapshot.backends.len();
        if n == 0 {
            return Err(NoBackend);
        }
        let any_fits = snapshot.eligible().any(|(_, b)| b.kv_fits(features));
        let start = (self.tiebreak.fetch_add(1, Ordering::Relaxed) % n as u64) as usize;
        let mut best: Option<(usize, f64)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let b = &snapshot.backends[i];
            if !b.eligible() || (any_fits && !b.kv_fits(features)) {
                continue;
            }
            let x = b.ttft_inputs(features);
            let work = (x.queued_prefill_tokens + x.uncached_tokens) / f64::from(b.weight.max(1));
            let better = best.is_none_or(|(j, w)| {
                work < w || (work == w && b.inflight < snapshot.backends[j].inflight)
            });
            if better {
                best = Some((i, work));
            }
        }
        let (index, _) = best.ok_or(NoBackend)?;
        Ok(Decision {
            index,
            predicted_ttft_s: snapshot.backends[index].predicted_ttft(features),
            reason: Reason::Fallback,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::{Coefficients, Quality};
    use crate::routing::test_support::views;
    use crate::routing::{AllocRate, BackendView, TtftModelView};

    fn model(s_per_token: f64, samples: u32, rel_error: f64) -> Option<TtftModelView> {
        Some(TtftModelView {
            coefficients: Coefficients {
                base_s: 0.02,
                s_per_token,
                s_per_token_sq: 0.0,
                s_per_decode: 0.001,
                s_per_waiting: 0.0,
            },
            quality: Quality { samples, rel_error },
            since_last_observation_s: 1.0,
        })
    }

    fn prompt(tokens: u32) -> RequestFeatures {
        let mut f = RequestFeatures::synthetic("m", "x".into(), None);
        f.prompt_tokens = tokens;
        f
    }

    fn pick(p: &PredictedTtft, v: &[BackendView], f: &RequestFeatures) -> Decision {
        p.select(f, &Snapshot { backends: v }, Instant::now())
            .unwrap()
    }

    #[test]
    fn faster_backend_wins_and_prediction_is_reported() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        v[0].ttft_model = model(1e-4, 50, 0.1);
        v[1].ttft_model = model(2e-5, 50, 0.1);
        let d = pick(&p, &v, &prompt(4000));
        assert_eq!((d.index, d.reason), (1, Reason::PredictedBest));
        let expected = 0.02 + 4000.0 * 2e-5;
        assert!((d.predicted_ttft_s.unwrap() - expected).abs() < 1e-9);
    }

    #[test]
    fn cache_hit_is_worth_the_prefill_it_saves_but_not_a_long_queue() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        v[0].ttft_model = model(5e-5, 50, 0.1);
        v[1].ttft_model = model(5e-5, 50, 0.1);
        v[0].cached_tokens = 7000;
        let f = prompt(8000);
        assert_eq!(pick(&p, &v, &f).index, 0, "the cache-affine backend wins");
        // Its queue now costs more than the prefill the hit saves (7000 tokens).
        v[0].outstanding_prefill_tokens = 20_000;
        assert_eq!(
            pick(&p, &v, &f).index,
            1,
            "an idle backend beats a hot affine one"
        );
    }

    #[test]
    fn cost_is_monotonic_in_queue_depth() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        v[0].ttft_model = model(5e-5, 50, 0.1);
        v[1].ttft_model = model(5e-5, 50, 0.1);
        v[1].outstanding_prefill_tokens = 10;
        let f = prompt(100);
        for q in [0u64, 5, 9] {
            v[0].outstanding_prefill_tokens = q;
            assert_eq!(pick(&p, &v, &f).index, 0);
        }
        v[0].outstanding_prefill_tokens = 11;
        assert_eq!(pick(&p, &v, &f).index, 1);
    }

    #[test]
    fn a_missing_model_falls_back_to_the_least_queued_work() {
        let p = PredictedTtft::default();
        let mut v = views(3);
        v[0].ttft_model = model(5e-5, 50, 0.1);
        // More requests in flight, but less prefill queued: least work, not least in flight.
        v[1].inflight = 3;
        v[1].outstanding_prefill_tokens = 100;
        v[2].outstanding_prefill_tokens = 50_000;
        v[0].outstanding_prefill_tokens = 20_000;
        let d = pick(&p, &v, &prompt(1000));
        assert_eq!((d.index, d.reason), (1, Reason::Fallback));
        // A prefix hit counts: its uncached prompt is part of the work.
        v[2].outstanding_prefill_tokens = 0;
        v[2].cached_tokens = 950;
        assert_eq!(pick(&p, &v, &prompt(1000)).index, 2);
    }

    #[test]
    fn a_poor_model_is_distrusted_not_obeyed_and_all_poor_falls_back() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        let f = prompt(10_000);
        // 0.02 + 10k × 1e-4 = 1.02 s (trusted) against 0.02 + 10k × 6e-5 = 0.62 s predicted by a
        // model typically off by 3× (rel_error 2): 0.62 × 3 / 2 = 0.93 s, still better.
        v[0].ttft_model = model(1e-4, 50, 0.1);
        v[1].ttft_model = model(6e-5, 50, 2.0);
        let d = pick(&p, &v, &f);
        assert_eq!((d.index, d.reason), (1, Reason::PredictedBest));
        assert!(
            (d.predicted_ttft_s.unwrap() - 0.62).abs() < 1e-9,
            "raw prediction"
        );
        // 0.72 s predicted, 1.08 s distrusted: the trusted backend wins.
        v[1].ttft_model = model(7e-5, 50, 2.0);
        assert_eq!(pick(&p, &v, &f).index, 0);
        // The same error under the threshold is trusted as is.
        v[1].ttft_model = model(7e-5, 50, 0.9);
        assert_eq!(pick(&p, &v, &f).index, 1);
        // Nothing trusted: least queued work decides.
        v[0].ttft_model = model(1e-4, 50, 1.5);
        v[1].ttft_model = model(7e-5, 50, 2.0);
        v[1].outstanding_prefill_tokens = 1;
        let d = pick(&p, &v, &f);
        assert_eq!((d.index, d.reason), (0, Reason::Fallback));
        // A cold model is not evidence of a poor one: no fallback.
        v[0].ttft_model = model(1e-4, 0, 0.0);
        assert_ne!(pick(&p, &v, &f).reason, Reason::Fallback);
    }

    #[test]
    fn a_cold_start_fallback_keeps_a_repeated_prefix_on_its_holder() {
        let p = PredictedTtft::default();
        let mut v = views(3);
        // No models yet (cold start, as in front of a fresh real vLLM): fallback, all idle —
        // the holder has the least work every time, no rotation scatters the prefix.
        v[2].cached_tokens = 900;
        for _ in 0..6 {
            let d = pick(&p, &v, &prompt(1000));
            assert_eq!((d.index, d.reason), (2, Reason::Fallback));
        }
        // Queued work still counts: a holder busy with a long prefill loses to idle backends,
        // which share the load.
        v[2].outstanding_prefill_tokens = 5000;
        let picks: Vec<usize> = (0..4).map(|_| pick(&p, &v, &prompt(1000)).index).collect();
        assert!(picks.iter().all(|&i| i != 2), "{picks:?}");
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn a_cold_backend_is_probed_on_a_calibrated_peers_model_when_its_prior_is_pessimistic() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        // b0 calibrated: 20 ms + 1000 tokens × 1e-5 = 30 ms. b1 cold, its prior 5× slower per
        // token: 120 ms, beyond the exploration margin (2 × 30 ms).
        v[0].ttft_model = model(1e-5, 50, 0.1);
        v[1].ttft_model = model(1e-4, 0, 0.0);
        v[0].running_decodes = 4; // b0 busy: 34 ms; b1 on b0's model: 30 ms
        let d = pick(&p, &v, &prompt(1000));
        assert_eq!((d.index, d.reason), (1, Reason::Explore), "{d:?}");
        assert!((d.predicted_ttft_s.unwrap() - 0.030).abs() < 1e-9, "{d:?}");
        // A probe at a time: with one in prefill it is not chosen on the borrowed model.
        v[1].outstanding_prefill_tokens = 1000;
        assert_eq!(pick(&p, &v, &prompt(1000)).index, 0);
        v[1].outstanding_prefill_tokens = 0;
        // Once calibrated, b1 stands on its own model.
        v[1].ttft_model = model(1e-4, 3, 0.1);
        assert_eq!(pick(&p, &v, &prompt(1000)).index, 0);
        // A poor peer is not borrowed from (b0 distrusted: cost 30 ms × 4/2 = 60 ms, still
        // below b1's own 120 ms; borrowing would have made b1 30 ms and the winner) …
        v[0].ttft_model = model(1e-5, 50, 3.0);
        v[1].ttft_model = model(1e-4, 0, 0.0);
        v[0].running_decodes = 0;
        assert_eq!(pick(&p, &v, &prompt(1000)).index, 0);
        // … nor a more pessimistic one (b1 keeps its own 120 ms and wins over 1.02 s).
        v[0].ttft_model = model(1e-3, 50, 0.1);
        v[1].ttft_model = model(1e-4, 0, 0.0);
        let d = pick(&p, &v, &prompt(1000));
        assert_eq!(d.index, 1);
        assert!((d.predicted_ttft_s.unwrap() - 0.120).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn explores_cold_backends_one_probe_at_a_time_within_the_margin() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        v[0].ttft_model = model(5e-5, 50, 0.1);
        v[1].ttft_model = model(6e-5, 0, 0.0);
        let f = prompt(1000);
        let d = pick(&p, &v, &f);
        assert_eq!((d.index, d.reason), (1, Reason::Explore));
        // While the probe is in prefill, no second probe.
        v[1].outstanding_prefill_tokens = 1000;
        let d = pick(&p, &v, &f);
        assert_eq!((d.index, d.reason), (0, Reason::PredictedBest));
        // Far beyond the margin, even on the calibrated peer's model (100 running decodes:
        // 170 ms against 70 ms): never probed.
        v[1].outstanding_prefill_tokens = 0;
        v[1].running_decodes = 100;
        v[1].ttft_model = model(1e-3, 0, 0.0);
        assert_eq!(pick(&p, &v, &f).index, 0);
        // Its own prior alone (1 s) was the reason before; the peer's model now lets it in.
        v[1].running_decodes = 0;
        assert_eq!(pick(&p, &v, &f).index, 1);
    }

    #[test]
    fn waiting_for_kv_room_is_a_cost() {
        let p = PredictedTtft::default();
        let mut v = views(2);
        v[0].ttft_model = model(5e-5, 50, 0.1);
        v[1].ttft_model = model(5e-5, 50, 0.1);
        // b1: 0.02 + 6000 × 5e-5 = 0.32 s; b0: 0.07 s.
        v[1].outstanding_prefill_tokens = 5000;
        v[0].kv_capacity_tokens = Some(10_000);
        v[1].kv_capacity_tokens = Some(10_000);
        let mut f = prompt(1000);
        f.max_tokens = Some(1000);
        assert_eq!(pick(&p, &v, &f).index, 0, "fits and is faster");
        // 8500 reserved + 2000 needed: 500 tokens over. Turnover unknown: skipped.
        v[0].kv_reserved_tokens = 8500;
        assert_eq!(v[0].kv_wait_s(&f), f64::INFINITY);
        assert_eq!(pick(&p, &v, &f).index, 1);
        // 10k tokens/s turn over: 50 ms of waiting, still the best (0.12 s).
        v[0].kv_alloc = AllocRate::constant(10_000.0);
        let d = pick(&p, &v, &f);
        assert_eq!(d.index, 0);
        assert!((d.predicted_ttft_s.unwrap() - 0.12).abs() < 1e-9, "{d:?}");
        // 1k tokens/s: 0.5 s of waiting loses to b1's queue.
        v[0].kv_alloc = AllocRate::constant(1000.0);
        assert_eq!(pick(&p, &v, &f).index, 1);
        // b1 full too, with no known turnover: b0's known wait is the better bet.
        v[1].kv_reserved_tokens = 9000;
        assert_eq!(pick(&p, &v, &f).index, 0);
        // No wait known anywhere: the plain argmin.
        v[0].kv_alloc = AllocRate::constant(0.0);
        assert_eq!(pick(&p, &v, &f).index, 0);
        // Unknown capacity always fits.
        v[1].kv_capacity_tokens = None;
        assert_eq!(v[1].kv_wait_s(&f), 0.0);
        v[0].kv_alloc = AllocRate::constant(1000.0);
        assert_eq!(pick(&p, &v, &f).index, 1);
    }

    #[test]
    fn a_backend_that_would_break_the_tpot_slo_is_avoided_while_another_meets_both() {
        use crate::predict::TpotCoefficients;
        let p = PredictedTtft::default();
        let mut v = views(3);
        for b in &mut v {
            b.ttft_model = model(5e-5, 50, 0.1);
        }
        // b0 fastest to a first token (0.07 s) but decoding a big batch: 1 ms × 40 = 40 ms
        // per token. b1 (0.12 s) and b2 (0.37 s) queue some prefill but decode small batches.
        let tpot = |s_per_seq| {
            Some(TpotCoefficients {
                base_s: 0.0,
                s_per_seq,
                samples: 10,
                cautious_base_s: 0.0,
                cautious_s_per_seq: s_per_seq,
            })
        };
        v[0].tpot_model = tpot(0.001);
        v[0].inflight = 39;
        v[1].tpot_model = tpot(0.001);
        v[1].inflight = 4;
        v[1].outstanding_prefill_tokens = 1000;
        v[2].tpot_model = tpot(0.001);
        v[2].inflight = 2;
        v[2].outstanding_prefill_tokens = 6000;
        let mut f = prompt(1000);
        assert_eq!(
            pick(&p, &v, &f).index,
            0,
            "no objective: the soonest first token"
        );
        f.slo.tpot_s = Some(0.02);
        let d = pick(&p, &v, &f);
        assert_eq!((d.index, d.reason), (1, Reason::PredictedBest), "{d:?}");
        assert_eq!(v[0].predicted_tpot_s(), Some(0.04));
        // b1 meets the TPOT but not a 0.1 s TTFT; b2 neither: nobody meets both, so the
        // plain argmin stands.
        f.slo.ttft_s = Some(0.1);
        assert_eq!(pick(&p, &v, &f).index, 0);
        // With room for b1's TTFT, b1 again.
        f.slo.ttft_s = Some(0.3);
        assert_eq!(pick(&p, &v, &f).index, 1);
        // Meeting them may cost at most explore_margin × the best: at 0.27 s (> 2 × 0.07 s)
        // b1 is too dear, and the argmin stands.
        v[1].outstanding_prefill_tokens = 4000;
        assert_eq!(pick(&p, &v, &f).index, 0);
        v[1].outstanding_prefill_tokens = 1000;
        // A backend without a TPOT model yet is not ruled out by it.
        v[0].tpot_model = None;
        assert_eq!(pick(&p, &v, &f).index, 0);
        // Nor does a backend without KV room count as meeting them (it would queue or
        // preempt): b0 decoding little now (5 ms per token) but full, b1 chosen.
        v[0].tpot_model = tpot(0.001);
        v[0].inflight = 4;
        assert_eq!(pick(&p, &v, &f).index, 0, "b0 meets both while it has room");
        v[0].kv_capacity_tokens = Some(10_000);
        v[0].kv_reserved_tokens = 10_000;
        v[0].kv_alloc = AllocRate::constant(1e9);
        v[1].kv_capacity_tokens = Some(10_000);
        assert_eq!(pick(&p, &v, &f).index, 1);
    }

    #[test]
    fn with_a_tpot_objective_a_prefill_is_charged_the_stall_it_imposes_on_decoding_streams() {
        use crate::predict::TpotCoefficients;
        let mut v = views(2);
        for b in &mut v {
            b.ttft_model = model(5e-5, 50, 0.1);
        }
        // b0: nothing queued, 20 streams decoding (0.54 s to a first token); b1: 2000 tokens
        // queued, nobody decoding (0.62 s).
        v[0].running_decodes = 20;
        v[0].inflight = 20;
        v[1].outstanding_prefill_tokens = 2000;
        let mut f = prompt(10_000);
        let p = PredictedTtft::default();
        assert_eq!(pick(&p, &v, &f).index, 0, "no TPOT objective: no charge");
        f.slo.tpot_s = Some(0.05);
        // The 0.5 s prefill stalls 20 streams: 0.2 × 20 × 0.5 = 2 s on b0.
        let d = pick(&p, &v, &f);
        assert_eq!(d.index, 1, "{d:?}");
        let reported = d.predicted_ttft_s.unwrap();
        assert!(
            (reported - 0.62).abs() < 1e-9,
            "the charge only ranks: {reported}"
        );
        // A weight of 0 turns it off.
        let off = PredictedTtft::new(1.0, 3, 30.0, 2.0, 0.0);
        assert_eq!(pick(&off, &v, &f).index, 0);
        // Where the streams decode far inside the objective (1 ms per token against 50) the
        // charge fades with the risk: 2 s × 0.021 = 0.04 s, and b0 is back.
        v[0].tpot_model = Some(TpotCoefficients {
            base_s: 0.0,
            s_per_seq: 5e-5,
            samples: 10,
            cautious_base_s: 0.0,
            cautious_s_per_seq: 5e-5,
        });
        assert_eq!(pick(&p, &v, &f).index, 0);
        // A cache hit saves the stall too: near the objective again, a prompt that b0 holds
        // but for 1000 tokens stalls its streams 0.05 s, not 0.5 s: 0.2 × 20 × 0.05 = 0.2 s.
        v[0].tpot_model = None;
        assert_eq!(pick(&p, &v, &f).index, 1);
        v[0].cached_tokens = 9000;
        assert_eq!(pick(&p, &v, &f).index, 0);
    }

    #[test]
    fn the_ttfa_objective_adds_the_reasoning_at_each_backends_tpot() {
        use crate::predict::TpotCoefficients;
        use crate::slo::Objective;
        let p = PredictedTtft::default();
        let mut v = views(2);
        for b in &mut v {
            b.ttft_model = model(5e-5, 50, 0.1);
        }
        let tpot = |s_per_seq| {
            Some(TpotCoefficients {
                base_s: 0.005,
                s_per_seq,
                samples: 10,
                ..Default::default()
            })
        };
        // b0: first token at 0.07 s, decoding 20 ms per token; b1: 0.17 s (2000 tokens of
        // prefill queued), 8 ms per token.
        v[0].tpot_model = tpot(0.015);
        v[1].tpot_model = tpot(0.003);
        v[1].outstanding_prefill_tokens = 2000;
        let mut f = prompt(1000);
        let d = pick(&p, &v, &f);
        assert_eq!(d.index, 0, "ttft: the soonest first token");
        // 400 reasoning tokens: 0.07 + 8 s against 0.17 + 3.2 s.
        f.objective = Objective::Ttfa {
            reasoning_tokens: 400.0,
        };
        let d = pick(&p, &v, &f);
        assert_eq!((d.index, d.reason), (1, Reason::PredictedBest), "{d:?}");
        let ttft = 0.02 + 3000.0 * 5e-5 + 0.0;
        assert!(
            (d.predicted_ttft_s.unwrap() - ttft).abs() < 1e-9,
            "the decision reports its TTFT prediction: {d:?}"
        );
        // Nothing expected before the answer: as ttft.
        f.objective = Objective::Ttfa {
            reasoning_tokens: 0.0,
        };
        assert_eq!(pick(&p, &v, &f).index, 0);
        // A backend whose TPOT is not predicted yet is charged the worst one predicted: b1
        // without a model costs 0.17 + 8 s and loses to b0.
        f.objective = Objective::Ttfa {
            reasoning_tokens: 400.0,
        };
        v[1].tpot_model = None;
        assert_eq!(pick(&p, &v, &f).index, 0);
        // None predicted anywhere: the term is 0 and the first token decides.
        v[0].tpot_model = None;
        v[1].outstanding_prefill_tokens = 0;
        v[1].inflight = 1;
        assert_eq!(pick(&p, &v, &f).index, 0, "ties to fewer in flight");
    }

    #[test]
    fn only_eligible_backends_and_none_is_an_error() {
        let p = PredictedTtft::default();
        let mut v = views(3);
        for b in &mut v {
            b.ttft_model = model(5e-5, 50, 0.1);
        }
        v[0].healthy = false;
        v[1].excluded = true;
        assert_eq!(pick(&p, &v, &prompt(10)).index, 2);
        v[2].max_inflight = Some(0);
        let r = p.select(&prompt(10), &Snapshot { backends: &v }, Instant::now());
        assert_eq!(r, Err(NoBackend));
    }
}
