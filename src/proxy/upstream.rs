//! One upstream attempt: connect, send the request (the full body, every attempt), and wait for
//! the response head — and, for streams, the first body chunk — before anything is committed to
//! the client. Until [`Attempt::Committed`] nothing has reached the client, so every failure
//! here may be retried on another backend.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName};
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::v1::client::HttpSession as Http1Session;
use pingora_core::protocols::Stream;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_http::RequestHeader;

use crate::backend::{Backend, InflightGuard};
use crate::coalesce::{self, Coalesce};
use crate::telemetry::RetryReason;

/// Headers that describe one connection, not the message: never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` must not cross the proxy.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.as_str().eq_ignore_ascii_case(h))
}

/// What one attempt produced.
pub enum Attempt {
    /// The backend answered in a way the client will get: stream it.
    Committed {
        /// The upstream session, positioned after `first_chunk`; its response head as received
        /// is `upstream.response_header()`.
        upstream: Box<HttpSession>,
        /// The first body chunk, for streams (read under the first-token deadline).
        first_chunk: Option<Bytes>,
        /// The response body already ended.
        body_done: bool,
        /// When the request was fully sent.
        sent_at: Instant,
        /// When the first token arrived, if the attempt held the stream past it (a race on
        /// the first answer: `first_chunk` is then everything up to the first answer token).
        held_first_token_at: Option<Instant>,
    },
    /// Nothing reached the client; the request may be tried elsewhere.
    Failed {
        /// Why, for `pronto_retries_total` and `pronto_upstream_errors_total`.
        reason: RetryReason,
        /// A description for the log (never for the client: it may name addresses).
        detail: String,
        /// Whether the failure says the backend is unwell (connect failure, reset, 5xx) and
        /// counts toward ejecting it; a 429 says it is busy, which is not a fault.
        backend_fault: bool,
    },
    /// The backend took too long to produce its first byte.
    FirstTokenTimeout,
}

/// Timeouts for one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// Request sent → first body chunk of a stream.
    pub first_token: Duration,
    /// Request sent → response head of a non-streamed request (its whole answer, usually).
    pub total: Duration,
    /// Between body chunks.
    pub idle: Duration,
}

impl Deadlines {
    /// How long the attempt waits for its first answer: a stream's first token, or a
    /// non-streamed request's whole answer.
    pub fn first_answer(&self, stream: bool) -> Duration {
        if stream {
            self.first_token
        } else {
            self.total
        }
    }
}

/// Whether the client's `Authorization` is a credential the gateway used: checked by `auth:`
/// (`auth_on`), or matched by the request's route (`match.api_keys`, or a `match.headers`
/// condition on `authorization`). Such a key stays with the gateway; a client's key passes
/// through only when the gateway does not use it.
pub fn client_key_is_ours(auth_on: bool, route: Option<&crate::config::Route>) -> bool {
    auth_on || route.is_some_and(|r| r.matcher.uses_authorization())
}

/// The request head sent upstream: the client's end-to-end headers, our `Host` and framing,
/// and the request's id as `x-request-id` (replacing the client's, which it equals when that
/// was valid). The client's `Authorization` is dropped when it is the gateway's credential
/// (`client_auth_is_ours`, see [`client_key_is_ours`]) or the backend has a key of its own,
/// which is sent instead.
pub fn upstream_request_head(
    client: &RequestHeader,
    backend: &Backend,
    body_len: usize,
    client_auth_is_ours: bool,
    request_id: &str,
) -> pingora_core::Result<RequestHeader> {
    let path = client.uri.path_and_query().map_or("/", |p| p.as_str());
    let drop_auth = client_auth_is_ours || backend.authorization.is_some();
    // Header names go out lowercase (no case map to build): HTTP/1.1 names are
    // case-insensitive.
    let mut req =
        RequestHeader::build_no_case("POST", path.as_bytes(), Some(client.headers.len() + 3))?;
    for (name, value) in client.headers.iter() {
        if is_hop_by_hop(name)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::EXPECT
            || (drop_auth && name == header::AUTHORIZATION)
        {
            continue;
        }
        req.append_header(name.clone(), value.clone())?;
    }
    match &backend.host_header {
        Some(host) => req.insert_header(header::HOST, host.clone())?,
        None => req.insert_header(header::HOST, backend.authority.as_str())?,
    };
    req.insert_header(header::CONTENT_LENGTH, body_len.to_string())?;
    if let Some(auth) = &backend.authorization {
        req.insert_header(header::AUTHORIZATION, auth.clone())?;
    }
    req.insert_header(super::request_id::HEADER, request_id)?;
    Ok(req)
}

/// Whether a status is worth trying on another backend (nothing has reached the client yet),
/// and whether it is the backend's fault.
pub fn retryable_status(status: u16) -> Option<(RetryReason, bool)> {
    match status {
        429 => Some((RetryReason::Status429, false)),
        500..=599 => Some((RetryReason::Status5xx, true)),
        _ => None,
    }
}

/// Connections for attempts: pingora's transport connector and its pool of idle connections,
/// each connection wrapped in a [`Coalesce`] so that a request's head and body go out in one
/// write. (Upstreams speak HTTP/1.1: a backend's peer offers no other ALPN.)
pub struct Connectors {
    transport: TransportConnector,
}

impl Connectors {
    /// Connectors keeping up to `pool_size` idle upstream connections.
    pub fn new(pool_size: usize) -> Connectors {
        let mut opts = pingora_core::connectors::ConnectorOptions::new(pool_size);
        opts.keepalive_pool_size = pool_size;
        Connectors {
            transport: TransportConnector::new(Some(opts)),
        }
    }

    /// A session to `peer` — an idle pooled connection when there is one, unless `fresh` — and
    /// whether it was reused.
    pub async fn session(
        &self,
        peer: &HttpPeer,
        fresh: bool,
    ) -> pingora_core::Result<(HttpSession, bool)> {
        // What `TransportConnector::get_stream` does, with the connect boxed: its future is
        // large (about 8 KiB), and inline it would size the request's whole future, which stays
        // allocated for as long as the response streams. A pooled connection allocates nothing
        // more; a new one pays one box next to the connect's own allocations.
        let pooled = if fresh {
            None
        } else {
            self.transport.reused_stream(peer).await
        };
        let (stream, reused) = match pooled {
            Some(stream) => (stream, true),
            None => (Box::pin(self.transport.new_stream(peer)).await?, false),
        };
        // A pooled connection is wrapped already.
        let stream: Stream = if (*stream).as_any().is::<Coalesce>() {
            stream
        } else {
            Box::new(Coalesce::new(stream))
        };
        let session = HttpSession::H1(Http1Session::new_with_options(stream, peer));
        Ok((session, reused))
    }

    /// Give a session back: its connection is pooled for `idle` when the exchange left it
    /// reusable, closed otherwise.
    pub async fn release(&self, session: HttpSession, peer: &HttpPeer, idle: Duration) {
        if let HttpSession::H1(mut s) = session {
            s.respect_keepalive();
            if let Some(stream) = s.reuse().await {
                self.transport
                    .release_stream(stream, peer.reuse_hash(), Some(idle));
            }
        }
    }
}

/// Writing the request, or reading the response head, failed on one connection.
struct SendError(String);

/// Run one attempt against `backend`. `may_retry_status` says whether a 5xx/429 answer should
/// be abandoned for another backend (false on the last attempt: the client then gets it).
///
/// A *stale* pooled connection (the backend closed it while idle: the write or the head read
/// fails on a reused connection) is not the backend's fault and not a retry: the request is
/// sent again at once, once, on a fresh connection to the same backend.
///
/// A non-streamed request's prefill is taken off the ledger when its response head arrives or
/// its predicted TTFT passes, whichever is first (see [`pronto_core::load`]).
///
/// `until_answer` (a stream raced on its first answer, a route's `race_on: ttfa`): the attempt
/// commits at its first *answer* token, not its first token — the reasoning before it is held
/// here (read chunk by chunk under the idle timeout, at most [`MAX_HELD_BYTES`]; past that it
/// commits with what it holds) and becomes `first_chunk`, so until then the copy may still be
/// dropped. The first token ends the booking's prefill when it arrives
/// ([`InflightGuard::first_token_held`]).
#[allow(clippy::too_many_arguments)]
pub async fn attempt(
    connectors: &Connectors,
    backend: &Backend,
    head: RequestHeader,
    body: &Bytes,
    stream: bool,
    until_answer: bool,
    deadlines: Deadlines,
    may_retry_status: bool,
    guard: &mut InflightGuard,
) -> Attempt {
    let head_deadline = deadlines.first_answer(stream);
    let mut fresh = false;
    let (mut up, sent_at, status) = loop {
        let (mut up, reused) = match connectors.session(&backend.peer, fresh).await {
            Ok(s) => s,
            Err(e) => return failed(RetryReason::Connect, backend, "connect to", &e),
        };
        let sent = send(&mut up, head.clone(), body).await;
        let sent_at = Instant::now();
        let deadline = tokio::time::Instant::from_std(sent_at + head_deadline);
        let result = match sent {
            Err(e) => Err(e),
            Ok(()) => match read_head(&mut up, deadline, stream, guard).await {
                None => return Attempt::FirstTokenTimeout,
                Some(r) => r,
            },
        };
        match result {
            Ok(status) => break (up, sent_at, status),
            Err(SendError(_)) if reused => {
                tracing::debug!(backend = %backend.name(), "stale pooled connection; resending on a fresh one");
                backend.count_upstream_error(RetryReason::StaleConnection.as_str());
                fresh = true;
            }
            Err(SendError(e)) => return failed(RetryReason::Io, backend, "exchange with", &e),
        }
    };
    if !stream {
        guard.end_prefill();
        if (200..300).contains(&status) {
            // A non-streamed answer's head comes with its whole generation: progress.
            guard.progressed(Instant::now());
        }
    }
    if may_retry_status {
        if let Some((reason, backend_fault)) = retryable_status(status) {
            return Attempt::Failed {
                reason,
                detail: format!("{} answered {status}", backend.name()),
                backend_fault,
            };
        }
    }
    let (mut first_chunk, mut body_done) = (None, up.response_done());
    if stream && (200..300).contains(&status) && !body_done {
        let deadline = tokio::time::Instant::from_std(sent_at + head_deadline);
        match tokio::time::timeout_at(deadline, up.read_response_body()).await {
            Err(_) => return Attempt::FirstTokenTimeout,
            Ok(Err(e)) => return failed(RetryReason::Io, backend, "reading first chunk from", &e),
            Ok(Ok(None)) => body_done = true,
            Ok(Ok(Some(c))) => first_chunk = Some(c),
        }
    }
    let mut held_first_token_at = None;
    if let Some(first) = first_chunk.take_if(|_| until_answer) {
        match hold_until_answer(
            &mut up,
            first,
            &mut body_done,
            deadlines.idle,
            sent_at,
            guard,
        )
        .await
        {
            Ok((held, at)) => (first_chunk, held_first_token_at) = (Some(held), at),
            Err(e) => return failed(RetryReason::Io, backend, "reading the reasoning from", &e),
        }
    }
    Attempt::Committed {
        upstream: Box::new(up),
        first_chunk,
        body_done,
        sent_at,
        held_first_token_at,
    }
}

/// Most response bytes an attempt holds back waiting for its first answer token.
pub const MAX_HELD_BYTES: usize = 1 << 20;

/// Read a stream from its `first` chunk until the first answer token (or its end, or
/// [`MAX_HELD_BYTES`]): everything read, and when the first token came. See [`attempt`].
async fn hold_until_answer(
    up: &mut HttpSession,
    first: Bytes,
    body_done: &mut bool,
    idle: Duration,
    sent_at: Instant,
    guard: &mut InflightGuard,
) -> Result<(Bytes, Option<Instant>), String> {
    let mut scanner = pronto_core::sse::SseScanner::new();
    let mut held = bytes::BytesMut::new();
    let mut first_token_at = None;
    let mut chunk = Some(first);
    loop {
        if let Some(c) = chunk.take() {
            let update = scanner.feed(&c);
            held.extend_from_slice(&c);
            if update.first_token {
                let at = Instant::now();
                first_token_at = Some(at);
                guard.first_token_held(at.saturating_duration_since(sent_at).as_secs_f64(), at);
            }
            if update.first_answer || held.len() >= MAX_HELD_BYTES {
                break;
            }
        }
        if *body_done {
            break;
        }
        match tokio::time::timeout(idle, up.read_response_body()).await {
            Ok(Ok(Some(c))) => chunk = Some(c),
            Ok(Ok(None)) => *body_done = true,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("no byte for {} ms", idle.as_millis())),
        }
    }
    Ok((held.freeze(), first_token_at))
}

fn failed(
    reason: RetryReason,
    backend: &Backend,
    what: &str,
    e: &dyn std::fmt::Display,
) -> Attempt {
    Attempt::Failed {
        reason,
        detail: format!("{what} {} failed: {e}", backend.name()),
        backend_fault: true,
    }
}

/// Send the request: its head and body in one write (the head is held in the connection's
/// [`Coalesce`] buffer until the body follows it).
async fn send(up: &mut HttpSession, head: RequestHeader, body: &Bytes) -> Result<(), SendError> {
    let held = !body.is_empty() && hold_upstream(up, true);
    let r = up.write_request_header(Box::new(head)).await;
    if held {
        hold_upstream(up, false);
    }
    r.map_err(|e| SendError(format!("sending request: {e}")))?;
    up.write_request_body(body.clone(), true)
        .await
        .map_err(|e| SendError(format!("sending body: {e}")))?;
    up.finish_request_body()
        .await
        .map_err(|e| SendError(format!("finishing body: {e}")))?;
    Ok(())
}

/// [`coalesce::hold`] on an upstream session's connection.
fn hold_upstream(up: &HttpSession, on: bool) -> bool {
    match up {
        HttpSession::H1(s) => coalesce::hold(Some(s.stream()), on),
        _ => false,
    }
}

/// Wait for the response head until `deadline` (`None`: it passed); its status. A non-streamed
/// request's prefill ends at its predicted TTFT if the head is not there by then.
async fn read_head(
    up: &mut HttpSession,
    deadline: tokio::time::Instant,
    stream: bool,
    guard: &mut InflightGuard,
) -> Option<Result<u16, SendError>> {
    let prefill_ends = (!stream)
        .then(|| guard.booking().prefill_ends_by())
        .flatten()
        .map(tokio::time::Instant::from_std);
    let r = {
        let read = up.read_response_header();
        tokio::pin!(read);
        let early = match prefill_ends {
            Some(at) if at < deadline => {
                tokio::select! {
                    r = &mut read => Some(r),
                    _ = tokio::time::sleep_until(at) => {
                        guard.end_prefill();
                        None
                    }
                }
            }
            _ => None,
        };
        match early {
            Some(r) => r,
            None => tokio::time::timeout_at(deadline, read).await.ok()?,
        }
    };
    Some(match r {
        Err(e) => Err(SendError(format!("reading response: {e}"))),
        Ok(()) => up
            .response_header()
            .map(|h| h.status.as_u16())
            .ok_or_else(|| SendError("no response header".into())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_recognised() {
        assert!(is_hop_by_hop(&HeaderName::from_static("connection")));
        assert!(is_hop_by_hop(&HeaderName::from_static("transfer-encoding")));
        assert!(!is_hop_by_hop(&HeaderName::from_static("authorization")));
    }

    #[test]
    fn a_request_head_and_its_body_go_out_in_one_write() {
        use crate::proxy::test_io::Recorder;
        use std::sync::{Arc, Mutex};
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let writes = Arc::new(Mutex::new(Vec::new()));
            let recorder = Recorder {
                reads: tokio::io::duplex(64).0,
                writes: Arc::clone(&writes),
                wrote: Arc::default(),
            };
            let stream: Stream = Box::new(recorder);
            let mut up = HttpSession::H1(Http1Session::new(Box::new(Coalesce::new(stream))));
            let body = Bytes::from_static(b"{\"model\":\"m\",\"prompt\":\"hi\"}");
            let mut head = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
            head.insert_header("host", "b").unwrap();
            head.insert_header("content-length", body.len().to_string())
                .unwrap();
            assert!(send(&mut up, head, &body).await.is_ok());
            let writes = writes.lock().unwrap().clone();
            assert_eq!(writes.len(), 1, "{writes:?}");
            let text = String::from_utf8(writes[0].clone()).unwrap();
            assert!(
                text.starts_with("POST /v1/completions HTTP/1.1\r\n"),
                "{text}"
            );
            assert!(
                text.ends_with("\r\n\r\n{\"model\":\"m\",\"prompt\":\"hi\"}"),
                "{text}"
            );
        });
    }

    #[test]
    fn retryable_statuses() {
        assert_eq!(retryable_status(503), Some((RetryReason::Status5xx, true)));
        assert_eq!(retryable_status(429), Some((RetryReason::Status429, false)));
        assert_eq!(retryable_status(400), None);
        assert_eq!(retryable_status(200), None);
    }
}
