//! The edge checks on the request path: request framing and header limits first (a request
//! with both `Content-Length` and `Transfer-Encoding`, or conflicting `Content-Length`s, is a
//! smuggling attempt: 400 and the connection is closed; a transfer coding other than `chunked`
//! is a 501), then authentication and the key's request limits before the body is read;
//! authorization and token / route limits once the request is parsed and matched to a route.
//! The rules live in [`crate::edge::auth`] and [`crate::edge::ratelimit`]; this file only applies them in
//! order and carries what they grant until the request ends.

use std::sync::Arc;
use std::time::Instant;

use pingora_core::protocols::http::ServerSession;

use super::Edge;
use crate::config::edge::ApiKey;
use crate::config::Route;
use crate::edge::auth;
use crate::edge::ratelimit::{Grant, Scope, TokenCharge};
use crate::error::GatewayError;
use crate::state::GatewayState;
use pronto_core::sse::Usage;

/// What the edge checks granted one request; dropping it releases its concurrency slots.
#[derive(Default)]
pub(crate) struct Pass<'c> {
    /// The authenticated key (`None` when `auth:` is not configured).
    pub(crate) key: Option<&'c ApiKey>,
    /// Concurrency permits and request-bucket headers, key first.
    grants: Vec<Grant>,
    /// Token charges to correct from `usage`.
    charges: Vec<TokenCharge>,
    /// `x-ratelimit-*-tokens` headers of the key (else of the route).
    token_headers: Vec<(&'static str, String)>,
}

impl Pass<'_> {
    /// The authenticated key's name.
    pub(crate) fn key_name(&self) -> Option<&Arc<str>> {
        self.key.map(|k| &k.name)
    }

    /// The `x-ratelimit-*` headers for the response: the key's buckets, else the route's.
    pub(crate) fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<_> = self
            .grants
            .iter()
            .find(|g| !g.headers.is_empty())
            .map(|g| g.headers.clone())
            .unwrap_or_default();
        out.extend(self.token_headers.iter().cloned());
        out
    }

    /// The rank `route`'s requests queue at for this key: the key's priority class when the
    /// route names none, else the route's.
    pub(crate) fn rank(&self, route: &Route) -> u32 {
        match self.key.and_then(|k| k.priority.as_ref()) {
            Some((_, rank)) if !route.priority_explicit => *rank,
            _ => route.rank,
        }
    }
}

/// Most header fields accepted in a request head.
pub const MAX_HEADERS: usize = 100;
/// Most bytes of header names and values accepted in a request head.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Reject ambiguous framing (request smuggling) and oversized heads. Errors here must close
/// the connection: the rest of the stream cannot be trusted to be framed as pingora read it.
///
/// - `Transfer-Encoding` must be one field whose value is `chunked` (any case): a second
///   field is a 400, any other coding (`identity, chunked`, `gzip, chunked`,
///   `chunked, chunked`, unknown ones) a 501, as nginx answers. Pingora itself refuses a
///   final coding other than `chunked` (`proxy::App` answers that 501).
/// - `Content-Length` with `Transfer-Encoding`, conflicting or malformed lengths: 400.
/// - An HTTP/1.1 request without exactly one `Host`: 400 (RFC 9112 §3.2).
///
/// `raw` is the HTTP/1 head as received: pingora drops `Content-Length` when
/// `Transfer-Encoding` is also present (RFC 9112 §6.3), so only the raw head shows both.
pub(crate) fn check_head(
    headers: &http::HeaderMap,
    version: http::Version,
    raw: &[u8],
) -> Result<(), GatewayError> {
    if headers.len() > MAX_HEADERS {
        return Err(GatewayError::HeadersTooLarge(format!(
            "{} header fields (at most {MAX_HEADERS})",
            headers.len()
        )));
    }
    let bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        return Err(GatewayError::HeadersTooLarge(format!(
            "{bytes} bytes of headers (at most {MAX_HEADER_BYTES})"
        )));
    }
    let mut codings = headers.get_all(http::header::TRANSFER_ENCODING).iter();
    let te = codings.next();
    if codings.next().is_some() {
        return Err(GatewayError::Framing(
            "Transfer-Encoding must appear at most once".into(),
        ));
    }
    if let Some(te) = te {
        if !te.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Err(GatewayError::UnsupportedTransferCoding(shown(
                te.as_bytes(),
            )));
        }
    }
    let te = te.is_some();
    if te && raw_has_header(raw, b"content-length") {
        return Err(GatewayError::Framing(
            "Content-Length and Transfer-Encoding must not both be present".into(),
        ));
    }
    let mut lengths = headers.get_all(http::header::CONTENT_LENGTH).iter();
    if let Some(first) = lengths.next() {
        if te {
            return Err(GatewayError::Framing(
                "Content-Length and Transfer-Encoding must not both be present".into(),
            ));
        }
        let valid = |v: &http::HeaderValue| {
            let b = v.as_bytes();
            !b.is_empty() && b.iter().all(u8::is_ascii_digit)
        };
        if !valid(first) || lengths.any(|v| v != first || !valid(v)) {
            return Err(GatewayError::Framing(
                "conflicting or malformed Content-Length headers".into(),
            ));
        }
    }
    if version == http::Version::HTTP_11 && headers.get_all(http::header::HOST).iter().count() != 1
    {
        return Err(GatewayError::Framing(
            "an HTTP/1.1 request must carry exactly one Host header".into(),
        ));
    }
    Ok(())
}

/// A client's header value quoted for an error message: at most 64 bytes, escaped.
fn shown(v: &[u8]) -> String {
    let cut = &v[..v.len().min(64)];
    format!("`{}`", cut.escape_ascii())
}

/// Whether the raw HTTP/1 head has a header line named `name` (lowercase).
fn raw_has_header(raw: &[u8], name: &[u8]) -> bool {
    raw.split(|&b| b == b'\n').skip(1).any(|line| {
        line.len() > name.len()
            && line[..name.len()].eq_ignore_ascii_case(name)
            && line[name.len()..].trim_ascii_start().starts_with(b":")
    })
}

impl Edge {
    /// Authenticate (401) and take the key's concurrency slot and request (429).
    pub(crate) fn gate_key<'c>(
        &self,
        session: &ServerSession,
        state: &'c GatewayState,
    ) -> Result<Pass<'c>, GatewayError> {
        let Some(keys) = &state.config.auth else {
            return Ok(Pass::default());
        };
        let key = auth::authenticate(keys, &session.req_header().headers)?;
        let mut pass = Pass {
            key: Some(key),
            ..Pass::default()
        };
        if let Some(limit) = state.config.rate_limits.for_key(&key.name) {
            let scope = Scope::Key(Arc::clone(&key.name));
            pass.grants
                .push(self.limiter.request(&scope, limit, Instant::now())?);
        }
        Ok(pass)
    }

    /// Authorize the key for `model` / `route` (403), then take the route's slot and request
    /// and charge `tokens` to the key's and the route's token buckets (429).
    pub(crate) fn gate_route(
        &self,
        pass: &mut Pass<'_>,
        state: &GatewayState,
        route: Option<&Route>,
        model: &str,
        tokens: u32,
    ) -> Result<(), GatewayError> {
        if let Some(key) = pass.key {
            auth::authorize(key, model, route)?;
        }
        let now = Instant::now();
        let limits = &state.config.rate_limits;
        let route_limit =
            route.and_then(|r| Some((Scope::Route(r.name.clone()), limits.routes.get(&r.name)?)));
        if let Some((scope, limit)) = &route_limit {
            pass.grants.push(self.limiter.request(scope, limit, now)?);
        }
        let key_limit = pass
            .key
            .and_then(|k| Some((Scope::Key(k.name.clone()), limits.for_key(&k.name)?)));
        for (scope, limit) in key_limit.iter().chain(&route_limit) {
            let mut headers = Vec::new();
            if let Some(c) = self
                .limiter
                .tokens(scope, limit, tokens, now, &mut headers)?
            {
                pass.charges.push(c);
            }
            if pass.token_headers.is_empty() {
                pass.token_headers = headers;
            }
        }
        Ok(())
    }

    /// Correct the token charges from the response's `usage`.
    pub(crate) fn settle(&self, pass: &mut Pass<'_>, usage: &Usage) {
        let used = usage.prompt_tokens.saturating_add(usage.completion_tokens);
        let now = Instant::now();
        for c in pass.charges.drain(..) {
            self.limiter.settle(c, used, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTP/1.0: no `Host` needed (the Host rule has its own test).
    const V: http::Version = http::Version::HTTP_10;

    fn head(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn smuggling_shapes_are_rejected() {
        let te_only = head(&[("transfer-encoding", "chunked")]);
        let raw = b"POST / HTTP/1.1\r\nContent-Length : 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(check_head(&te_only, V, raw).unwrap_err().status(), 400);
        assert!(check_head(
            &te_only,
            V,
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nX-Content-Length: 1\r\n\r\n"
        )
        .is_ok());
        assert!(check_head(&head(&[("content-length", "5")]), V, b"").is_ok());
        assert!(check_head(
            &head(&[("content-length", "5"), ("content-length", "5")]),
            V,
            b""
        )
        .is_ok());
        assert!(check_head(&head(&[("transfer-encoding", "chunked")]), V, b"").is_ok());
        for bad in [
            &[("content-length", "5"), ("transfer-encoding", "chunked")][..],
            &[("content-length", "5"), ("content-length", "6")][..],
            &[("content-length", "+5")][..],
            &[("content-length", "5, 5")][..],
        ] {
            assert_eq!(
                check_head(&head(bad), V, b"").unwrap_err().status(),
                400,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn transfer_codings_and_host() {
        for (te, status) in [
            ("identity, chunked", 501),
            ("gzip, chunked", 501),
            ("chunked, chunked", 501),
            ("foo", 501),
            ("", 501),
            (" Chunked ", 0),
        ] {
            let r = check_head(&head(&[("transfer-encoding", te)]), V, b"");
            assert_eq!(r.map_err(|e| e.status()).err().unwrap_or(0), status, "{te}");
        }
        let two = head(&[
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ]);
        assert_eq!(check_head(&two, V, b"").unwrap_err().status(), 400);
        let v11 = http::Version::HTTP_11;
        assert_eq!(check_head(&head(&[]), v11, b"").unwrap_err().status(), 400);
        let two_hosts = head(&[("host", "a"), ("host", "b")]);
        assert_eq!(check_head(&two_hosts, v11, b"").unwrap_err().status(), 400);
        assert!(check_head(&head(&[("host", "a")]), v11, b"").is_ok());
        assert!(check_head(&head(&[]), http::Version::HTTP_2, b"").is_ok());
    }

    #[test]
    fn header_limits() {
        let names: Vec<String> = (0..=MAX_HEADERS).map(|i| format!("x-h{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        assert_eq!(check_head(&head(&many), V, b"").unwrap_err().status(), 431);
        assert!(check_head(&head(&many[1..]), V, b"").is_ok());
        let big = "v".repeat(MAX_HEADER_BYTES);
        assert_eq!(
            check_head(&head(&[("x-big", &big)]), V, b"")
                .unwrap_err()
                .status(),
            431
        );
    }
}
