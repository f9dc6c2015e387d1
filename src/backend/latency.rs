//! Measured latency of one backend's streams: time to first token, time per output token and
//! end-to-end time, as EWMAs (lock-free, for anything that wants a cheap current estimate) and
//! sliding-window quantiles (for operators: `GET /admin/backends`).
//!
//! The gateway measures these itself on the streams it proxies (DESIGN §3.2): TTFT from the
//! moment the request was sent upstream to the first generated token, TPOT as the time from
//! the first to the last token over the tokens in between, E2E from send to the end of the
//! stream. An EWMA (weight [`EWMA_ALPHA`]) lives in one atomic per signal, updated by
//! compare-and-swap. The window keeps the last [`WINDOW`] of samples younger than
//! [`WINDOW_AGE`] in a ring under a mutex that is taken once per *finished* request and by
//! admin reads — never on the routing decision — and quantiles are computed on read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// EWMA weight of the newest sample.
pub const EWMA_ALPHA: f64 = 0.1;
/// Samples kept for quantiles at most.
pub const WINDOW: usize = 1024;
/// Samples older than this leave the window.
pub const WINDOW_AGE: Duration = Duration::from_secs(60);

/// One finished request's measurements, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Send → first generated token (streams only).
    pub ttft_s: Option<f64>,
    /// The routing decision's predicted TTFT, for a request with a measured `ttft_s`.
    pub predicted_ttft_s: Option<f64>,
    /// Mean seconds between output tokens after the first (streams with ≥ 2 tokens).
    pub tpot_s: Option<f64>,
    /// Send → end of the response.
    pub e2e_s: f64,
}

/// An f64 EWMA in one atomic; NaN until the first sample.
#[derive(Debug)]
struct AtomicEwma(AtomicU64);

impl AtomicEwma {
    fn new() -> Self {
        AtomicEwma(AtomicU64::new(f64::NAN.to_bits()))
    }

    fn observe(&self, x: f64) {
        if !x.is_finite() {
            return;
        }
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let cur = f64::from_bits(bits);
                let next = if cur.is_nan() {
                    x
                } else {
                    cur + EWMA_ALPHA * (x - cur)
                };
                Some(next.to_bits())
            });
    }

    fn get(&self) -> Option<f64> {
        Some(f64::from_bits(self.0.load(Ordering::Relaxed))).filter(|v| !v.is_nan())
    }
}

/// Mean, p50 / p90 / p99 of one signal over the window.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Quantiles {
    /// Samples in the window.
    pub n: usize,
    /// Mean, seconds.
    pub mean_s: f64,
    /// Median, seconds.
    pub p50_s: f64,
    /// 90th percentile, seconds.
    pub p90_s: f64,
    /// 99th percentile, seconds.
    pub p99_s: f64,
}

fn quantiles(mut v: Vec<f64>) -> Option<Quantiles> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    Some(Quantiles {
        n: v.len(),
        mean_s: v.iter().sum::<f64>() / v.len() as f64,
        p50_s: q(0.5),
        p90_s: q(0.9),
        p99_s: q(0.99),
    })
}

/// A backend's latency statistics.
#[derive(Debug)]
pub struct LatencyStats {
    ttft: AtomicEwma,
    tpot: AtomicEwma,
    e2e: AtomicEwma,
    window: Mutex<VecDeque<(Instant, Sample)>>,
}

impl Default for LatencyStats {
    fn default() -> Self {
        LatencyStats {
            ttft: AtomicEwma::new(),
            tpot: AtomicEwma::new(),
            e2e: AtomicEwma::new(),
            window: Mutex::new(VecDeque::with_capacity(64)),
        }
    }
}

impl LatencyStats {
    /// Record a request that finished at `now`.
    pub fn record(&self, s: Sample, now: Instant) {
        if let Some(t) = s.ttft_s {
            self.ttft.observe(t);
        }
        if let Some(t) = s.tpot_s {
            self.tpot.observe(t);
        }
        self.e2e.observe(s.e2e_s);
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() == WINDOW {
            w.pop_front();
        }
        w.push_back((now, s));
    }

    /// EWMAs of (TTFT, TPOT, E2E), seconds; `None` before a sample.
    pub fn ewma(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        (self.ttft.get(), self.tpot.get(), self.e2e.get())
    }

    /// Quantiles of (TTFT, TPOT, E2E) over the samples of the last [`WINDOW_AGE`] at `now`.
    pub fn window(&self, now: Instant) -> [Option<Quantiles>; 3] {
        self.window_with_predictions(now).0
    }

    /// [`LatencyStats::window`], and the mean predicted and measured TTFT over the same
    /// samples (those with both), seconds.
    pub fn window_with_predictions(
        &self,
        now: Instant,
    ) -> ([Option<Quantiles>; 3], Option<(f64, f64)>) {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        while w
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > WINDOW_AGE)
        {
            w.pop_front();
        }
        let ttft = w.iter().filter_map(|(_, s)| s.ttft_s).collect();
        let tpot = w.iter().filter_map(|(_, s)| s.tpot_s).collect();
        let e2e = w.iter().map(|(_, s)| s.e2e_s).collect();
        let (mut n, mut predicted, mut actual) = (0usize, 0.0, 0.0);
        for (_, s) in w.iter() {
            if let (Some(p), Some(a)) = (s.predicted_ttft_s, s.ttft_s) {
                n += 1;
                predicted += p;
                actual += a;
            }
        }
        drop(w);
        let pair = (n > 0).then(|| (predicted / n as f64, actual / n as f64));
        ([quantiles(ttft), quantiles(tpot), quantiles(e2e)], pair)
    }

    /// JSON for `GET /admin/backends`. `window_60s` holds the TTFT quantiles and mean, and
    /// `predicted_vs_actual` the mean predicted and measured TTFT of the window's requests
    /// that carried a prediction: every number over the same samples of the last minute.
    pub fn admin_json(&self, now: Instant) -> serde_json::Value {
        let (ttft, tpot, e2e) = self.ewma();
        let ([qt, qp, qe], pva) = self.window_with_predictions(now);
        let pva =
            pva.map(|(p, a)| serde_json::json!({ "predicted_mean_s": p, "actual_mean_s": a }));
        serde_json::json!({
            "ewma": { "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e },
            "window_60s": { "ttft": qt, "tpot": qp, "e2e": qe, "predicted_vs_actual": pva },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft: f64, tpot: Option<f64>, e2e: f64) -> Sample {
        Sample {
            ttft_s: Some(ttft),
            predicted_ttft_s: None,
            tpot_s: tpot,
            e2e_s: e2e,
        }
    }

    #[test]
    fn ewma_starts_at_the_first_sample_and_moves_toward_new_ones() {
        let s = LatencyStats::default();
        assert_eq!(s.ewma(), (None, None, None));
        let t0 = Instant::now();
        s.record(sample(1.0, None, 2.0), t0);
        assert_eq!(s.ewma(), (Some(1.0), None, Some(2.0)));
        s.record(sample(2.0, Some(0.02), 3.0), t0);
        let (ttft, tpot, _) = s.ewma();
        assert!((ttft.unwrap() - 1.1).abs() < 1e-12);
        assert_eq!(tpot, Some(0.02));
    }

    #[test]
    fn window_quantiles_drop_old_samples_and_are_bounded() {
        let s = LatencyStats::default();
        let t0 = Instant::now();
        for i in 1..=100 {
            s.record(sample(f64::from(i) / 100.0, None, 1.0), t0);
        }
        let [q, p, e] = s.window(t0);
        let q = q.unwrap();
        assert_eq!(q.n, 100);
        assert!((q.p50_s - 0.5).abs() <= 0.011 && (q.p99_s - 0.99).abs() <= 0.011);
        assert_eq!(p, None, "no TPOT samples");
        assert_eq!(e.unwrap().n, 100);
        // A minute later only the newer sample is left.
        s.record(sample(5.0, None, 6.0), t0 + Duration::from_secs(30));
        let [q, _, _] = s.window(t0 + Duration::from_secs(61));
        assert_eq!(q.unwrap().n, 1);
        assert_eq!(q.unwrap().mean_s, 5.0);
        for _ in 0..2 * WINDOW {
            s.record(sample(1.0, None, 1.0), t0 + Duration::from_secs(61));
        }
        assert_eq!(s.window(t0 + Duration::from_secs(61))[0].unwrap().n, WINDOW);
    }

    #[test]
    fn predicted_and_actual_means_are_over_the_windows_samples() {
        let s = LatencyStats::default();
        let t0 = Instant::now();
        let with = |ttft: f64, predicted: f64| Sample {
            predicted_ttft_s: Some(predicted),
            ..sample(ttft, None, 1.0)
        };
        s.record(with(9.0, 1.0), t0);
        s.record(with(0.2, 0.1), t0 + Duration::from_secs(30));
        s.record(with(0.4, 0.3), t0 + Duration::from_secs(31));
        s.record(sample(0.6, None, 1.0), t0 + Duration::from_secs(31));
        // At 61 s the first sample has left: the means are of the two later predictions,
        // the quantiles of the three later TTFTs.
        let ([q, _, _], pva) = s.window_with_predictions(t0 + Duration::from_secs(61));
        let (p, a) = pva.unwrap();
        assert!(
            (p - 0.2).abs() < 1e-12 && (a - 0.3).abs() < 1e-12,
            "{p} {a}"
        );
        assert_eq!(q.unwrap().n, 3);
        let json = s.admin_json(t0 + Duration::from_secs(61));
        assert!(json["window_60s"]["predicted_vs_actual"]["predicted_mean_s"].is_number());
        assert!(json["window_60s"]["ttft"]["mean_s"].is_number());
        let ([q, _, _], pva) = s.window_with_predictions(t0 + Duration::from_secs(200));
        assert_eq!((q, pva), (None, None));
    }
}
