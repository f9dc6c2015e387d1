//! The admin listener: liveness, readiness, metrics and backend state.
//!
//! Binds to loopback unless configured otherwise. Routes:
//! `GET /healthz` (the process is up), `GET /readyz` (200 when every pool has a healthy
//! backend, else 503 with the pools that have none), `GET /metrics` (Prometheus text),
//! `GET /admin/backends` (JSON state of every backend).

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;

use crate::gateway::GatewayState;
use crate::telemetry::Metrics;

/// The admin HTTP app.
pub struct Admin {
    state: Arc<ArcSwap<GatewayState>>,
    metrics: Metrics,
}

impl Admin {
    /// An admin app over the given state.
    pub fn new(state: Arc<ArcSwap<GatewayState>>, metrics: Metrics) -> Admin {
        Admin { state, metrics }
    }

    /// Status and body for `method path`.
    pub fn route(&self, method: &http::Method, path: &str) -> (StatusCode, &'static str, Vec<u8>) {
        const JSON: &str = "application/json";
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
            "/metrics" => (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                self.metrics.render().into_bytes(),
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
                            v
                        })
                    })
                    .collect();
                let body = serde_json::json!({ "backends": backends });
                (StatusCode::OK, JSON, body.to_string().into_bytes())
            }
            _ => (
                StatusCode::NOT_FOUND,
                JSON,
                br#"{"error":"not found: admin serves /healthz, /readyz, /metrics, /admin/backends"}"#
                    .to_vec(),
            ),
        }
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        let (status, content_type, body) = self.route(&method, &path);
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-length", body.len())
            .body(body)
            .expect("valid response")
    }
}
