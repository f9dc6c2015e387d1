//! The access log and the recent decisions: what one request was and what became of it.
//!
//! An [`Access`] record is filled in as the request goes through its steps (the key at the
//! gate, the model, route and pool at the match, the backend and decision at each attempt, the
//! status and bytes at the end) and written once, when the response has ended, as one line
//! with the log target `pronto::access` and the message `access` — one JSON object with
//! `--log-format json`. Fields, each present when known:
//!
//! | field | meaning |
//! | --- | --- |
//! | `request_id` | the client's `x-request-id`, or the generated one ([`super::request_id`]) |
//! | `method`, `path` | as received |
//! | `model`, `stream` | from the request body |
//! | `route`, `pool` | the matched route (with `routes:`) and the pool that served it (after an SLO fallback, the fallback) |
//! | `key` | the API key's name (never the key) |
//! | `backend` | the backend of the last attempt |
//! | `attempts` | attempts made (1 + retries); 0 when no backend was tried |
//! | `status` | the status the client got (499: it hung up first) |
//! | `request_bytes`, `response_bytes` | the request body read; the response body sent |
//! | `ttft_ms` | arrival at the gateway to the first token forwarded (streams) |
//! | `upstream_ttft_ms` | request sent to the backend to its first token: what `predicted_ttft_ms` predicts |
//! | `ttfa_ms` | arrival at the gateway to the first answer token forwarded — content or a tool call, after any reasoning (streams; equals `ttft_ms` without reasoning) |
//! | `reasoning_tokens` | reasoning-only events relayed (≈ reasoning tokens; streams) |
//! | `duration_ms` | arrival to the end of the response |
//! | `reason`, `predicted_ttft_ms` | the last attempt's routing decision: its reason and prediction |
//! | `race`, `race_winner` | a failover or hedge raced a second backend before the first token (`failover`, `hedge`), and which copy was relayed (`first`, `second`); `backend` is the one relayed |
//! | `error` | the error code of a response Pronto wrote itself (`model_not_found`, …) |
//! | `end` | how a relayed response ended: `complete`, `client_gone`, `client_stalled` (it stopped reading: released at the write deadline), `upstream_failed` |
//!
//! `access_log.sample_rate` keeps a share of requests, chosen by a hash of the request id: a
//! client's id is kept or dropped alike on every gateway replica.
//!
//! Every request that reached a routing decision also goes into [`RecentDecisions`], a small
//! ring shown as `recent_decisions` in the admin `GET /admin/backends` (and on the status
//! page), whatever the sampling.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::AccessLog;
use crate::error::GatewayError;
use crate::state::activity::{round_ms, RecentDecision};
use pronto_core::routing::Reason;

use super::relay::{RelayEnd, RelayOutcome};

/// The access log's tracing target.
pub const TARGET: &str = "pronto::access";

/// One request, as the access log records it.
#[derive(Debug)]
pub(super) struct Access {
    pub id: String,
    pub method: http::Method,
    pub path: String,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub route: Option<Arc<str>>,
    pub pool: Option<Arc<str>>,
    pub key: Option<Arc<str>>,
    pub backend: Option<Arc<str>>,
    pub attempts: u32,
    pub status: u16,
    pub request_bytes: Option<u64>,
    pub response_bytes: u64,
    pub ttft: Option<Duration>,
    pub upstream_ttft: Option<Duration>,
    pub ttfa: Option<Duration>,
    pub reasoning_tokens: Option<u32>,
    pub reason: Option<Reason>,
    pub predicted_ttft_s: Option<f64>,
    pub error: Option<&'static str>,
    pub end: Option<RelayEnd>,
    pub race: Option<super::race::Raced>,
    /// The backend collision repair first moved the request from ([`super::repair`]).
    pub moved_from: Option<Arc<str>>,
    /// How a stream whose backend failed went on ([`crate::telemetry::MigrationOutcome`]).
    pub migration: Option<&'static str>,
    /// Continuations the stream was sent (`super::migrate`).
    pub migrations: u32,
    /// Keep-alives sent before the first token (the first committed a 200 head).
    pub keepalives: u32,
}

impl Access {
    /// A request with id `id`, as it arrived.
    pub fn new(id: String, method: http::Method, path: String) -> Access {
        Access {
            id,
            method,
            path,
            model: None,
            stream: None,
            route: None,
            pool: None,
            key: None,
            backend: None,
            attempts: 0,
            status: 0,
            request_bytes: None,
            response_bytes: 0,
            ttft: None,
            upstream_ttft: None,
            ttfa: None,
            reasoning_tokens: None,
            reason: None,
            predicted_ttft_s: None,
            error: None,
            end: None,
            race: None,
            moved_from: None,
            migration: None,
            migrations: 0,
            keepalives: 0,
        }
    }

    /// The client was answered `err` (a JSON body of `body_len` bytes) by the gateway.
    pub fn failed(&mut self, err: &GatewayError, body_len: usize) {
        self.status = err.status();
        self.error = Some(err.code());
        self.response_bytes = body_len as u64;
    }

    /// A relayed response ended as `outcome`.
    pub fn relayed(&mut self, status: u16, outcome: &RelayOutcome) {
        self.status = status;
        self.response_bytes = outcome.bytes_sent;
        self.end = Some(outcome.end);
    }

    /// Write the line (when `settings` keep this request), `duration` after arrival.
    pub fn emit(&self, duration: Duration, settings: &AccessLog) {
        if !settings.enabled || !sampled(&self.id, settings.sample_rate) {
            return;
        }
        tracing::info!(
            target: TARGET,
            request_id = %self.id,
            method = %self.method,
            path = %self.path,
            model = self.model.as_deref(),
            stream = self.stream,
            route = self.route.as_deref(),
            pool = self.pool.as_deref(),
            key = self.key.as_deref(),
            backend = self.backend.as_deref(),
            attempts = self.attempts,
            status = self.status,
            request_bytes = self.request_bytes,
            response_bytes = self.response_bytes,
            ttft_ms = self.ttft.map(ms),
            upstream_ttft_ms = self.upstream_ttft.map(ms),
            ttfa_ms = self.ttfa.map(ms),
            reasoning_tokens = self.reasoning_tokens,
            duration_ms = ms(duration),
            reason = self.reason.map(Reason::as_str),
            predicted_ttft_ms = self.predicted_ttft_s.map(|s| round_ms(s * 1e3)),
            error = self.error,
            end = self.end.map(end_str),
            race = self.race.as_ref().map(|r| r.kind.label()),
            race_winner = self
                .race
                .as_ref()
                .map(|r| if r.second_won { "second" } else { "first" }),
            moved_from = self.moved_from.as_deref(),
            migration = self.migration,
            migrations = self.migrations,
            "access"
        );
    }

    /// The request's routing decision for [`RecentDecisions`], when it reached one; `at`: now.
    pub fn into_decision(self, at: SystemTime) -> Option<RecentDecision> {
        Some(RecentDecision {
            at,
            pool: self.pool?,
            backend: self.backend?,
            reason: self.reason?,
            predicted_ttft_s: self.predicted_ttft_s,
            actual_ttft_s: self.upstream_ttft.map(|d| d.as_secs_f64()),
            status: self.status,
            request_id: self.id,
        })
    }
}

fn end_str(end: RelayEnd) -> &'static str {
    match end {
        RelayEnd::Complete => "complete",
        RelayEnd::ClientGone => "client_gone",
        RelayEnd::ClientStalled => "client_stalled",
        RelayEnd::UpstreamFailed => "upstream_failed",
    }
}

/// Milliseconds, to the microsecond.
fn ms(d: Duration) -> f64 {
    round_ms(d.as_secs_f64() * 1e3)
}

/// Whether the request with id `id` is kept at `rate` (0..=1): a uniform hash of the id
/// below the rate; 0 keeps none, 1 keeps all.
pub fn sampled(id: &str, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 {
        return false;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in id.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let u = (super::request_id::mix(h) >> 11) as f64 / (1u64 << 53) as f64;
    u < rate
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::activity::{RecentDecisions, RECENT_DECISIONS};

    #[test]
    fn sampling_keeps_the_rate_and_is_a_function_of_the_id() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("req-{i}")).collect();
        assert!(ids.iter().all(|id| sampled(id, 1.0)));
        assert!(ids.iter().all(|id| !sampled(id, 0.0)));
        let kept = ids.iter().filter(|id| sampled(id, 0.25)).count();
        assert!((2_200..2_800).contains(&kept), "{kept}");
        for id in &ids[..100] {
            assert_eq!(sampled(id, 0.25), sampled(id, 0.25));
            // A higher rate keeps a superset.
            assert!(!sampled(id, 0.25) || sampled(id, 0.5));
        }
    }

    fn access(pool: Option<&str>, backend: Option<&str>) -> Access {
        let mut a = Access::new("id-1".into(), http::Method::POST, "/v1/completions".into());
        a.pool = pool.map(Arc::from);
        a.backend = backend.map(Arc::from);
        a.reason = Some(Reason::PredictedBest);
        a.predicted_ttft_s = Some(0.0123456);
        a.upstream_ttft = Some(Duration::from_micros(15_500));
        a.status = 200;
        a
    }

    #[test]
    fn a_request_without_a_decision_is_not_a_recent_decision() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert!(access(Some("m"), None).into_decision(at).is_none());
        assert!(access(None, Some("b")).into_decision(at).is_none());
        let d = access(Some("m"), Some("b")).into_decision(at).unwrap();
        assert_eq!((&*d.pool, &*d.backend, d.status), ("m", "b", 200));
    }

    #[test]
    fn recent_decisions_keep_the_newest_first_in_the_status_page_shape() {
        let ring = RecentDecisions::default();
        assert_eq!(ring.to_json(), serde_json::json!([]));
        for i in 0..RECENT_DECISIONS as u64 + 5 {
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_000 + i);
            let mut d = access(Some("m"), Some("b")).into_decision(at).unwrap();
            d.request_id = format!("r{i}");
            ring.push(d);
        }
        let v = ring.to_json();
        let list = v.as_array().unwrap();
        assert_eq!(list.len(), RECENT_DECISIONS);
        let last = RECENT_DECISIONS as u64 + 4;
        assert_eq!(list[0]["request_id"], format!("r{last}"));
        assert_eq!(list[0]["at_ms"], 1_000 + last);
        assert_eq!(list[RECENT_DECISIONS - 1]["request_id"], "r5");
        assert_eq!(list[0]["backend"], "b");
        assert_eq!(list[0]["reason"], "predicted_best");
        assert_eq!(list[0]["predicted_ttft_ms"], 12.346);
        assert_eq!(list[0]["actual_ttft_ms"], 15.5);
        assert_eq!(list[0]["status"], 200);
    }
}
