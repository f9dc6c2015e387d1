//! What the proxy records of the requests it handles and the admin listener reads: the
//! requests in progress ([`ActiveRequests`], for the drain on shutdown and the status page) and
//! the last routing decisions ([`RecentDecisions`], `recent_decisions` in
//! `GET /admin/backends`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use pronto_core::routing::Reason;

/// Requests currently being handled, across all proxy threads.
#[derive(Debug, Default)]
pub struct ActiveRequests(AtomicUsize);

impl ActiveRequests {
    /// Count one request until the guard drops.
    pub fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(Arc::clone(self))
    }

    /// Requests in progress.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One request in progress.
#[derive(Debug)]
pub struct ActiveGuard(Arc<ActiveRequests>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Decisions kept for `GET /admin/backends`.
pub const RECENT_DECISIONS: usize = 100;

/// One request's routing decision and how it went.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentDecision {
    /// When the request ended.
    pub at: SystemTime,
    /// Its request id.
    pub request_id: String,
    /// The pool that served it.
    pub pool: Arc<str>,
    /// The backend of its last attempt.
    pub backend: Arc<str>,
    /// Why that backend.
    pub reason: Reason,
    /// The decision's predicted TTFT, seconds.
    pub predicted_ttft_s: Option<f64>,
    /// The measured TTFT (request sent to first token), seconds; streams only.
    pub actual_ttft_s: Option<f64>,
    /// The status the client got.
    pub status: u16,
}

/// The last [`RECENT_DECISIONS`] decisions over all pools (the proxy writes, the admin
/// listener reads; the lock is held for a push or a copy, never across an await).
#[derive(Debug, Default)]
pub struct RecentDecisions {
    ring: Mutex<VecDeque<RecentDecision>>,
}

impl RecentDecisions {
    /// Keep `d`, forgetting the oldest beyond [`RECENT_DECISIONS`].
    pub fn push(&self, d: RecentDecision) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == RECENT_DECISIONS {
            ring.pop_front();
        }
        ring.push_back(d);
    }

    /// The decisions as the status page reads them, newest first: `[{at_ms (Unix ms),
    /// request_id, pool, backend, reason, predicted_ttft_ms, actual_ttft_ms, status}]`
    /// (`null` where unknown).
    pub fn to_json(&self) -> serde_json::Value {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let list: Vec<serde_json::Value> = ring
            .iter()
            .rev()
            .map(|d| {
                let at_ms =
                    d.at.duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |t| t.as_millis() as u64);
                serde_json::json!({
                    "at_ms": at_ms,
                    "request_id": d.request_id,
                    "pool": &*d.pool,
                    "backend": &*d.backend,
                    "reason": d.reason.as_str(),
                    "predicted_ttft_ms": d.predicted_ttft_s.map(|s| round_ms(s * 1e3)),
                    "actual_ttft_ms": d.actual_ttft_s.map(|s| round_ms(s * 1e3)),
                    "status": d.status,
                })
            })
            .collect();
        serde_json::Value::Array(list)
    }
}

/// Milliseconds rounded to the microsecond (three decimals), as logs and JSON show them.
pub(crate) fn round_ms(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}
