//! Reading the whole request body before routing (DESIGN §3.1 option (a)).
//!
//! The body is read whole before the request is routed, so routing sees the entire prompt
//! whatever its size, and the same bytes are sent to each upstream attempt. The limit is
//! enforced both on a declared `Content-Length` (rejected before reading a byte) and on the
//! bytes actually read (chunked bodies), and a client that stalls mid-body is timed out: each
//! chunk within `idle`, the whole body within `total` (408 either way). The bytes are charged
//! to the global [`super::budget::BufferBudget`] as they are read — a declared
//! `Content-Length` at once, before a byte is read — and a body that does not fit is refused
//! with 503.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora_core::protocols::http::ServerSession;

use super::budget::Reservation;
use crate::error::GatewayError;

/// How long [`linger`] keeps reading a refused body, and how much of it.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 << 20;

/// After an early answer to a request whose body was not read (413, 503 `gateway_busy`):
/// read and discard what the client is still sending, for at most [`LINGER_TIME`] and
/// [`LINGER_BYTES`], before the connection is closed. Closing a socket with unread data
/// resets it, and the reset can destroy the answer before the client reads it (nginx's
/// lingering close). Nothing is buffered. HTTP/2 needs none of this: a stream is reset alone.
pub async fn linger(session: &mut ServerSession) {
    if session.is_http2() {
        return;
    }
    let _ = tokio::time::timeout(LINGER_TIME, async {
        let mut read = 0;
        while let Ok(Some(chunk)) = session.read_request_body().await {
            read += chunk.len();
            if read > LINGER_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Deadlines and limits of one body read.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body, bytes.
    pub max_bytes: u64,
    /// Longest wait for the next chunk.
    pub idle: Duration,
    /// Longest wait for the whole body.
    pub total: Duration,
}

/// Read the full request body within `limits`, charging it to `budget`.
pub async fn read_body(
    session: &mut ServerSession,
    limits: BodyLimits,
    budget: &mut Reservation<'_>,
) -> Result<Bytes, GatewayError> {
    let limit = limits.max_bytes;
    let declared = session
        .get_header("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    if declared.is_some_and(|n| !budget.grow(n)) {
        return Err(GatewayError::Busy("buffered request bytes"));
    }
    match tokio::time::timeout(limits.total, read_all(session, limits, declared, budget)).await {
        Ok(r) => r,
        Err(_) => Err(GatewayError::RequestTimeout),
    }
}

/// What went wrong reading a body, for the client: the innermost cause's message (the
/// framing checker's reason, pingora's chunk error), without pingora's error chain.
fn body_error(e: &pingora_core::Error) -> String {
    let detail = match (&e.cause, &e.context) {
        (Some(_), _) => e.root_cause().to_string(),
        (None, Some(c)) => c.as_str().to_string(),
        (None, None) => e.etype.as_str().to_string(),
    };
    format!("the request body could not be read ({detail})")
}

async fn read_all(
    session: &mut ServerSession,
    limits: BodyLimits,
    declared: Option<u64>,
    budget: &mut Reservation<'_>,
) -> Result<Bytes, GatewayError> {
    let (limit, idle) = (limits.max_bytes, limits.idle);
    let expects_continue = session
        .get_header("expect")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue && !session.is_http2() {
        session
            .write_continue_response()
            .await
            .map_err(|e| GatewayError::BadRequest(format!("client connection failed: {e}")))?;
    }
    // Chunks are kept as they arrive and joined once at the end: a body that arrives in one
    // chunk is not copied at all.
    let mut parts: Vec<Bytes> = Vec::new();
    let mut total: u64 = 0;
    loop {
        let chunk = match tokio::time::timeout(idle, session.read_request_body()).await {
            Err(_) => return Err(GatewayError::RequestTimeout),
            // A malformed body (pingora's parser or `crate::edge::framing`'s checker) or a
            // connection that failed mid-body: either way where the body ends is unknown.
            Ok(Err(e)) => return Err(GatewayError::Framing(body_error(&e))),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        total += chunk.len() as u64;
        if total > limit {
            return Err(GatewayError::BodyTooLarge { limit });
        }
        if declared.is_none_or(|d| total > d) && !budget.grow(chunk.len() as u64) {
            return Err(GatewayError::Busy("buffered request bytes"));
        }
        parts.push(chunk);
    }
    Ok(match parts.len() {
        0 | 1 => parts.pop().unwrap_or_default(),
        _ => {
            let mut b = BytesMut::with_capacity(total as usize);
            for p in &parts {
                b.extend_from_slice(p);
            }
            b.freeze()
        }
    })
}
