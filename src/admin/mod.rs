//! The admin listener: the status page, liveness, readiness, metrics and backend state.
//!
//! Binds to loopback unless configured otherwise (elsewhere it needs `admin.token`). Routes:
//! `GET /` (the status page, [`status`]), `GET /healthz` (the process is up), `GET /readyz` (200 when every pool has a healthy
//! backend, else 503 with the pools that have none), `GET /metrics` (Prometheus text),
//! `GET /admin/backends` (JSON state of every backend, and the last routing decisions as
//! `recent_decisions`: [`crate::state::activity::RecentDecisions::to_json`]), `GET /admin/config` (the active
//! config, its version and hash, the last reload error; see [`Reloader::status_json`]) and
//! `POST /admin/reload` (reload the config file now: 200 with
//! `{result: "ok"|"unchanged", version, hash, error: null, warnings, ...}`, 400 with
//! `result: "error"` and the located problems when the file is invalid — the old config
//! keeps serving — and 409 when the gateway was started without a config file), and
//! `POST /admin/tokenize?endpoint=chat|completions|embeddings` (what routing would count for
//! an OpenAI request body: its pool, the estimated and — with the pool's `tokenizer` — exact
//! prompt tokens and token ids, to compare with an engine's `/tokenize`).
//!
//! With `admin.token` configured, every route except `/healthz` and `/readyz` (probes) needs
//! `Authorization: Bearer <token>`, else 401 (the status page also takes `?token=`).
//! `POST` routes must carry a `Host` that names this listener and, from a browser, a
//! same-origin `Origin`, else 403 ([`guard`]).

mod guard;
pub mod status;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;

use crate::services::reload::{Reloader, Trigger};
use crate::state::activity::RecentDecisions;
use crate::state::StateHandle;
use crate::telemetry::{Metrics, ReloadResult};
use pronto_core::request::{parse_request, Endpoint};

const JSON: &str = "application/json";

/// The admin HTTP app.
pub struct Admin {
    state: StateHandle,
    metrics: Metrics,
    reloader: Arc<Reloader>,
    decisions: Arc<RecentDecisions>,
}

impl Admin {
    /// An admin app over the given state, reloading through `reloader`, showing the proxy's
    /// `decisions`.
    pub fn new(
        state: StateHandle,
        metrics: Metrics,
        reloader: Arc<Reloader>,
        decisions: Arc<RecentDecisions>,
    ) -> Admin {
        Admin {
            state,
            metrics,
            reloader,
            decisions,
        }
    }

    /// `POST /admin/reload`: status and JSON body. Runs the reload on the blocking pool.
    pub async fn reload(&self) -> (StatusCode, &'static str, Vec<u8>) {
        let reloader = Arc::clone(&self.reloader);
        let (status, body) = match tokio::task::spawn_blocking(move || {
            reloader.reload(Trigger::Admin)
        })
        .await
        {
            Ok(Ok(report)) => {
                let status = if report.result == ReloadResult::Error {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::OK
                };
                let body = serde_json::to_value(&report).unwrap_or_else(
                    |e| serde_json::json!({ "result": "error", "error": e.to_string() }),
                );
                (status, body)
            }
            Ok(Err(no_file)) => (
                StatusCode::CONFLICT,
                serde_json::json!({ "result": "error", "error": no_file.to_string() }),
            ),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({ "result": "error", "error": format!("reload task failed: {e}") }),
            ),
        };
        (status, JSON, body.to_string().into_bytes())
    }

    /// Status and body for `method path`, except `POST /admin/reload` ([`Admin::reload`]).
    pub fn route(&self, method: &http::Method, path: &str) -> (StatusCode, &'static str, Vec<u8>) {
        if method != http::Method::GET {
            return (
                StatusCode::METHOD_NOT_ALLOWED,
                JSON,
                br#"{"error":"method not allowed"}"#.to_vec(),
            );
        }
        let now = Instant::now();
        match path {
            "/healthz" => (StatusCode::OK, "text/plain", b"ok\n".to_vec()),
            "/readyz" => {
                let state = self.state.load();
                let mut empty: Vec<&str> = state
                    .pools
                    .values()
                    .filter(|p| !p.backends.iter().any(|b| b.is_healthy(now)))
                    .map(|p| &*p.model)
                    .collect();
                empty.sort_unstable();
                if empty.is_empty() {
                    (StatusCode::OK, "text/plain", b"ready\n".to_vec())
                } else {
                    let body = serde_json::json!({ "ready": false, "pools_without_healthy_backend": empty });
                    (StatusCode::SERVICE_UNAVAILABLE, JSON, body.to_string().into_bytes())
                }
            }
            "/metrics" => {
                let state = self.state.load();
                self.metrics.publish_pools(state.pools.values().map(|p| {
                    let healthy = p.backends.iter().filter(|b| b.is_healthy(now)).count();
                    (&*p.model, p.backends.len(), healthy)
                }));
                (
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.metrics.render().into_bytes(),
                )
            }
            "/admin/config" => (
                StatusCode::OK,
                JSON,
                self.reloader.status_json().to_string().into_bytes(),
            ),
            "/admin/backends" => {
                let state = self.state.load();
                let backends: Vec<serde_json::Value> = state
                    .config
                    .pools
                    .iter()
                    .flat_map(|p| {
                        let pool = state.pool(&p.model).expect("pool built from config");
                        pool.backends.iter().map(move |b| {
                            let mut v = b.admin_json(now);
                            v["pool"] = serde_json::Value::from(&*p.model);
                            let ttft = b.state.ttft.view(now).quality;
                            v["ttft_samples"] = serde_json::Value::from(ttft.samples);
                            v["ttft_rel_error"] = serde_json::Value::from(ttft.rel_error);
                            v
                        })
                    })
                    .collect();
                let body = serde_json::json!({
                    "backends": backends,
                    "recent_decisions": self.decisions.to_json(),
                });
                (StatusCode::OK, JSON, body.to_string().into_bytes())
            }
            _ => (
                StatusCode::NOT_FOUND,
                JSON,
                br#"{"error":"not found: admin serves GET / (status page), /healthz, /readyz, /metrics, /admin/backends, /admin/config and POST /admin/reload, /admin/tokenize"}"#
                    .to_vec(),
            ),
        }
    }
}

/// Largest body `POST /admin/tokenize` reads.
const MAX_TOKENIZE_BODY: usize = 16 << 20;

async fn read_body(session: &mut ServerSession) -> Result<bytes::Bytes, String> {
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = session
        .read_request_body()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
    {
        if body.len() + chunk.len() > MAX_TOKENIZE_BODY {
            return Err(format!("body over {MAX_TOKENIZE_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

impl Admin {
    /// `POST /admin/tokenize`: the tokens routing would count for `body`, an OpenAI request to
    /// the endpoint in `query` (`endpoint=chat` by default).
    async fn tokenize(
        &self,
        query: &str,
        body: bytes::Bytes,
    ) -> (StatusCode, &'static str, Vec<u8>) {
        let bad = |msg: String| {
            let v = serde_json::json!({ "error": msg });
            (StatusCode::BAD_REQUEST, JSON, v.to_string().into_bytes())
        };
        let endpoint = match query
            .split('&')
            .find_map(|kv| kv.strip_prefix("endpoint="))
            .unwrap_or("chat")
        {
            "chat" => Endpoint::ChatCompletions,
            "completions" => Endpoint::Completions,
            "embeddings" => Endpoint::Embeddings,
            other => {
                return bad(format!(
                    "endpoint `{other}`: use chat, completions or embeddings"
                ))
            }
        };
        let features = match parse_request(endpoint, &body, None) {
            Ok(f) => f,
            Err(e) => return bad(e.to_string()),
        };
        let state = self.state.load();
        let Some(pool) = state.pool(&features.model) else {
            let v = serde_json::json!({ "error": format!("no pool serves model `{}`", features.model) });
            return (StatusCode::NOT_FOUND, JSON, v.to_string().into_bytes());
        };
        let mut v = serde_json::json!({
            "model": features.model,
            "pool": &*pool.model,
            "estimated_prompt_tokens": features.prompt_tokens,
            "token_ratio": pool.token_ratio.ratio(),
            "tokenizer": null,
        });
        if let Some(tok) = pool.tokenizer.clone() {
            v["tokenizer"] = serde_json::Value::from(tok.path().display().to_string());
            v["chat_template"] = serde_json::Value::from(tok.chat_template_source());
            let ids = tokio::task::spawn_blocking(move || tok.prompt_ids(endpoint, &body)).await;
            match ids {
                Ok(Ok(Some(ids))) => {
                    v["result"] = "exact".into();
                    v["prompt_tokens"] = ids.len().into();
                    v["full_blocks"] = (ids.len() / pronto_core::tokens::BLOCK_TOKENS).into();
                    v["token_ids"] = ids.into();
                }
                Ok(Ok(None)) => v["result"] = "skipped".into(),
                Ok(Err(e)) => {
                    v["result"] = e.label().into();
                    v["error"] = e.to_string().into();
                }
                Err(e) => {
                    v["result"] = "error".into();
                    v["error"] = e.to_string().into();
                }
            }
        } else {
            v["result"] = "estimate".into();
        }
        (StatusCode::OK, JSON, v.to_string().into_bytes())
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        let open_path = path == "/healthz" || path == "/readyz";
        let admin = self.state.load().config.admin.clone();
        let allowed =
            open_path || crate::edge::auth::admin_allowed(&admin, &session.req_header().headers);
        if path == "/" && method == http::Method::GET {
            let query = session.req_header().uri.query();
            let (status, body) = status::respond(&admin, allowed, query);
            let mut r = Response::builder()
                .status(status)
                .header("content-type", "text/html; charset=utf-8")
                .header("content-length", body.len());
            for (k, v) in status::HEADERS {
                r = r.header(k, v);
            }
            return r.body(body).expect("valid response");
        }
        let refused = (method == http::Method::POST)
            .then(|| {
                let req = session.req_header();
                let authority = req.uri.authority().map(|a| a.as_str());
                guard::check_post(&req.headers, authority, &admin.allowed_hosts).err()
            })
            .flatten();
        let (status, content_type, body) = if let Some(why) = refused {
            (
                StatusCode::FORBIDDEN,
                JSON,
                serde_json::json!({ "error": why }).to_string().into_bytes(),
            )
        } else if !allowed {
            (
                StatusCode::UNAUTHORIZED,
                JSON,
                br#"{"error":"the admin listener needs `Authorization: Bearer <admin.token>`"}"#
                    .to_vec(),
            )
        } else if path == "/admin/tokenize" {
            if method == http::Method::POST {
                let query = session.req_header().uri.query().unwrap_or("").to_string();
                match read_body(session).await {
                    Ok(body) => self.tokenize(&query, body).await,
                    Err(msg) => (
                        StatusCode::BAD_REQUEST,
                        JSON,
                        serde_json::json!({ "error": msg }).to_string().into_bytes(),
                    ),
                }
            } else {
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    JSON,
                    br#"{"error":"use POST /admin/tokenize"}"#.to_vec(),
                )
            }
        } else if path == "/admin/reload" {
            if method == http::Method::POST {
                self.reload().await
            } else {
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    JSON,
                    br#"{"error":"use POST /admin/reload"}"#.to_vec(),
                )
            }
        } else {
            self.route(&method, &path)
        };
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-length", body.len())
            .body(body)
            .expect("valid response")
    }
}
