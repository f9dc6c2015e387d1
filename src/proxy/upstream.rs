//! One upstream attempt: connect, send the request (the full body, every attempt), and wait for
//! the response head — and, for streams, the first body chunk — before anything is committed to
//! the client. Until [`Attempt::Committed`] nothing has reached the client, so every failure
//! here may be retried on another backend.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName};
use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_http::{RequestHeader, ResponseHeader};

use crate::backend::Backend;
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
        /// The upstream session, positioned after `first_chunk`.
        upstream: Box<HttpSession>,
        /// The response head as received.
        head: Box<ResponseHeader>,
        /// The first body chunk, for streams (read under the first-token deadline).
        first_chunk: Option<Bytes>,
        /// The response body already ended.
        body_done: bool,
        /// When the request was fully sent.
        sent_at: Instant,
    },
    /// Nothing reached the client; try elsewhere.
    Retry {
        /// Why, for `pronto_retries_total`.
        reason: RetryReason,
        /// A description for logs and the final 503.
        detail: String,
        /// The failure says nothing about the backend's health (a stale pooled connection).
        backend_blameless: bool,
    },
    /// The backend took too long to produce its first byte.
    FirstTokenTimeout,
}

/// Timeouts for one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// Request sent → first body chunk of a stream.
    pub first_token: Duration,
    /// Request sent → response head of a non-streaming request, and between body chunks.
    pub idle: Duration,
}

/// The request head sent upstream: the client's end-to-end headers, our `Host` and framing.
pub fn upstream_request_head(
    client: &RequestHeader,
    backend: &Backend,
    body_len: usize,
) -> pingora_core::Result<RequestHeader> {
    let path = client
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut req = RequestHeader::build("POST", path.as_bytes(), Some(client.headers.len() + 2))?;
    for (name, value) in client.headers.iter() {
        if is_hop_by_hop(name)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::EXPECT
        {
            continue;
        }
        req.append_header(name.clone(), value.clone())?;
    }
    req.insert_header(header::HOST, backend.authority.as_str())?;
    req.insert_header(header::CONTENT_LENGTH, body_len.to_string())?;
    Ok(req)
}

/// Whether a status is worth trying on another backend (nothing has reached the client yet).
pub fn retryable_status(status: u16) -> Option<RetryReason> {
    match status {
        429 => Some(RetryReason::Status429),
        500..=599 => Some(RetryReason::Status5xx),
        _ => None,
    }
}

/// Run one attempt against `backend`. `may_retry_status` says whether a 5xx/429 answer should
/// be abandoned for another backend (false on the last attempt: the client then gets it).
pub async fn attempt(
    connector: &Connector,
    backend: &Backend,
    head: RequestHeader,
    body: &Bytes,
    stream: bool,
    deadlines: Deadlines,
    may_retry_status: bool,
) -> Attempt {
    let (mut up, reused) = match connector.get_http_session(&backend.peer).await {
        Ok(s) => s,
        Err(e) => {
            return Attempt::Retry {
                reason: RetryReason::Connect,
                detail: format!("connect to {} failed: {e}", backend.name()),
                backend_blameless: false,
            }
        }
    };
    let io_failure = |what: &str, e: &dyn std::fmt::Display| Attempt::Retry {
        reason: if reused {
            RetryReason::StaleConnection
        } else {
            RetryReason::Io
        },
        detail: format!("{what} {} failed: {e}", backend.name()),
        backend_blameless: reused,
    };
    if let Err(e) = up.write_request_header(Box::new(head)).await {
        return io_failure("sending request to", &e);
    }
    if let Err(e) = up.write_request_body(body.clone(), true).await {
        return io_failure("sending body to", &e);
    }
    if let Err(e) = up.finish_request_body().await {
        return io_failure("finishing body to", &e);
    }
    let sent_at = Instant::now();
    let head_deadline = if stream {
        deadlines.first_token
    } else {
        deadlines.idle
    };
    let deadline = tokio::time::Instant::from_std(sent_at + head_deadline);
    match tokio::time::timeout_at(deadline, up.read_response_header()).await {
        Err(_) => return Attempt::FirstTokenTimeout,
        Ok(Err(e)) => return io_failure("reading response from", &e),
        Ok(Ok(())) => {}
    }
    let Some(resp) = up.response_header().cloned() else {
        return io_failure("reading response from", &"no response header");
    };
    let status = resp.status.as_u16();
    if may_retry_status {
        if let Some(reason) = retryable_status(status) {
            return Attempt::Retry {
                reason,
                detail: format!("{} answered {status}", backend.name()),
                backend_blameless: status == 429,
            };
        }
    }
    let (mut first_chunk, mut body_done) = (None, up.response_done());
    if stream && (200..300).contains(&status) && !body_done {
        match tokio::time::timeout_at(deadline, up.read_response_body()).await {
            Err(_) => return Attempt::FirstTokenTimeout,
            Ok(Err(e)) => return io_failure("reading first chunk from", &e),
            Ok(Ok(None)) => body_done = true,
            Ok(Ok(Some(c))) => first_chunk = Some(c),
        }
    }
    Attempt::Committed {
        upstream: Box::new(up),
        head: Box::new(resp),
        first_chunk,
        body_done,
        sent_at,
    }
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
    fn retryable_statuses() {
        assert_eq!(retryable_status(503), Some(RetryReason::Status5xx));
        assert_eq!(retryable_status(429), Some(RetryReason::Status429));
        assert_eq!(retryable_status(400), None);
        assert_eq!(retryable_status(200), None);
    }
}
