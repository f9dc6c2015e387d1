//! Before the first byte: a route's first-token deadline (failover) and hedging — the file
//! structs, their validation with field paths, the typed model, and the pure arithmetic that
//! turns a decision's prediction into a delay.
//!
//! ```yaml
//! routes:
//!   - name: chat
//!     pool: llama
//!     # Absolute, or relative to the decision's predicted TTFT (k × predicted, at least floor).
//!     first_token_deadline: {factor: 3, floor: 250ms}     # or {after: 2s}
//!     hedge:
//!       quantile: 0.95          # or after: 300ms
//!       budget: 0.05            # at most 5 % of the route's requests are hedged
//!       max_predicted_ttft: 2s  # no hedge while the best backend is predicted slower
//! ```
//!
//! Both apply to streamed requests only, while nothing has reached the client (the gateway
//! holds the response until the first token). **Failover**: a backend that has not produced
//! its first token by the deadline gets the request also sent to the next-best backend (the
//! decision taken again without the late one); the first to produce a token is relayed, the
//! other is cancelled (its upstream connection closed, so the engine aborts it), and the late
//! one's TTFT model observes the time it was given — a lower bound of its real TTFT.
//! **Hedging**: the same race, started after `after` or at the `quantile` of the prediction's
//! error distribution, whether or not the backend is late — bounded by a token bucket
//! (each request earns `budget` hedges, at most [`HEDGE_BURST`] banked) and never while the
//! best predicted TTFT exceeds `max_predicted_ttft`, so hedges cannot amplify an overload.
//!
//! ## The quantile of a prediction
//! A backend's TTFT model reports its typical relative error `e` (`exp(EWMA |ln ratio|) − 1`,
//! [`pronto_core::predict::Quality`]). Taking `ln(actual / predicted)` as normal with mean 0,
//! its mean absolute deviation `ln(1 + e)` gives `σ = ln(1 + e) · √(π/2)`, and the `q`
//! quantile of the TTFT is `predicted · exp(σ · Φ⁻¹(q))`.

use std::time::Duration;

use serde::Deserialize;

use super::file::Quantity;
use super::validate::Checker;

/// Hedges a route may bank (the token bucket's capacity).
pub const HEDGE_BURST: f64 = 10.0;

/// `first_token_deadline:` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadlineFile {
    /// An absolute deadline, from sending the request.
    pub after: Option<Quantity>,
    /// The deadline is this many times the decision's predicted TTFT.
    pub factor: Option<f64>,
    /// With `factor`: never shorter than this (also the deadline without a prediction).
    pub floor: Option<Quantity>,
}

/// `hedge:` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeFile {
    /// Send the second copy this long after the first.
    pub after: Option<Quantity>,
    /// Send it at this quantile (0–1) of the first backend's predicted TTFT.
    pub quantile: Option<f64>,
    /// Hedged requests at most, as a fraction of the route's requests.
    pub budget: Option<f64>,
    /// No hedge while the best predicted TTFT is above this.
    pub max_predicted_ttft: Option<Quantity>,
}

/// When a backend is late.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FirstTokenDeadline {
    /// This long after the request was sent.
    After(Duration),
    /// `factor ×` the decision's predicted TTFT, at least `floor`.
    Predicted {
        /// Multiple of the prediction (>= 1).
        factor: f64,
        /// The shortest deadline, and the deadline of a decision without a prediction.
        floor: Duration,
    },
}

impl FirstTokenDeadline {
    /// The deadline of a decision that predicted `predicted_s` (if it predicted).
    pub fn resolve(&self, predicted_s: Option<f64>) -> Duration {
        match *self {
            FirstTokenDeadline::After(d) => d,
            FirstTokenDeadline::Predicted { factor, floor } => predicted_s
                .filter(|p| p.is_finite() && *p > 0.0)
                .and_then(|p| Duration::try_from_secs_f64(p * factor).ok())
                .map_or(floor, |d| d.max(floor)),
        }
    }
}

/// When the second copy goes out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeDelay {
    /// This long after the first.
    After(Duration),
    /// At this quantile (0–1) of the first backend's predicted TTFT.
    Quantile(f64),
}

/// A route's hedging.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hedge {
    /// When the second copy goes out.
    pub delay: HedgeDelay,
    /// Hedged requests at most, as a fraction of the route's requests (0–1].
    pub budget: f64,
    /// No hedge while the best predicted TTFT is above this.
    pub max_predicted_ttft: Option<Duration>,
}

impl Hedge {
    /// The hedge delay for a decision that predicted `predicted_s` on a backend whose model's
    /// typical relative error is `rel_error`; `None`: no hedge (the fleet is saturated, or a
    /// quantile is asked of a decision without a prediction).
    pub fn delay(&self, predicted_s: Option<f64>, rel_error: Option<f64>) -> Option<Duration> {
        let predicted = predicted_s.filter(|p| p.is_finite() && *p >= 0.0);
        if let (Some(bound), Some(p)) = (self.max_predicted_ttft, predicted) {
            if p > bound.as_secs_f64() {
                return None;
            }
        }
        match self.delay {
            HedgeDelay::After(d) => Some(d),
            HedgeDelay::Quantile(q) => {
                let sigma =
                    rel_error.unwrap_or(0.0).max(0.0).ln_1p() * (std::f64::consts::PI / 2.0).sqrt();
                Duration::try_from_secs_f64(predicted? * (sigma * normal_quantile(q)).exp()).ok()
            }
        }
    }
}

/// Φ⁻¹(q) for 0 < q < 1 (Acklam's rational approximation, relative error < 1.2e-9).
pub fn normal_quantile(q: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let q = q.clamp(1e-12, 1.0 - 1e-12);
    let tail = |p: f64| {
        let t = (-2.0 * p.ln()).sqrt();
        (((((C[0] * t + C[1]) * t + C[2]) * t + C[3]) * t + C[4]) * t + C[5])
            / ((((D[0] * t + D[1]) * t + D[2]) * t + D[3]) * t + 1.0)
    };
    if q < 0.024_25 {
        tail(q)
    } else if q > 1.0 - 0.024_25 {
        -tail(1.0 - q)
    } else {
        let u = q - 0.5;
        let r = u * u;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * u
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

// === validation ===

impl Checker {
    /// `{path}.first_token_deadline`; `None` when absent or invalid (errors recorded).
    pub(super) fn first_token_deadline(
        &mut self,
        path: &str,
        f: Option<&DeadlineFile>,
    ) -> Option<FirstTokenDeadline> {
        let f = f?;
        let path = format!("{path}.first_token_deadline");
        match (&f.after, f.factor) {
            (Some(after), None) => {
                if f.floor.is_some() {
                    self.error(
                        format!("{path}.floor"),
                        "only applies with `factor`; an absolute `after` needs no floor",
                    );
                    return None;
                }
                let d = self.duration(Some(after), &format!("{path}.after"), Duration::ZERO);
                (!d.is_zero()).then_some(FirstTokenDeadline::After(d))
            }
            (None, Some(factor)) => {
                if !(factor.is_finite() && factor >= 1.0) {
                    self.error(
                        format!("{path}.factor"),
                        format!(
                            "must be a number >= 1 (a deadline before the predicted first \
                             token fails over on time), got {factor}"
                        ),
                    );
                    return None;
                }
                let floor = match &f.floor {
                    None => DEFAULT_DEADLINE_FLOOR,
                    Some(q) => self.duration(Some(q), &format!("{path}.floor"), Duration::ZERO),
                };
                (!floor.is_zero()).then_some(FirstTokenDeadline::Predicted { factor, floor })
            }
            (Some(_), Some(_)) => {
                self.error(
                    path,
                    "set either `after` (absolute) or `factor` (× the predicted TTFT), not both",
                );
                None
            }
            (None, None) => {
                self.error(
                    path,
                    "needs `after` (absolute) or `factor` (× the predicted TTFT, with `floor`)",
                );
                None
            }
        }
    }

    /// `{path}.hedge`; `None` when absent or invalid (errors recorded).
    pub(super) fn hedge(&mut self, path: &str, f: Option<&HedgeFile>) -> Option<Hedge> {
        let f = f?;
        let path = format!("{path}.hedge");
        let before = self.error_count();
        let delay = match (&f.after, f.quantile) {
            (Some(after), None) => {
                let d = self.duration(Some(after), &format!("{path}.after"), Duration::ZERO);
                HedgeDelay::After(d)
            }
            (None, Some(q)) if q > 0.0 && q < 1.0 => HedgeDelay::Quantile(q),
            (None, Some(q)) => {
                self.error(
                    format!("{path}.quantile"),
                    format!("must be between 0 and 1 (exclusive), got {q}"),
                );
                HedgeDelay::Quantile(0.5)
            }
            (Some(_), Some(_)) => {
                self.error(
                    &path,
                    "set either `after` (a delay) or `quantile` (of the predicted TTFT), not both",
                );
                HedgeDelay::Quantile(0.5)
            }
            (None, None) => {
                self.error(
                    &path,
                    "needs `after` (a delay) or `quantile` (of the predicted TTFT)",
                );
                HedgeDelay::Quantile(0.5)
            }
        };
        let budget = f.budget.unwrap_or(DEFAULT_HEDGE_BUDGET);
        if !(budget > 0.0 && budget <= 1.0) {
            self.error(
                format!("{path}.budget"),
                format!("must be a fraction of requests in (0, 1], got {budget}"),
            );
        }
        let max_predicted_ttft = f.max_predicted_ttft.as_ref().map(|q| {
            self.duration(
                Some(q),
                &format!("{path}.max_predicted_ttft"),
                Duration::from_secs(1),
            )
        });
        (self.error_count() == before).then_some(Hedge {
            delay,
            budget,
            max_predicted_ttft,
        })
    }
}

/// `first_token_deadline.floor` when a `factor` is given without one.
pub const DEFAULT_DEADLINE_FLOOR: Duration = Duration::from_millis(250);
/// `hedge.budget` when absent: at most 5 % of a route's requests are hedged.
pub const DEFAULT_HEDGE_BUDGET: f64 = 0.05;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_resolve_from_the_prediction() {
        let abs = FirstTokenDeadline::After(Duration::from_secs(2));
        assert_eq!(abs.resolve(Some(0.1)), Duration::from_secs(2));
        assert_eq!(abs.resolve(None), Duration::from_secs(2));
        let rel = FirstTokenDeadline::Predicted {
            factor: 3.0,
            floor: Duration::from_millis(250),
        };
        assert_eq!(rel.resolve(Some(1.0)), Duration::from_secs(3));
        assert_eq!(rel.resolve(Some(0.01)), Duration::from_millis(250));
        assert_eq!(rel.resolve(None), Duration::from_millis(250));
        assert_eq!(rel.resolve(Some(f64::NAN)), Duration::from_millis(250));
        assert_eq!(rel.resolve(Some(f64::INFINITY)), Duration::from_millis(250));
    }

    #[test]
    fn normal_quantiles() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-5);
        assert!((normal_quantile(0.01) + 2.326_348).abs() < 1e-5);
        assert!(normal_quantile(0.9) > normal_quantile(0.8));
    }

    #[test]
    fn hedge_delays_follow_the_prediction_and_stop_at_saturation() {
        let h = Hedge {
            delay: HedgeDelay::Quantile(0.95),
            budget: 0.05,
            max_predicted_ttft: Some(Duration::from_secs(2)),
        };
        // A perfect model: the quantile is the prediction.
        assert_eq!(
            h.delay(Some(0.5), Some(0.0)),
            Some(Duration::from_millis(500))
        );
        // A noisier model waits longer; a higher quantile waits longer.
        let noisy = h.delay(Some(0.5), Some(0.3)).unwrap();
        assert!(noisy > Duration::from_millis(500));
        let q99 = Hedge {
            delay: HedgeDelay::Quantile(0.99),
            ..h
        };
        assert!(q99.delay(Some(0.5), Some(0.3)).unwrap() > noisy);
        // Saturated: the best backend is predicted past the bound.
        assert_eq!(h.delay(Some(2.5), Some(0.1)), None);
        // No prediction, no quantile; a fixed delay needs none.
        assert_eq!(h.delay(None, None), None);
        let fixed = Hedge {
            delay: HedgeDelay::After(Duration::from_millis(300)),
            ..h
        };
        assert_eq!(fixed.delay(None, None), Some(Duration::from_millis(300)));
        assert_eq!(fixed.delay(Some(3.0), None), None);
    }
}
