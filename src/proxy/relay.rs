//! Relaying a committed upstream response to the client, chunk by chunk, unbuffered.
//!
//! While relaying, three things race: the next upstream chunk (bounded by the idle timeout),
//! and the client hanging up (`read_body_or_idle`: a FIN on HTTP/1.1, a reset on h2). A client
//! hang-up drops the upstream session at once, which closes its connection so the backend
//! stops generating.
//!
//! A client that stops reading is released the same way: a write that makes no progress
//! within `limits.write_timeout` (or the time `limits.min_send_rate` allows for its size) —
//! the end of the body included, which pingora leaves unbounded — ends the relay as
//! [`RelayEnd::ClientStalled`]. Its connection is then reset, not closed gracefully
//! ([`abort`]): what is still queued for it in the kernel is dropped at once, and the
//! upstream connection is closed (never pooled), so the engine aborts the request. An upstream failure after the first byte cannot be retried: a stream ends
//! with an SSE error event, then a clean end of body; other bodies are cut off (the client sees
//! a truncated body, never a hang). A stream that may migrate passes through a
//! [`Splicer`](pronto_core::splice::Splicer) (whole events only; an error event, or an end
//! without `[DONE]` or a finish, is a failure) and its failure is left to
//! [`super::migrate`], which may continue it on another backend.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::ServerSession;
use pingora_core::{Error, ErrorType};
use pingora_http::ResponseHeader;

use futures::FutureExt;

use super::observe::FirstTokenObserver;
use super::upstream::is_hop_by_hop;
use crate::coalesce;
use crate::error::GatewayError;
use crate::models::rename::Unrename;
use pronto_core::splice::Splicer;
use pronto_core::sse::{usage_from_body, SseScanner, Usage};

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// The whole body reached the client.
    Complete,
    /// The backend failed or went idle mid-body; the client got an error event or a cut.
    UpstreamFailed,
    /// The client hung up.
    ClientGone,
    /// The client stopped reading: a write made no progress within the write deadline. Its
    /// connection was made to reset ([`abort`]): drop it without another write.
    ClientStalled,
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
    /// Response head to send the client; `None` when it is out already (by the stream this
    /// one continues, or by keep-alives sent before the first token, `super::keepalive`).
    pub head: Option<ResponseHeader>,
    /// Rewrites the backend's model name back to the client's in the body, when they differ
    /// ([`crate::models::rename`]); the head then loses its `Content-Length`.
    pub unrename: Option<Unrename>,
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
    /// A stream that may migrate: its events pass through the splicer, and a failure is left
    /// to the caller (no error event).
    pub splice: Option<&'a mut Splicer>,
}

impl Relay<'_> {
    /// Relay the response; returns how it ended.
    pub async fn run(self, client: &mut ServerSession, up: &mut HttpSession) -> RelayOutcome {
        let Relay {
            head,
            mut unrename,
            first_chunk,
            mut body_done,
            mut held_first_token_at,
            sse,
            idle,
            mut observer,
            request_id,
            mut splice,
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
        let mut kept: Option<Vec<u8>> = head
            .as_ref()
            .filter(|_| !sse)
            .and_then(|h| h.headers.get(header::CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .filter(|&n| n <= USAGE_BODY_LIMIT)
            .map(Vec::with_capacity);
        let mut head = head;
        if let Some(h) = head.as_mut().filter(|_| unrename.is_some()) {
            if h.headers.get(header::CONTENT_LENGTH).is_some() {
                // The body's length changes with the name: chunked (h2: pingora frames it).
                h.remove_header(&header::CONTENT_LENGTH);
                if h.insert_header(header::TRANSFER_ENCODING, "chunked")
                    .is_err()
                {
                    out.end = RelayEnd::UpstreamFailed;
                    return out;
                }
            }
        }
        let splice_set = splice.is_some();
        // The head goes out with the first chunk (or the end of the body), in one write.
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
                let chunk = match splice.as_deref_mut() {
                    None => chunk,
                    Some(s) => {
                        let fed = s.feed(&chunk);
                        if let Some(e) = fed.error {
                            tracing::warn!(request_id, error = %e, "backend sent an error event mid-stream");
                            failed = Some(pingora_core::Error::explain(
                                pingora_core::ErrorType::ReadError,
                                "error event",
                            ));
                            pending = None;
                        }
                        Bytes::from(fed.out)
                    }
                };
                let chunk = match unrename.as_mut() {
                    Some(u) => u.feed(chunk),
                    None => chunk,
                };
                // An empty chunk (all of it held by the splicer or the rewriter) would end
                // the body: only the head goes out then, and only once there are bytes.
                let len = chunk.len() as u64;
                let written = match write_head(client, &mut head, len > 0).await {
                    Ok(()) if len > 0 => write_chunk(client, chunk, more).await,
                    r => r,
                };
                if let Err(e) = written {
                    out.end = client_failed(client, &e).await;
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
        if let Some(s) = splice {
            if out.end == RelayEnd::Complete {
                let rest = Bytes::from(s.finish());
                let rest = match unrename.as_mut() {
                    Some(u) => u.feed(rest),
                    None => rest,
                };
                if !rest.is_empty() {
                    let len = rest.len() as u64;
                    if let Err(e) = write_both(client, &mut head, rest).await {
                        out.end = client_failed(client, &e).await;
                        return out;
                    }
                    out.bytes_sent += len;
                }
                if !s.done() && !s.finished() {
                    tracing::warn!(
                        request_id,
                        "backend ended the stream without [DONE] or a finish"
                    );
                    out.end = RelayEnd::UpstreamFailed;
                }
            }
        }
        // What the rewriter still holds was the backend's: it goes out as it came.
        if let Some(tail) = unrename.as_mut().map(Unrename::finish) {
            let len = tail.len() as u64;
            if len > 0 {
                if let Err(e) = write_both(client, &mut head, tail).await {
                    out.end = client_failed(client, &e).await;
                    return out;
                }
            }
            out.bytes_sent += len;
        }
        if splice_set && out.end == RelayEnd::UpstreamFailed {
            // The migration decides how the client's stream goes on.
            if let Err(e) = write_head(client, &mut head, false).await {
                out.end = client_failed(client, &e).await;
            }
            return out;
        }
        // A head still unsent: the body ended (or failed) before its first byte.
        let ends_now = out.end == RelayEnd::Complete || sse;
        if let Err(e) = write_head(client, &mut head, ends_now).await {
            out.end = client_failed(client, &e).await;
            return out;
        }
        if out.end == RelayEnd::UpstreamFailed {
            if sse {
                out.bytes_sent += end_with_error_event(client).await;
            } else {
                // A fixed-length or chunked body cannot be ended cleanly without lying about
                // its completeness.
                cut(client).await;
            }
            return out;
        }
        if let Err(e) = write_last(client, Bytes::new()).await {
            out.end = client_failed(client, &e).await;
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

/// End a stream whose backend failed with an SSE error event, within the client's write
/// deadline; returns the bytes written (0 when the client is gone, or stalled: then released).
pub async fn end_with_error_event(client: &mut ServerSession) -> u64 {
    let e = GatewayError::Internal("the backend failed while streaming the response".into());
    let event = e.to_sse_event();
    let len = event.len() as u64;
    match write_last(client, event).await {
        Ok(()) => len,
        // The backend's failure is what the caller records; a stalled client is still released.
        Err(e) => {
            client_failed(client, &e).await;
            0
        }
    }
}

/// End a stream the gateway completes itself (`data: [DONE]`, then the end of the body),
/// within the client's write deadline; returns the bytes written, `None` when the client is
/// gone (a stalled one released).
pub async fn end_with_done(client: &mut ServerSession) -> Option<u64> {
    let done = Bytes::from_static(b"data: [DONE]\n\n");
    let len = done.len() as u64;
    if let Err(e) = write_last(client, done).await {
        client_failed(client, &e).await;
        return None;
    }
    Some(len)
}

/// Write the head if still unsent, then `chunk` (more follows at once).
async fn write_both(
    client: &mut ServerSession,
    head: &mut Option<ResponseHeader>,
    chunk: Bytes,
) -> pingora_core::Result<()> {
    write_head(client, head, true).await?;
    write_chunk(client, chunk, true).await
}

/// Close the client's connection mid-answer so that it sees a truncation: after the relay
/// returns, pingora would otherwise end a chunked body cleanly (and reuse the connection).
/// The close flushes what is buffered: within the write deadline, else it is a reset.
async fn cut(client: &mut ServerSession) {
    client.set_keepalive(None);
    let deadline = client.get_write_timeout();
    let shutdown = client.shutdown();
    let done = match deadline {
        Some(t) => tokio::time::timeout(t, shutdown).await.is_ok(),
        None => {
            shutdown.await;
            true
        }
    };
    if !done {
        abort(client).await;
    }
}

/// Whether a failed write to the client is a stall (no progress within the write deadline)
/// rather than a broken connection.
fn stalled(e: &Error) -> bool {
    e.etype == ErrorType::WriteTimedout
}

/// A write to the client failed with `e`: a stalled client's connection is aborted.
async fn client_failed(client: &mut ServerSession, e: &Error) -> RelayEnd {
    if stalled(e) {
        abort(client).await;
        RelayEnd::ClientStalled
    } else {
        RelayEnd::ClientGone
    }
}

/// Release a client that stopped reading: on HTTP/1.1 its connection is made to reset when
/// it is dropped (`SO_LINGER` 0, [`coalesce::abort`]) and is never reused; on h2 its stream
/// is reset (flow control bounds what the connection holds for it).
async fn abort(client: &mut ServerSession) {
    client.set_keepalive(None);
    if client.is_http2() {
        client.shutdown().await;
    } else if !coalesce::abort(client.stream()) {
        tracing::debug!("client connection cannot be reset; it is closed instead");
    }
}

/// Write the last of the body, `data`, and its end, within the client's write deadline:
/// pingora bounds a body write, but not the end of a chunked body (its terminator and flush).
async fn write_last(client: &mut ServerSession, data: Bytes) -> pingora_core::Result<()> {
    let deadline = client.get_write_timeout();
    let write = client.write_response_body(data, true);
    match deadline {
        None => write.await,
        Some(t) => match tokio::time::timeout(t, write).await {
            Ok(r) => r,
            Err(_) => Error::e_explain(
                ErrorType::WriteTimedout,
                format!("writing the end of the body, timeout: {t:?}"),
            ),
        },
    }
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
