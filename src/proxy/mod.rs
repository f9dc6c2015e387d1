//! The pingora glue: the proxy listener's app ([`App`]) hands each request to [`Proxy`], which
//! owns the whole exchange.
//!
//! Pingora 0.9's proxy forwards a body it has pre-read only up to 64 KiB (DESIGN §3.1), and
//! Pronto must see the whole prompt before it chooses a backend. So Pronto does not use
//! pingora-proxy: [`Proxy::handle`] does the whole job —
//! read the body ([`body`]), parse it ([`pronto_core::request`]), route ([`pronto_core::routing`]), talk to
//! the backend with pingora's connector ([`upstream`]), relay the answer ([`relay`]) —
//! and [`App`] finishes the session for reuse. Pingora-core still provides HTTP/1.1 and h2c
//! parsing, the upstream connectors and their connection pool.
//!
//! Retries: connect failures, I/O failures on a reused connection, and 5xx/429 answers are
//! retried on another backend (at most `retry.max_retries` times, the full body sent again)
//! while nothing has reached the client. Once the client has a byte, never.

// No panics on the request path: every module below answers requests (their tests may
// unwrap: clippy.toml allows it in tests).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod app;
mod attempts;
mod body;
mod budget;
mod commit;
mod keepalive;
mod lifecycle;
mod local;
mod migrate;
mod models;
mod observe;
mod race;
mod relay;
mod repair;
pub mod request_id;
mod respond;
mod retry;
#[cfg(test)]
mod test_io;
mod tokenize;
mod upstream;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::Method;
use pingora_core::protocols::http::ServerSession;

use crate::edge::Failure;
use crate::error::GatewayError;
use crate::state::activity::{ActiveRequests, RecentDecisions};
use crate::state::StateHandle;
use crate::state::{GatewayState, Pool, Routed};
use crate::telemetry::{Metrics, NONE};
use access::Access;
pub use app::App;
use pronto_core::request::Endpoint;
use request_id::{IdSource, RequestIds};
use upstream::Connectors;

/// Upstream connections kept idle in the pool this long.
const UPSTREAM_IDLE_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);
/// Idle upstream connections kept at most.
const UPSTREAM_POOL_SIZE: usize = 1024;

/// The gateway's proxy service.
pub struct Proxy {
    state: StateHandle,
    metrics: Metrics,
    connectors: Connectors,
    active: Arc<ActiveRequests>,
    /// Admission queues and rate limits; outlive reloads.
    edge: crate::edge::Edge,
    /// Request body bytes buffered now, over all requests.
    budget: budget::BufferBudget,
    /// Where generated request ids come from.
    ids: RequestIds,
    /// The last decisions, for the admin listener.
    decisions: Arc<RecentDecisions>,
    /// Hedge credit per route; outlives reloads.
    hedges: race::HedgeBudgets,
}

impl Proxy {
    /// A proxy over the given (reloadable) state, keeping its recent routing decisions in
    /// `decisions`.
    pub fn new(
        state: StateHandle,
        metrics: Metrics,
        active: Arc<ActiveRequests>,
        decisions: Arc<RecentDecisions>,
    ) -> Proxy {
        Proxy {
            state,
            edge: crate::edge::Edge::new(metrics.clone(), Instant::now()),
            metrics,
            connectors: Connectors::new(UPSTREAM_POOL_SIZE),
            active,
            budget: budget::BufferBudget::default(),
            ids: RequestIds::from_entropy(),
            decisions,
            hedges: race::HedgeBudgets::default(),
        }
    }

    async fn handle(&self, session: &mut ServerSession) {
        let arrived = Instant::now();
        let _active = self.active.enter();
        // The relay watches the client for a hang-up with a one-byte idle read. A keep-alive
        // client may already be sending its next request by then (a Content-Length response is
        // complete before we finish the exchange): with pipelining enabled pingora keeps that
        // byte for the next request instead of losing it.
        session.set_pipelining_enabled(true);
        let state = self.state.load();
        // A client that stops reading: a write that cannot progress within the deadline fails,
        // the relay ends and the upstream request is dropped (its engine slot freed).
        let limits = state.config.limits;
        session.set_write_timeout(Some(limits.write_timeout));
        // Pingora keeps an HTTP/1.1 connection alive without end between requests unless told
        // otherwise; it applies this timeout only while it waits for the next head, never
        // while an answer streams. (Validation keeps it at whole seconds, at least one.)
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(limits.keepalive_timeout.as_secs()));
        }
        if let Some(rate) = limits.min_send_rate {
            session.set_min_send_rate(Some(rate as usize));
        }
        let req = session.req_header();
        let (id, source) = self.ids.for_request(&req.headers);
        let mut access = Access::new(id, req.method.clone(), req.uri.path().to_string());
        if source == IdSource::Replaced {
            tracing::debug!(request_id = %access.id, "x-request-id replaced: not 1 to 128 bytes of visible ASCII");
        }
        let raw_head = if session.is_http2() {
            Bytes::new()
        } else {
            session.to_h1_raw()
        };
        let req = session.req_header();
        let result = match crate::edge::gate::check_head(&req.headers, req.version, &raw_head) {
            // The framing of the rest of the stream cannot be trusted: close after answering.
            Err(err) => {
                session.set_keepalive(None);
                Err((None, err))
            }
            Ok(()) => self.serve(session, &state, &mut access, arrived).await,
        };
        let mut unread = false;
        let counted = match result {
            Ok(()) => access
                .end
                .is_some()
                .then(|| (access.backend.clone(), access.status)),
            Err((pool, err)) => {
                if access.pool.is_none() {
                    access.pool = pool;
                }
                let pool_label = access.pool.as_deref().unwrap_or(NONE);
                if err.status() >= 500 {
                    tracing::warn!(request_id = %access.id, pool = pool_label, error = %err, "request failed");
                } else {
                    tracing::debug!(request_id = %access.id, pool = pool_label, error = %err, "request rejected");
                }
                unread = matches!(
                    err,
                    GatewayError::BodyTooLarge { .. } | GatewayError::Busy(_)
                );
                if unread
                    || matches!(
                        err,
                        GatewayError::RequestTimeout
                            | GatewayError::Framing(_)
                            | GatewayError::UnsupportedTransferCoding(_)
                    )
                {
                    // The rest of the body was not read, or where it ends is unknown (a
                    // framing error: no byte after it may be parsed as a request): the
                    // connection cannot be reused. The answer says `Connection: close`.
                    session.set_keepalive(None);
                }
                let len = if access.keepalives > 0 {
                    // Keep-alives committed a 200 stream: the error is its last event.
                    let route = access.route.as_deref().unwrap_or(NONE);
                    self.metrics
                        .progress
                        .keepalive_errors_total
                        .with_label_values(&[route])
                        .inc();
                    keepalive::error_event(session, &err).await
                } else {
                    respond::error(session, &err, &access.id).await
                };
                access.failed(&err, len);
                if access.keepalives > 0 {
                    access.status = 200;
                }
                Some((None, access.status))
            }
        };
        // The access line is written before the request is counted: once `/metrics` shows a
        // request, its line is out.
        access.emit(arrived.elapsed(), &state.config.access_log);
        if let Some((backend, status)) = counted {
            let pool = access.pool.as_deref().unwrap_or(NONE);
            self.count(pool, backend.as_deref().unwrap_or(NONE), status, arrived);
        }
        if let Some(d) = access.into_decision(SystemTime::now()) {
            self.decisions.push(d);
        }
        if unread {
            // Answered, logged and counted; now drain what the client still sends, so the
            // close does not reset the connection before it reads the answer.
            body::linger(session).await;
        }
    }

    /// Answer one request whose head passed the edge checks.
    async fn serve(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        access: &mut Access,
        arrived: Instant,
    ) -> Result<(), Failure> {
        let method = access.method.clone();
        let path = access.path.as_str();
        let not_allowed = |access: &Access| {
            Err((
                None,
                GatewayError::MethodNotAllowed {
                    method: method.to_string(),
                    path: access.path.clone(),
                },
            ))
        };
        if let Some(ep) = Endpoint::from_path(path) {
            if method != Method::POST {
                return not_allowed(access);
            }
            return self.proxy(session, state, ep, access, arrived).await;
        }
        let model_id = models::id_from_path(path);
        if path == "/v1/models" || model_id.is_some() || path == "/health" {
            if method != Method::GET {
                return not_allowed(access);
            }
            if path == "/health" {
                self.health(session, state, access).await;
                return Ok(());
            }
            return self
                .models(session, state, access, model_id.as_deref())
                .await;
        }
        Err((
            None,
            GatewayError::NotFound {
                path: access.path.clone(),
            },
        ))
    }

    /// A request to `pool.backends[index]` failed; forget its cache if that ejected it.
    fn record_failure(&self, pool: &Pool, index: usize, health: &crate::config::Health) {
        let ejected = pool.backends[index].record_failure(
            Instant::now(),
            health.eject_after_failures,
            health.readmit_after,
        );
        if ejected {
            pool.forget(index);
        }
    }

    fn record_decision(&self, pool: &Pool, policy: &str, routed: &Routed, prompt_tokens: u32) {
        let m = &self.metrics;
        let d = &routed.decision;
        m.route_decisions_total
            .with_label_values(&[&pool.model, policy, d.reason.as_str()])
            .inc();
        if let Some(p) = d.predicted_ttft_s {
            m.predicted_ttft_seconds
                .with_label_values(&[&pool.model])
                .observe(p);
        }
        if prompt_tokens > 0 {
            m.prefix_match_ratio
                .with_label_values(&[&pool.model])
                .observe(f64::from(routed.chosen.cached_tokens) / f64::from(prompt_tokens));
        }
    }

    fn count(&self, pool: &str, backend: &str, status: u16, arrived: Instant) {
        self.metrics
            .requests_total
            .with_label_values(&[pool, backend, status_label(status)])
            .inc();
        self.metrics
            .request_duration_seconds
            .with_label_values(&[pool])
            .observe(arrived.elapsed().as_secs_f64());
    }
}

/// Status codes as static label values (bounded: anything unusual is `other`).
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        400 => "400",
        401 => "401",
        431 => "431",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        413 => "413",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        s if (200..300).contains(&s) => "2xx",
        s if (400..500).contains(&s) => "4xx",
        s if (500..600).contains(&s) => "5xx",
        _ => "other",
    }
}
