//! The pingora glue: one [`ProxyHttp`] implementation that owns the upstream exchange.
//!
//! Pingora 0.9 forwards a body it has pre-read only up to 64 KiB (DESIGN §3.1), and Pronto must
//! see the whole prompt before it chooses a backend. So `request_filter` does the whole job —
//! read the body ([`body`]), parse it ([`crate::request`]), route ([`crate::routing`]), talk to
//! the backend with pingora's connector ([`upstream`]), relay the answer ([`relay`]) — and
//! returns `Ok(true)` ("response sent"). Pingora still provides the listeners, HTTP/1.1 and h2c
//! parsing, connection pooling and graceful shutdown.
//!
//! Retries: connect failures, I/O failures on a reused connection, and 5xx/429 answers are
//! retried on another backend (at most `retry.max_retries` times, the full body sent again)
//! while nothing has reached the client. Once the client has a byte, never.

mod admit;
mod body;
mod gate;
mod relay;
mod respond;
mod tokenize;
mod upstream;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::ServerSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

use crate::admission::Admission;
use crate::backend::{latency, RequestLoad};
use crate::error::GatewayError;
use crate::gateway::{GatewayState, Pool};
use crate::request::{parse_request, Endpoint};
use crate::routing::{Decision, Snapshot};
use crate::server::ActiveRequests;
use crate::telemetry::{Metrics, NONE};
use relay::{client_response_head, Relay, RelayEnd};
use upstream::{attempt, upstream_request_head, Attempt, Deadlines};

/// Upstream connections kept idle in the pool this long.
const UPSTREAM_IDLE_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);
/// Extra retries allowed for stale pooled connections (not counted against the retry budget).
const MAX_STALE_RETRIES: u32 = 4;

/// The gateway's proxy service.
pub struct Proxy {
    state: Arc<ArcSwap<GatewayState>>,
    metrics: Metrics,
    connector: Connector,
    active: Arc<ActiveRequests>,
    /// The SLO admission queue; outlives reloads (requests queued under an old config keep
    /// their place).
    admission: Admission,
    /// Per-key and per-route rate limits; outlive reloads too.
    limiter: crate::ratelimit::RateLimiter,
}

impl Proxy {
    /// A proxy over the given (reloadable) state.
    pub fn new(
        state: Arc<ArcSwap<GatewayState>>,
        metrics: Metrics,
        active: Arc<ActiveRequests>,
    ) -> Proxy {
        let mut opts = pingora_core::connectors::ConnectorOptions::new(1024);
        opts.keepalive_pool_size = 1024;
        Proxy {
            state,
            admission: Admission::new(metrics.clone()),
            metrics,
            connector: Connector::new(Some(opts)),
            active,
            limiter: crate::ratelimit::RateLimiter::new(Instant::now()),
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
        let raw_head = if session.is_http2() {
            Bytes::new()
        } else {
            session.to_h1_raw()
        };
        if let Err(err) = gate::check_head(&session.req_header().headers, &raw_head) {
            // The framing of the rest of the stream cannot be trusted: close after answering.
            session.set_keepalive(None);
            let _ = respond::error(session, &err).await;
            self.count(NONE, NONE, err.status(), arrived);
            return;
        }
        let state = self.state.load_full();
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        let endpoint = Endpoint::from_path(&path);
        let result = match (&method, endpoint) {
            (&Method::POST, Some(ep)) => self.proxy(session, &state, ep, arrived).await,
            (&Method::GET, None) if path == "/v1/models" => {
                if let Err(e) = self.gate_key(session, &state) {
                    let _ = respond::error(session, &e).await;
                    self.count(NONE, NONE, e.status(), arrived);
                    return;
                }
                let body = Bytes::from(state.models_json().to_string());
                let _ = respond::json(session, 200, body, &[]).await;
                Ok(())
            }
            (_, Some(_)) => Err((
                None,
                GatewayError::MethodNotAllowed {
                    method: method.to_string(),
                    path,
                },
            )),
            (_, None) if path == "/v1/models" => Err((
                None,
                GatewayError::MethodNotAllowed {
                    method: method.to_string(),
                    path,
                },
            )),
            (_, None) => Err((None, GatewayError::NotFound { path })),
        };
        if let Err((pool, err)) = result {
            let pool_label = pool.as_deref().unwrap_or(NONE);
            if err.status() >= 500 {
                tracing::warn!(pool = pool_label, error = %err, "request failed");
            } else {
                tracing::debug!(pool = pool_label, error = %err, "request rejected");
            }
            if matches!(
                err,
                GatewayError::BodyTooLarge { .. } | GatewayError::RequestTimeout
            ) {
                // The rest of the body was not read: the connection cannot be reused.
                session.set_keepalive(None);
            }
            let _ = respond::error(session, &err).await;
            self.count(pool_label, NONE, err.status(), arrived);
        }
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

    fn record_decision(
        &self,
        pool: &Pool,
        policy: &str,
        d: &Decision,
        cached_tokens: u32,
        prompt_tokens: u32,
    ) {
        let m = &self.metrics;
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
                .observe(f64::from(cached_tokens) / f64::from(prompt_tokens));
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

    /// Read, parse, route, forward and relay one inference request.
    async fn proxy(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        endpoint: Endpoint,
        arrived: Instant,
    ) -> Result<(), (Option<Arc<str>>, GatewayError)> {
        let limits = &state.config.limits;
        let mut pass = self.gate_key(session, state).map_err(|e| (None, e))?;
        let body = body::read_body(session, limits.max_body_bytes, limits.idle_timeout)
            .await
            .map_err(|e| (None, e))?;
        let session_header = session
            .get_header("x-session-id")
            .and_then(|v| v.to_str().ok());
        let mut features = parse_request(endpoint, &body, session_header)
            .map_err(|e| (None, GatewayError::BadRequest(e.to_string())))?;
        let Some((pool, route)) = state.route(
            &features.model,
            session.req_header().uri.path(),
            &session.req_header().headers,
        ) else {
            return Err((
                None,
                GatewayError::ModelNotFound {
                    model: features.model.clone(),
                },
            ));
        };
        tokenize::apply(pool, endpoint, &body, &mut features, &self.metrics).await;
        // Costs are in the engine's tokens: correct our count by what `usage` taught the pool
        // (again after admission, which may fall back to another pool).
        let mut our_prompt_tokens = features.prompt_tokens;
        features.prompt_tokens = pool.token_ratio.scale(our_prompt_tokens);
        self.gate_route(
            &mut pass,
            state,
            route,
            &features.model,
            features.prompt_tokens,
        )
        .map_err(|e| (Some(pool.model.clone()), e))?;
        let keyed_route = pass.keyed_route(route);
        let route = keyed_route.as_ref().or(route);
        let first_pool = pool;
        let (pool, _departure) = self
            .admit(session, state, pool, route, &features, arrived)
            .await?;
        if !tokenize::same_tokenizer(first_pool, pool) {
            // A fallback pool that tokenizes differently: its tokens, its block hashes.
            let session_header = session
                .get_header("x-session-id")
                .and_then(|v| v.to_str().ok());
            features = parse_request(endpoint, &body, session_header)
                .map_err(|e| (None, GatewayError::BadRequest(e.to_string())))?;
            tokenize::apply(pool, endpoint, &body, &mut features, &self.metrics).await;
            our_prompt_tokens = features.prompt_tokens;
        }
        features.prompt_tokens = pool.token_ratio.scale(our_prompt_tokens);
        let pool_err = |e| (Some(pool.model.clone()), e);
        let policy = state.policy_for(pool, route);
        let deadlines = Deadlines {
            first_token: route
                .and_then(|r| r.first_token_timeout)
                .unwrap_or(limits.first_token_timeout),
            idle: route
                .and_then(|r| r.idle_timeout)
                .unwrap_or(limits.idle_timeout),
        };
        let max_retries = route
            .and_then(|r| r.max_retries)
            .unwrap_or(state.config.retry.max_retries);
        let health = &state.config.health;
        let mut tried: Vec<usize> = Vec::new();
        let mut retries = 0u32;
        let mut stale_retries = 0u32;
        let mut last_failure = String::new();
        loop {
            let now = Instant::now();
            let views = pool.views_for(&**policy, &features, now, &tried);
            let snapshot = Snapshot { backends: &views };
            let decision = match policy.select(&features, &snapshot, now) {
                Ok(d) => d,
                Err(_) => {
                    let detail = if last_failure.is_empty() {
                        String::new()
                    } else {
                        format!(": {last_failure}")
                    };
                    return Err(pool_err(GatewayError::NoBackend {
                        model: pool.model.to_string(),
                        detail,
                    }));
                }
            };
            let backend = &pool.backends[decision.index];
            let chosen = &views[decision.index];
            let inputs = chosen.ttft_inputs(&features);
            self.record_decision(
                pool,
                policy.name(),
                &decision,
                chosen.cached_tokens,
                features.prompt_tokens,
            );
            let others_left = views
                .iter()
                .enumerate()
                .any(|(i, v)| i != decision.index && v.eligible());
            let may_retry_status = retries < max_retries && others_left;
            let head = upstream_request_head(session.req_header(), backend, body.len())
                .map_err(|e| pool_err(GatewayError::Internal(e.to_string())))?;
            let load = RequestLoad {
                prefill_tokens: inputs.uncached_tokens as u32,
                kv_tokens: chosen.kv_need(&features),
            };
            let mut guard = backend.start_request(load, now);
            let outcome = attempt(
                &self.connector,
                backend,
                head,
                &body,
                features.stream,
                deadlines,
                may_retry_status,
            )
            .await;
            match outcome {
                Attempt::Retry {
                    reason,
                    detail,
                    backend_blameless,
                } => {
                    drop(guard);
                    tracing::info!(backend = %backend.name(), %detail, "attempt failed");
                    self.metrics
                        .upstream_errors_total
                        .with_label_values(&[backend.name(), reason.as_str()])
                        .inc();
                    if backend_blameless && stale_retries < MAX_STALE_RETRIES {
                        // A pooled connection the backend had closed: try again, same budget.
                        stale_retries += 1;
                    } else {
                        if !backend_blameless {
                            self.record_failure(pool, decision.index, health);
                        }
                        tried.push(decision.index);
                        if retries >= max_retries {
                            return Err(pool_err(GatewayError::NoBackend {
                                model: pool.model.to_string(),
                                detail: format!(": {detail}"),
                            }));
                        }
                        retries += 1;
                    }
                    self.metrics
                        .retries_total
                        .with_label_values(&[&pool.model, reason.as_str()])
                        .inc();
                    last_failure = detail;
                }
                Attempt::FirstTokenTimeout => {
                    drop(guard);
                    self.record_failure(pool, decision.index, health);
                    self.metrics
                        .upstream_errors_total
                        .with_label_values(&[backend.name(), "first_token_timeout"])
                        .inc();
                    let timeout = if features.stream {
                        deadlines.first_token
                    } else {
                        deadlines.idle
                    };
                    return Err(pool_err(GatewayError::FirstTokenTimeout {
                        backend: backend.name().to_string(),
                        timeout_ms: timeout.as_millis() as u64,
                    }));
                }
                Attempt::Committed {
                    mut upstream,
                    head,
                    first_chunk,
                    body_done,
                    sent_at,
                } => {
                    let status = head.status.as_u16();
                    if status < 500 {
                        backend.record_success();
                        // The backend took the prompt: it holds its prefix from now on (a
                        // failed attempt must not teach the index otherwise).
                        pool.index
                            .record(decision.index, &features.block_hashes, now);
                    }
                    let mut extra = pass.headers();
                    if state.config.explain_headers {
                        extra.push(("x-pronto-backend", backend.name().to_string()));
                        if let Some(p) = decision.predicted_ttft_s {
                            extra.push(("x-pronto-predicted-ttft-ms", format!("{:.1}", p * 1e3)));
                        }
                    }
                    let client_head = client_response_head(&head, &extra)
                        .map_err(|e| pool_err(GatewayError::Internal(e.to_string())))?;
                    let is_sse = features.stream
                        && head
                            .headers
                            .get(http::header::CONTENT_TYPE)
                            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    let outcome = Relay {
                        head: client_head,
                        first_chunk,
                        body_done,
                        sse: is_sse,
                        idle: deadlines.idle,
                        guard: &mut guard,
                    }
                    .run(session, &mut upstream)
                    .await;
                    if let Some(t) = outcome.first_token_at {
                        let actual = (t - sent_at).as_secs_f64();
                        let predicted = backend.ttft.observe(&inputs, actual, t);
                        self.metrics
                            .ttft_seconds
                            .with_label_values(&[backend.name()])
                            .observe(actual);
                        self.metrics
                            .ttft_prediction_error_seconds
                            .with_label_values(&[backend.name()])
                            .observe(predicted - actual);
                        self.metrics
                            .client_ttft_seconds
                            .with_label_values(&[&pool.model])
                            .observe((t - arrived).as_secs_f64());
                    }
                    if outcome.end == RelayEnd::Complete {
                        let done = Instant::now();
                        let sample = latency::Sample {
                            ttft_s: outcome.first_token_at.map(|t| (t - sent_at).as_secs_f64()),
                            tpot_s: match (outcome.first_token_at, outcome.last_token_at) {
                                (Some(a), Some(b)) if outcome.output_events >= 2 => Some(
                                    (b - a).as_secs_f64() / f64::from(outcome.output_events - 1),
                                ),
                                _ => None,
                            },
                            e2e_s: (done - sent_at).as_secs_f64(),
                        };
                        backend.latency.record(sample, done);
                        if let Some(t) = sample.tpot_s {
                            self.metrics
                                .tpot_seconds
                                .with_label_values(&[backend.name()])
                                .observe(t);
                        }
                        self.metrics
                            .e2e_seconds
                            .with_label_values(&[backend.name()])
                            .observe(sample.e2e_s);
                    }
                    if let Some(u) = outcome.usage {
                        self.settle(&mut pass, &u);
                        pool.token_ratio.observe(u.prompt_tokens, our_prompt_tokens);
                        self.metrics
                            .prompt_token_ratio
                            .with_label_values(&[&pool.model])
                            .set(pool.token_ratio.ratio());
                    }
                    match outcome.end {
                        RelayEnd::Complete => {}
                        RelayEnd::ClientGone => {
                            self.metrics
                                .client_disconnects_total
                                .with_label_values(&[&pool.model])
                                .inc();
                        }
                        RelayEnd::UpstreamFailed => {
                            self.record_failure(pool, decision.index, health);
                            self.metrics
                                .upstream_errors_total
                                .with_label_values(&[backend.name(), "mid_stream"])
                                .inc();
                        }
                    }
                    drop(guard);
                    if outcome.reusable {
                        self.connector
                            .release_http_session(
                                *upstream,
                                &backend.peer,
                                Some(UPSTREAM_IDLE_KEEPALIVE),
                            )
                            .await;
                    } else {
                        upstream.shutdown().await;
                    }
                    self.count(&pool.model, backend.name(), status, arrived);
                    return Ok(());
                }
            }
        }
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

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> pingora_core::Result<bool> {
        self.handle(session.as_downstream_mut()).await;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> pingora_core::Result<Box<HttpPeer>> {
        // request_filter always answers, so pingora never asks for a peer.
        pingora_core::Error::e_explain(
            pingora_core::ErrorType::InternalError,
            "Pronto answers every request in request_filter",
        )
    }
}
