//! Racing two backends before the first token: the pure arithmetic of a first-token deadline
//! (failover) and of bounded hedging, shared by the gateway (a route's `first_token_deadline`
//! and `hedge`, `pronto::config::race`) and the offline evaluator (`pronto evaluate
//! --first-token-deadline / --hedge`).
//!
//! - `FirstTokenDeadline::resolve`: when a backend is late — an absolute delay, or `factor ×`
//!   the decision's predicted TTFT, at least `floor` (the floor also without a prediction).
//! - [`Hedge::delay`]: when a second copy goes out — a fixed delay, or the `quantile` of the
//!   prediction's error distribution; never while the best predicted TTFT exceeds
//!   `max_predicted_ttft` (a saturated fleet), so hedges cannot amplify an overload.
//! - [`HedgeBucket`]: the hedge budget, a token bucket — each request earns `budget` hedges,
//!   at most [`HEDGE_BURST`] are banked, the bucket starts with one, a hedge spends one.
//! - [`plan`]: what a first attempt's race plan is, from the decision's prediction.
//! - [`FirstTokenDeadline::from_parts`] / [`Hedge::from_parts`]: the one validation of both
//!   settings, on parsed values; callers add their field path to [`FieldError::field`].
//!
//! ## The quantile of a prediction
//! A backend's TTFT model reports its typical relative error `e` (`exp(EWMA |ln ratio|) − 1`,
//! [`crate::predict::Quality`]). Taking `ln(actual / predicted)` as normal with mean 0, its
//! mean absolute deviation `ln(1 + e)` gives `σ = ln(1 + e) · √(π/2)`, and the `q` quantile of
//! the TTFT is `predicted · exp(σ · Φ⁻¹(q))`.
//!
//! - [`Race`]: the sequencing of one race — when the second copy goes out and
//!   what the loser does — as a state machine both the gateway and the evaluator drive.
//!
//! Nothing here reads a clock or takes a lock: the caller owns time and shared state.

use std::time::Duration;

mod machine;
pub use machine::{Action, Race, Side, Trigger};

/// Hedges a route may bank (the token bucket's capacity).
pub const HEDGE_BURST: f64 = 10.0;
/// `first_token_deadline.floor` when a `factor` is given without one.
pub const DEFAULT_DEADLINE_FLOOR: Duration = Duration::from_millis(250);
/// `hedge.budget` when absent: at most 5 % of a route's requests are hedged.
pub const DEFAULT_HEDGE_BUDGET: f64 = 0.05;

/// What a race waits for (a route's `race_on:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RaceOn {
    /// A copy wins at its first token.
    #[default]
    Ttft,
    /// A copy wins at its first answer token; the reasoning before it is held.
    Ttfa,
}

impl RaceOn {
    /// The prediction a race plan scales ([`plan`]): the decision's TTFT, or with
    /// [`RaceOn::Ttfa`] and reasoning expected, the predicted TTFA — that TTFT plus
    /// `reasoning_tokens` at the chosen backend's predicted TPOT (`None`, so a deadline's
    /// floor, while that TPOT is not predicted).
    pub fn prediction(
        self,
        ttft_s: Option<f64>,
        tpot_s: Option<f64>,
        reasoning_tokens: f64,
    ) -> Option<f64> {
        match self {
            RaceOn::Ttfa if reasoning_tokens > 0.0 => ttft_s
                .zip(tpot_s)
                .map(|(p, tpot)| p + reasoning_tokens * tpot),
            _ => ttft_s,
        }
    }
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

/// Why a failover fired: which kind of deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineKind {
    /// An absolute [`FirstTokenDeadline::After`].
    Absolute,
    /// A [`FirstTokenDeadline::Predicted`] (`factor ×` the prediction, or the floor).
    Relative,
}

/// A setting that does not validate: the field (relative to the setting; `""` for the
/// setting itself) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `after`, `factor`, `floor`, `quantile`, `budget`, or `""`.
    pub field: &'static str,
    /// Why, for a human.
    pub message: String,
}

impl FieldError {
    fn new(field: &'static str, message: impl Into<String>) -> FieldError {
        FieldError {
            field,
            message: message.into(),
        }
    }

    /// `path.field: message` (or `path: message` for the setting itself).
    #[cfg(test)]
    pub(crate) fn at(&self, path: &str) -> String {
        if self.field.is_empty() {
            format!("{path}: {}", self.message)
        } else {
            format!("{path}.{}: {}", self.field, self.message)
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

fn positive(field: &'static str, d: Option<Duration>) -> Result<Option<Duration>, FieldError> {
    match d {
        Some(d) if d.is_zero() => Err(FieldError::new(field, "must be greater than zero")),
        d => Ok(d),
    }
}

impl FirstTokenDeadline {
    /// The deadline written as `{after}` or `{factor, floor}` (durations already parsed):
    /// exactly one of `after` and `factor`, `factor >= 1`, `floor` only with `factor`
    /// ([`DEFAULT_DEADLINE_FLOOR`] without), durations above zero.
    pub fn from_parts(
        after: Option<Duration>,
        factor: Option<f64>,
        floor: Option<Duration>,
    ) -> Result<FirstTokenDeadline, FieldError> {
        let after = positive("after", after)?;
        let floor = positive("floor", floor)?;
        match (after, factor) {
            (Some(_), None) if floor.is_some() => Err(FieldError::new(
                "floor",
                "only applies with `factor`; an absolute `after` needs no floor",
            )),
            (Some(d), None) => Ok(FirstTokenDeadline::After(d)),
            (None, Some(factor)) if !(factor.is_finite() && factor >= 1.0) => Err(FieldError::new(
                "factor",
                format!(
                    "must be a number >= 1 (a deadline before the predicted first token \
                         fails over on time), got {factor}"
                ),
            )),
            (None, Some(factor)) => Ok(FirstTokenDeadline::Predicted {
                factor,
                floor: floor.unwrap_or(DEFAULT_DEADLINE_FLOOR),
            }),
            (Some(_), Some(_)) => Err(FieldError::new(
                "",
                "set either `after` (absolute) or `factor` (× the predicted TTFT), not both",
            )),
            (None, None) => Err(FieldError::new(
                "",
                "needs `after` (absolute) or `factor` (× the predicted TTFT, with `floor`)",
            )),
        }
    }

    /// The deadline of a decision that predicted `predicted_s` (if it predicted).
    pub(crate) fn resolve(&self, predicted_s: Option<f64>) -> Duration {
        match *self {
            FirstTokenDeadline::After(d) => d,
            FirstTokenDeadline::Predicted { factor, floor } => predicted_s
                .filter(|p| p.is_finite() && *p > 0.0)
                .and_then(|p| Duration::try_from_secs_f64(p * factor).ok())
                .map_or(floor, |d| d.max(floor)),
        }
    }

    /// Which kind of deadline this is.
    pub(crate) fn kind(&self) -> DeadlineKind {
        match self {
            FirstTokenDeadline::After(_) => DeadlineKind::Absolute,
            FirstTokenDeadline::Predicted { .. } => DeadlineKind::Relative,
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
    /// The hedging written as `{after | quantile, budget, max_predicted_ttft}` (durations
    /// already parsed): exactly one of `after` and `quantile`, `0 < quantile < 1`,
    /// `0 < budget <= 1` ([`DEFAULT_HEDGE_BUDGET`] when absent), durations above zero. Every
    /// error found, in field order.
    pub fn from_parts(
        after: Option<Duration>,
        quantile: Option<f64>,
        budget: Option<f64>,
        max_predicted_ttft: Option<Duration>,
    ) -> Result<Hedge, Vec<FieldError>> {
        let mut errors = Vec::new();
        let delay = match (positive("after", after), quantile) {
            (Err(e), _) => {
                errors.push(e);
                None
            }
            (Ok(Some(d)), None) => Some(HedgeDelay::After(d)),
            (Ok(None), Some(q)) if q > 0.0 && q < 1.0 => Some(HedgeDelay::Quantile(q)),
            (Ok(None), Some(q)) => {
                errors.push(FieldError::new(
                    "quantile",
                    format!("must be between 0 and 1 (exclusive), got {q}"),
                ));
                None
            }
            (Ok(Some(_)), Some(_)) => {
                errors.push(FieldError::new(
                    "",
                    "set either `after` (a delay) or `quantile` (of the predicted TTFT), not both",
                ));
                None
            }
            (Ok(None), None) => {
                errors.push(FieldError::new(
                    "",
                    "needs `after` (a delay) or `quantile` (of the predicted TTFT)",
                ));
                None
            }
        };
        let budget = budget.unwrap_or(DEFAULT_HEDGE_BUDGET);
        if !(budget > 0.0 && budget <= 1.0) {
            errors.push(FieldError::new(
                "budget",
                format!("must be a fraction of requests in (0, 1], got {budget}"),
            ));
        }
        let max_predicted_ttft = positive("max_predicted_ttft", max_predicted_ttft)
            .map_err(|e| errors.push(e))
            .ok()
            .flatten();
        match delay {
            Some(delay) if errors.is_empty() => Ok(Hedge {
                delay,
                budget,
                max_predicted_ttft,
            }),
            _ => Err(errors),
        }
    }

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

/// One route's hedge credit (a token bucket): each request earns `budget`, at most
/// [`HEDGE_BURST`] are banked, a hedge spends one. A new bucket holds one hedge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgeBucket {
    /// Hedges banked.
    pub credit: f64,
}

impl Default for HedgeBucket {
    fn default() -> Self {
        HedgeBucket { credit: 1.0 }
    }
}

impl HedgeBucket {
    /// A request arrived on a route that hedges with `budget`.
    pub fn earn(&mut self, budget: f64) {
        self.credit = (self.credit + budget).min(HEDGE_BURST);
    }

    /// Spend one hedge, if one is banked.
    pub fn take(&mut self) -> bool {
        if self.credit >= 1.0 {
            self.credit -= 1.0;
            true
        } else {
            false
        }
    }
}

/// When a first attempt gets company, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// The hedge delay, when hedging and the fleet is not saturated.
    pub hedge: Option<Duration>,
    /// The first-token deadline, when there is one, and its kind.
    pub deadline: Option<(Duration, DeadlineKind)>,
}

/// The race plan of a streamed request whose first decision predicted `predicted_s` on a
/// backend whose model's typical relative error is `rel_error`, under `deadline` and `hedge`;
/// `None` when there is nothing to race (no deadline, and no hedge delay).
pub fn plan(
    deadline: Option<&FirstTokenDeadline>,
    hedge: Option<&Hedge>,
    predicted_s: Option<f64>,
    rel_error: Option<f64>,
) -> Option<Plan> {
    let plan = Plan {
        hedge: hedge.and_then(|h| h.delay(predicted_s, rel_error)),
        deadline: deadline.map(|d| (d.resolve(predicted_s), d.kind())),
    };
    (plan.hedge.is_some() || plan.deadline.is_some()).then_some(plan)
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn deadlines_resolve_from_the_prediction() {
        let abs = FirstTokenDeadline::After(Duration::from_secs(2));
        assert_eq!(abs.resolve(Some(0.1)), Duration::from_secs(2));
        assert_eq!(abs.resolve(None), Duration::from_secs(2));
        let rel = FirstTokenDeadline::Predicted {
            factor: 3.0,
            floor: MS(250),
        };
        assert_eq!(rel.resolve(Some(1.0)), Duration::from_secs(3));
        assert_eq!(rel.resolve(Some(0.01)), MS(250));
        assert_eq!(rel.resolve(None), MS(250));
        assert_eq!(rel.resolve(Some(f64::NAN)), MS(250));
        assert_eq!(rel.resolve(Some(f64::INFINITY)), MS(250));
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
        assert_eq!(h.delay(Some(0.5), Some(0.0)), Some(MS(500)));
        // A noisier model waits longer; a higher quantile waits longer.
        let noisy = h.delay(Some(0.5), Some(0.3)).unwrap();
        assert!(noisy > MS(500));
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
            delay: HedgeDelay::After(MS(300)),
            ..h
        };
        assert_eq!(fixed.delay(None, None), Some(MS(300)));
        assert_eq!(fixed.delay(Some(3.0), None), None);
    }

    #[test]
    fn the_hedge_budget_is_a_token_bucket() {
        let mut b = HedgeBucket::default();
        // A new bucket holds one hedge.
        b.earn(0.1);
        assert!(b.take());
        assert!(!b.take());
        // Ten requests at 10 % earn one more.
        for _ in 0..10 {
            b.earn(0.1);
        }
        assert!(b.take());
        assert!(!b.take());
        // Credit is capped: a quiet route cannot bank a burst beyond HEDGE_BURST.
        for _ in 0..1000 {
            b.earn(1.0);
        }
        let burst = (0..100).filter(|_| b.take()).count();
        assert_eq!(burst, HEDGE_BURST as usize);
    }

    #[test]
    fn a_plan_needs_a_deadline_or_a_hedge_delay() {
        let rel = FirstTokenDeadline::Predicted {
            factor: 3.0,
            floor: MS(100),
        };
        assert_eq!(plan(None, None, Some(0.2), None), None);
        let p = plan(Some(&rel), None, Some(0.2), None).unwrap();
        assert_eq!(p.hedge, None);
        let (d, kind) = p.deadline.unwrap();
        assert!((d.as_secs_f64() - 0.6).abs() < 1e-9, "{d:?}");
        assert_eq!(kind, DeadlineKind::Relative);
        // Without a prediction, the floor.
        let p = plan(Some(&rel), None, None, None).unwrap();
        assert_eq!(p.deadline.unwrap().0, MS(100));
        // A saturated fleet gets no hedge (and a race with only a hedge, no plan).
        let h = Hedge {
            delay: HedgeDelay::After(MS(50)),
            budget: 0.05,
            max_predicted_ttft: Some(Duration::from_secs(1)),
        };
        let p = plan(None, Some(&h), Some(0.2), None).unwrap();
        assert_eq!((p.hedge, p.deadline), (Some(MS(50)), None));
        assert_eq!(plan(None, Some(&h), Some(1.5), None), None);
        let abs = FirstTokenDeadline::After(Duration::from_secs(2));
        let p = plan(Some(&abs), Some(&h), Some(1.5), None).unwrap();
        assert_eq!(
            (p.hedge, p.deadline),
            (None, Some((Duration::from_secs(2), DeadlineKind::Absolute)))
        );
    }

    #[test]
    fn settings_validate_once_with_the_field_named() {
        let s = Some(Duration::from_secs(1));
        assert_eq!(
            FirstTokenDeadline::from_parts(None, Some(2.0), None),
            Ok(FirstTokenDeadline::Predicted {
                factor: 2.0,
                floor: DEFAULT_DEADLINE_FLOOR
            })
        );
        assert_eq!(
            FirstTokenDeadline::from_parts(s, None, None),
            Ok(FirstTokenDeadline::After(Duration::from_secs(1)))
        );
        for (after, factor, floor, field, msg) in [
            (None, None, None, "", "needs `after`"),
            (s, Some(2.0), None, "", "set either"),
            (None, Some(0.5), None, "factor", "must be a number >= 1"),
            (
                None,
                Some(f64::NAN),
                None,
                "factor",
                "must be a number >= 1",
            ),
            (s, None, s, "floor", "only applies"),
            (
                Some(Duration::ZERO),
                None,
                None,
                "after",
                "greater than zero",
            ),
            (
                None,
                Some(2.0),
                Some(Duration::ZERO),
                "floor",
                "greater than zero",
            ),
        ] {
            let e = FirstTokenDeadline::from_parts(after, factor, floor).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(msg), "{e}");
        }
        assert_eq!(
            FieldError::new("floor", "x").at("routes[0].first_token_deadline"),
            "routes[0].first_token_deadline.floor: x"
        );
        assert_eq!(FieldError::new("", "x").at("d"), "d: x");
        let h = Hedge::from_parts(None, Some(0.9), Some(0.1), Some(Duration::from_secs(2)));
        assert_eq!(
            h,
            Ok(Hedge {
                delay: HedgeDelay::Quantile(0.9),
                budget: 0.1,
                max_predicted_ttft: Some(Duration::from_secs(2)),
            })
        );
        assert_eq!(Hedge::from_parts(s, None, None, None).unwrap().budget, 0.05);
        let fields = |r: Result<Hedge, Vec<FieldError>>| -> Vec<&'static str> {
            r.unwrap_err().iter().map(|e| e.field).collect()
        };
        assert_eq!(fields(Hedge::from_parts(None, None, None, None)), [""]);
        assert_eq!(fields(Hedge::from_parts(s, Some(0.9), None, None)), [""]);
        assert_eq!(
            fields(Hedge::from_parts(None, Some(1.5), Some(0.0), None)),
            ["quantile", "budget"]
        );
        assert_eq!(
            fields(Hedge::from_parts(s, None, None, Some(Duration::ZERO))),
            ["max_predicted_ttft"]
        );
    }
}
