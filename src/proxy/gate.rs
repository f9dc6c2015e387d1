//! The edge checks on the request path: authentication and the key's request limits before
//! the body is read; authorization and token / route limits once the request is parsed and
//! matched to a route. The rules live in [`crate::auth`] and [`crate::ratelimit`]; this file
//! only applies them in order and carries what they grant until the request ends.

use std::sync::Arc;
use std::time::Instant;

use pingora_core::protocols::http::ServerSession;

use super::Proxy;
use crate::auth;
use crate::config::edge::ApiKey;
use crate::config::Route;
use crate::error::GatewayError;
use crate::gateway::GatewayState;
use crate::ratelimit::{Grant, Scope, TokenCharge};
use crate::sse::Usage;

/// What the edge checks granted one request; dropping it releases its concurrency slots.
#[derive(Default)]
pub(super) struct Pass<'c> {
    /// The authenticated key (`None` when `auth:` is not configured).
    key: Option<&'c ApiKey>,
    /// Concurrency permits and request-bucket headers, key first.
    grants: Vec<Grant>,
    /// Token charges to correct from `usage`.
    charges: Vec<TokenCharge>,
    /// `x-ratelimit-*-tokens` headers of the key (else of the route).
    token_headers: Vec<(&'static str, String)>,
}

impl Pass<'_> {
    /// The `x-ratelimit-*` headers for the response: the key's buckets, else the route's.
    pub(super) fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<_> = self
            .grants
            .iter()
            .find(|g| !g.headers.is_empty())
            .map(|g| g.headers.clone())
            .unwrap_or_default();
        out.extend(self.token_headers.iter().cloned());
        out
    }

    /// `route` with the key's priority class when the route names none.
    pub(super) fn keyed_route(&self, route: Option<&Route>) -> Option<Route> {
        let route = route?;
        let (priority, rank) = self.key?.priority.clone()?;
        (!route.priority_explicit).then(|| Route {
            priority,
            rank,
            ..route.clone()
        })
    }
}

impl Proxy {
    /// Authenticate (401) and take the key's concurrency slot and request (429).
    pub(super) fn gate_key<'c>(
        &self,
        session: &ServerSession,
        state: &'c GatewayState,
    ) -> Result<Pass<'c>, GatewayError> {
        let Some(keys) = &state.config.auth else {
            return Ok(Pass::default());
        };
        let key = auth::authenticate(keys, &session.req_header().headers)?;
        let mut pass = Pass {
            key: Some(key),
            ..Pass::default()
        };
        if let Some(limit) = state.config.rate_limits.for_key(&key.name) {
            let scope = Scope::Key(Arc::clone(&key.name));
            pass.grants
                .push(self.limiter.request(&scope, limit, Instant::now())?);
        }
        Ok(pass)
    }

    /// Authorize the key for `model` / `route` (403), then take the route's slot and request
    /// and charge `tokens` to the key's and the route's token buckets (429).
    pub(super) fn gate_route(
        &self,
        pass: &mut Pass<'_>,
        state: &GatewayState,
        route: Option<&Route>,
        model: &str,
        tokens: u32,
    ) -> Result<(), GatewayError> {
        if let Some(key) = pass.key {
            auth::authorize(key, model, route)?;
        }
        let now = Instant::now();
        let limits = &state.config.rate_limits;
        let route_limit =
            route.and_then(|r| Some((Scope::Route(r.name.clone()), limits.routes.get(&r.name)?)));
        if let Some((scope, limit)) = &route_limit {
            pass.grants.push(self.limiter.request(scope, limit, now)?);
        }
        let key_limit = pass
            .key
            .and_then(|k| Some((Scope::Key(k.name.clone()), limits.for_key(&k.name)?)));
        for (scope, limit) in key_limit.iter().chain(&route_limit) {
            let mut headers = Vec::new();
            if let Some(c) = self
                .limiter
                .tokens(scope, limit, tokens, now, &mut headers)?
            {
                pass.charges.push(c);
            }
            if pass.token_headers.is_empty() {
                pass.token_headers = headers;
            }
        }
        Ok(())
    }

    /// Correct the token charges from the response's `usage`.
    pub(super) fn settle(&self, pass: &mut Pass<'_>, usage: &Usage) {
        let used = usage.prompt_tokens.saturating_add(usage.completion_tokens);
        let now = Instant::now();
        for c in pass.charges.drain(..) {
            self.limiter.settle(c, used, now);
        }
    }
}
