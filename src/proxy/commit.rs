//! After an attempt commits: the commit itself (the response head, with the explain
//! headers), the relay, and the finish — settlement, how it ended, the upstream connection
//! released or closed, and a migration when the backend failed mid-stream. The attempt loop
//! that gets here is [`super::attempts`]'s.

use std::time::Instant;

use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::ServerSession;
use pingora_http::ResponseHeader;

use super::access::Access;
use super::attempts::Request;
use super::lifecycle::{Failure, Parsed};
use super::observe::{self, FirstTokenObserver};
use super::relay::{client_response_head, Relay, RelayEnd, RelayOutcome};
use super::retry::Retries;
use super::{migrate, request_id, Proxy, UPSTREAM_IDLE_KEEPALIVE};
use crate::edge::gate::Pass;
use crate::error::GatewayError;
use crate::state::{Attempted, GatewayState, Pool, Routed};
use pronto_core::slo::Objective;
use pronto_core::splice::{Api, Splicer};

/// A committed attempt's upstream side: the fields of
/// [`Attempt::Committed`](super::upstream::Attempt::Committed).
pub(super) struct Committed {
    pub upstream: Box<HttpSession>,
    pub first_chunk: Option<Bytes>,
    pub body_done: bool,
    pub sent_at: Instant,
    pub held_first_token_at: Option<Instant>,
}

impl Proxy {
    /// Commit step: the backend's answer is the client's. Its response head (with the
    /// rate-limit, request-id and explain headers), unless keep-alives already sent one — then
    /// anything but an SSE success reaches the client as an SSE error event
    /// ([`super::keepalive`]); then the relay.
    pub(super) async fn commit(
        &self,
        session: &mut ServerSession,
        req: &Request<'_, '_>,
        pass: &mut Pass<'_>,
        (routed, attempted, mut c): (&Routed, Attempted, Committed),
        retries: &mut Retries,
        access: &mut Access,
    ) -> Result<(), Failure> {
        let Parsed { pool, features, .. } = req.parsed;
        let i = routed.decision.index;
        let head = c
            .upstream
            .response_header()
            .ok_or_else(|| req.fail(GatewayError::Internal("no response head".into())))?;
        let status = head.status.as_u16();
        if status < 500 {
            pool.backends[i].record_success();
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
        let migration = migrate::plan(
            req.state,
            req.parsed.route,
            &pool.model,
            features.endpoint,
            is_sse,
        );
        let mut extra = pass.headers();
        extra.push((request_id::HEADER, access.id.clone()));
        if req.state.config.explain_headers {
            let max_migrations = migration.map_or(0, |(_, n)| n);
            let explained = (routed, retries.attempts(), is_sse.then_some(max_migrations));
            self.explain(&mut extra, req, explained, access);
        }
        let client_head = client_response_head(head, &extra)
            .map_err(|e| req.fail(GatewayError::Internal(e.to_string())))?;
        let head_sent = access.keepalives > 0;
        if head_sent && !(is_sse && (200..300).contains(&status)) {
            let idle = req.deadlines.idle;
            let err = super::keepalive::upstream_error(&mut c.upstream, status, idle).await;
            drop(attempted);
            c.upstream.shutdown().await;
            return Err(req.fail(err));
        }
        let client_head = (!head_sent).then_some(client_head);
        let relay = (routed, attempted, c, client_head);
        self.relay(
            session,
            req,
            pass,
            relay,
            (status, is_sse, migration),
            retries,
            access,
        )
        .await;
        Ok(())
    }

    /// Relay and finish steps: stream the answer (observing its first token), settle and
    /// record how it ended, release or close the upstream connection — and, when the
    /// backend failed mid-stream on a route that migrates, continue the stream elsewhere
    /// ([`super::migrate`]).
    #[allow(clippy::too_many_arguments)]
    async fn relay(
        &self,
        session: &mut ServerSession,
        req: &Request<'_, '_>,
        pass: &mut Pass<'_>,
        (routed, mut attempted, c, head): (&Routed, Attempted, Committed, Option<ResponseHeader>),
        (status, is_sse, migration): (u16, bool, Option<(Api, u32)>),
        retries: &mut Retries,
        access: &mut Access,
    ) {
        let Parsed { pool, features, .. } = req.parsed;
        let i = routed.decision.index;
        let Committed {
            mut upstream,
            first_chunk,
            body_done,
            sent_at,
            held_first_token_at,
        } = c;
        let mut splicer = migration.map(|(api, _)| Splicer::new(api));
        let outcome = Relay {
            head,
            unrename: pool.answer_for(i, req.body, features),
            first_chunk,
            body_done,
            held_first_token_at,
            sse: is_sse,
            idle: req.deadlines.idle,
            observer: FirstTokenObserver {
                metrics: &self.metrics,
                pool: &pool.model,
                guard: &mut attempted.guard,
                inputs: attempted.inputs,
                predicted_s: routed.decision.predicted_ttft_s,
                sent_at,
                arrived: req.arrived,
            },
            request_id: &access.id,
            splice: splicer.as_mut(),
        }
        .run(session, &mut upstream)
        .await;
        let predicted = routed.decision.predicted_ttft_s;
        let own_tokens = req.parsed.own_tokens;
        self.finish(
            req.state,
            pass,
            pool,
            i,
            &outcome,
            (sent_at, predicted),
            own_tokens,
        );
        if is_sse && outcome.end == RelayEnd::Complete {
            // A whole stream: how long this model reasoned before answering.
            pool.reasoning
                .observe(features.reasoning_effort, outcome.reasoning_events);
        }
        access.relayed(status, &outcome);
        let since = |from: Instant| move |t: Instant| t.saturating_duration_since(from);
        access.ttft = outcome.first_token_at.map(since(req.arrived));
        access.upstream_ttft = outcome.first_token_at.map(since(sent_at));
        access.ttfa = outcome.first_answer_at.map(since(req.arrived));
        access.reasoning_tokens = is_sse.then_some(outcome.reasoning_events);
        drop(attempted);
        let backend = &pool.backends[i];
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
                parsed: req.parsed,
                body: req.body,
                splicer,
                tried: &mut retries.tried,
                deadlines: req.deadlines,
                max_attempts,
                arrived: req.arrived,
            };
            // Boxed: only a failed stream pays for the continuation's future.
            Box::pin(self.migrate(session, req.state, pass, m, access)).await;
        }
    }

    /// Explain step: the backend, the decision's prediction and reason, the runner-up and its
    /// prediction, the attempt count; the race, the collision-repair move and the migration
    /// bound (`Some` for an SSE stream) when there are any.
    fn explain(
        &self,
        extra: &mut Vec<(&'static str, String)>,
        req: &Request<'_, '_>,
        (routed, attempts, max_migrations): (&Routed, u32, Option<u32>),
        access: &Access,
    ) {
        let Parsed { pool, features, .. } = req.parsed;
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
        if let Some(r) = &access.race {
            extra.push(("x-pronto-race", r.kind.label().to_string()));
            extra.push(("x-pronto-race-first", r.first.to_string()));
        }
        if let Some(from) = &access.moved_from {
            extra.push(("x-pronto-moved-from", from.to_string()));
        }
        if let Some(n) = max_migrations {
            extra.push(("x-pronto-migration-max-attempts", n.to_string()));
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
}
