//! Stream migration, the glue: a stream whose backend failed after its first token is
//! continued on another backend, spliced into the client's stream.
//!
//! ```text
//! relay (through a Splicer) fails → [continuation body → parse → route → dispatch → attempt
//!   → relay the continuation (rewritten into the first stream)]* → [DONE] | error event
//! ```
//!
//! A stream may migrate when it is an SSE chat or completions stream, its route's (else the
//! top-level) `migration.max_attempts` is above 0, and its pool has `continue_streams` (the
//! default). Then its events pass through a [`Splicer`] (whole events only) and a failure —
//! a reset, an idle timeout, an error event, an end without `[DONE]` or a finish — is handled
//! here instead of ending the stream with an error event:
//! - a finish was relayed already: the answer is whole, the stream ends with `data: [DONE]`
//!   (`finished`);
//! - the request cannot be continued honestly ([`pronto_core::splice::NotContinuable`]): the
//!   error event, as without migration (`not_continuable`);
//! - else the continuation request ([`continuation_body`]: the text so far as a final assistant
//!   message with `continue_final_message`, or appended to a completions prompt, `max_tokens`
//!   reduced) is parsed and tokenized like any request — its prompt is the longer one, its
//!   prefix blocks begin with the original prompt's, so the routing decision prefers a backend
//!   holding that prefix — and routed with every backend tried so far excluded. Its answer is
//!   spliced in (same `id` and `created`, no second role chunk, `usage` summed). A continuation
//!   that fails before committing (connect error, 5xx, a 400 from an engine that does not
//!   continue, no first token in time), or after, counts one attempt; when `max_attempts` are
//!   spent or no backend is left, the stream ends with the error event (`failed`).
//!
//! Each continuation's prompt tokens (the prefill paid again) are counted in
//! `pronto_stream_migration_reprefill_tokens_total`; the outcome in
//! `pronto_stream_migrations_total{outcome}` and the access log (`migration`, `migrations`).

use std::time::Instant;

use bytes::Bytes;
use pingora_core::protocols::http::ServerSession;

use super::access::Access;
use super::lifecycle::{parse_off_thread, session_key, Parsed};
use super::observe::FirstTokenObserver;
use super::relay::{end_with_done, end_with_error_event, Relay, RelayEnd};
use super::upstream::{attempt, upstream_request_head, Attempt, Deadlines};
use super::{tokenize, Proxy, UPSTREAM_IDLE_KEEPALIVE};
use crate::config::Route;
use crate::edge::gate::Pass;
use crate::state::GatewayState;
use crate::telemetry::MigrationOutcome;
use pronto_core::ids::BackendId;
use pronto_core::request::Endpoint;
use pronto_core::splice::{continuation_body, Api, Splicer};

/// The API of a stream that may migrate on `route` of a pool that continues streams, with
/// its bound: `None` when migration is off for it.
pub(super) fn plan(
    state: &GatewayState,
    route: Option<&Route>,
    pool: &str,
    endpoint: Endpoint,
    sse: bool,
) -> Option<(Api, u32)> {
    let api = match endpoint {
        Endpoint::ChatCompletions => Api::Chat,
        Endpoint::Completions => Api::Completions,
        Endpoint::Embeddings => return None,
    };
    let max_attempts = route
        .and_then(|r| r.migration)
        .unwrap_or(state.config.migration)
        .max_attempts;
    let continues = state.config.pool(pool).is_some_and(|p| p.continue_streams);
    (sse && continues && max_attempts > 0).then_some((api, max_attempts))
}

/// One stream to continue.
pub(super) struct Migration<'a> {
    pub parsed: &'a Parsed<'a>,
    /// The client's request body.
    pub body: &'a Bytes,
    pub splicer: &'a mut Splicer,
    /// Backends not to continue on (every one tried so far, the failed one included).
    pub tried: &'a mut Vec<BackendId>,
    pub deadlines: Deadlines,
    pub max_attempts: u32,
    pub arrived: Instant,
}

impl Proxy {
    /// Go on with a stream whose backend failed (see the module docs); the client's response
    /// ends here, one way or the other.
    pub(super) async fn migrate(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        pass: &mut Pass<'_>,
        m: Migration<'_>,
        access: &mut Access,
    ) {
        let outcome = self.continue_stream(session, state, pass, m, access).await;
        let Some(outcome) = outcome else {
            // The client went away, or stopped reading (then `continue_stream` said so).
            if access.end != Some(RelayEnd::ClientStalled) {
                access.end = Some(RelayEnd::ClientGone);
            }
            return;
        };
        match outcome {
            MigrationOutcome::Continued => access.end = Some(RelayEnd::Complete),
            MigrationOutcome::Finished => match end_with_done(session).await {
                Some(n) => {
                    access.response_bytes += n;
                    access.end = Some(RelayEnd::Complete);
                }
                None => access.end = Some(RelayEnd::ClientGone),
            },
            MigrationOutcome::NotContinuable | MigrationOutcome::Failed => {
                access.response_bytes += end_with_error_event(session).await;
                access.end = Some(RelayEnd::UpstreamFailed);
            }
        }
        access.migration = Some(outcome.label());
        self.metrics.migration.count(outcome);
    }

    /// The continuation attempts; `None` when the client went away.
    async fn continue_stream(
        &self,
        session: &mut ServerSession,
        state: &GatewayState,
        pass: &mut Pass<'_>,
        m: Migration<'_>,
        access: &mut Access,
    ) -> Option<MigrationOutcome> {
        let Migration {
            parsed,
            body,
            splicer,
            tried,
            deadlines,
            max_attempts,
            arrived,
        } = m;
        let pool = parsed.pool;
        let endpoint = parsed.features.endpoint;
        let api = match endpoint {
            Endpoint::ChatCompletions => Api::Chat,
            _ => Api::Completions,
        };
        let policy = state.policy_for(pool, parsed.route_id);
        let mut attempts = 0;
        loop {
            if splicer.finished() {
                return Some(MigrationOutcome::Finished);
            }
            if let Some(why) = splicer.refusal() {
                tracing::info!(request_id = %access.id, why = why.as_str(), "stream not continued");
                return Some(MigrationOutcome::NotContinuable);
            }
            if attempts >= max_attempts {
                return Some(MigrationOutcome::Failed);
            }
            let cont = match continuation_body(api, body, splicer.text(), splicer.output_events()) {
                Ok(b) => Bytes::from(b),
                Err(why) => {
                    tracing::info!(request_id = %access.id, why = why.as_str(), "stream not continued");
                    return Some(MigrationOutcome::NotContinuable);
                }
            };
            attempts += 1;
            let Ok(mut features) = parse_off_thread(endpoint, &cont, session_key(session)).await
            else {
                return Some(MigrationOutcome::Failed);
            };
            tokenize::apply(pool, endpoint, &cont, &mut features, &self.metrics).await;
            let own_tokens = features.prompt_tokens;
            features.prompt_tokens = pool.token_ratio.scale(own_tokens);
            features.slo = parsed.features.slo;
            features.objective = parsed.features.objective;
            let now = Instant::now();
            let explain = state.config.explain_headers;
            let Ok(routed) = pool.route(&**policy, &features, now, tried, explain) else {
                return Some(MigrationOutcome::Failed);
            };
            let i = routed.decision.index;
            let backend = &pool.backends[i];
            tried.push(backend.id());
            self.record_decision(pool, policy.name(), &routed, features.prompt_tokens);
            self.metrics
                .migration
                .reprefill_tokens_total
                .with_label_values(&[&pool.model])
                .inc_by(u64::from(features.prompt_tokens));
            let client_auth_is_ours = state.config.auth.is_some();
            let Ok(head) = upstream_request_head(
                session.req_header(),
                backend,
                cont.len(),
                client_auth_is_ours,
                &access.id,
            ) else {
                return Some(MigrationOutcome::Failed);
            };
            tracing::info!(request_id = %access.id, backend = %backend.name(),
                tokens_so_far = splicer.output_events(), "continuing the stream on another backend");
            let mut attempted = pool.dispatch(&routed, &features, true, now);
            // The backend's own model name in the body, and back to the client's in the answer.
            let sent = pool.body_for(i, &cont, &features);
            let outcome = attempt(
                &self.connectors,
                backend,
                head,
                &sent,
                true,
                false,
                deadlines,
                false,
                &mut attempted.guard,
            )
            .await;
            let Attempt::Committed {
                mut upstream,
                first_chunk,
                body_done,
                sent_at,
                held_first_token_at,
            } = outcome
            else {
                pool.undo_record(i, &features, attempted.held_blocks);
                if let Attempt::Failed {
                    backend_fault: true,
                    ..
                } = outcome
                {
                    self.record_failure(pool, i, &state.config.health);
                }
                continue;
            };
            let head = upstream.response_header();
            let ok = head.is_some_and(|h| {
                h.status.is_success()
                    && h.headers
                        .get(http::header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
            });
            if !ok {
                // An engine that does not continue (a 400), or no stream: try another.
                tracing::info!(request_id = %access.id, backend = %backend.name(),
                    status = head.map(|h| h.status.as_u16()), "continuation refused");
                pool.undo_record(i, &features, attempted.held_blocks);
                upstream.shutdown().await;
                continue;
            }
            backend.record_success();
            // What the continuation's prompt has beyond the client's: the text so far.
            let extra = features
                .prompt_tokens
                .saturating_sub(parsed.features.prompt_tokens);
            splicer.begin_continuation(extra);
            access.migrations += 1;
            access.backend = Some(backend.config.name.clone());
            let outcome = Relay {
                head: None,
                unrename: pool.answer_for(i, &cont, &features),
                first_chunk,
                body_done,
                held_first_token_at,
                sse: true,
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
                splice: Some(&mut *splicer),
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
                own_tokens,
            );
            access.response_bytes += outcome.bytes_sent;
            drop(attempted);
            if outcome.reusable {
                self.connectors
                    .release(*upstream, &backend.peer, UPSTREAM_IDLE_KEEPALIVE)
                    .await;
            } else {
                upstream.shutdown().await;
            }
            match outcome.end {
                RelayEnd::Complete => return Some(MigrationOutcome::Continued),
                RelayEnd::ClientGone => return None,
                RelayEnd::ClientStalled => {
                    access.end = Some(RelayEnd::ClientStalled);
                    return None;
                }
                RelayEnd::UpstreamFailed => {}
            }
        }
    }
}
