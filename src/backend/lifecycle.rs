//! Backend lifecycle in the log: one line per transition, never one per probe.
//!
//! Three background loops watch each backend and proxying ejects it passively. Each watcher
//! keeps the previous state of what it watches and logs only when that state changes:
//!
//! | watcher | transitions (level) |
//! | --- | --- |
//! | active health check ([`HealthTracker`]) | `backend down` (warn, with the [`CheckFailure`]), `backend up` (info), `backend ejected` (warn, with the passive failure count), `backend re-admitted` (info) |
//! | engine scraper ([`Condition`]) | `engine metrics scrape failing` (warn, with the error), `engine metrics scrape recovered` (info) |
//! | KV-event subscriber ([`KvLink`]) | `KV events connected` (info, the first time), `KV events lost` / `KV events connect failing` (warn, with the reason), `KV events resumed` (info) |
//! | progress ([`StallChange`], [`pronto_core::stall`]) | `backend stalled: no token on any stream` (warn, with its silence and bound), `backend producing again` (info) |
//!
//! While a condition persists, a repeat is logged at most once per [`REPEAT_EVERY`] (30 s)
//! with the number of failures since the first and how many were not logged since the last
//! line ([`Change::StillFailing`]).
//!
//! Everything here is pure: every method takes `now`, nothing reads a clock, so the rules are
//! unit-tested on synthetic instants. The loops call the trackers and log what they return
//! ([`HealthChange::log`], [`Change`] through the loops' own wording).

use std::time::{Duration, Instant};

/// Shortest time between two log lines about one persisting failure.
pub const REPEAT_EVERY: Duration = Duration::from_secs(30);

// === Condition ===

/// A watched condition that is either fine or failing.
#[derive(Debug, Clone, Default)]
pub struct Condition {
    /// Failures in a row (0: fine).
    failures: u64,
    /// When the last line about the current failure was logged.
    last_logged: Option<Instant>,
    /// Failures since then that were not logged.
    suppressed: u64,
}

/// What one observation of a [`Condition`] is worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The first failure after a success (or ever): a transition.
    Failing,
    /// Still failing, and the last line is at least [`REPEAT_EVERY`] old: `failures` in a row
    /// so far, `suppressed` of them not logged since the last line.
    StillFailing {
        /// Failures in a row, this one included.
        failures: u64,
        /// Failures not logged since the previous line.
        suppressed: u64,
    },
    /// The first success after `failures` failures in a row: a transition.
    Recovered {
        /// How many failed in a row.
        failures: u64,
    },
}

impl Condition {
    /// A failure observed at `now`; `None` when it is a repeat not worth a line yet.
    pub fn fail(&mut self, now: Instant) -> Option<Change> {
        self.failures += 1;
        if self.failures == 1 {
            self.last_logged = Some(now);
            self.suppressed = 0;
            return Some(Change::Failing);
        }
        let due = self
            .last_logged
            .is_none_or(|t| now.saturating_duration_since(t) >= REPEAT_EVERY);
        if !due {
            self.suppressed += 1;
            return None;
        }
        let change = Change::StillFailing {
            failures: self.failures,
            suppressed: self.suppressed,
        };
        self.last_logged = Some(now);
        self.suppressed = 0;
        Some(change)
    }

    /// A success; `Some(Recovered)` when it ends a failure.
    pub fn ok(&mut self) -> Option<Change> {
        let failures = std::mem::take(&mut self.failures);
        self.last_logged = None;
        self.suppressed = 0;
        (failures > 0).then_some(Change::Recovered { failures })
    }

    /// Whether the last observation was a failure.
    pub fn is_failing(&self) -> bool {
        self.failures > 0
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

// === Health ===

pub use crate::telemetry::CheckFailure;

impl CheckFailure {
    /// Classify a failed probe's `reqwest` error.
    pub fn from_reqwest(e: &reqwest::Error) -> CheckFailure {
        if e.is_timeout() {
            return CheckFailure::Timeout;
        }
        if e.is_connect() {
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                if let Some(io) = s.downcast_ref::<std::io::Error>() {
                    if io.kind() == std::io::ErrorKind::ConnectionRefused {
                        return CheckFailure::Refused;
                    }
                }
                source = s.source();
            }
            return CheckFailure::Connect;
        }
        match e.status() {
            Some(s) => CheckFailure::Status(s.as_u16()),
            None => CheckFailure::Io,
        }
    }
}

/// A backend's routing eligibility as its active checks and passive ejection leave it: the
/// previous state, so that only transitions are logged.
#[derive(Debug, Clone, Default)]
pub struct HealthTracker {
    active: Condition,
    /// The last failed check's reason (meaningful while `active` is failing).
    reason: Option<CheckFailure>,
    /// Ejected and not re-admitted yet.
    ejected: bool,
}

/// A health transition worth a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// The active check started failing.
    Down(CheckFailure),
    /// The active check still fails (a rate-limited repeat, see [`Change::StillFailing`]).
    StillDown {
        /// The latest failure's reason.
        reason: CheckFailure,
        /// Failed checks in a row.
        failures: u64,
        /// Failed checks not logged since the previous line.
        suppressed: u64,
    },
    /// The active check passes again after `failures` failed checks.
    Up {
        /// Failed checks in a row before this pass.
        failures: u64,
    },
    /// Passively ejected after `failures` consecutive request failures.
    Ejected {
        /// Consecutive failed requests.
        failures: u32,
    },
    /// The ejection is over and the active check passes: routed to again.
    Readmitted,
}

impl HealthTracker {
    /// An active check at `now` came to `result`; `still_ejected`: whether the passive
    /// ejection holds at `now`.
    pub fn on_check(
        &mut self,
        result: Result<(), CheckFailure>,
        still_ejected: bool,
        now: Instant,
    ) -> Option<HealthChange> {
        match result {
            Err(reason) => {
                self.reason = Some(reason);
                if !still_ejected {
                    // Re-admission waits for a passing check; the next `Up` says so.
                    self.ejected = false;
                }
                match self.active.fail(now)? {
                    Change::Failing => Some(HealthChange::Down(reason)),
                    Change::StillFailing {
                        failures,
                        suppressed,
                    } => Some(HealthChange::StillDown {
                        reason,
                        failures,
                        suppressed,
                    }),
                    Change::Recovered { .. } => None,
                }
            }
            Ok(()) => {
                let recovered = self.active.ok();
                self.reason = None;
                let readmitted = self.ejected && !still_ejected;
                if readmitted {
                    self.ejected = false;
                }
                match recovered {
                    Some(Change::Recovered { failures }) => Some(HealthChange::Up { failures }),
                    _ if readmitted => Some(HealthChange::Readmitted),
                    _ => None,
                }
            }
        }
    }

    /// Proxying ejected the backend after `failures` consecutive failed requests.
    pub fn on_ejected(&mut self, failures: u32) -> HealthChange {
        self.ejected = true;
        HealthChange::Ejected { failures }
    }

    /// Whether the last active check failed.
    pub fn is_down(&self) -> bool {
        self.active.is_failing()
    }
}

impl HealthChange {
    /// One log line for `backend`.
    pub fn log(self, backend: &str) {
        match self {
            HealthChange::Down(reason) => {
                tracing::warn!(backend, %reason, "backend down: active health check failing")
            }
            HealthChange::StillDown {
                reason,
                failures,
                suppressed,
            } => tracing::warn!(
                backend,
                %reason,
                failures,
                suppressed,
                "backend still down"
            ),
            HealthChange::Up { failures } => {
                tracing::info!(backend, failures, "backend up: active health check passing")
            }
            HealthChange::Ejected { failures } => tracing::warn!(
                backend,
                failures,
                "backend ejected after consecutive request failures"
            ),
            HealthChange::Readmitted => tracing::info!(backend, "backend re-admitted"),
        }
    }
}

// === KV-event link ===

/// A backend's KV-event connection: the previous state of its subscriber, so that only
/// transitions are logged.
#[derive(Debug, Clone, Default)]
pub struct KvLink {
    /// Connected at least once.
    ever_connected: bool,
    /// Lost, or never made, and not (re)connected since.
    down: Condition,
}

/// A KV-event connection transition worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvChange {
    /// Connected for the first time.
    Connected,
    /// The connection dropped (the exact index is suspended).
    Lost(String),
    /// Connecting fails (first failure since the last connection or ever).
    ConnectFailing(String),
    /// Still not connected (a rate-limited repeat): `failures` connect attempts or losses in
    /// a row, `suppressed` of them not logged since the last line.
    StillDown {
        /// The latest reason.
        reason: String,
        /// Failures in a row.
        failures: u64,
        /// Failures not logged since the previous line.
        suppressed: u64,
    },
    /// Connected again after `failures` failures (a loss and failed reconnects).
    Resumed {
        /// Failures in a row before this connection.
        failures: u64,
    },
}

impl KvLink {
    /// The subscriber connected.
    pub fn on_connected(&mut self) -> Option<KvChange> {
        let first = !self.ever_connected;
        self.ever_connected = true;
        match self.down.ok() {
            Some(Change::Recovered { failures }) if !first => Some(KvChange::Resumed { failures }),
            _ if first => Some(KvChange::Connected),
            _ => None,
        }
    }

    /// An established connection dropped at `now` for `reason`.
    pub fn on_lost(&mut self, reason: String, now: Instant) -> Option<KvChange> {
        match self.down.fail(now)? {
            Change::Failing => Some(KvChange::Lost(reason)),
            change => Self::repeat(change, reason),
        }
    }

    /// A connect attempt failed at `now` for `reason`.
    pub fn on_connect_failed(&mut self, reason: String, now: Instant) -> Option<KvChange> {
        match self.down.fail(now)? {
            Change::Failing => Some(KvChange::ConnectFailing(reason)),
            change => Self::repeat(change, reason),
        }
    }

    fn repeat(change: Change, reason: String) -> Option<KvChange> {
        match change {
            Change::StillFailing {
                failures,
                suppressed,
            } => Some(KvChange::StillDown {
                reason,
                failures,
                suppressed,
            }),
            _ => None,
        }
    }
}

impl KvChange {
    /// One log line for `backend`'s subscription to `endpoint`.
    pub fn log(&self, backend: &str, endpoint: &str) {
        match self {
            KvChange::Connected => tracing::info!(backend, endpoint, "KV events connected"),
            KvChange::Lost(reason) => tracing::warn!(
                backend,
                endpoint,
                %reason,
                "KV events lost: exact prefix index suspended"
            ),
            KvChange::ConnectFailing(reason) => {
                tracing::warn!(backend, endpoint, %reason, "KV events connect failing")
            }
            KvChange::StillDown {
                reason,
                failures,
                suppressed,
            } => tracing::warn!(
                backend,
                endpoint,
                %reason,
                failures,
                suppressed,
                "KV events still disconnected"
            ),
            KvChange::Resumed { failures } => {
                tracing::info!(backend, endpoint, failures, "KV events resumed")
            }
        }
    }
}

// === progress ===

/// A backend entered or left the stalled state ([`pronto_core::stall`]). Routing marks it
/// (one decision sees it first), a token from it clears it: each transition is one line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StallChange {
    /// Marked stalled: it held streams and produced no token for `silent_s`, past its
    /// `bound_s`; no new requests until it produces.
    Entered {
        /// Seconds without a token on any of its streams.
        silent_s: f64,
        /// The bound it passed (`max(floor, factor × booked prefill)`).
        bound_s: f64,
        /// Requests it holds.
        inflight: u32,
    },
    /// A token arrived from it: routed to again.
    Left,
}

impl StallChange {
    /// One log line for `backend`.
    pub fn log(self, backend: &str) {
        match self {
            StallChange::Entered {
                silent_s,
                bound_s,
                inflight,
            } => tracing::warn!(
                backend,
                silent_s,
                bound_s,
                inflight,
                "backend stalled: no token on any stream; no new requests until it produces"
            ),
            StallChange::Left => tracing::info!(backend, "backend producing again"),
        }
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
