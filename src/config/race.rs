//! Before the first byte: a route's first-token deadline (failover) and hedging — the file
//! structs and their validation with field paths. The typed model, its one validation
//! ([`FirstTokenDeadline::from_parts`], [`Hedge::from_parts`]) and the pure arithmetic that
//! turns a decision's prediction into a delay live in [`pronto_core::race`] (re-exported
//! here), where the offline evaluator uses them too.
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
//! (each request earns `budget` hedges, at most [`HEDGE_BURST`](pronto_core::race::HEDGE_BURST) banked) and never while the
//! best predicted TTFT exceeds `max_predicted_ttft`, so hedges cannot amplify an overload.
//!
//! The quantile of a prediction: see [`pronto_core::race`].

use std::time::Duration;

use serde::Deserialize;

use super::duration::text_duration;
use super::validate::Checker;

use pronto_core::race::{FirstTokenDeadline, Hedge};

/// Streams: a backend without a first token by then also gets the request sent to the
/// next-best backend; the first to answer is relayed, the other cancelled. Either after, or
/// factor (with floor)
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadlineFile {
    /// Absolute deadline from sending the request
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::schema::DurationText>")]
    pub after: Option<Duration>,
    /// Deadline as this many times the decision's predicted TTFT
    #[schemars(range(min = 1))]
    pub factor: Option<f64>,
    /// With factor: the shortest deadline, and the deadline without a prediction
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::schema::DurationText>", extend("default" = "250ms"))]
    pub floor: Option<Duration>,
}

/// Streams: send a second copy to the next-best backend after a delay (after, or quantile of
/// the predicted TTFT); the first to answer is relayed, the other cancelled
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HedgeFile {
    /// Delay of the second copy
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::schema::DurationText>")]
    pub after: Option<Duration>,
    /// Delay as this quantile (0-1) of the first backend's predicted TTFT
    #[schemars(range(min = 0))]
    pub quantile: Option<f64>,
    /// Hedged requests at most, as a fraction of the route's requests (token bucket)
    #[schemars(range(min = 0), extend("default" = 0.05))]
    pub budget: Option<f64>,
    /// No hedge while the best predicted TTFT is above this (saturated fleet)
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::schema::DurationText>")]
    pub max_predicted_ttft: Option<Duration>,
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
        FirstTokenDeadline::from_parts(f.after, f.factor, f.floor)
            .map_err(|e| self.error(field_path(&path, e.field), e.message))
            .ok()
    }

    /// `{path}.hedge`; `None` when absent or invalid (errors recorded).
    pub(super) fn hedge(&mut self, path: &str, f: Option<&HedgeFile>) -> Option<Hedge> {
        let f = f?;
        let path = format!("{path}.hedge");
        match Hedge::from_parts(f.after, f.quantile, f.budget, f.max_predicted_ttft) {
            Ok(h) => Some(h),
            Err(errors) => {
                for e in errors {
                    self.error(field_path(&path, e.field), e.message);
                }
                None
            }
        }
    }
}

/// `path.field`, or `path` for the setting itself (`field` empty).
fn field_path(path: &str, field: &str) -> String {
    if field.is_empty() {
        path.to_string()
    } else {
        format!("{path}.{field}")
    }
}
