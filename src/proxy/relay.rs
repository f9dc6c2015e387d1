//! Relaying a committed upstream response to the client, chunk by chunk, unbuffered.
//!
//! While relaying, three things race: the next upstream chunk (bounded by the idle timeout),
//! and the client hanging up (`read_body_or_idle`: a FIN on HTTP/1.1, a reset on h2). A client
//! hang-up drops the upstream session at once, which closes its connection so the backend
//! stops generating. An upstream failure after the first byte cannot be retried: a stream ends
//! with an SSE error event, then a clean end of body; other bodies are cut off (the client sees
//! a truncated body, never a hang).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::ServerSession;
use pingora_http::ResponseHeader;

use futures::FutureExt;

use super::observe::FirstTokenObserver;
use super::upstream::is_hop_by_hop;
use crate::coalesce;
use crate::error::GatewayError;
use crate::sse::{usage_from_body, SseScanner, Usage};

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// The whole body reached the client.
    Complete,
    /// The backend failed or went idle mid-body; the client got an error event or a cut.
    UpstreamFailed,
    /// The client hung up.
    ClientGone,
}

/// Observations from one relay.
#[derive(Debug, Clone, Copy)]
pub struct RelayOutcome {
    /// How it ended.
    pub end: RelayEnd,
    /// When the first generated token passed through (streams only).
    pub first_token_at: Option<Instant>,
    /// When the first answer token — content or a tool call, not reasoning — passed through
    /// (streams only): the time to first answer.
    pub first_answer_at: Option<Instant>,
    /// When the last output-carrying event passed through (streams only).
    pub last_token_at: Option<Instant>,
    /// Output-carrying events relayed (≈ output tokens; streams only).
    pub output_events: u32,
    /// Of those, reasoning-only events (≈ reasoning tokens; streams only).
    pub reasoning_events: u32,
    /// Body bytes written to the client (an error event included).
    pub bytes_sent: u64,
    /// The upstream connection is clean and may be pooled.
    pub reusable: bool,
    /// The response's `usage`: the stream's last usage event, or a complete JSON body's (bodies
    /// up to [`USAGE_BODY_LIMIT`] are kept for it).
    pub usage: Option<Usage>,
}

/// Largest non-streamed response body copied to read its `usage` (typical chat completions
/// are a few KiB; larger ones — embeddings — are relayed without a copy).
pub const USAGE_BODY_LIMIT: usize = 256 << 10;

/// The response head for the client: the backend's, minus hop-by-hop headers, plus our own.
pub fn client_response_head(
    upstream: &ResponseHeader,
    extra: &[(&'static str, String)],
) -> pingora_core::Result<ResponseHeader> {
    let mut h = ResponseHeader::build_no_case(upstream.status, Some(upstream.headers.len() + 2))?;
    for (name, value) in upstream.headers.iter() {
        if !is_hop_by_hop(name) {
            h.append_header(name.clone(), value.clone())?;
        }
    }
    if h.headers.get(header::CONTENT_LENGTH).is_none() {
        // Unknown length (a stream): chunked on HTTP/1.1, so the connection stays reusable.
        // Pingora drops this header on h2.
        h.insert_header(header::TRANSFER_ENCODING, "chunked")?;
    }
    for (k, v) in extra {
        h.insert_header(*k, v.as_str())?;
    }
    Ok(h)
}

/// Everything the relay needs besides the two sessions.
pub struct Relay<'a> {
    /// Response head to send the client; `None` when it is out already (keep-alives sent
    /// before the first token, `super::keepalive`).
    pub head: Option<ResponseHeader>,
    /// First body chunk already read by the attempt.
    pub first_chunk: Option<Bytes>,
    /// The upstream body already ended.
    pub body_done: bool,
    /// When the first token really arrived, if the attempt held the stream past it (then
    /// `first_chunk` holds the reasoning; see `upstream::attempt`).
    pub held_first_token_at: Option<Instant>,
    /// Whether this is an SSE stream (scan for the first token; end with an error event).
    pub sse: bool,
    /// Longest wait for the next upstream chunk.
    pub idle: Duration,
    /// Told of the first generated token, once (the model learns, the booking leaves
    /// prefill).
    pub observer: FirstTokenObserver<'a>,
    /// The request's id, for the log.
    pub request_id: &'a str,
}

impl Relay<'_> {
    /// Relay the response; returns how it ended.
    pub async fn run(self, client: &mut ServerSession, up: &mut HttpSession) -> RelayOutcome {
        let Relay {
            head,
            first_chunk,
            mut body_done,
            mut held_first_token_at,
            sse,
            idle,
            mut observer,
            request_id,
        } = self;
        let mut scanner = SseScanner::new();
        let mut out = RelayOutcome {
            end: RelayEnd::Complete,
            first_token_at: None,
            first_answer_at: None,
            last_token_at: None,
            output_events: 0,
            reasoning_events: 0,
            bytes_sent: 0,
            reusable: false,
            usage: None,
        };
        // A non-streamed body of known, small length is kept to read its `usage` at the end.
        let mut kept: Option<Vec<u8>> = (!sse)
            .then(|| head.as_ref()?.headers.get(header::CONTENT_LENGTH))
            .flatten()
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .filter(|&n| n <= USAGE_BODY_LIMIT)
            .map(Vec::with_capacity);
        // The head goes out with the first chunk (or the end of the body), in one write.
        let mut head = head;
        let mut pending = first_chunk;
        loop {
            if let Some(chunk) = pending.take() {
                if sse {
                    let update = scanner.feed(&chunk);
                    if update.output_events > 0 {
                        let at = Instant::now();
                        observer.progressed(at);
                        out.last_token_at = Some(at);
                        out.output_events += update.output_events;
                        out.reasoning_events += update.reasoning_events;
                        if update.first_token {
                            let at = held_first_token_at.take().unwrap_or(at);
                            out.first_token_at = Some(at);
                            observer.first_token(at);
                        }
                        if update.first_answer {
                            out.first_answer_at = Some(at);
                            observer.first_answer(at);
                        }
                    }
                }
                if let Some(k) = kept.as_mut() {
                    if k.len() + chunk.len() <= USAGE_BODY_LIMIT {
                        k.extend_from_slice(&chunk);
                    } else {
                        kept = None;
                    }
                }
                // What the backend has already sent after this chunk — the next chunk, or the
                // end of the body — goes out in the same write; nothing is waited for.
                let mut failed = None;
                if !body_done {
                    match tokio::task::unconstrained(up.read_response_body()).now_or_never() {
                        Some(Ok(Some(next))) => pending = Some(next),
                        Some(Ok(None)) => body_done = true,
                        Some(Err(e)) => failed = Some(e),
                        None => {}
                    }
                }
                let more = pending.is_some() || body_done;
                let len = chunk.len() as u64;
                if write_head(client, &mut head, true).await.is_err()
                    || write_chunk(client, chunk, more).await.is_err()
                {
                    out.end = RelayEnd::ClientGone;
                    return out;
                }
                out.bytes_sent += len;
                if let Some(e) = failed {
                    tracing::warn!(request_id, error = %e, "backend failed mid-response");
                    out.end = RelayEnd::UpstreamFailed;
                    break;
                }
                if pending.is_some() {
                    continue;
                }
            }
            if body_done {
                break;
            }
            tokio::select! {
                r = tokio::time::timeout(idle, up.read_response_body()) => match r {
                    Ok(Ok(Some(chunk))) => pending = Some(chunk),
                    Ok(Ok(None)) => body_done = true,
                    Ok(Err(e)) => {
                        tracing::warn!(request_id, error = %e, "backend failed mid-response");
                        out.end = RelayEnd::UpstreamFailed;
                        break;
                    }
                    Err(_) => {
                        tracing::warn!(request_id, "backend idle mid-response");
                        out.end = RelayEnd::UpstreamFailed;
                        break;
                    }
                },
                r = client.read_body_or_idle(true) => {
                    // Any outcome here means the client went away (or its connection broke).
                    // Cut it: a client still there must not take the stream as complete.
                    tracing::debug!(request_id, result = ?r.map(|b| b.map(|b| b.len())), "client gone");
                    cut(client).await;
                    out.end = RelayEnd::ClientGone;
                    return out;
                }
            }
        }
        // A head still unsent: the body ended (or failed) before its first byte.
        let ends_now = out.end == RelayEnd::Complete || sse;
        if write_head(client, &mut head, ends_now).await.is_err() {
            out.end = RelayEnd::ClientGone;
            return out;
        }
        if out.end == RelayEnd::UpstreamFailed {
            if sse {
                let e = GatewayError::Internal(
                    "the backend failed while streaming the response".into(),
                );
                let event = e.to_sse_event();
                let len = event.len() as u64;
                if client.write_response_body(event, true).await.is_ok() {
                    out.bytes_sent += len;
                }
            } else {
                // A fixed-length or chunked body cannot be ended cleanly without lying about
                // its completeness.
                cut(client).await;
            }
            return out;
        }
        if client
            .write_response_body(Bytes::new(), true)
            .await
            .is_err()
        {
            out.end = RelayEnd::ClientGone;
            return out;
        }
        out.reusable = up.response_done();
        out.usage = if sse {
            scanner.usage()
        } else {
            kept.as_deref().and_then(usage_from_body)
        };
        out
    }
}

/// Close the client's connection mid-answer so that it sees a truncation: after the relay
/// returns, pingora would otherwise end a chunked body cleanly (and reuse the connection).
async fn cut(client: &mut ServerSession) {
    client.set_keepalive(None);
    let _ = client.shutdown().await;
}

/// Write the response head if it is still unsent. `more_now`: another write follows at once
/// (a chunk in hand, or the end of the body), so the head waits in the connection's
/// [`Coalesce`](crate::coalesce::Coalesce) buffer and goes out with it.
async fn write_head(
    client: &mut ServerSession,
    head: &mut Option<ResponseHeader>,
    more_now: bool,
) -> pingora_core::Result<()> {
    let Some(h) = head.take() else {
        return Ok(());
    };
    let held = more_now && coalesce::hold(client.stream(), true);
    let r = client.write_response_header(Box::new(h)).await;
    if held {
        coalesce::hold(client.stream(), false);
    }
    r
}

/// Write one body chunk; `more_now` as for [`write_head`].
async fn write_chunk(
    client: &mut ServerSession,
    chunk: Bytes,
    more_now: bool,
) -> pingora_core::Result<()> {
    let held = more_now && coalesce::hold(client.stream(), true);
    let r = client.write_response_body(chunk, false).await;
    if held {
        coalesce::hold(client.stream(), false);
    }
    r
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
