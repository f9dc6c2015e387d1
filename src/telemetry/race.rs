//! The first-token race families (`first_token_deadline` failover and `hedge`,
//! [`crate::config::race`]), registered with the others; each route with either gets its
//! series at zero.

use prometheus::IntCounterVec;

use super::{counter, Families};

/// Why a request was also sent to another backend (the `reason` label of
/// `pronto_failovers_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverReason {
    /// An absolute `first_token_deadline.after` passed.
    AbsoluteDeadline,
    /// `factor ×` the predicted TTFT (or the floor) passed.
    RelativeDeadline,
}

impl FailoverReason {
    /// Every label value.
    pub const LABELS: [&'static str; 2] = ["absolute_deadline", "relative_deadline"];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            FailoverReason::AbsoluteDeadline => "absolute_deadline",
            FailoverReason::RelativeDeadline => "relative_deadline",
        }
    }
}

/// Which race a copy belonged to (the `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaceKind {
    /// A first-token deadline failover.
    Failover,
    /// A hedge.
    Hedge,
}

impl RaceKind {
    /// Every label value.
    pub const LABELS: [&'static str; 2] = ["failover", "hedge"];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            RaceKind::Failover => "failover",
            RaceKind::Hedge => "hedge",
        }
    }
}

/// The race families.
#[derive(Debug, Clone)]
pub struct RaceMetrics {
    /// `pronto_failovers_total{route,reason}`: requests also sent to the next-best backend
    /// because the first missed its first-token deadline.
    pub failovers_total: IntCounterVec,
    /// `pronto_failovers_won_total{route}`: of those, the ones the second backend answered
    /// first.
    pub failovers_won_total: IntCounterVec,
    /// `pronto_hedges_sent_total{route}`: second copies sent by `hedge`.
    pub hedges_sent_total: IntCounterVec,
    /// `pronto_hedges_won_total{route}`: hedges whose copy answered first.
    pub hedges_won_total: IntCounterVec,
    /// `pronto_race_wasted_prompt_tokens_total{route,kind}`: prompt tokens sent to the copy
    /// that lost a race and was cancelled (prefill work thrown away).
    pub wasted_prompt_tokens_total: IntCounterVec,
}

impl RaceMetrics {
    pub(super) fn new(r: &Families) -> RaceMetrics {
        RaceMetrics {
            failovers_total: counter(
                r,
                "pronto_failovers_total",
                "Requests also sent to the next-best backend after missing the route's first_token_deadline, by reason",
                &["route", "reason"],
            ),
            failovers_won_total: counter(
                r,
                "pronto_failovers_won_total",
                "Failovers the second backend answered first",
                &["route"],
            ),
            hedges_sent_total: counter(
                r,
                "pronto_hedges_sent_total",
                "Second copies sent by the route's hedge",
                &["route"],
            ),
            hedges_won_total: counter(
                r,
                "pronto_hedges_won_total",
                "Hedges whose second copy answered first",
                &["route"],
            ),
            wasted_prompt_tokens_total: counter(
                r,
                "pronto_race_wasted_prompt_tokens_total",
                "Prompt tokens sent to the copy that lost a failover or hedge race and was cancelled",
                &["route", "kind"],
            ),
        }
    }

    /// The series of `route` at zero, when it races.
    pub fn publish_route(&self, route: &crate::config::Route) {
        let name = &*route.name;
        if route.first_token_deadline.is_some() {
            for reason in FailoverReason::LABELS {
                self.failovers_total.with_label_values(&[name, reason]);
            }
            self.failovers_won_total.with_label_values(&[name]);
            self.wasted_prompt_tokens_total
                .with_label_values(&[name, RaceKind::Failover.label()]);
        }
        if route.hedge.is_some() {
            self.hedges_sent_total.with_label_values(&[name]);
            self.hedges_won_total.with_label_values(&[name]);
            self.wasted_prompt_tokens_total
                .with_label_values(&[name, RaceKind::Hedge.label()]);
        }
    }
}
