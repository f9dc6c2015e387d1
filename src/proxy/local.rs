//! Answers the gateway gives itself on the client listener, without a backend:
//!
//! - `GET /health`: 200 `{"status":"ok"}` when every pool has a backend eligible for routing,
//!   else 503 `{"status":"unavailable"}` — what load balancers and peer routers probe on the
//!   port they send traffic to. Never needs a key, so it says only up or down: which pools are
//!   down (models a caller may not be allowed to use) is the admin listener's `/readyz`.
//! - `GET /v1/models` and `GET /v1/models/{id}` ([`super::models`]): authenticated like
//!   inference (401 without a valid key when `auth:` is on), listing only what the key may use,
//!   and charged to no rate limit.

use std::time::Instant;

use bytes::Bytes;
use pingora_core::protocols::http::ServerSession;

use super::access::Access;
use super::lifecycle::Failure;
use super::models;
use super::{request_id, respond, Proxy};
use crate::edge::auth;
use crate::error::GatewayError;
use crate::state::GatewayState;

impl Proxy {
    /// `GET /health`.
    pub(super) async fn health(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        access: &mut Access,
    ) {
        let now = Instant::now();
        let up = state
            .pools
            .values()
            .all(|p| p.backends.iter().any(|b| b.is_healthy(now)));
        let (status, body) = if up {
            (200, serde_json::json!({ "status": "ok" }))
        } else {
            (503, serde_json::json!({ "status": "unavailable" }))
        };
        self.answer(session, access, status, body).await;
    }

    /// `GET /v1/models` (`id: None`) or `GET /v1/models/{id}`.
    pub(super) async fn models(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        access: &mut Access,
        id: Option<&str>,
    ) -> Result<(), Failure> {
        let key = match &state.config.auth {
            Some(keys) => Some(
                auth::authenticate(keys, &session.req_header().headers).map_err(|e| (None, e))?,
            ),
            None => None,
        };
        access.key = key.map(|k| k.name.clone());
        let body = match id {
            None => models::list_json(state, key),
            Some(id) => models::get_json(state, key, id).ok_or_else(|| {
                (
                    None,
                    GatewayError::ModelNotFound {
                        model: id.to_string(),
                    },
                )
            })?,
        };
        access.model = id.map(str::to_string);
        self.answer(session, access, 200, body).await;
        Ok(())
    }

    async fn answer(
        &self,
        session: &mut ServerSession,
        access: &mut Access,
        status: u16,
        body: serde_json::Value,
    ) {
        let body = Bytes::from(body.to_string());
        access.status = status;
        access.response_bytes = body.len() as u64;
        let headers = [(request_id::HEADER, access.id.clone())];
        let _ = respond::json(session, status, body, &headers).await;
    }
}
