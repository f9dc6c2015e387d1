//! Per-backend TPOT model: the time per output token a request will see, from the decode load
//! it joins, learned from the TPOTs the router observes when streams end.
//!
//! ```text
//! tpot ≈ base_s + s_per_seq · batch
//! ```
//! `batch` is the number of requests decoding together. An observation takes it from the
//! ledger when the stream ends (its running decodes, the request itself included: over a
//! stream's life the batch it shared is, on average, the one around it); a prediction for a
//! request about to be sent takes every request in flight plus this one (`inflight + 1`: those
//! still in prefill will be decoding beside it). A decode step's cost grows with the sequences
//! in it (each reads its KV cache), so this is the decode-load term the TTFT model lacks.
//!
//! Learning: weighted least squares over `(batch, tpot)` with exponential forgetting (each
//! earlier observation's weight × `exp(−Δt/τ)`, τ = 60 s, as the TTFT model), projected onto
//! non-negative coefficients. While the batches seen are too alike to tell a slope (variance
//! under 1), the fit keeps the mean and takes its shape from a prior: a decode step's cost
//! doubles at `PRIOR_DOUBLING_BATCH` sequences (`s_per_seq = base / 64`), which is what
//! memory-bound decode of 8B–70B models at 1–2k tokens of context costs on H100/A100-class GPUs
//! (the sim profiles' `decode_ms_per_seq + 2 · decode_ms_per_kctx` over `floor_ms`: 1/64 for
//! an H100 8B, 1/52 for an A100 8B, 1/90 for a 70B on 8 GPUs). So a lightly loaded backend
//! seen at batch 1–2 is predicted near its floor one or two requests later, not at twice its
//! TPOT — what an objective that compares backends (`ttfa`) needs — and one seen at a steady
//! batch is still charged for a larger one. A fitted slope flatter than the prior's is
//! replaced by the prior's shape through the same mean, so no backend's predicted TPOT ignores
//! the requests added to it (a flat model would draw every `ttfa` request until the
//! observations caught up, a stream's length later). No prediction before `MIN_SAMPLES`
//! observations.
//!
//! **Central and cautious.** That estimate is the *central* one, for comparing backends (the
//! `ttfa` objective). Checking an objective (`tpot_slo`) uses a *cautious* fit beside it:
//! proportional to the batch (`base 0`, `s_per_seq = mean tpot / mean batch`) where no slope
//! can be told, flat at the mean where the fitted slope is not positive, the fit itself
//! otherwise. It is pessimistic for batches larger than those seen, and a backend counts as
//! meeting a TPOT objective only when even it says so.

use std::sync::Mutex;
use std::time::Instant;

use crate::seq_cell::SeqCell;

/// Observations before a TPOT model predicts.
pub(crate) const MIN_SAMPLES: u32 = 3;
/// Forgetting time constant, seconds.
const TAU_S: f64 = 60.0;
/// Below this variance of the observed batches the slope comes from the prior (module docs).
const MIN_BATCH_VARIANCE: f64 = 1.0;
/// The prior's batch at which a decode step costs twice its empty-batch cost.
pub(crate) const PRIOR_DOUBLING_BATCH: f64 = 64.0;

/// Learned TPOT coefficients of one backend: the central estimate (`base_s`, `s_per_seq`,
/// what comparing backends needs) and the cautious one (`cautious_*`, what checking an
/// objective needs; see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TpotCoefficients {
    /// Seconds per token at an empty batch.
    pub base_s: f64,
    /// Seconds per token added by each sequence in the batch.
    pub s_per_seq: f64,
    /// Observations learned from.
    pub samples: u32,
    /// The cautious fit's seconds per token at an empty batch.
    pub cautious_base_s: f64,
    /// The cautious fit's seconds per token per sequence.
    pub cautious_s_per_seq: f64,
}

impl TpotCoefficients {
    /// Predicted seconds per output token in a batch of `batch` sequences.
    #[inline]
    pub(crate) fn predict(&self, batch: f64) -> f64 {
        self.base_s + self.s_per_seq * batch
    }

    /// The cautious fit's prediction for a batch of `batch` (module docs): what a
    /// `tpot_slo` is checked against.
    #[inline]
    pub(crate) fn predict_cautious(&self, batch: f64) -> f64 {
        self.cautious_base_s + self.cautious_s_per_seq * batch
    }
}

/// Decayed sums of a weighted least-squares fit of `tpot` on `batch`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TpotFit {
    s0: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    samples: u32,
    last_s: Option<f64>,
}

impl TpotFit {
    /// Learn a TPOT of `tpot_s` in a batch of `batch`, observed at `at_s` seconds (any epoch,
    /// non-decreasing). Non-finite or negative values are ignored.
    pub(crate) fn observe(&mut self, batch: f64, tpot_s: f64, at_s: f64) {
        if !(batch.is_finite() && tpot_s.is_finite() && batch >= 0.0 && tpot_s >= 0.0) {
            return;
        }
        let decay = self
            .last_s
            .map_or(1.0, |t| (-(at_s - t).max(0.0) / TAU_S).exp());
        self.s0 = self.s0 * decay + 1.0;
        self.sx = self.sx * decay + batch;
        self.sy = self.sy * decay + tpot_s;
        self.sxx = self.sxx * decay + batch * batch;
        self.sxy = self.sxy * decay + batch * tpot_s;
        self.samples = self.samples.saturating_add(1);
        self.last_s = Some(self.last_s.map_or(at_s, |t| t.max(at_s)));
    }

    /// The fit, once it has `MIN_SAMPLES` observations (see the module docs).
    pub(crate) fn coefficients(&self) -> Option<TpotCoefficients> {
        if self.samples < MIN_SAMPLES || self.s0 <= 0.0 {
            return None;
        }
        let (mx, my) = (self.sx / self.s0, self.sy / self.s0);
        let var = self.sxx / self.s0 - mx * mx;
        // The prior's shape through the mean: my = base · (1 + mx / PRIOR_DOUBLING_BATCH).
        let prior_base = my / (1.0 + mx / PRIOR_DOUBLING_BATCH);
        let prior = (prior_base, prior_base / PRIOR_DOUBLING_BATCH);
        let slope = (var >= MIN_BATCH_VARIANCE).then(|| (self.sxy / self.s0 - mx * my) / var);
        let through_origin = (0.0, self.sxy / self.sxx);
        let fitted = |slope: f64| (my - slope * mx, slope);
        let (base_s, s_per_seq) = match slope {
            None => prior,
            // Flatter than any decode step is (noise, or prefill interference falling as the
            // batch grew): a flat model would let one backend take everything.
            Some(b) if b < prior.1 => prior,
            Some(b) if my - b * mx < 0.0 => through_origin,
            Some(b) => fitted(b),
        };
        // The cautious fit: proportional to the batch where no slope can be told, flat at the
        // mean where the slope is not positive (module docs).
        let (cautious_base_s, cautious_s_per_seq) = match slope {
            None => (0.0, if mx > 0.0 { my / mx } else { 0.0 }),
            Some(b) if b <= 0.0 => (my, 0.0),
            Some(b) if my - b * mx < 0.0 => through_origin,
            Some(b) => fitted(b),
        };
        Some(TpotCoefficients {
            base_s,
            s_per_seq,
            samples: self.samples,
            cautious_base_s,
            cautious_s_per_seq,
        })
    }
}

/// One backend's TPOT model as shared state: learned under a small mutex when a stream ends
/// (off the decision path), published through a `SeqCell` for lock-free reads.
#[derive(Debug)]
pub struct TpotModel {
    fit: Mutex<TpotFit>,
    /// base_s, s_per_seq bits, samples (0: no prediction yet), the cautious pair's bits.
    published: SeqCell<5>,
    epoch: Instant,
}

impl TpotModel {
    /// A model with nothing learnt; times relative to `epoch`.
    pub(crate) fn new(epoch: Instant) -> TpotModel {
        TpotModel {
            fit: Mutex::new(TpotFit::default()),
            published: SeqCell::new([0; 5]),
            epoch,
        }
    }

    /// Learn a TPOT of `tpot_s` seen by a stream that ended at `now` in a batch of `batch`.
    pub fn observe(&self, batch: f64, tpot_s: f64, now: Instant) {
        let at = now.saturating_duration_since(self.epoch).as_secs_f64();
        let mut fit = self.fit.lock().unwrap_or_else(|p| p.into_inner());
        fit.observe(batch, tpot_s, at);
        if let Some(c) = fit.coefficients() {
            self.published.store([
                c.base_s.to_bits(),
                c.s_per_seq.to_bits(),
                u64::from(c.samples),
                c.cautious_base_s.to_bits(),
                c.cautious_s_per_seq.to_bits(),
            ]);
        }
    }

    /// The published coefficients, once the model predicts.
    #[inline]
    pub(crate) fn view(&self) -> Option<TpotCoefficients> {
        let w = self.published.load();
        (w[2] > 0).then(|| TpotCoefficients {
            base_s: f64::from_bits(w[0]),
            s_per_seq: f64::from_bits(w[1]),
            samples: w[2] as u32,
            cautious_base_s: f64::from_bits(w[3]),
            cautious_s_per_seq: f64::from_bits(w[4]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_the_decode_load_slope() {
        let mut f = TpotFit::default();
        for i in 0..40 {
            let batch = f64::from(1 + i % 20);
            f.observe(batch, 0.01 + 0.002 * batch, f64::from(i));
        }
        let c = f.coefficients().unwrap();
        assert!((c.base_s - 0.01).abs() < 1e-9, "{c:?}");
        assert!((c.s_per_seq - 0.002).abs() < 1e-9, "{c:?}");
        assert!((c.predict(30.0) - 0.07).abs() < 1e-9);
    }

    #[test]
    fn no_prediction_before_min_samples_and_alike_batches_take_the_priors_shape() {
        let mut f = TpotFit::default();
        f.observe(4.0, 0.02, 0.0);
        f.observe(4.0, 0.02, 1.0);
        assert_eq!(f.coefficients(), None);
        f.observe(4.0, 0.02, 2.0);
        let c = f.coefficients().unwrap();
        assert!(
            (c.predict(4.0) - 0.02).abs() < 1e-12,
            "the mean is kept: {c:?}"
        );
        assert!(
            (c.predict(64.0) / c.predict(0.0) - 2.0).abs() < 1e-12,
            "{c:?}"
        );
        assert!(c.predict(5.0) > 0.02 && c.predict(5.0) < 0.021, "{c:?}");
        // The cautious fit is proportional: twice the batch, twice the TPOT.
        assert_eq!(c.cautious_base_s, 0.0);
        assert!((c.predict_cautious(8.0) - 0.04).abs() < 1e-12, "{c:?}");
        f.observe(f64::NAN, 0.02, 3.0);
        f.observe(4.0, -1.0, 3.0);
        assert_eq!(f.coefficients().unwrap().samples, 3, "bad values ignored");
    }

    #[test]
    fn coefficients_never_go_negative_and_old_evidence_fades() {
        // TPOT falling with the batch (noise): the prior's shape through the mean.
        let mut f = TpotFit::default();
        for (b, t) in [(1.0, 0.05), (5.0, 0.04), (9.0, 0.03)] {
            f.observe(b, t, 0.0);
        }
        let c = f.coefficients().unwrap();
        assert!((c.predict(5.0) - 0.04).abs() < 1e-12, "{c:?}");
        assert!((c.s_per_seq * PRIOR_DOUBLING_BATCH - c.base_s).abs() < 1e-12);
        assert_eq!(c.cautious_s_per_seq, 0.0, "cautious: flat at the mean");
        assert!((c.cautious_base_s - 0.04).abs() < 1e-12);
        // Ten minutes later the backend is twice as slow: the new evidence dominates.
        for i in 0..20 {
            let b = f64::from(1 + i % 9);
            f.observe(b, 0.08, 600.0 + f64::from(i));
        }
        assert!((f.coefficients().unwrap().predict(5.0) - 0.08).abs() < 1e-3);
    }

    #[test]
    fn the_shared_model_publishes_once_it_predicts() {
        let t0 = Instant::now();
        let m = TpotModel::new(t0);
        m.observe(2.0, 0.02, t0);
        m.observe(2.0, 0.02, t0);
        assert_eq!(m.view(), None);
        m.observe(2.0, 0.02, t0);
        let v = m.view().unwrap();
        assert_eq!(v.samples, 3);
        assert!((v.predict(2.0) - 0.02).abs() < 1e-12);
        assert!(
            (v.predict_cautious(2.0) - 0.02).abs() < 1e-12,
            "published with the rest"
        );
    }
}
