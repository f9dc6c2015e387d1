//! Observations of one request: at its first token (once), at its first answer token (once:
//! the first content or tool call after any reasoning), and when its response ends.
//!
//! The first token is *the* observation (see [`pronto_core::state`]): the booking leaves
//! prefill, the backend's TTFT model learns from the inputs the request was routed on, and the
//! accuracy metrics score the decision's own prediction — the number in
//! `x-pronto-predicted-ttft-ms` and the one admission compared with the SLO.

use std::time::Instant;

use crate::backend::{latency, Backend, InflightGuard};
use crate::telemetry::Metrics;
use pronto_core::predict::TtftInputs;

use super::relay::RelayOutcome;

/// What is known at dispatch, to observe the request's first token with.
pub(super) struct FirstTokenObserver<'a> {
    pub metrics: &'a Metrics,
    /// The pool's model (label).
    pub pool: &'a str,
    /// The request's booking on its backend.
    pub guard: &'a mut InflightGuard,
    /// The inputs it was routed on.
    pub inputs: TtftInputs,
    /// The decision's prediction.
    pub predicted_s: Option<f64>,
    /// When the request was fully sent upstream.
    pub sent_at: Instant,
    /// When the client's request arrived.
    pub arrived: Instant,
}

impl FirstTokenObserver<'_> {
    /// The first generated token passed through at `at`.
    pub fn first_token(&mut self, at: Instant) {
        let actual = at.saturating_duration_since(self.sent_at).as_secs_f64();
        if self.guard.first_token(&self.inputs, actual, at).is_none() {
            return;
        }
        let backend = self.guard.backend().name();
        let m = self.metrics;
        m.ttft_seconds.with_label_values(&[backend]).observe(actual);
        if let Some(p) = self.predicted_s {
            m.ttft_prediction_error_seconds
                .with_label_values(&[backend])
                .observe(p - actual);
            m.ttft_prediction_abs_error_seconds
                .with_label_values(&[backend])
                .observe((p - actual).abs());
        }
        m.client_ttft_seconds
            .with_label_values(&[self.pool])
            .observe(at.saturating_duration_since(self.arrived).as_secs_f64());
    }

    /// Output passed through at `at`: the backend is producing ([`pronto_core::stall`]).
    pub fn progressed(&self, at: Instant) {
        self.guard.progressed(at);
    }

    /// The first answer token (content or a tool call, after any reasoning) passed through
    /// at `at`: the time to first answer, upstream and as the client saw it.
    pub fn first_answer(&mut self, at: Instant) {
        let backend = self.guard.backend().name();
        let m = self.metrics;
        m.ttfa_seconds
            .with_label_values(&[backend])
            .observe(at.saturating_duration_since(self.sent_at).as_secs_f64());
        m.client_ttfa_seconds
            .with_label_values(&[self.pool])
            .observe(at.saturating_duration_since(self.arrived).as_secs_f64());
    }
}

/// A complete response from `backend`, sent at `sent_at` with the decision's predicted TTFT:
/// its latency sample.
pub(super) fn completed(
    metrics: &Metrics,
    backend: &Backend,
    outcome: &RelayOutcome,
    sent_at: Instant,
    predicted_ttft_s: Option<f64>,
) {
    let done = Instant::now();
    let ttft_s = outcome
        .first_token_at
        .map(|t| t.saturating_duration_since(sent_at).as_secs_f64());
    let sample = latency::Sample {
        ttft_s,
        predicted_ttft_s: ttft_s.and(predicted_ttft_s),
        tpot_s: match (outcome.first_token_at, outcome.last_token_at) {
            (Some(a), Some(b)) if outcome.output_events >= 2 => {
                Some((b - a).as_secs_f64() / f64::from(outcome.output_events - 1))
            }
            _ => None,
        },
        e2e_s: done.saturating_duration_since(sent_at).as_secs_f64(),
    };
    backend.latency.record(sample, done);
    if let Some(t) = sample.tpot_s {
        // The TPOT model learns it, against the decode batch the ledger counts now.
        backend.state.observe_tpot(t, done);
        metrics
            .tpot_seconds
            .with_label_values(&[backend.name()])
            .observe(t);
    }
    metrics
        .e2e_seconds
        .with_label_values(&[backend.name()])
        .observe(sample.e2e_s);
}
