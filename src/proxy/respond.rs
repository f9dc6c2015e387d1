//! Answers the gateway writes itself: errors and small JSON documents.

use bytes::Bytes;
use pingora_core::protocols::http::ServerSession;
use pingora_http::ResponseHeader;

use crate::error::GatewayError;

/// Write a complete JSON response. Errors writing to the client are returned (the client is
/// gone; nothing else to do).
pub async fn json(
    session: &mut ServerSession,
    status: u16,
    body: Bytes,
    extra: &[(&'static str, String)],
) -> pingora_core::Result<()> {
    let mut h = ResponseHeader::build_no_case(status, Some(4 + extra.len()))?;
    h.insert_header("content-type", "application/json")?;
    h.insert_header("content-length", body.len().to_string())?;
    for (k, v) in extra {
        h.insert_header(*k, v.as_str())?;
    }
    session.write_response_header(Box::new(h)).await?;
    session.write_response_body(body, true).await
}

/// Write `err` as an OpenAI-style JSON error carrying `x-request-id: request_id`; returns the
/// body's length. A client that is gone is not an error here: nothing else would be done.
pub async fn error(session: &mut ServerSession, err: &GatewayError, request_id: &str) -> usize {
    let body = err.to_json();
    let len = body.len();
    let mut headers = err.headers();
    headers.push((super::request_id::HEADER, request_id.to_string()));
    let _ = json(session, err.status(), body, &headers).await;
    len
}
