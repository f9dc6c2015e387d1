//! The bounded label values of Pronto's metric families.

/// Label value for requests that matched no pool or reached no backend.
pub const NONE: &str = "none";

/// Why a request was retried (a bounded label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// TCP connect failed or timed out.
    Connect,
    /// A reused (pooled) connection turned out to be closed.
    StaleConnection,
    /// Writing the request or reading the response head failed.
    Io,
    /// The backend answered 5xx before any byte reached the client.
    Status5xx,
    /// The backend answered 429 before any byte reached the client.
    Status429,
}

impl RetryReason {
    /// Every reason, for registering the series at zero.
    pub const ALL: [RetryReason; 5] = [
        RetryReason::Connect,
        RetryReason::StaleConnection,
        RetryReason::Io,
        RetryReason::Status5xx,
        RetryReason::Status429,
    ];

    /// Label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            RetryReason::Connect => "connect",
            RetryReason::StaleConnection => "stale_connection",
            RetryReason::Io => "io",
            RetryReason::Status5xx => "status_5xx",
            RetryReason::Status429 => "status_429",
        }
    }
}

/// How a config reload attempt ended (a bounded label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadResult {
    /// A new config was validated and swapped in.
    Ok,
    /// The file is identical to the active config; nothing was swapped.
    Unchanged,
    /// The file could not be read or is invalid; the active config stays.
    Error,
}

impl ReloadResult {
    /// Every result, for registering the series at zero.
    pub const ALL: [ReloadResult; 3] = [
        ReloadResult::Ok,
        ReloadResult::Unchanged,
        ReloadResult::Error,
    ];

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Ok => "ok",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Error => "error",
        }
    }
}

/// What a rate limit that refused a request applies to (the `scope` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitScope {
    /// An API key (`rate_limits.per_key` / `rate_limits.keys`); `name` is the key's name.
    Key,
    /// A route (`rate_limits.routes`); `name` is the route's name.
    Route,
}

impl RateLimitScope {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RateLimitScope::Key => "key",
            RateLimitScope::Route => "route",
        }
    }
}

/// Which limit refused a request (the `limit` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitKind {
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
    /// `max_concurrent`.
    Concurrency,
}

impl RateLimitKind {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RateLimitKind::Requests => "requests",
            RateLimitKind::Tokens => "tokens",
            RateLimitKind::Concurrency => "concurrency",
        }
    }
}

/// The `kind` label values of `pronto_upstream_errors_total`: a failed attempt's
/// [`RetryReason`], `first_token_timeout` (no first token within the deadline) and
/// `mid_stream` (the backend failed after the response started).
pub const UPSTREAM_ERROR_KINDS: [&str; 7] = [
    RetryReason::Connect.as_str(),
    RetryReason::StaleConnection.as_str(),
    RetryReason::Io.as_str(),
    RetryReason::Status5xx.as_str(),
    RetryReason::Status429.as_str(),
    "first_token_timeout",
    "mid_stream",
];

// Why admission refused a request is the core's verdict, `pronto_core::admission::ShedReason`,
// used as a label under its one name (not re-exported here).

/// Why an active health check failed (a bounded metric label, [`CheckFailure::label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckFailure {
    /// The backend answered with this non-2xx status.
    Status(u16),
    /// No answer within `health.timeout`.
    Timeout,
    /// Nothing listens on the backend's port.
    Refused,
    /// The connection could not be made otherwise (unreachable, TLS handshake, DNS).
    Connect,
    /// The connection broke after it was made.
    Io,
}

impl CheckFailure {
    /// Every label value, for tests and dashboards.
    pub const LABELS: [&'static str; 5] = ["status", "timeout", "refused", "connect", "io"];

    /// The `reason` label of `pronto_health_check_failures_total`.
    pub fn label(self) -> &'static str {
        match self {
            CheckFailure::Status(_) => "status",
            CheckFailure::Timeout => "timeout",
            CheckFailure::Refused => "refused",
            CheckFailure::Connect => "connect",
            CheckFailure::Io => "io",
        }
    }
}

impl std::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckFailure::Status(s) => write!(f, "HTTP status {s}"),
            CheckFailure::Timeout => f.write_str("timed out"),
            CheckFailure::Refused => f.write_str("connection refused"),
            CheckFailure::Connect => f.write_str("connect failed"),
            CheckFailure::Io => f.write_str("connection broke"),
        }
    }
}
