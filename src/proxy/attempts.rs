//! The attempt loop of one inference request, as the steps `docs/architecture.md` names:
//!
//! ```text
//! loop {
//!   route (or take admission's decision) → race plan → repair watch → dispatch → attempt
//!   → failed: failure bookkeeping, then retry or give up
//! }
//! → committed: commit (response head, explain headers) → relay → finish (→ migrate)
//! ```
//!
//! Each step is a method of [`Proxy`] over one [`Request`] (what every attempt of the request
//! shares); what follows the commit is [`super::commit`]'s. Nothing reaches the client until an
//! attempt commits; the retry budget is [`super::retry`]'s.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use pingora_core::protocols::http::ServerSession;
use pingora_http::RequestHeader;

use super::access::Access;
use super::keepalive::KeepAlive;
use super::lifecycle::{timeout_is_backend_fault, Failure, Parsed};
use super::race;
use super::repair;
use super::retry::{Next, Retries};
use super::upstream::{attempt, client_key_is_ours, upstream_request_head, Attempt, Deadlines};
use super::Proxy;
use crate::edge::gate::Pass;
use crate::error::GatewayError;
use crate::state::{Attempted, GatewayState, Routed};
use crate::telemetry::RetryReason;
use pronto_core::cluster::repair::MAX_MOVES;
use pronto_core::ids::BackendId;
use pronto_core::routing::Policy;

/// What every attempt of one request shares.
pub(super) struct Request<'r, 's> {
    pub state: &'s GatewayState,
    pub parsed: &'r Parsed<'s>,
    /// The client's request body.
    pub body: &'r Bytes,
    /// The policy that routes it ([`GatewayState::policy_for`]).
    pub policy: &'s Arc<dyn Policy>,
    pub deadlines: Deadlines,
    pub max_retries: u32,
    pub arrived: Instant,
}

impl<'r, 's> Request<'r, 's> {
    /// The request's policy, deadlines and retry budget: the route's where it sets them, else
    /// the config's.
    fn new(
        state: &'s GatewayState,
        parsed: &'r Parsed<'s>,
        body: &'r Bytes,
        arrived: Instant,
    ) -> Request<'r, 's> {
        let (route, limits) = (parsed.route, &state.config.limits);
        Request {
            state,
            parsed,
            body,
            policy: state.policy_for(parsed.pool, parsed.route_id),
            deadlines: Deadlines {
                first_token: route
                    .and_then(|r| r.first_token_timeout)
                    .unwrap_or(limits.first_token_timeout),
                total: limits.request_timeout,
                idle: route
                    .and_then(|r| r.idle_timeout)
                    .unwrap_or(limits.idle_timeout),
            },
            max_retries: route
                .and_then(|r| r.max_retries)
                .unwrap_or(state.config.retry.max_retries),
            arrived,
        }
    }

    /// The client's error, labelled with the request's pool.
    pub(super) fn fail(&self, e: GatewayError) -> Failure {
        (Some(self.parsed.pool.model.clone()), e)
    }

    /// The 503 when no backend is left to try.
    fn no_backend(&self) -> Failure {
        self.fail(GatewayError::NoBackend {
            model: self.parsed.pool.model.to_string(),
        })
    }
}

/// What waiting on one dispatched attempt (alone, raced, or watched by collision repair)
/// came to. Matched at once and never stored: the large variant costs no allocation.
#[allow(clippy::large_enum_variant)]
enum Waited {
    /// Its outcome, on the entrant whose outcome is final; `Some(raced)` when it ran as a
    /// race (what the access log records of it).
    Done(Routed, Attempted, Attempt, Option<Option<race::Raced>>),
    /// Collision repair moves the request: route it again as decided here.
    Moves(Box<Routed>),
}

/// One dispatched attempt, ready to be waited on.
struct Dispatched {
    routed: Routed,
    attempted: Attempted,
    /// The request head for the backend.
    head: RequestHeader,
    /// The body as this backend names the model ([`crate::models::rename`]).
    sent: Bytes,
    /// The race plan; with it, a copy of the client's request head, from which a second
    /// copy's head is built (a copy, so that keep-alives may write to the client meanwhile).
    race: Option<(race::Plan, RequestHeader)>,
    /// Collision repair's watch on the chosen backend (never with a race).
    watch: Option<repair::Watch>,
    may_retry: bool,
    at: Instant,
}

impl Proxy {
    /// Route, dispatch and attempt until one attempt commits (then relay it) or the retry
    /// budget is spent. `admitted`: the decision admission already made on this pool, used for
    /// the first attempt.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn attempts(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        pass: &mut Pass<'_>,
        parsed: &Parsed<'_>,
        body: &Bytes,
        mut admitted: Option<Routed>,
        access: &mut Access,
        arrived: Instant,
    ) -> Result<(), Failure> {
        let req = Request::new(state, parsed, body, arrived);
        let mut retries = Retries::excluding(parsed.excluded);
        // Times collision repair moved the request.
        let mut moves = 0;
        if let Some((r, h)) = parsed.route.and_then(|r| Some((r, r.hedge?))) {
            self.hedges.earn(&r.name, h.budget);
        }
        // A stream on a route with keep-alives: SSE comments until its first token.
        let mut keepalive = parsed
            .route
            .filter(|_| parsed.features.stream)
            .and_then(|r| KeepAlive::new(r, &self.metrics, arrived, &access.id));
        loop {
            let now = Instant::now();
            let routed = match admitted.take() {
                Some(r) => r,
                None => self.route_next(&req, &retries, now)?,
            };
            let first = routed.decision.index;
            self.note_decision(&req, &routed, retries.attempts(), access);
            let dispatched = self.dispatch(session, &req, routed, &retries, moves, access, now)?;
            let waited = self.wait(&req, dispatched, &mut retries.tried, &access.id);
            // With keep-alives, the client hears from us while the attempt waits.
            let waited = match keepalive.as_mut() {
                None => waited.await,
                Some(k) => {
                    // Boxed: only keep-alive routes' requests pay for the timer.
                    let w = Box::pin(k.wait(session, waited)).await;
                    access.keepalives = k.sent();
                    w.map_err(|e| req.fail(e))?
                }
            };
            let (routed, attempted, outcome) = match waited {
                Waited::Done(routed, attempted, outcome, raced) => {
                    if let Some(r) = raced {
                        access.race = r;
                    }
                    (routed, attempted, outcome)
                }
                Waited::Moves(next) => {
                    moves += 1;
                    let from = &parsed.pool.backends[first].config.name;
                    access.moved_from.get_or_insert_with(|| from.clone());
                    admitted = Some(*next);
                    continue;
                }
            };
            self.note_outcome(&req, &routed, access);
            match outcome {
                Attempt::Failed {
                    reason,
                    detail,
                    backend_fault,
                } => {
                    let failed = (reason, detail.as_str(), backend_fault);
                    let id = access.id.as_str();
                    self.attempt_failed(&req, &routed, attempted, failed, &mut retries, id)?;
                }
                Attempt::FirstTokenTimeout => {
                    return Err(self.first_token_timeout(&req, &routed, attempted));
                }
                Attempt::Committed {
                    upstream,
                    first_chunk,
                    body_done,
                    sent_at,
                    held_first_token_at,
                } => {
                    let committed = super::commit::Committed {
                        upstream,
                        first_chunk,
                        body_done,
                        sent_at,
                        held_first_token_at,
                    };
                    let attempt = (&routed, attempted, committed);
                    return self
                        .commit(session, &req, pass, attempt, &mut retries, access)
                        .await;
                }
            }
        }
    }

    /// Route step: a new decision on the pool, excluding the backends already tried.
    fn route_next(
        &self,
        req: &Request<'_, '_>,
        retries: &Retries,
        now: Instant,
    ) -> Result<Routed, Failure> {
        let Parsed { pool, features, .. } = req.parsed;
        pool.route(
            &**req.policy,
            features,
            now,
            &retries.tried,
            req.state.config.explain_headers,
        )
        .map_err(|_| req.no_backend())
    }

    /// The decision's metrics and recent-decisions entry, and its access-log fields.
    fn note_decision(
        &self,
        req: &Request<'_, '_>,
        routed: &Routed,
        attempts: u32,
        access: &mut Access,
    ) {
        let Parsed { pool, features, .. } = req.parsed;
        self.record_decision(pool, req.policy.name(), routed, features.prompt_tokens);
        access.attempts = attempts;
        self.note_outcome(req, routed, access);
    }

    /// The access-log fields of the decision whose outcome is final (after a race, the
    /// winner's).
    fn note_outcome(&self, req: &Request<'_, '_>, routed: &Routed, access: &mut Access) {
        let backend = &req.parsed.pool.backends[routed.decision.index];
        access.backend = Some(backend.config.name.clone());
        access.reason = Some(routed.decision.reason);
        access.predicted_ttft_s = routed.decision.predicted_ttft_s;
    }

    /// Race plan, repair watch and dispatch steps: the backend's request head and body, the
    /// race a streamed request on a route with a first-token deadline or hedging may run
    /// ([`super::race`]; with `race_on: ttfa`, to its first answer token) — else the watch of
    /// collision repair ([`super::repair`]), from before the dispatch — and the dispatch that
    /// books the load and records the prefix.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        session: &ServerSession,
        req: &Request<'_, '_>,
        routed: Routed,
        retries: &Retries,
        moves: u32,
        access: &Access,
        now: Instant,
    ) -> Result<Dispatched, Failure> {
        let Parsed {
            pool,
            features,
            route,
            ..
        } = req.parsed;
        let i = routed.decision.index;
        let backend = &pool.backends[i];
        let sent = pool.body_for(i, req.body, features);
        let head = upstream_request_head(
            session.req_header(),
            backend,
            sent.len(),
            client_key_is_ours(req.state.config.auth.is_some(), *route),
            &access.id,
        )
        .map_err(|e| req.fail(GatewayError::Internal(e.to_string())))?;
        let reasoning = pool.reasoning.expected(features.reasoning_effort);
        let race = race::Plan::of(*route, &routed, features.stream, reasoning)
            .map(|plan| (plan, session.req_header().clone()));
        let watch = (race.is_none() && moves < MAX_MOVES)
            .then(|| repair::Watch::on(pool, i))
            .flatten();
        let attempted = pool.dispatch(&routed, features, features.stream, now);
        let may_retry = retries.may_retry(req.max_retries, routed.others_left);
        Ok(Dispatched {
            routed,
            attempted,
            head,
            sent,
            race,
            watch,
            may_retry,
            at: now,
        })
    }

    /// Attempt step: wait on the dispatched attempt — as a race, watched by collision repair,
    /// or alone. It borrows nothing of the client session, so keep-alives may write to the
    /// client meanwhile.
    async fn wait(
        &self,
        req: &Request<'_, '_>,
        d: Dispatched,
        tried: &mut Vec<BackendId>,
        request_id: &str,
    ) -> Waited {
        let Parsed {
            pool,
            features,
            route,
            ..
        } = req.parsed;
        let Dispatched {
            routed,
            mut attempted,
            head,
            sent,
            race,
            watch,
            may_retry,
            at,
        } = d;
        if let (Some((plan, client_head)), Some(route)) = (race, route) {
            let race = race::Race {
                proxy: self,
                state: req.state,
                pool,
                route,
                policy: &**req.policy,
                features,
                body: req.body,
                client_head: &client_head,
                request_id,
                deadlines: req.deadlines,
                may_retry,
            };
            let entrant = race::Entrant {
                routed,
                attempted,
                at,
            };
            // Boxed: a race holds two attempts, and inline it would size the future of every
            // request (raced or not) for as long as its stream is open.
            let f = Box::pin(race.run(entrant, head, plan, tried)).await;
            return Waited::Done(
                f.entrant.routed,
                f.entrant.attempted,
                f.outcome,
                Some(f.raced),
            );
        }
        let i = routed.decision.index;
        let (own, held_blocks) = (attempted.guard.booking().load(), attempted.held_blocks);
        let attempt = attempt(
            &self.connectors,
            &pool.backends[i],
            head,
            &sent,
            features.stream,
            false,
            req.deadlines,
            may_retry,
            &mut attempted.guard,
        );
        let Some(watch) = watch else {
            let outcome = attempt.await;
            return Waited::Done(routed, attempted, outcome, None);
        };
        let watched = repair::Attempting {
            pool,
            policy: &**req.policy,
            features,
            tried,
            explain: req.state.config.explain_headers,
            metrics: &self.metrics,
            request_id,
            index: i,
            own,
            held_blocks,
            at,
            inputs: &mut attempted.inputs,
        };
        // Boxed: only a replicated gateway's requests pay for it.
        match Box::pin(watched.run(attempt, watch)).await {
            repair::Watched::Done(outcome) => Waited::Done(routed, attempted, outcome, None),
            // Its attempt is dropped (the upstream connection closed), its record already
            // undone; the booking goes with it.
            repair::Watched::Moves(next) => Waited::Moves(next),
        }
    }

    /// Failure bookkeeping after an attempt that failed before anything reached the client:
    /// undo its prefix record, count it, mark a backend fault toward ejection; `Ok` to retry,
    /// or the 503 when the retry budget or the backends are spent.
    fn attempt_failed(
        &self,
        req: &Request<'_, '_>,
        routed: &Routed,
        attempted: Attempted,
        (reason, detail, backend_fault): (RetryReason, &str, bool),
        retries: &mut Retries,
        request_id: &str,
    ) -> Result<(), Failure> {
        let Parsed { pool, features, .. } = req.parsed;
        let i = routed.decision.index;
        let backend = &pool.backends[i];
        pool.undo_record(i, features, attempted.held_blocks);
        drop(attempted);
        tracing::info!(request_id = %request_id, backend = %backend.name(), %detail, "attempt failed");
        self.metrics
            .upstream_errors_total
            .with_label_values(&[backend.name(), reason.as_str()])
            .inc();
        if backend_fault {
            self.record_failure(pool, i, &req.state.config.health);
        }
        if retries.failed(backend.id(), req.max_retries, routed.others_left) == Next::GiveUp {
            return Err(req.no_backend());
        }
        self.metrics
            .retries_total
            .with_label_values(&[&pool.model, reason.as_str()])
            .inc();
        Ok(())
    }

    /// Failure bookkeeping after a first-answer timeout: no retry (the client has waited its
    /// deadline), a backend fault only when nothing else explains it
    /// ([`timeout_is_backend_fault`]).
    fn first_token_timeout(
        &self,
        req: &Request<'_, '_>,
        routed: &Routed,
        attempted: Attempted,
    ) -> Failure {
        let Parsed { pool, features, .. } = req.parsed;
        let i = routed.decision.index;
        pool.undo_record(i, features, attempted.held_blocks);
        drop(attempted);
        let timeout = req.deadlines.first_answer(features.stream);
        if timeout_is_backend_fault(features.stream, routed, timeout) {
            self.record_failure(pool, i, &req.state.config.health);
        }
        self.metrics
            .upstream_errors_total
            .with_label_values(&[pool.backends[i].name(), "first_token_timeout"])
            .inc();
        req.fail(GatewayError::FirstTokenTimeout {
            timeout_ms: timeout.as_millis() as u64,
        })
    }
}
