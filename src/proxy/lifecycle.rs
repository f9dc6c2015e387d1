//! One inference request, as named steps:
//!
//! ```text
//! authenticate → read → parse → match route → tokenize → authorize → admit
//!   → [route → dispatch → attempt]* → relay (observe at the first token) → finish
//! ```
//!
//! Each step is a method that returns what the next needs, or the [`GatewayError`] the client
//! gets. The attempt loop and its steps (route, race plan, repair watch, dispatch, attempt,
//! failure bookkeeping) are [`super::attempts`]'s, and what follows a commit (commit, explain,
//! relay, finish) [`super::commit`]'s: nothing has reached the client until an attempt
//! commits.

use std::time::Instant;

use bytes::Bytes;
use pingora_core::protocols::http::ServerSession;

use super::access::Access;
use super::{tokenize, Proxy};
use crate::config::route::RouteObjective;
use crate::config::Route;
use crate::edge::gate::Pass;
use crate::edge::Admitting;
use crate::error::GatewayError;
use crate::state::{GatewayState, Pool, Routed, Target};
use pronto_core::ids::{BackendId, RouteId};
use pronto_core::request::{parse_request, Endpoint, RequestFeatures};
use pronto_core::slo::Objective;

pub(super) use crate::edge::Failure;

/// A parsed request matched to its pool.
pub(super) struct Parsed<'s> {
    pub features: RequestFeatures,
    pub pool: &'s Pool,
    pub route: Option<&'s Route>,
    /// The matched route's id: what its policy is found by.
    pub route_id: Option<RouteId>,
    /// Backends of the pool that do not serve the request's model.
    pub excluded: &'s [BackendId],
    /// Prompt tokens as Pronto counted them, before the pool's learnt engine ratio.
    pub own_tokens: u32,
}

impl Proxy {
    /// Read, parse, route, forward and relay one inference request.
    pub(super) async fn proxy(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        endpoint: Endpoint,
        access: &mut Access,
        arrived: Instant,
    ) -> Result<(), Failure> {
        let mut pass = self.edge.gate_key(session, state).map_err(|e| (None, e))?;
        access.key = pass.key_name().cloned();
        // The body's share of the buffer budget lives as long as the request.
        let mut budget = self.budget.reservation(state.config.limits.buffer_budget());
        let body = self.read(session, state, &mut budget).await?;
        access.request_bytes = Some(body.len() as u64);
        let mut parsed = self
            .parse(session, state, endpoint, &body, pass.key, access)
            .await?;
        self.authorize(&mut pass, state, &parsed)?;
        let admitting = parsed
            .route
            .zip(parsed.route_id)
            .map(|(route, id)| Admitting {
                id,
                route,
                rank: pass.rank(route),
            });
        let (first_pool, route, route_id) = (parsed.pool, parsed.route, parsed.route_id);
        let (pool, _departure, admitted) = self
            .edge
            .admit(
                session,
                state,
                (parsed.pool, &parsed.features, parsed.excluded),
                admitting,
                arrived,
            )
            .await?;
        if !tokenize::same_tokenizer(first_pool, pool) {
            // A fallback pool that tokenizes differently: its tokens, its block hashes.
            parsed = self.parse_for(session, endpoint, &body, pool).await?;
        }
        parsed.features.prompt_tokens = pool.token_ratio.scale(parsed.own_tokens);
        let parsed = Parsed {
            pool,
            route,
            route_id,
            ..parsed
        };
        access.pool = Some(pool.model.clone());
        self.attempts(
            session, state, &mut pass, &parsed, &body, admitted, access, arrived,
        )
        .await
    }

    /// Read the whole body (limits and deadlines from the config), charged to `budget`.
    async fn read(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        budget: &mut super::budget::Reservation<'_>,
    ) -> Result<Bytes, Failure> {
        let limits = &state.config.limits;
        let body_limits = super::body::BodyLimits {
            max_bytes: limits.max_body_bytes,
            idle: limits.idle_timeout,
            total: limits.body_timeout,
        };
        let r = super::body::read_body(session, body_limits, budget).await;
        self.metrics
            .buffered_request_bytes
            .set(self.budget.used() as i64);
        if matches!(r, Err(GatewayError::Busy(_))) {
            self.metrics
                .capacity_rejections_total
                .with_label_values(&["buffered_bytes"])
                .inc();
        }
        r.map_err(|e| (None, e))
    }

    /// Parse the body, match its route and pool, and count its tokens with the pool's
    /// tokenizer (in the engine's terms: the pool's learnt ratio applied). A model no pool
    /// serves is a 404 only for a key that could use it: a restricted key learns nothing of
    /// what exists outside its models and routes (403).
    async fn parse<'s>(
        &self,
        session: &ServerSession,
        state: &'s GatewayState,
        endpoint: Endpoint,
        body: &Bytes,
        key: Option<&crate::config::edge::ApiKey>,
        access: &mut Access,
    ) -> Result<Parsed<'s>, Failure> {
        let mut features = parse_off_thread(endpoint, body, session_key(session)).await?;
        access.model = Some(features.model.clone());
        access.stream = Some(features.stream);
        let header = session.req_header();
        let Some(Target {
            pool,
            route,
            excluded,
        }) = state.route(&features.model, header.uri.path(), &header.headers)
        else {
            if let Some(key) = key {
                crate::edge::auth::authorize(key, &features.model, None).map_err(|e| (None, e))?;
            }
            return Err((
                None,
                GatewayError::ModelNotFound {
                    model: features.model.clone(),
                },
            ));
        };
        access.pool = Some(pool.model.clone());
        let (route_id, route) = (route.map(|(id, _)| id), route.map(|(_, r)| r));
        access.route = route.map(|r| r.name.clone());
        // The route's objectives travel with the request: policies see them.
        if let Some(r) = route {
            features.slo = pronto_core::slo::SloTargets {
                ttft_s: r.slo.as_ref().map(|s| s.ttft.as_secs_f64()),
                tpot_s: r.tpot_slo.map(|d| d.as_secs_f64()),
            };
            if r.objective == RouteObjective::Ttfa {
                features.objective = Objective::Ttfa {
                    reasoning_tokens: pool.reasoning.expected(features.reasoning_effort),
                };
            }
        }
        tokenize::apply(pool, endpoint, body, &mut features, &self.metrics).await;
        let own_tokens = features.prompt_tokens;
        // Costs are in the engine's tokens: correct our count by what `usage` taught the pool.
        features.prompt_tokens = pool.token_ratio.scale(own_tokens);
        Ok(Parsed {
            features,
            pool,
            route,
            route_id,
            excluded,
            own_tokens,
        })
    }

    /// The features of `body` for `pool` (its tokenizer, if any).
    async fn parse_for<'s>(
        &self,
        session: &ServerSession,
        endpoint: Endpoint,
        body: &Bytes,
        pool: &'s Pool,
    ) -> Result<Parsed<'s>, Failure> {
        let mut features = parse_off_thread(endpoint, body, session_key(session)).await?;
        tokenize::apply(pool, endpoint, body, &mut features, &self.metrics).await;
        let own_tokens = features.prompt_tokens;
        Ok(Parsed {
            features,
            pool,
            route: None,
            route_id: None,
            excluded: &[],
            own_tokens,
        })
    }

    /// The key may use this model and route (403); the route's and the key's rate limits
    /// (429).
    fn authorize(
        &self,
        pass: &mut Pass<'_>,
        state: &GatewayState,
        parsed: &Parsed<'_>,
    ) -> Result<(), Failure> {
        self.edge
            .gate_route(
                pass,
                state,
                parsed.route,
                &parsed.features.model,
                parsed.features.prompt_tokens,
            )
            .map_err(|e| (Some(parsed.pool.model.clone()), e))
    }
}

/// Whether a first-answer timeout says the backend is unwell (and counts toward ejecting it),
/// rather than being explained by the request itself: a non-streamed request's answer is its
/// whole generation (a long one is not a fault); a stream that waited behind queued work — the
/// decision saw other prefills outstanding or a waiting engine queue, or predicted at least
/// half the deadline — timed out on the overload that queue is, not on a broken backend. Only
/// a backend that was idle, predicted fast, and still produced nothing is at fault.
pub(super) fn timeout_is_backend_fault(
    stream: bool,
    routed: &Routed,
    deadline: std::time::Duration,
) -> bool {
    let v = &routed.chosen;
    let queued = v.outstanding_prefill_tokens > 0
        || v.engine.is_some_and(|e| e.waiting > 0.0)
        || v.running_decodes > 0
            && v.kv_capacity_tokens
                .is_some_and(|c| v.kv_reserved_tokens >= c);
    let predicted_slow = routed
        .decision
        .predicted_ttft_s
        .is_some_and(|p| p >= deadline.as_secs_f64() / 2.0);
    stream && !queued && !predicted_slow
}

/// At most this many of a prompt's blocks are matched against the prefix index and recorded
/// in it (2^15 blocks of 16 tokens: 512k tokens, beyond any engine's context). Routing work
/// and index growth stay bounded whatever a client sends; a longer prompt is matched on its
/// first blocks, and the engine decides whether it fits.
pub const MAX_ROUTED_BLOCKS: usize = 1 << 15;

/// Bodies larger than this are parsed and hashed on tokio's blocking pool: a 10 MiB prompt
/// takes tens of milliseconds to parse, which on a proxy thread would stall every other
/// request that thread serves. Smaller ones parse inline (cheaper than the hand-off).
pub const INLINE_PARSE_MAX_BYTES: usize = 256 * 1024;

/// [`parse_request`], off the proxy thread for a large body.
pub(super) async fn parse_off_thread(
    endpoint: Endpoint,
    body: &Bytes,
    session: Option<&str>,
) -> Result<pronto_core::request::RequestFeatures, Failure> {
    let parsed = if body.len() <= INLINE_PARSE_MAX_BYTES {
        parse_request(endpoint, body, session).map_err(|e| e.to_string())
    } else {
        let (body, session) = (body.clone(), session.map(str::to_string));
        tokio::task::spawn_blocking(move || {
            parse_request(endpoint, &body, session.as_deref()).map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(format!("parser task failed: {e}")))
    };
    let mut features = parsed.map_err(|e| (None, GatewayError::BadRequest(e)))?;
    features.block_hashes.truncate(MAX_ROUTED_BLOCKS);
    Ok(features)
}

pub(super) fn session_key(session: &ServerSession) -> Option<&str> {
    session
        .get_header("x-session-id")
        .and_then(|v| v.to_str().ok())
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
