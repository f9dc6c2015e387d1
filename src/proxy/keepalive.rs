//! Keep-alives before the first token (a route's `keepalive`,
//! [`crate::config::progress`]).
//!
//! A long prefill — a 100k-token prompt behind a queue — can take more than a minute to its
//! first token, and the idle timeouts in front of Pronto (nginx's `proxy_read_timeout`, a
//! cloud load balancer's 60 s) close a connection that carries nothing for that long. While a
//! streamed request on such a route waits for its first token — its attempts, retries and
//! races included — an SSE comment frame (`: keep-alive`) goes to the client every `keepalive`
//! interval, counted from the request's arrival. SSE clients ignore comments.
//!
//! ```text
//! arrival ── every ──► 200 head + ": keep-alive" ── every ──► ": keep-alive" ── first token ──► relay
//! ```
//!
//! The first keep-alive commits a `200 text/event-stream` head: until then a failure may
//! still be answered with its own status (no keep-alive is sent before one interval has
//! passed), after it only inside the stream. Failover before the first token goes on as
//! before (nothing of an attempt has reached the client); if every attempt fails the client
//! gets the failure as one SSE error event — the shape of the relay's mid-stream error event
//! ([`GatewayError::to_sse_event`]) — and a clean end of the stream
//! ([`error_event`]); an answer that is not a stream (a backend's 4xx or 5xx on the last
//! attempt) is turned into the same. The explain headers are not sent on a stream whose head
//! went out before its backend was known.
//!
//! The wait runs in the request's task: no spawn, no lock; a client that hung up is noticed
//! at the next keep-alive write, and its attempts are dropped (their upstream connections
//! closed, so the engines abort them).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::ServerSession;
use pingora_http::ResponseHeader;

use crate::config::Route;
use crate::error::GatewayError;
use crate::telemetry::Metrics;

/// One SSE comment frame.
pub const FRAME: &[u8] = b": keep-alive\n\n";

/// Most bytes of a non-stream answer read to find its error message (the rest is dropped).
const MAX_ERROR_BODY: usize = 64 << 10;

/// The keep-alive state of one streamed request.
pub(super) struct KeepAlive<'a> {
    every: Duration,
    route: Arc<str>,
    metrics: &'a Metrics,
    /// When the next keep-alive is due.
    next: Instant,
    /// Keep-alives sent (the first sent the head).
    sent: u32,
    /// The request's id, for the head's `x-request-id`.
    request_id: String,
}

impl<'a> KeepAlive<'a> {
    /// Keep-alives for a stream on `route` that arrived at `arrived`; `None` when the route
    /// sends none.
    pub fn new(
        route: &Route,
        metrics: &'a Metrics,
        arrived: Instant,
        request_id: &str,
    ) -> Option<KeepAlive<'a>> {
        let every = route.keepalive?;
        Some(KeepAlive {
            every,
            route: Arc::clone(&route.name),
            metrics,
            next: arrived + every,
            sent: 0,
            request_id: request_id.to_string(),
        })
    }

    /// Keep-alives sent so far.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// Await `fut`, writing a keep-alive to the client whenever one is due meanwhile. A write
    /// that fails means the client is gone: `fut` is dropped and the error says so.
    pub async fn wait<F: Future>(
        &mut self,
        session: &mut ServerSession,
        fut: F,
    ) -> Result<F::Output, GatewayError> {
        tokio::pin!(fut);
        loop {
            let due = tokio::time::Instant::from_std(self.next);
            tokio::select! {
                out = &mut fut => return Ok(out),
                _ = tokio::time::sleep_until(due) => {}
            }
            if self.send(session).await.is_err() {
                return Err(GatewayError::ClientClosed);
            }
            self.next = Instant::now() + self.every;
        }
    }

    /// Write one keep-alive (the head first, with the first one).
    async fn send(&mut self, session: &mut ServerSession) -> pingora_core::Result<()> {
        if self.sent == 0 {
            let head = stream_head(&self.request_id)?;
            session.write_response_header(Box::new(head)).await?;
        }
        session
            .write_response_body(Bytes::from_static(FRAME), false)
            .await?;
        self.sent += 1;
        self.metrics
            .progress
            .keepalives_sent_total
            .with_label_values(&[&self.route])
            .inc();
        Ok(())
    }
}

/// The head a keep-alive commits: `200`, an event stream, not cached, chunked.
fn stream_head(request_id: &str) -> pingora_core::Result<ResponseHeader> {
    let mut h = ResponseHeader::build_no_case(200, Some(4))?;
    h.insert_header(http::header::CONTENT_TYPE, "text/event-stream")?;
    h.insert_header(http::header::CACHE_CONTROL, "no-cache")?;
    // Pingora drops this header on h2.
    h.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
    h.insert_header(super::request_id::HEADER, request_id)?;
    Ok(h)
}

/// Write `err` as one SSE event and end the stream; the bytes written (0: the client is gone).
pub async fn error_event(session: &mut ServerSession, err: &GatewayError) -> usize {
    let event = err.to_sse_event();
    let len = event.len();
    match session.write_response_body(event, true).await {
        Ok(()) => len,
        Err(_) => 0,
    }
}

/// The error a committed stream's client is told when the backend answered `status` without
/// a stream (a 4xx or 5xx on the last attempt): a 4xx's own message (read from its body, at
/// most [`MAX_ERROR_BODY`] bytes within `idle`), as a bad request; anything else as a failed
/// backend.
pub async fn upstream_error(up: &mut HttpSession, status: u16, idle: Duration) -> GatewayError {
    if !(400..500).contains(&status) {
        return GatewayError::Internal(format!(
            "the backend answered {status} instead of a stream"
        ));
    }
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout(idle, up.read_response_body()).await {
            Ok(Ok(Some(c))) => body.extend_from_slice(&c),
            _ => break,
        }
    }
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| Some(v.get("error")?.get("message")?.as_str()?.to_string()))
        .unwrap_or_else(|| format!("the backend refused the request ({status})"));
    GatewayError::BadRequest(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keep_alive_is_an_sse_comment() {
        // A line starting with a colon is a comment: every SSE parser skips it.
        assert!(FRAME.starts_with(b":") && FRAME.ends_with(b"\n\n"));
        let mut scanner = pronto_core::sse::SseScanner::new();
        let u = scanner.feed(FRAME);
        assert_eq!(u.output_events, 0);
        assert!(!u.first_token);
    }

    #[test]
    fn the_committed_head_is_an_uncached_event_stream() {
        let h = stream_head("req-1").unwrap();
        assert_eq!(h.status.as_u16(), 200);
        assert_eq!(h.headers["content-type"], "text/event-stream");
        assert_eq!(h.headers["cache-control"], "no-cache");
        assert_eq!(h.headers["x-request-id"], "req-1");
    }
}
