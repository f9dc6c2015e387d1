//! The edge: what a request must pass before it is routed. Framing and the head deadline
//! (the request head read in time and well-formed), authentication and authorization
//! ([`auth`]), rate limits ([`ratelimit`]), and SLO admission ([`admission`], driven by
//! `admit`), with the gate that applies them per request (`gate`).

pub mod admission;
pub(crate) mod admit;
pub mod auth;
pub mod framing;
pub(crate) mod gate;
pub mod head_deadline;
pub mod ratelimit;

use std::sync::Arc;
use std::time::Instant;

use crate::config::Route;
use crate::error::GatewayError;
use crate::telemetry::Metrics;
use pronto_core::ids::RouteId;

/// A failed request: the pool it reached (for the metric label) and the client's error.
pub type Failure = (Option<Arc<str>>, GatewayError);

/// A matched route as admission sees it.
#[derive(Debug, Clone, Copy)]
pub struct Admitting<'s> {
    /// Its id, for its policy ([`crate::state::GatewayState::policy_for`]).
    pub id: RouteId,
    /// Its settings.
    pub route: &'s Route,
    /// The rank its request queues at: the key's priority class unless the route names its
    /// own (`Pass::rank`).
    pub rank: u32,
}

/// The edge's state that outlives reloads: the SLO admission queue (requests queued under an
/// old config keep their place) and the per-key and per-route rate limiters. The gate
/// (`gate_key`, `gate_route`, `settle`) and admission (`admit`) are its methods.
pub struct Edge {
    metrics: Metrics,
    admission: admission::Admission,
    limiter: ratelimit::RateLimiter,
}

impl Edge {
    /// Empty queues and full buckets, as of `now`.
    pub fn new(metrics: Metrics, now: Instant) -> Edge {
        Edge {
            admission: admission::Admission::new(metrics.clone()),
            metrics,
            limiter: ratelimit::RateLimiter::new(now),
        }
    }
}
