//! Per-backend TTFT prediction, learned online from the TTFTs the gateway observes.
//!
//! ## The model
//! A request's time to first token on a backend is dominated by the prefill work queued ahead
//! of it, its own uncached prefill, a fixed overhead, and interference from the batch of
//! running decodes (DESIGN §3.4):
//!
//! ```text
//! ttft ≈ base + (queued_prefill_tokens + uncached_tokens) · s_per_token
//!             + (uncached_tokens² + Σ queued_i²) · s_per_token_sq
//!             + running_decodes · s_per_decode + engine_waiting · s_per_waiting
//! ```
//!
//! The squared term is prefill attention, which grows with the square of the prompt: without
//! it a linear fit over prompts of 100 and 50,000 tokens inflates the intercept and predicts
//! short prompts several times too slow.
//!
//! `queued_prefill_tokens` is the router's own count of uncached prompt tokens sent to the
//! backend that have not produced a first token (exact and immediate, so a burst cannot herd);
//! `engine_waiting` is the engine's scraped queue length (traffic from elsewhere), 0 when the
//! scrape is stale. The four coefficients are learned per backend, so an H100 and an A100 get
//! their own prefill rate with no hand-tuning.
//!
//! ## Learning
//! Recursive least squares on a mix of absolute and relative error (each row weighted by
//! `1 / √ttft`), with
//! exponential forgetting: each observation `(x, ttft)` updates
//! the coefficient vector `θ` and its covariance `P`; older evidence decays with a time constant
//! (`λ = exp(−Δt/τ)` between observations, bounded below), so a backend that slows down is
//! re-learned within a minute. Predictions use `θ` projected onto `≥ 0` (no negative costs;
//! the unconstrained estimate is kept so RLS stays consistent),
//! and `P`'s trace is capped to prevent wind-up during quiet periods. Cold start: `θ` starts at
//! a prior (from config or a generic 8B-class GPU) with a weak covariance, so the first few
//! observations dominate it.
//!
//! ## Quality
//! Each estimator keeps an EWMA of the log-ratio error `|ln((pred + 10 ms) / (actual + 10 ms))|`
//! of its predictions *before* the update (honest, out-of-sample), reported as the typical
//! relative error `exp(ewma) − 1` (0.5 = typically off by a factor 1.5). Log ratios treat a
//! 20 ms TTFT predicted as 40 ms like a 2 s one predicted as 4 s. A policy treats a backend with
//! few samples as cold (to be explored) and one with a large error as poorly predicted (fall
//! back to load balancing).

mod reasoning;
mod shared;
mod tpot;

pub use reasoning::{ReasoningEffort, ReasoningLengths};
pub use shared::TtftModel;
pub use tpot::{TpotCoefficients, TpotModel};

use std::time::Instant;

/// Number of model features.
const N: usize = 5;
/// Token counts enter the model in thousands (keeps the RLS well-conditioned).
const TOKEN_SCALE: f64 = 1e-3;
/// Forgetting time constant, seconds.
const TAU_S: f64 = 60.0;
/// Least forgetting factor applied by a single observation.
const MIN_LAMBDA: f64 = 0.9;
/// Cap on trace(P).
const MAX_TRACE: f64 = 1e4;
/// Added to both sides of the log-ratio error, so sub-10 ms TTFTs are not over-weighted.
const ERR_FLOOR_S: f64 = 0.01;
/// Each observation's row is weighted by `(ttft + WEIGHT_FLOOR_S)^-WEIGHT_EXPONENT` (see
/// `observe`); chosen on the Mooncake conversation trace (0.5: p99 −6 % against 1.0).
const WEIGHT_EXPONENT: f64 = 0.5;
/// Floor of the TTFT that weights an observation (see `observe`).
const WEIGHT_FLOOR_S: f64 = 0.02;
/// EWMA weight of the newest relative error.
const ERR_ALPHA: f64 = 0.1;

/// What a prediction is made from, known at dispatch time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TtftInputs {
    /// Uncached prompt tokens sent to the backend, not yet past their first token.
    pub queued_prefill_tokens: f64,
    /// Σ over those queued prefills of (uncached tokens / 1000)²: their attention work.
    pub queued_prefill_sq: f64,
    /// This request's prompt tokens not expected in the backend's prefix cache.
    pub uncached_tokens: f64,
    /// Requests on the backend past their first token, still decoding.
    pub running_decodes: f64,
    /// The engine's own waiting queue (scraped), 0 when unknown or stale.
    pub engine_waiting: f64,
}

impl TtftInputs {
    fn features(&self) -> [f64; N] {
        let u = self.uncached_tokens * TOKEN_SCALE;
        [
            1.0,
            (self.queued_prefill_tokens + self.uncached_tokens) * TOKEN_SCALE,
            u * u + self.queued_prefill_sq,
            self.running_decodes,
            self.engine_waiting,
        ]
    }
}

/// The learned coefficients of one backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coefficients {
    /// Fixed overhead, seconds.
    pub base_s: f64,
    /// Seconds per prefill token (1 / prefill rate).
    pub s_per_token: f64,
    /// Seconds per squared uncached prompt token (prefill attention).
    pub s_per_token_sq: f64,
    /// Seconds added per running decode.
    pub s_per_decode: f64,
    /// Seconds added per request in the engine's waiting queue.
    pub s_per_waiting: f64,
}

impl Default for Coefficients {
    /// A generic prior: an 8B-class model on one datacenter GPU (≈20 ms overhead, ≈20k prefill
    /// tokens/s plus 0.5 s of attention at 32k tokens, 1 ms per running decode, 50 ms per
    /// queued engine request).
    fn default() -> Self {
        Coefficients {
            base_s: 0.02,
            s_per_token: 5e-5,
            s_per_token_sq: 5e-10,
            s_per_decode: 0.001,
            s_per_waiting: 0.05,
        }
    }
}

impl Coefficients {
    fn to_theta(self) -> [f64; N] {
        [
            self.base_s,
            self.s_per_token / TOKEN_SCALE,
            self.s_per_token_sq / (TOKEN_SCALE * TOKEN_SCALE),
            self.s_per_decode,
            self.s_per_waiting,
        ]
    }

    fn from_theta(t: &[f64; N]) -> Coefficients {
        Coefficients {
            base_s: t[0],
            s_per_token: t[1] * TOKEN_SCALE,
            s_per_token_sq: t[2] * TOKEN_SCALE * TOKEN_SCALE,
            s_per_decode: t[3],
            s_per_waiting: t[4],
        }
    }

    /// Predicted TTFT in seconds (finite, ≥ 0).
    #[inline]
    pub(crate) fn predict(&self, x: &TtftInputs) -> f64 {
        let t = self.to_theta();
        let f = x.features();
        let p: f64 = t.iter().zip(f.iter()).map(|(a, b)| a * b).sum();
        if p.is_finite() {
            p.max(0.0)
        } else {
            f64::MAX
        }
    }
}

/// How trustworthy a backend's predictions are.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Quality {
    /// Observations learned from.
    pub samples: u32,
    /// Typical out-of-sample relative error: `exp(EWMA |ln ratio|) − 1`, over the predictions
    /// made after the first observation (the first measures the prior); 0 until then.
    pub rel_error: f64,
}

/// An online TTFT estimator for one backend.
#[derive(Debug, Clone)]
pub(crate) struct TtftEstimator {
    theta: [f64; N],
    p: [[f64; N]; N],
    last: Option<Instant>,
    log_error: f64,
    quality: Quality,
}

impl TtftEstimator {
    /// An estimator starting at `prior`; `prior_variance` sets how quickly data overrides it
    /// (larger = faster).
    pub(crate) fn new(prior: Coefficients, prior_variance: f64) -> TtftEstimator {
        let mut p = [[0.0; N]; N];
        for (i, row) in p.iter_mut().enumerate() {
            row[i] = prior_variance;
        }
        TtftEstimator {
            theta: prior.to_theta(),
            p,
            last: None,
            log_error: 0.0,
            quality: Quality::default(),
        }
    }

    /// Current coefficients, projected onto `≥ 0` (the unconstrained estimate keeps learning;
    /// predictions never reward a longer queue).
    pub(crate) fn coefficients(&self) -> Coefficients {
        Coefficients::from_theta(&self.theta.map(|t| t.max(0.0)))
    }

    /// Current quality.
    pub(crate) fn quality(&self) -> Quality {
        self.quality
    }

    /// Learn from one observed TTFT (seconds) for a request dispatched with inputs `x`.
    /// Returns the prediction made before the update (for the residual metric).
    pub(crate) fn observe(&mut self, x: &TtftInputs, actual_s: f64, now: Instant) -> f64 {
        let predicted = self.coefficients().predict(x);
        if !actual_s.is_finite() || actual_s < 0.0 {
            return predicted;
        }
        // The first prediction is the prior's, made before any observation: its error says
        // how far the prior was, not how well the model predicts, and is not counted. (A GPU
        // prior in front of a CPU engine is ~25× off: counted, it kept the real fleet's models
        // "poorly predicted", so routed by the fallback, for ~15 observations each after they
        // had learnt.) Then a running mean until 1 / ERR_ALPHA errors are in, an EWMA after.
        // Errors already scored: one per observation but the first.
        let scored = self.quality.samples;
        if scored > 0 {
            let e = ((predicted + ERR_FLOOR_S) / (actual_s + ERR_FLOOR_S))
                .ln()
                .abs();
            let a = ERR_ALPHA.max(1.0 / f64::from(scored));
            self.log_error = (1.0 - a) * self.log_error + a * e;
            self.quality.rel_error = self.log_error.exp() - 1.0;
        }
        self.quality.samples = self.quality.samples.saturating_add(1);

        let lambda = match self.last {
            Some(prev) => (-(now.saturating_duration_since(prev).as_secs_f64()) / TAU_S)
                .exp()
                .max(MIN_LAMBDA),
            None => 1.0,
        };
        self.last = Some(now);
        // Weighted least squares between absolute and relative error: scale the row by
        // 1 / √actual, so the many 20 ms TTFTs do not drown the few long prefills the tail is
        // made of (exponent 1 fits short prompts and under-predicts long ones; 0 the reverse).
        let w = (actual_s + WEIGHT_FLOOR_S).powf(-WEIGHT_EXPONENT);
        let f = x.features().map(|v| v * w);
        let y = actual_s * w;
        // k = P f / (λ + fᵀ P f)
        let mut pf = [0.0; N];
        for (i, out) in pf.iter_mut().enumerate() {
            *out = (0..N).map(|j| self.p[i][j] * f[j]).sum();
        }
        let denom = lambda + (0..N).map(|i| f[i] * pf[i]).sum::<f64>();
        if !denom.is_finite() || denom <= 0.0 {
            return predicted;
        }
        let err = y - (0..N).map(|i| self.theta[i] * f[i]).sum::<f64>();
        for (t, k) in self.theta.iter_mut().zip(pf) {
            *t += k / denom * err;
        }
        // P = (P − k fᵀ P) / λ
        let mut trace = 0.0;
        for i in 0..N {
            for j in 0..N {
                self.p[i][j] = (self.p[i][j] - pf[i] * pf[j] / denom) / lambda;
            }
            trace += self.p[i][i];
        }
        if trace > MAX_TRACE {
            let s = MAX_TRACE / trace;
            self.p.iter_mut().flatten().for_each(|v| *v *= s);
        }
        predicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::time::Duration;

    fn truth(c: &Coefficients, x: &TtftInputs) -> f64 {
        c.predict(x)
    }

    fn random_inputs(rng: &mut rand::rngs::SmallRng) -> TtftInputs {
        let queued: f64 = rng.gen_range(0.0..20_000.0);
        TtftInputs {
            queued_prefill_tokens: queued,
            // As if the queue were one or two prefills.
            queued_prefill_sq: (queued / 1000.0).powi(2) / rng.gen_range(1.0..2.0),
            uncached_tokens: rng.gen_range(50.0..8_000.0),
            running_decodes: rng.gen_range(0.0..64.0),
            engine_waiting: rng.gen_range(0.0..4.0),
        }
    }

    #[test]
    fn converges_to_heterogeneous_truths_from_one_prior() {
        let h100 = Coefficients {
            base_s: 0.03,
            s_per_token: 1.0 / 40_000.0,
            s_per_token_sq: 4e-10,
            s_per_decode: 0.0008,
            s_per_waiting: 0.02,
        };
        let a100 = Coefficients {
            base_s: 0.06,
            s_per_token: 1.0 / 14_000.0,
            s_per_token_sq: 1.2e-9,
            s_per_decode: 0.0015,
            s_per_waiting: 0.04,
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let t0 = Instant::now();
        let held_out: Vec<TtftInputs> = (0..200).map(|_| random_inputs(&mut rng)).collect();
        let mut learned = Vec::new();
        for truth_c in [h100, a100] {
            let mut est = TtftEstimator::new(Coefficients::default(), 1.0);
            for i in 0..400 {
                let x = random_inputs(&mut rng);
                let noise = 1.0 + rng.gen_range(-0.05..0.05);
                est.observe(
                    &x,
                    truth(&truth_c, &x) * noise,
                    t0 + Duration::from_millis(50 * i),
                );
            }
            let c = est.coefficients();
            let worst = held_out
                .iter()
                .map(|x| (c.predict(x) - truth(&truth_c, x)).abs() / truth(&truth_c, x))
                .fold(0.0, f64::max);
            assert!(worst < 0.15, "held-out error {worst}: {c:?} vs {truth_c:?}");
            assert!(est.quality().rel_error < 0.15, "{:?}", est.quality());
            assert_eq!(est.quality().samples, 400);
            learned.push(c);
        }
        // The A100's model predicts slower than the H100's for every input.
        for x in &held_out {
            assert!(learned[1].predict(x) > learned[0].predict(x));
        }
    }

    /// A prior far from the engine (a GPU prior before a CPU engine, ~25× too fast) is not
    /// held against the model once it has learnt: its error is within the policies'
    /// `poor_error` (1.0) a few observations after the first.
    #[test]
    fn a_wrong_prior_is_forgiven_once_the_model_has_learnt() {
        let cpu = Coefficients {
            base_s: 0.25,
            s_per_token: 1.0 / 550.0,
            s_per_token_sq: 0.0,
            s_per_decode: 0.02,
            s_per_waiting: 0.3,
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let t0 = Instant::now();
        let mut est = TtftEstimator::new(Coefficients::default(), 1.0);
        let mut first = None;
        for i in 0..6 {
            let x = TtftInputs {
                uncached_tokens: rng.gen_range(100.0..1_500.0),
                running_decodes: rng.gen_range(0.0..3.0),
                ..TtftInputs::default()
            };
            let actual = truth(&cpu, &x) * (1.0 + rng.gen_range(-0.1..0.1));
            let predicted = est.observe(&x, actual, t0 + Duration::from_millis(500 * i));
            first.get_or_insert(actual / predicted);
        }
        let first = first.unwrap();
        assert!(
            first > 10.0,
            "the prior is far off: actual/predicted {first}"
        );
        let q = est.quality();
        assert_eq!(q.samples, 6);
        assert!(q.rel_error < 1.0, "{q:?}");
    }

    #[test]
    fn relearns_after_a_slowdown() {
        let fast = Coefficients {
            base_s: 0.03,
            s_per_token: 2e-5,
            s_per_token_sq: 3e-10,
            s_per_decode: 0.001,
            s_per_waiting: 0.0,
        };
        let slow = Coefficients {
            s_per_token: 8e-5,
            ..fast
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut est = TtftEstimator::new(Coefficients::default(), 1.0);
        let t0 = Instant::now();
        let mut t = t0;
        for _ in 0..300 {
            let x = random_inputs(&mut rng);
            est.observe(&x, fast.predict(&x), t);
            t += Duration::from_millis(100);
        }
        let probe: Vec<TtftInputs> = (0..100).map(|_| random_inputs(&mut rng)).collect();
        let err = |c: &Coefficients, truth_c: &Coefficients| {
            probe
                .iter()
                .map(|x| (c.predict(x) - truth_c.predict(x)).abs() / truth_c.predict(x))
                .fold(0.0, f64::max)
        };
        let e_fast = err(&est.coefficients(), &fast);
        assert!(e_fast < 0.15, "{e_fast} {:?}", est.coefficients());
        for _ in 0..300 {
            let x = random_inputs(&mut rng);
            est.observe(&x, slow.predict(&x), t);
            t += Duration::from_millis(500);
        }
        // Re-learned towards the slower backend: well past the old rate.
        let probe_x = TtftInputs {
            uncached_tokens: 4000.0,
            ..TtftInputs::default()
        };
        let after = est.coefficients().predict(&probe_x);
        assert!(
            after > 1.5 * fast.predict(&probe_x),
            "{:?}",
            est.coefficients()
        );
    }

    #[test]
    fn predictions_are_finite_and_non_negative_and_monotonic_in_queue() {
        let est = TtftEstimator::new(Coefficients::default(), 1.0);
        let c = est.coefficients();
        let mut last = -1.0;
        for q in [0.0, 10.0, 1e3, 1e6, 1e12] {
            let p = c.predict(&TtftInputs {
                queued_prefill_tokens: q,
                ..TtftInputs::default()
            });
            assert!(p.is_finite() && p >= 0.0);
            assert!(p >= last);
            last = p;
        }
    }

    #[test]
    fn garbage_observations_do_not_poison_the_model() {
        let mut est = TtftEstimator::new(Coefficients::default(), 1.0);
        let before = est.coefficients();
        let x = TtftInputs::default();
        est.observe(&x, f64::NAN, Instant::now());
        est.observe(&x, -1.0, Instant::now());
        assert_eq!(est.coefficients(), before);
        assert_eq!(est.quality().samples, 0);
    }
}
