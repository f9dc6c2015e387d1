//! SLO admission on the request path: between the route match and the routing decision.
//!
//! The rules (miss conditions, actions, queue order, deadlines) are documented in
//! [`crate::edge::admission`]; this file applies them to one request and waits in the queue, racing
//! the wait against the client hanging up.

use std::time::Instant;

use pingora_core::protocols::http::ServerSession;

use super::Edge;
use super::{Admitting, Failure};
use crate::config::{Route, Slo, SloAction};
use crate::edge::admission::Departure;
use crate::error::GatewayError;
use crate::state::{GatewayState, Pool, Routed};
use pronto_core::admission::ShedReason;
use pronto_core::ids::BackendId;
use pronto_core::request::RequestFeatures;

/// Longest `Retry-After` suggested for an SLO miss, seconds.
const MAX_RETRY_AFTER_S: u32 = 60;
/// How often a queued request looks whether its pool still has a backend up.
const OUTAGE_CHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// The 503 of a pool with no backend up (`Retry-After` from [`GatewayError::retry_after`]).
fn no_backend(pool: &Pool) -> Failure {
    (
        Some(pool.model.clone()),
        GatewayError::NoBackend {
            model: pool.model.to_string(),
        },
    )
}

impl Edge {
    /// Apply `route`'s admission control: the pool to send the request to (its own or the
    /// fallback), the guard that marks its end on that pool, and the routing decision admission
    /// judged (the first attempt uses it: one decision, one prediction) — or a 429 (backends
    /// up, the SLO cannot be met), a 503 `no_backend_available` at once (no backend of the pool
    /// is up: healthy, not ejected; also for a request already queued when the last goes
    /// down, within [`OUTAGE_CHECK`]), or a client-gone error. A request without a route, or whose route has no SLO, passes at once
    /// (and is routed by the attempt). `route` is the request's (ranked by its key's priority);
    /// `pool`, `features` and `excluded` are the parsed request's (its excluded backends do not
    /// serve its model).
    pub(crate) async fn admit<'s>(
        &'s self,
        session: &mut ServerSession,
        state: &'s GatewayState,
        (pool, features, excluded): (&'s Pool, &RequestFeatures, &[BackendId]),
        route: Option<Admitting<'s>>,
        arrived: Instant,
    ) -> Result<(&'s Pool, Departure<'s>, Option<Routed>), Failure> {
        let Some((route, slo)) = route.and_then(|r| Some((r, r.route.slo.as_ref()?))) else {
            return Ok((pool, self.admission.departure(pool.model.clone()), None));
        };
        // An outage is not an overload: with no backend up, waiting cannot help and a 429
        // would send clients' SDKs retrying. A fallback pool may still serve it.
        if !matches!(slo.on_miss, SloAction::Fallback(_)) && !pool.any_up(Instant::now(), excluded)
        {
            return Err(no_backend(pool));
        }
        let (miss, routed) =
            self.slo_check(state, pool, Some(route), features, excluded, slo, true);
        let Some((reason, predicted)) = miss else {
            return Ok((pool, self.admission.departure(pool.model.clone()), routed));
        };
        match &slo.on_miss {
            SloAction::Shed => Err(self.shed(pool, route.route, slo, reason, predicted)),
            SloAction::Fallback(name) => match state.pool(name) {
                Some(fallback) => {
                    tracing::debug!(route = %route.route.name, reason = reason.as_str(), fallback = %name, "SLO miss: fallback");
                    Ok((
                        fallback,
                        self.admission.departure(fallback.model.clone()),
                        None,
                    ))
                }
                // Validation guarantees the pool exists in the same config.
                None => Err((
                    Some(pool.model.clone()),
                    GatewayError::Internal(format!("fallback pool `{name}` is missing")),
                )),
            },
            SloAction::Queue => {
                self.wait_in_queue(
                    session, state, pool, route, slo, features, excluded, arrived,
                )
                .await
            }
        }
    }

    /// Route `features` on `pool` now and judge the decision against `slo`: why it cannot be
    /// served in time (with the decision's prediction; infinite when no backend is eligible),
    /// or `None` when it can; and the decision itself. `excluded` backends are not
    /// considered.
    #[allow(clippy::too_many_arguments)]
    fn slo_check(
        &self,
        state: &GatewayState,
        pool: &Pool,
        route: Option<Admitting<'_>>,
        features: &RequestFeatures,
        excluded: &[BackendId],
        slo: &Slo,
        check_queue: bool,
    ) -> (Option<(ShedReason, f64)>, Option<Routed>) {
        let policy = state.policy_for(pool, route.map(|r| r.id));
        let routed = pool
            .route(
                &**policy,
                features,
                Instant::now(),
                excluded,
                state.config.explain_headers,
            )
            .ok();
        // The rule is the core's, shared with the evaluator ([`pronto_core::admission::miss`]).
        let rank = route.map_or(0, |r| r.rank);
        let ahead = check_queue && self.admission.waiting_ahead(&pool.model, rank);
        let decided = routed.as_ref().map(|r| r.decision.predicted_ttft_s);
        let miss = pronto_core::admission::miss(ahead, decided, slo.ttft.as_secs_f64());
        (miss, routed)
    }

    /// Count and build the 429 for a shed request.
    fn shed(
        &self,
        pool: &Pool,
        route: &Route,
        slo: &Slo,
        reason: ShedReason,
        predicted: f64,
    ) -> Failure {
        self.metrics
            .admission_sheds_total
            .with_label_values(&[&route.name, reason.as_str()])
            .inc();
        // For a prediction, the excess over the SLO is about how long the backlog takes to
        // drain; otherwise one second.
        let excess = predicted - slo.ttft.as_secs_f64();
        let retry_after_s = if excess.is_finite() {
            (excess.ceil() as u32).clamp(1, MAX_RETRY_AFTER_S)
        } else {
            1
        };
        (
            Some(pool.model.clone()),
            GatewayError::Overloaded {
                route: route.name.to_string(),
                reason: reason.as_str(),
                retry_after_s,
            },
        )
    }

    /// Queue the request until it is the head of its pool's queue and the SLO can be met, or
    /// its deadline (arrival + SLO) passes, or its client hangs up.
    #[allow(clippy::too_many_arguments)]
    async fn wait_in_queue<'s>(
        &'s self,
        session: &mut ServerSession,
        state: &GatewayState,
        pool: &'s Pool,
        route: Admitting<'_>,
        slo: &Slo,
        features: &RequestFeatures,
        excluded: &[BackendId],
        arrived: Instant,
    ) -> Result<(&'s Pool, Departure<'s>, Option<Routed>), Failure> {
        let deadline = arrived + slo.ttft;
        let Some(ticket) = self.admission.enqueue(
            pool.model.clone(),
            route.route.name.clone(),
            route.rank,
            deadline,
            state.config.admission.queue_size,
        ) else {
            return Err(self.shed(pool, route.route, slo, ShedReason::QueueFull, f64::NAN));
        };
        loop {
            let deadline_passed = tokio::select! {
                _ = ticket.woken() => false,
                _ = tokio::time::sleep_until(deadline.into()) => true,
                // Every backend went down while it waited: an outage, answered at once.
                _ = tokio::time::sleep(OUTAGE_CHECK) => {
                    if pool.any_up(Instant::now(), excluded) {
                        continue;
                    }
                    drop(ticket);
                    return Err(no_backend(pool));
                }
                _ = session.read_body_or_idle(true) => {
                    // Any outcome means the client went away (or broke protocol).
                    self.metrics
                        .client_disconnects_total
                        .with_label_values(&[&pool.model])
                        .inc();
                    return Err((Some(pool.model.clone()), GatewayError::ClientClosed));
                }
            };
            if deadline_passed {
                // The SLO is lost either way: send late if a backend is free, else shed.
                let (_, routed) =
                    self.slo_check(state, pool, Some(route), features, excluded, slo, false);
                if routed.is_some() {
                    ticket.dispatch();
                    return Ok((pool, self.admission.departure(pool.model.clone()), routed));
                }
                drop(ticket);
                if !pool.any_up(Instant::now(), excluded) {
                    return Err(no_backend(pool));
                }
                return Err(self.shed(pool, route.route, slo, ShedReason::Deadline, f64::NAN));
            }
            if ticket.claim() {
                let (miss, routed) =
                    self.slo_check(state, pool, Some(route), features, excluded, slo, false);
                if miss.is_none() {
                    ticket.dispatch();
                    return Ok((pool, self.admission.departure(pool.model.clone()), routed));
                }
            }
        }
    }
}
