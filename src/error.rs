//! The gateway's one error vocabulary, mapped to HTTP exactly once.
//!
//! Every failure the client can see is a [`GatewayError`]. [`GatewayError::status`] gives its
//! HTTP status, [`GatewayError::to_json`] the OpenAI-style body
//! (`{"error":{"message","type","code"}}`), and [`GatewayError::retry_after`] an optional
//! `Retry-After`. Nothing else in the crate chooses a status code for an error.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GatewayError {
    /// No such route.
    #[error("Unknown path {path}: Pronto serves POST /v1/chat/completions, /v1/completions and /v1/embeddings, and GET /v1/models, /v1/models/{{id}} and /health")]
    NotFound {
        /// The path requested.
        path: String,
    },
    /// Known path, wrong method.
    #[error("Method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The method used.
        method: String,
        /// The path requested.
        path: String,
    },
    /// The body could not be understood.
    #[error("{0}")]
    BadRequest(String),
    /// The request is not framed as HTTP/1.1 requires (RFC 9112): the connection is closed
    /// after the answer, since where the next request would begin is unknown.
    #[error("The request is not framed as HTTP/1.1 requires: {0}")]
    Framing(String),
    /// A `Transfer-Encoding` other than a single `chunked` (nginx answers 501 too).
    #[error("Transfer-Encoding {0} is not supported: only a single `chunked` is")]
    UnsupportedTransferCoding(String),
    /// No pool serves this model.
    #[error(
        "The model `{model}` does not exist; see GET /v1/models for the models this gateway serves"
    )]
    ModelNotFound {
        /// The model asked for.
        model: String,
    },
    /// The body is larger than `limits.max_body_bytes`.
    #[error("Request body is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The configured limit.
        limit: u64,
    },
    /// No backend of the pool can take the request (all unhealthy, ejected, full or tried).
    /// The client learns no more: which backends failed and why goes to the log, with the
    /// request id.
    #[error("No backend is available for model `{model}`")]
    NoBackend {
        /// Pool / model name.
        model: String,
    },
    /// The backend produced no first byte of its answer in time.
    #[error("The backend produced no first token within {timeout_ms} ms")]
    FirstTokenTimeout {
        /// The configured first-token timeout.
        timeout_ms: u64,
    },
    /// The client was too slow sending its request body.
    #[error("Timed out reading the request body")]
    RequestTimeout,
    /// The client did not finish its request head within `limits.header_timeout`.
    #[error("Timed out reading the request head")]
    HeadTimeout,
    /// SLO admission refused the request (its route's `on_slo_miss: shed`, a full queue, or
    /// a queue deadline that passed with no backend free).
    #[error("Route `{route}` cannot serve this request within its time-to-first-token objective now ({reason}); retry later")]
    Overloaded {
        /// Route name.
        route: String,
        /// Why (a [`pronto_core::admission::ShedReason`] label).
        reason: &'static str,
        /// Suggested wait before retrying, seconds.
        retry_after_s: u32,
    },
    /// The request head has too many or too large headers.
    #[error("Request headers are too large: {0}")]
    HeadersTooLarge(String),
    /// No API key, or one the gateway does not know (`auth:` is configured).
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The key is valid but may not use this model or route.
    #[error("API key `{key}` is not allowed to use {what}")]
    Forbidden {
        /// The key's name (never the key).
        key: String,
        /// What was refused, e.g. "model `x`".
        what: String,
        /// `model_not_allowed` or `route_not_allowed`.
        code: &'static str,
    },
    /// A per-key or per-route rate limit was reached.
    #[error("Rate limit reached for {scope} on {limit}: limit {limit_value}, retry after {retry_after_s} s")]
    RateLimited {
        /// `key `name`` or `route `name``.
        scope: String,
        /// `requests per minute`, `tokens per minute` or `concurrent requests`.
        limit: &'static str,
        /// The configured limit.
        limit_value: u32,
        /// Seconds until a retry can succeed.
        retry_after_s: u32,
        /// `x-ratelimit-*` headers.
        headers: Vec<(&'static str, String)>,
    },
    /// The gateway is at a global capacity limit (buffered request bytes, connections).
    #[error("The gateway is at capacity ({0}); retry shortly")]
    Busy(&'static str),
    /// The client hung up while its request waited in the admission queue.
    #[error("The client closed the request before it was sent to a backend")]
    ClientClosed,
    /// A bug or an unexpected local failure.
    #[error("Internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            GatewayError::NotFound { .. } | GatewayError::ModelNotFound { .. } => 404,
            GatewayError::MethodNotAllowed { .. } => 405,
            GatewayError::BadRequest(_) | GatewayError::Framing(_) => 400,
            GatewayError::UnsupportedTransferCoding(_) => 501,
            GatewayError::BodyTooLarge { .. } => 413,
            GatewayError::NoBackend { .. } | GatewayError::Busy(_) => 503,
            GatewayError::FirstTokenTimeout { .. } => 504,
            GatewayError::RequestTimeout | GatewayError::HeadTimeout => 408,
            GatewayError::Overloaded { .. } | GatewayError::RateLimited { .. } => 429,
            GatewayError::Unauthorized(_) => 401,
            GatewayError::HeadersTooLarge(_) => 431,
            GatewayError::Forbidden { .. } => 403,
            // nginx's "client closed request": never seen by the client, only in metrics.
            GatewayError::ClientClosed => 499,
            GatewayError::Internal(_) => 500,
        }
    }

    /// OpenAI error `type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            GatewayError::NotFound { .. }
            | GatewayError::MethodNotAllowed { .. }
            | GatewayError::BadRequest(_)
            | GatewayError::Framing(_)
            | GatewayError::UnsupportedTransferCoding(_)
            | GatewayError::ModelNotFound { .. }
            | GatewayError::BodyTooLarge { .. }
            | GatewayError::RequestTimeout
            | GatewayError::HeadTimeout
            | GatewayError::HeadersTooLarge(_)
            | GatewayError::ClientClosed => "invalid_request_error",
            GatewayError::Overloaded { .. } | GatewayError::RateLimited { .. } => {
                "rate_limit_error"
            }
            GatewayError::Unauthorized(_) => "authentication_error",
            GatewayError::Forbidden { .. } => "permission_error",
            GatewayError::NoBackend { .. }
            | GatewayError::FirstTokenTimeout { .. }
            | GatewayError::Busy(_) => "service_unavailable_error",
            GatewayError::Internal(_) => "internal_error",
        }
    }

    /// OpenAI error `code` (a stable machine-readable string).
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::NotFound { .. } => "not_found",
            GatewayError::MethodNotAllowed { .. } => "method_not_allowed",
            GatewayError::BadRequest(_) => "invalid_request",
            GatewayError::Framing(_) => "invalid_framing",
            GatewayError::UnsupportedTransferCoding(_) => "unsupported_transfer_coding",
            GatewayError::ModelNotFound { .. } => "model_not_found",
            GatewayError::BodyTooLarge { .. } => "request_too_large",
            GatewayError::NoBackend { .. } => "no_backend_available",
            GatewayError::Busy(_) => "gateway_busy",
            GatewayError::FirstTokenTimeout { .. } => "first_token_timeout",
            GatewayError::RequestTimeout | GatewayError::HeadTimeout => "request_timeout",
            GatewayError::Overloaded { .. } => "slo_overloaded",
            GatewayError::Unauthorized(_) => "invalid_api_key",
            GatewayError::HeadersTooLarge(_) => "request_header_fields_too_large",
            GatewayError::Forbidden { code, .. } => code,
            GatewayError::RateLimited { .. } => "rate_limit_exceeded",
            GatewayError::ClientClosed => "client_closed_request",
            GatewayError::Internal(_) => "internal_error",
        }
    }

    /// Seconds a client should wait before retrying, when that is meaningful.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            GatewayError::NoBackend { .. } | GatewayError::Busy(_) => Some(1),
            GatewayError::Overloaded { retry_after_s, .. }
            | GatewayError::RateLimited { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// Every header the error response carries besides the content headers: `retry-after`,
    /// the `x-ratelimit-*` set, `www-authenticate`.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(s) = self.retry_after() {
            out.push(("retry-after", s.to_string()));
        }
        match self {
            GatewayError::RateLimited { headers, .. } => out.extend(headers.iter().cloned()),
            GatewayError::Unauthorized(_) => out.push(("www-authenticate", "Bearer".into())),
            GatewayError::MethodNotAllowed { path, .. } => {
                let allow =
                    if path == "/v1/models" || path.starts_with("/v1/models/") || path == "/health"
                    {
                        "GET"
                    } else {
                        "POST"
                    };
                out.push(("allow", allow.into()));
            }
            _ => {}
        }
        out
    }

    /// The OpenAI-style JSON body.
    pub fn to_json(&self) -> Bytes {
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.error_type(),
                "code": self.code(),
            }
        });
        Bytes::from(body.to_string())
    }

    /// The whole HTTP/1.1 response, ending the connection (`Connection: close`): for answers
    /// written at the socket, outside pingora (a refused connection, a head that timed out or
    /// could not be parsed).
    pub fn to_http1_close(&self) -> Vec<u8> {
        let body = self.to_json();
        let status = self.status();
        let reason = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error");
        let mut out = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (name, value) in self.headers() {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        out.extend_from_slice(&body);
        out
    }

    /// The same error as one SSE event, for a stream that has already started.
    pub fn to_sse_event(&self) -> Bytes {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&self.to_json());
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_body_has_openai_shape() {
        let e = GatewayError::ModelNotFound { model: "x".into() };
        let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("`x`"));
        assert_eq!(e.status(), 404);
    }

    #[test]
    fn statuses() {
        assert_eq!(GatewayError::BodyTooLarge { limit: 1 }.status(), 413);
        let f = GatewayError::Framing("x".into());
        assert_eq!((f.status(), f.code()), (400, "invalid_framing"));
        let te = GatewayError::UnsupportedTransferCoding("`gzip`".into());
        assert_eq!(
            (te.status(), te.code()),
            (501, "unsupported_transfer_coding")
        );
        assert_eq!(GatewayError::BadRequest("b".into()).status(), 400);
        let nb = GatewayError::NoBackend { model: "m".into() };
        assert_eq!(nb.status(), 503);
        assert_eq!(nb.retry_after(), Some(1));
        let t = GatewayError::FirstTokenTimeout { timeout_ms: 5 };
        assert_eq!(t.status(), 504);
        assert!(t.to_sse_event().starts_with(b"data: {"));
    }

    #[test]
    fn edge_errors_map_to_openai_codes_and_headers() {
        let u = GatewayError::Unauthorized("Incorrect API key provided");
        assert_eq!((u.status(), u.code()), (401, "invalid_api_key"));
        assert_eq!(
            u.headers(),
            vec![("www-authenticate", "Bearer".to_string())]
        );
        let f = GatewayError::Forbidden {
            key: "a".into(),
            what: "model `m`".into(),
            code: "model_not_allowed",
        };
        assert_eq!((f.status(), f.code()), (403, "model_not_allowed"));
        let r = GatewayError::RateLimited {
            scope: "key `a`".into(),
            limit: "requests per minute",
            limit_value: 1,
            retry_after_s: 7,
            headers: vec![("x-ratelimit-limit-requests", "1".into())],
        };
        assert_eq!(r.status(), 429);
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert_eq!(
            r.headers(),
            vec![
                ("retry-after", "7".to_string()),
                ("x-ratelimit-limit-requests", "1".to_string())
            ]
        );
    }
}
