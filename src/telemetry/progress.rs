//! The families of the two guards against silence before the first token
//! ([`crate::config::progress`]): progress-based exclusion of a wedged backend, and SSE
//! keep-alives to clients waiting for a first token.

use prometheus::{IntCounterVec, IntGaugeVec};

use super::{counter, gauge, Families};

/// The progress families.
#[derive(Debug, Clone)]
pub struct ProgressMetrics {
    /// `pronto_backend_stalled{backend}`: 1 while the backend is marked stalled (streams in
    /// flight, no token for longer than its bound; out of routing for new requests).
    pub backend_stalled: IntGaugeVec,
    /// `pronto_backend_stall_exclusions_total{backend}`: times it was marked stalled.
    pub stall_exclusions_total: IntCounterVec,
    /// `pronto_keepalives_sent_total{route}`: SSE comment keep-alives sent to clients waiting
    /// for a first token.
    pub keepalives_sent_total: IntCounterVec,
    /// `pronto_keepalive_errors_total{route}`: streams that had sent keep-alives (so a 200
    /// head) and then failed before a first token: the client got an SSE error event.
    pub keepalive_errors_total: IntCounterVec,
}

impl ProgressMetrics {
    pub(super) fn new(r: &Families) -> ProgressMetrics {
        ProgressMetrics {
            backend_stalled: gauge(
                r,
                "pronto_backend_stalled",
                "1 while the backend holds streams and produced no token for longer than its stall bound (no new requests until it produces)",
                &["backend"],
            ),
            stall_exclusions_total: counter(
                r,
                "pronto_backend_stall_exclusions_total",
                "Times the backend was taken out of routing for making no progress",
                &["backend"],
            ),
            keepalives_sent_total: counter(
                r,
                "pronto_keepalives_sent_total",
                "SSE comment keep-alives sent to clients waiting for a first token",
                &["route"],
            ),
            keepalive_errors_total: counter(
                r,
                "pronto_keepalive_errors_total",
                "Streams that had sent keep-alives and then failed before a first token (the client got an SSE error event)",
                &["route"],
            ),
        }
    }

    /// `backend`'s series at zero.
    pub fn register_backend(&self, backend: &str) {
        self.backend_stalled.with_label_values(&[backend]);
        self.stall_exclusions_total.with_label_values(&[backend]);
    }

    /// The series of `route` at zero, when it sends keep-alives.
    pub fn publish_route(&self, route: &crate::config::Route) {
        if route.keepalive.is_some() {
            self.keepalives_sent_total.with_label_values(&[&route.name]);
            self.keepalive_errors_total
                .with_label_values(&[&route.name]);
        }
    }
}
