//! One inference request, as named steps:
//!
//! ```text
//! authenticate → read → parse → match route → tokenize → authorize → admit
//!   → [route → dispatch → attempt]* → relay (observe at the first token) → finish
//! ```
//!
//! Each step is a method that returns what the next needs, or the [`GatewayError`] the client
//! gets. The attempt loop retries per [`super::retry`]: nothing has reached the client until
//! an attempt commits.

use std::time::Instant;

use bytes::Bytes;
use pingora_core::protocols::http::ServerSession;

use super::access::Access;
use super::keepalive::KeepAlive;
use super::observe::{self, FirstTokenObserver};
use super::race;
use super::relay::{client_response_head, Relay, RelayEnd, RelayOutcome};
use super::repair;
use super::retry::{Next, Retries};
use super::upstream::{attempt, client_key_is_ours, upstream_request_head, Attempt, Deadlines};
use super::{migrate, request_id, tokenize, Proxy, UPSTREAM_IDLE_KEEPALIVE};
use crate::config::route::RouteObjective;
use crate::config::Route;
use crate::edge::gate::Pass;
use crate::edge::Admitting;
use crate::error::GatewayError;
use crate::request::{parse_request, Endpoint, RequestFeatures};
use crate::state::{Attempted, GatewayState, Pool, Routed, Target};
use pronto_core::cluster::repair::MAX_MOVES;
use pronto_core::ids::{BackendId, RouteId};
use pronto_core::slo::Objective;
use pronto_core::splice::Splicer;

pub(super) use crate::edge::Failure;

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
        let mut budget = self
            .budget
            .reservation(state.config.limits.max_buffered_bytes);
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

    /// Route, dispatch and attempt until one attempt commits (then relay it) or the retry
    /// budget is spent. `admitted`: the decision admission already made on this pool, used for
    /// the first attempt.
    #[allow(clippy::too_many_arguments)]
    async fn attempts(
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
        let Parsed {
            features,
            pool,
            route,
            route_id,
            excluded,
            own_tokens,
        } = parsed;
        let pool_err = |e| (Some(pool.model.clone()), e);
        let limits = &state.config.limits;
        let policy = state.policy_for(pool, *route_id);
        let deadlines = Deadlines {
            first_token: route
                .and_then(|r| r.first_token_timeout)
                .unwrap_or(limits.first_token_timeout),
            total: limits.request_timeout,
            idle: route
                .and_then(|r| r.idle_timeout)
                .unwrap_or(limits.idle_timeout),
        };
        let max_retries = route
            .and_then(|r| r.max_retries)
            .unwrap_or(state.config.retry.max_retries);
        let mut retries = Retries::excluding(excluded);
        // Times collision repair moved the request.
        let mut moves = 0;
        if let Some((r, h)) = route.and_then(|r| Some((r, r.hedge?))) {
            self.hedges.earn(&r.name, h.budget);
        }
        // A stream on a route with keep-alives: SSE comments until its first token.
        let mut keepalive = route
            .filter(|_| features.stream)
            .and_then(|r| KeepAlive::new(r, &self.metrics, arrived, &access.id));
        loop {
            let now = Instant::now();
            let routed = match admitted.take() {
                Some(r) => r,
                None => pool
                    .route(
                        &**policy,
                        features,
                        now,
                        &retries.tried,
                        state.config.explain_headers,
                    )
                    .map_err(|_| {
                        pool_err(GatewayError::NoBackend {
                            model: pool.model.to_string(),
                        })
                    })?,
            };
            let i = routed.decision.index;
            let backend = &pool.backends[i];
            self.record_decision(pool, policy.name(), &routed, features.prompt_tokens);
            access.backend = Some(backend.config.name.clone());
            access.attempts = retries.attempts();
            access.reason = Some(routed.decision.reason);
            access.predicted_ttft_s = routed.decision.predicted_ttft_s;
            // The body as this backend names the model (models::rename).
            let sent = pool.body_for(i, body, features);
            let head = upstream_request_head(
                session.req_header(),
                backend,
                sent.len(),
                client_key_is_ours(state.config.auth.is_some(), *route),
                &access.id,
            )
            .map_err(|e| pool_err(GatewayError::Internal(e.to_string())))?;
            // A streamed request on a route with a first-token deadline or hedging may race
            // a second backend until one produces its first token — or, with `race_on: ttfa`,
            // its first answer token (super::race).
            let reasoning = pool.reasoning.expected(features.reasoning_effort);
            let plan = race::Plan::of(*route, &routed, features.stream, reasoning);
            // Else collision repair may move it (super::repair), watching from before the
            // dispatch.
            let watch = (plan.is_none() && moves < MAX_MOVES)
                .then(|| repair::Watch::on(pool, i))
                .flatten();
            let mut attempted = pool.dispatch(&routed, features, features.stream, now);
            let may_retry = retries.may_retry(max_retries, routed.others_left);
            // A race may take the decision again: it builds the second backend's head from the
            // client's (a copy, so that keep-alives may write to the client meanwhile).
            let client_head = plan.is_some().then(|| session.req_header().clone());
            let request_id = access.id.as_str();
            let waited = async {
                match (plan, route, &client_head) {
                    (Some(plan), Some(r), Some(client_head)) => {
                        let race = race::Race {
                            proxy: self,
                            state,
                            pool,
                            route: r,
                            policy: &**policy,
                            features,
                            body,
                            client_head,
                            request_id,
                            deadlines,
                            may_retry,
                        };
                        let entrant = race::Entrant {
                            routed,
                            attempted,
                            at: now,
                        };
                        // Boxed: a race holds two attempts, and inline it would size the future
                        // of every request (raced or not) for as long as its stream is open.
                        let f = Box::pin(race.run(entrant, head, plan, &mut retries.tried)).await;
                        let raced = Some(f.raced);
                        Waited::Done(f.entrant.routed, f.entrant.attempted, f.outcome, raced)
                    }
                    _ => {
                        let (own, held_blocks) =
                            (attempted.guard.booking().load(), attempted.held_blocks);
                        let attempt = attempt(
                            &self.connectors,
                            backend,
                            head,
                            &sent,
                            features.stream,
                            false,
                            deadlines,
                            may_retry,
                            &mut attempted.guard,
                        );
                        let outcome = match watch {
                            None => attempt.await,
                            Some(watch) => {
                                let watched = repair::Attempting {
                                    pool,
                                    policy: &**policy,
                                    features,
                                    tried: &retries.tried,
                                    explain: state.config.explain_headers,
                                    metrics: &self.metrics,
                                    request_id,
                                    index: i,
                                    own,
                                    held_blocks,
                                    at: now,
                                    inputs: &mut attempted.inputs,
                                };
                                // Boxed: only a replicated gateway's requests pay for it.
                                match Box::pin(watched.run(attempt, watch)).await {
                                    repair::Watched::Done(outcome) => outcome,
                                    repair::Watched::Moves(next) => {
                                        // Its attempt is dropped (the upstream connection closed),
                                        // its record already undone; the booking goes with it.
                                        drop(attempted);
                                        return Waited::Moves(next);
                                    }
                                }
                            }
                        };
                        Waited::Done(routed, attempted, outcome, None)
                    }
                }
            };
            // With keep-alives, the client hears from us while the attempt waits.
            let waited = match keepalive.as_mut() {
                None => waited.await,
                Some(k) => {
                    // Boxed: only keep-alive routes' requests pay for the timer.
                    let w = Box::pin(k.wait(session, waited)).await;
                    access.keepalives = k.sent();
                    w.map_err(pool_err)?
                }
            };
            let (routed, mut attempted, outcome) = match waited {
                Waited::Done(routed, attempted, outcome, raced) => {
                    if let Some(r) = raced {
                        access.race = r;
                    }
                    (routed, attempted, outcome)
                }
                Waited::Moves(next) => {
                    moves += 1;
                    access
                        .moved_from
                        .get_or_insert_with(|| backend.config.name.clone());
                    admitted = Some(*next);
                    continue;
                }
            };
            let i = routed.decision.index;
            let backend = &pool.backends[i];
            access.backend = Some(backend.config.name.clone());
            access.reason = Some(routed.decision.reason);
            access.predicted_ttft_s = routed.decision.predicted_ttft_s;
            match outcome {
                Attempt::Failed {
                    reason,
                    detail,
                    backend_fault,
                } => {
                    pool.undo_record(i, features, attempted.held_blocks);
                    drop(attempted);
                    tracing::info!(request_id = %access.id, backend = %backend.name(), %detail, "attempt failed");
                    self.metrics
                        .upstream_errors_total
                        .with_label_values(&[backend.name(), reason.as_str()])
                        .inc();
                    if backend_fault {
                        self.record_failure(pool, i, &state.config.health);
                    }
                    if retries.failed(backend.id(), max_retries, routed.others_left) == Next::GiveUp
                    {
                        return Err(pool_err(GatewayError::NoBackend {
                            model: pool.model.to_string(),
                        }));
                    }
                    self.metrics
                        .retries_total
                        .with_label_values(&[&pool.model, reason.as_str()])
                        .inc();
                }
                Attempt::FirstTokenTimeout => {
                    pool.undo_record(i, features, attempted.held_blocks);
                    drop(attempted);
                    let timeout = deadlines.first_answer(features.stream);
                    if timeout_is_backend_fault(features.stream, &routed, timeout) {
                        self.record_failure(pool, i, &state.config.health);
                    }
                    self.metrics
                        .upstream_errors_total
                        .with_label_values(&[backend.name(), "first_token_timeout"])
                        .inc();
                    return Err(pool_err(GatewayError::FirstTokenTimeout {
                        timeout_ms: timeout.as_millis() as u64,
                    }));
                }
                Attempt::Committed {
                    mut upstream,
                    first_chunk,
                    body_done,
                    sent_at,
                    held_first_token_at,
                } => {
                    let head = upstream.response_header().ok_or_else(|| {
                        pool_err(GatewayError::Internal("no response head".into()))
                    })?;
                    let status = head.status.as_u16();
                    if status < 500 {
                        backend.record_success();
                    }
                    if !(200..300).contains(&status) {
                        // The backend did not take the prompt: it holds no new prefix.
                        pool.undo_record(i, features, attempted.held_blocks);
                    }
                    let is_sse = features.stream
                        && head
                            .headers
                            .get(http::header::CONTENT_TYPE)
                            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    let migration =
                        migrate::plan(state, *route, &pool.model, features.endpoint, is_sse);
                    let mut splicer = migration.map(|(api, _)| Splicer::new(api));
                    let mut extra = pass.headers();
                    extra.push((request_id::HEADER, access.id.clone()));
                    if state.config.explain_headers {
                        self.explain(&mut extra, pool, &routed, features, retries.attempts());
                        if let Some(r) = &access.race {
                            extra.push(("x-pronto-race", r.kind.label().to_string()));
                            extra.push(("x-pronto-race-first", r.first.to_string()));
                        }
                        if let Some(from) = &access.moved_from {
                            extra.push(("x-pronto-moved-from", from.to_string()));
                        }
                        if is_sse {
                            let n = migration.map_or(0, |(_, n)| n);
                            extra.push(("x-pronto-migration-max-attempts", n.to_string()));
                        }
                    }
                    let client_head = client_response_head(head, &extra)
                        .map_err(|e| pool_err(GatewayError::Internal(e.to_string())))?;
                    let head_sent = access.keepalives > 0;
                    if head_sent && !(is_sse && (200..300).contains(&status)) {
                        // The keep-alives' 200 is out: what the backend answered instead
                        // reaches the client as an SSE error event (super::keepalive).
                        let err =
                            super::keepalive::upstream_error(&mut upstream, status, deadlines.idle)
                                .await;
                        drop(attempted);
                        upstream.shutdown().await;
                        return Err(pool_err(err));
                    }
                    let outcome = Relay {
                        head: (!head_sent).then_some(client_head),
                        unrename: pool.answer_for(i, body, features),
                        first_chunk,
                        body_done,
                        held_first_token_at,
                        sse: is_sse,
                        idle: deadlines.idle,
                        observer: FirstTokenObserver {
                            metrics: &self.metrics,
                            pool: &pool.model,
                            guard: &mut attempted.guard,
                            inputs: attempted.inputs,
                            predicted_s: routed.decision.predicted_ttft_s,
                            sent_at,
                            arrived,
                        },
                        request_id: &access.id,
                        splice: splicer.as_mut(),
                    }
                    .run(session, &mut upstream)
                    .await;
                    let predicted = routed.decision.predicted_ttft_s;
                    self.finish(
                        state,
                        pass,
                        pool,
                        i,
                        &outcome,
                        (sent_at, predicted),
                        *own_tokens,
                    );
                    if is_sse && outcome.end == RelayEnd::Complete {
                        // A whole stream: how long this model reasoned before answering.
                        pool.reasoning
                            .observe(features.reasoning_effort, outcome.reasoning_events);
                    }
                    access.relayed(status, &outcome);
                    access.ttft = outcome
                        .first_token_at
                        .map(|t| t.saturating_duration_since(arrived));
                    access.upstream_ttft = outcome
                        .first_token_at
                        .map(|t| t.saturating_duration_since(sent_at));
                    access.ttfa = outcome
                        .first_answer_at
                        .map(|t| t.saturating_duration_since(arrived));
                    access.reasoning_tokens = is_sse.then_some(outcome.reasoning_events);
                    drop(attempted);
                    if outcome.reusable {
                        self.connectors
                            .release(*upstream, &backend.peer, UPSTREAM_IDLE_KEEPALIVE)
                            .await;
                    } else {
                        upstream.shutdown().await;
                    }
                    if let (Some(splicer), Some((_, max_attempts)), RelayEnd::UpstreamFailed) =
                        (splicer.as_mut(), migration, outcome.end)
                    {
                        retries.tried.push(backend.id());
                        let m = migrate::Migration {
                            parsed,
                            body,
                            splicer,
                            tried: &mut retries.tried,
                            deadlines,
                            max_attempts,
                            arrived,
                        };
                        // Boxed: only a failed stream pays for the continuation's future.
                        Box::pin(self.migrate(session, state, pass, m, access)).await;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// After the relay: latency windows, usage (rate-limit settlement and the token ratio),
    /// and how it ended.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &self,
        state: &GatewayState,
        pass: &mut Pass<'_>,
        pool: &Pool,
        i: usize,
        outcome: &RelayOutcome,
        (sent_at, predicted_ttft_s): (Instant, Option<f64>),
        own_tokens: u32,
    ) {
        let backend = &pool.backends[i];
        if let Some(u) = outcome.usage {
            self.edge.settle(pass, &u);
            pool.token_ratio.observe(u.prompt_tokens, own_tokens);
            self.metrics
                .prompt_token_ratio
                .with_label_values(&[&pool.model])
                .set(pool.token_ratio.ratio());
        }
        match outcome.end {
            RelayEnd::Complete => {
                observe::completed(&self.metrics, backend, outcome, sent_at, predicted_ttft_s)
            }
            RelayEnd::ClientGone => {
                self.metrics
                    .client_disconnects_total
                    .with_label_values(&[&pool.model])
                    .inc();
            }
            RelayEnd::ClientStalled => {
                self.metrics
                    .client_stalled_total
                    .with_label_values(&[&pool.model])
                    .inc();
            }
            RelayEnd::UpstreamFailed => {
                self.record_failure(pool, i, &state.config.health);
                self.metrics
                    .upstream_errors_total
                    .with_label_values(&[backend.name(), "mid_stream"])
                    .inc();
            }
        }
    }

    /// The explain headers: the backend, the decision's prediction and reason, the
    /// runner-up and its prediction, and the attempt count.
    fn explain(
        &self,
        extra: &mut Vec<(&'static str, String)>,
        pool: &Pool,
        routed: &Routed,
        features: &RequestFeatures,
        attempts: u32,
    ) {
        let d = &routed.decision;
        extra.push((
            "x-pronto-backend",
            pool.backends[d.index].name().to_string(),
        ));
        if let Some(p) = d.predicted_ttft_s {
            extra.push(("x-pronto-predicted-ttft-ms", format!("{:.1}", p * 1e3)));
        }
        if let Objective::Ttfa { reasoning_tokens } = features.objective {
            // What the objective ranked by: the TTFT plus the expected reasoning at the
            // chosen backend's predicted TPOT (when it predicts one).
            extra.push((
                "x-pronto-expected-reasoning-tokens",
                format!("{reasoning_tokens:.0}"),
            ));
            let tpot = routed.chosen.predicted_tpot_s();
            if let (Some(p), Some(t)) = (d.predicted_ttft_s, tpot) {
                let ttfa = p + reasoning_tokens * t;
                extra.push(("x-pronto-predicted-ttfa-ms", format!("{:.1}", ttfa * 1e3)));
            }
        }
        extra.push(("x-pronto-reason", d.reason.as_str().to_string()));
        if let Some(r) = routed.runner_up {
            extra.push((
                "x-pronto-runner-up",
                pool.backends[r.index].name().to_string(),
            ));
            extra.push((
                "x-pronto-runner-up-predicted-ttft-ms",
                format!("{:.1}", r.predicted_ttft_s * 1e3),
            ));
        }
        extra.push(("x-pronto-attempts", attempts.to_string()));
    }
}

/// Whether a first-answer timeout says the backend is unwell (and counts toward ejecting it),
/// rather than being explained by the request itself: a non-streamed request's answer is its
/// whole generation (a long one is not a fault); a stream that waited behind queued work — the
/// decision saw other prefills outstanding or a waiting engine queue, or predicted at least
/// half the deadline — timed out on the overload that queue is, not on a broken backend. Only
/// a backend that was idle, predicted fast, and still produced nothing is at fault.
fn timeout_is_backend_fault(stream: bool, routed: &Routed, deadline: std::time::Duration) -> bool {
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
) -> Result<crate::request::RequestFeatures, Failure> {
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
