//! The validated, typed config the gateway runs on.
//!
//! Nothing here can be wrong: every value was checked by [`super::validate()`], so consumers use
//! fields directly (a `Duration` is positive, a `weight` is at least 1, backend names are
//! unique across the file). Defaults live here, as the `DEFAULT_*` constants, and nowhere
//! else.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pronto_core::predict::Coefficients;
use pronto_core::routing::PolicySpec;

use super::duration::{text_duration, text_size};
use super::route::{AdmissionSettings, Route};
use super::schema::{dur, size, DurationText, SizeText};
use super::validate::{MAX_BODY_BYTES, MIN_BODY_BYTES};
use super::Diagnostic;

/// Default client listener.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080));
/// Default admin listener (loopback: metrics and config are not for the world).
pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9400));
/// Default proxy worker threads.
pub const DEFAULT_THREADS: usize = 2;
/// Default SIGTERM grace period.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// Default largest request body: 32 MiB (a 100k-token prompt is ~400 KB).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 << 20;
/// Default backend connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default deadline for the first byte of the answer.
pub const DEFAULT_FIRST_TOKEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Default longest mid-stream silence.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Default deadline of a non-streamed answer (a long generation is not a backend fault).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// Default deadline for a complete request head.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline for a whole request body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default deadline for one write to a client that does not read.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default wait of an idle keep-alive connection for its next request.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default budget of request bytes buffered at once (bodies are held until routed and sent).
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 512 << 20;
/// Default cap on open client connections.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;
/// Default retries on another backend.
pub const DEFAULT_MAX_RETRIES: u32 = 2;
/// Default health probe path.
pub const DEFAULT_HEALTH_PATH: &str = "/health";
/// Default time between health probes.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// Default health probe timeout.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// Default consecutive passive failures before ejection.
pub const DEFAULT_EJECT_AFTER_FAILURES: u32 = 3;
/// Default delay before an ejected backend is probed again.
pub const DEFAULT_READMIT_AFTER: Duration = Duration::from_secs(10);
/// Default backend weight.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Default time between two resolutions of a pool's `discover.dns` name.
pub const DEFAULT_DISCOVER_INTERVAL: Duration = Duration::from_secs(10);
/// Default `pools.*.scrape.interval`.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = pronto_core::engine::DEFAULT_SCRAPE_INTERVAL;
/// Shortest `pools.*.scrape.interval` accepted.
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_millis(10);
/// Default for watching the config file for changes.
pub const DEFAULT_RELOAD_WATCH: bool = true;
/// Default time between two looks at the config file.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// Default for writing the access log.
pub const DEFAULT_ACCESS_LOG_ENABLED: bool = true;
/// Default share of requests the access log records.
pub const DEFAULT_ACCESS_LOG_SAMPLE_RATE: f64 = 1.0;

/// A pool's tokenizer as the config names it, with the fingerprint of what was loaded (an
/// edited file is a different tokenizer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerRef {
    /// The `tokenizer.json` loaded, or the `tiktoken:<name>` spec.
    pub path: PathBuf,
    /// The pool's own chat template file, if it names one.
    pub chat_template: Option<PathBuf>,
    /// [`pronto_tokenizer::ModelTokenizer::fingerprint`] of what was loaded.
    pub fingerprint: String,
}

/// The gateway's validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Client listener.
    pub listen: SocketAddr,
    /// Admin listener (metrics, `/admin/config`).
    pub admin_listen: SocketAddr,
    /// Worker threads for the proxy service, 1..=256.
    pub threads: usize,
    /// How long in-flight streams may continue after SIGTERM.
    pub grace_period: Duration,
    /// Request limits and timeouts.
    pub limits: Limits,
    /// Retry policy.
    pub retry: Retry,
    /// Stream migration, for routes that set none ([`super::migration`]).
    pub migration: super::migration::Migration,
    /// Health checking.
    pub health: Health,
    /// Add the `x-pronto-*` explanation headers (backend, reason, prediction, runner-up,
    /// attempts) to responses.
    pub explain_headers: bool,
    /// The access log (one line per request).
    pub access_log: AccessLog,
    /// Live reload of the config file.
    pub reload: ReloadSettings,
    /// Pools in file order; each model name appears once.
    pub pools: Vec<Pool>,
    /// Priority classes, most urgent first (rank = position).
    pub priority_classes: Vec<Arc<str>>,
    /// The SLO admission queue.
    pub admission: AdmissionSettings,
    /// Routes in file order; empty: a request goes to the pool named by its model.
    pub routes: Vec<Route>,
    /// API keys; `None`: no key required.
    pub auth: Option<super::edge::Auth>,
    /// Admin listener settings (its token).
    pub admin: super::edge::AdminSettings,
    /// Rate limits per key and per route.
    pub rate_limits: super::edge::RateLimits,
    /// TLS on the client listener; `None`: plain HTTP (h2c allowed).
    pub tls: Option<super::tls::TlsListener>,
    /// Replica sync over NATS; `None`: this replica routes on its own state.
    pub cluster: Option<super::cluster::Cluster>,
    /// Where the config came from (a file path, or `--backend` for the quick start).
    pub origin: String,
    /// The file this config was read from by [`Config::load`]; `None` for a config built from
    /// text or from `--backend` flags (such a gateway cannot reload).
    pub source_path: Option<PathBuf>,
    /// Suspicious-but-valid settings, located where possible. Log them at load.
    pub warnings: Vec<Diagnostic>,
    /// Stable hash of the source text (see [`Config::hash`]).
    pub(super) source_hash: u64,
}

/// Request limits and timeouts
///
/// Both the file's `limits:` section and the model: serde reads the durations and sizes with
/// their ranges and fills the defaults; the checker keeps the default that depends on another
/// field and the checks between fields (`validate/limits.rs`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted request body, 1KiB..=1GiB
    #[serde(
        serialize_with = "text_size::serialize",
        deserialize_with = "text_size::within::<_, MIN_BODY_BYTES, MAX_BODY_BYTES>"
    )]
    #[schemars(with = "SizeText", extend("default" = size(DEFAULT_MAX_BODY_BYTES)))]
    pub max_body_bytes: u64,
    /// TCP connect timeout to a backend
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_CONNECT_TIMEOUT)))]
    pub connect_timeout: Duration,
    /// No first byte of the answer within this: 504, or a retry while nothing was sent
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_FIRST_TOKEN_TIMEOUT)))]
    pub first_token_timeout: Duration,
    /// Longest silence from a backend mid-stream
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_IDLE_TIMEOUT)))]
    pub idle_timeout: Duration,
    /// A non-streamed request's whole answer within this, else 504 (never a backend fault)
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_REQUEST_TIMEOUT)))]
    pub request_timeout: Duration,
    /// A request head from its first byte to its end within this, else the connection closes
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_HEADER_TIMEOUT)))]
    pub header_timeout: Duration,
    /// The whole request body within this, else 408
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_BODY_TIMEOUT)))]
    pub body_timeout: Duration,
    /// A write to a client that does not read fails after this: the stream ends, the
    /// upstream request is cancelled
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_WRITE_TIMEOUT)))]
    pub write_timeout: Duration,
    /// An idle keep-alive connection (its last answer complete; HTTP/2: no stream open) is
    /// closed after this (whole seconds)
    #[serde(
        serialize_with = "text_duration::serialize",
        deserialize_with = "text_duration::whole_seconds"
    )]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_KEEPALIVE_TIMEOUT)))]
    pub keepalive_timeout: Duration,
    /// Minimum bytes per second a client must read (a larger write may wait len / rate)
    #[serde(
        serialize_with = "text_size::option::serialize",
        deserialize_with = "text_size::within_option::<_, 0, MAX_BODY_BYTES>",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<SizeText>")]
    pub min_send_rate: Option<u64>,
    /// Request body bytes buffered at once over all requests; over it: 503 with Retry-After
    /// before the body is read
    #[serde(
        serialize_with = "text_size::option::serialize",
        deserialize_with = "text_size::within_option::<_, MIN_BODY_BYTES, { 64 * MAX_BODY_BYTES }>",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<SizeText>", extend("default" = size(DEFAULT_MAX_BUFFERED_BYTES)))]
    pub max_buffered_bytes: Option<u64>,
    /// Client connections open at once; one more gets 503 and is closed
    #[serde(deserialize_with = "super::value::int_in::<_, _, 1, 1_000_000>")]
    #[schemars(range(min = 1, max = 1_000_000), extend("default" = DEFAULT_MAX_CONNECTIONS))]
    pub max_connections: u64,
}

impl Limits {
    /// The request body budget: `max_buffered_bytes`, or when unset the larger of its
    /// default and `max_body_bytes` (the checker sets it so: a checked config always has it).
    pub fn buffer_budget(&self) -> u64 {
        self.max_buffered_bytes
            .unwrap_or(DEFAULT_MAX_BUFFERED_BYTES.max(self.max_body_bytes))
    }
}

/// Retry policy
///
/// Both the file's `retry:` section and the model: serde fills the default; nothing is left
/// to check.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Retry {
    /// Retries on another backend, only while no byte reached the client
    pub max_retries: u32,
}

/// Active and passive health checking
///
/// Both the file's `health:` section and the model: serde fills the defaults and checks the
/// ranges; the checker keeps the path's form and the warnings between fields.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Health {
    /// HTTP path probed with GET on each backend
    #[serde(deserialize_with = "super::value::http_path")]
    #[schemars(regex(pattern = r"^/\S*$"))]
    pub path: String,
    /// Time between active probes
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_HEALTH_INTERVAL)))]
    pub interval: Duration,
    /// Probe timeout
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_HEALTH_TIMEOUT)))]
    pub timeout: Duration,
    /// Consecutive failed requests that eject a backend
    #[serde(deserialize_with = "super::value::at_least::<_, _, 1>")]
    #[schemars(range(min = 1))]
    pub eject_after_failures: u32,
    /// Delay before an ejected backend may return
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_READMIT_AFTER)))]
    pub readmit_after: Duration,
    /// Progress-based exclusion: a backend with streams in flight and no token on any of them
    /// for max(floor, factor x the predicted time of its booked prefill) gets no new requests
    /// until it produces again (not ejected)
    pub stall: super::progress::Stall,
}

/// The access log: one line per request (log target pronto::access)
///
/// Both the file's `access_log:` section and the model: serde fills the defaults and checks
/// the sample rate's range; nothing is left to the checker (see `proxy::access`).
#[derive(
    Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct AccessLog {
    /// Write one line per request when its response ends
    pub enabled: bool,
    /// Share of requests written, chosen by a hash of the request id
    #[serde(deserialize_with = "super::value::float_in::<_, 0, 1>")]
    #[schemars(range(min = 0, max = 1))]
    pub sample_rate: f64,
}

impl Default for AccessLog {
    fn default() -> AccessLog {
        AccessLog {
            enabled: DEFAULT_ACCESS_LOG_ENABLED,
            sample_rate: DEFAULT_ACCESS_LOG_SAMPLE_RATE,
        }
    }
}

/// Live reload of this file (also on SIGHUP and POST /admin/reload)
///
/// Both the file's `reload:` section and the model (see `services::reload`): serde fills the
/// defaults (a zero interval is refused there); nothing is left to the checker.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct ReloadSettings {
    /// Poll the file and reload it when it changes
    pub watch: bool,
    /// Time between two polls of the file
    #[serde(with = "text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_WATCH_INTERVAL)))]
    pub watch_interval: Duration,
}

impl Default for ReloadSettings {
    fn default() -> ReloadSettings {
        ReloadSettings {
            watch: DEFAULT_RELOAD_WATCH,
            watch_interval: DEFAULT_WATCH_INTERVAL,
        }
    }
}

/// The backends serving one model name.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// The model name clients send (the pool's key in the file).
    pub model: Arc<str>,
    /// Routing policy and its parameters.
    pub policy: PolicySpec,
    /// Static backends, in file order; at least one unless `discover` is set.
    pub backends: Vec<Backend>,
    /// Backends found by resolving a DNS name (`discovery`), added after `backends`.
    pub discover: Option<Discover>,
    /// The pool's default profile hint, as written (already merged into each backend's
    /// [`Backend::profile`]; kept to write the effective config back).
    pub profile: Option<ProfileHint>,
    /// The model's tokenizer (`tokenizer:` / `chat_template:`), as named and fingerprinted;
    /// the loaded tokenizer is in [`super::Resources`]: exact prompt tokens
    /// and engine-matching block hashes. Equal across reloads when its files are unchanged.
    pub tokenizer: Option<TokenizerRef>,
    /// The pool also serves every model its backends list at `GET /v1/models`, each on the
    /// backends that list it (`models::served`). Set by `pronto serve --backend URL`
    /// without `--model`; a config file cannot.
    pub serve_listed_models: bool,
    /// The pool's `served_model_name`, as written (already in each static backend's
    /// [`Backend::served_model_name`] unless it has its own; discovered backends get it).
    pub served_model_name: Option<ServedName>,
    /// The pool's `api_key` (already in each static backend's [`Backend::api_key`] unless
    /// it has its own; discovered backends get it).
    pub api_key: Option<UpstreamKey>,
    /// Engine metrics scraping of the pool's backends (`scrape:`).
    pub scrape: Scrape,
    /// The pool's engines can continue a partial answer (`continue_streams:`): its streams
    /// may be migrated, and it may take migrated streams ([`super::migration`]).
    pub continue_streams: bool,
}

impl Pool {
    /// Whether the pool asks its backends what they serve at `GET /v1/models`
    /// (`models::discover`): it serves their models, or a backend's
    /// `served_model_name` (its own or the pool's) is `discover`.
    pub fn asks_models(&self) -> bool {
        let discover = |n: &Option<ServedName>| matches!(n, Some(ServedName::Discover));
        self.serve_listed_models
            || discover(&self.served_model_name)
            || self.backends.iter().any(|b| discover(&b.served_model_name))
    }
}

/// Engine metrics scraping of the pool's backends (GET /metrics)
///
/// Both a pool's `scrape:` section and the model (see `services::scrape`): serde fills the
/// default and checks the minimum ([`super::scrape`]); nothing is left to the checker.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Scrape {
    /// Time between two scrapes of each backend while they succeed (at least 10ms); a
    /// failing backend backs off, doubling up to 30s
    #[serde(
        serialize_with = "text_duration::serialize",
        deserialize_with = "text_duration::within::<_, { MIN_SCRAPE_INTERVAL.as_millis() as u64 }, { u64::MAX }>"
    )]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_SCRAPE_INTERVAL)))]
    pub interval: Duration,
}

impl Default for Scrape {
    fn default() -> Scrape {
        Scrape {
            interval: DEFAULT_SCRAPE_INTERVAL,
        }
    }
}

/// A pool's `discover:` section: every address a DNS name resolves to is a backend.
#[derive(Debug, Clone, PartialEq)]
pub struct Discover {
    /// The name to resolve: a DNS name or an IP literal (IPv6 bracketed), as written.
    pub host: String,
    /// Port of every discovered backend.
    pub port: u16,
    /// Time between two resolutions.
    pub interval: Duration,
    /// Which addresses to keep.
    pub family: AddressFamily,
    /// Weight of each discovered backend, >= 1.
    pub weight: u32,
    /// Cap on concurrent requests of each discovered backend.
    pub max_inflight: Option<u32>,
}

/// Which resolved addresses a [`Discover`] keeps (the file's `any`, `ipv4`, `ipv6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressFamily {
    /// IPv4 and IPv6.
    #[default]
    Any,
    /// IPv4 only.
    Ipv4,
    /// IPv6 only.
    Ipv6,
}

impl AddressFamily {
    /// The file spelling: `any`, `ipv4`, `ipv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressFamily::Any => "any",
            AddressFamily::Ipv4 => "ipv4",
            AddressFamily::Ipv6 => "ipv6",
        }
    }

    /// Whether `addr` is of this family.
    pub fn admits(self, addr: &SocketAddr) -> bool {
        match self {
            AddressFamily::Any => true,
            AddressFamily::Ipv4 => addr.is_ipv4(),
            AddressFamily::Ipv6 => addr.is_ipv6(),
        }
    }
}

impl Discover {
    /// `host:port` as resolved.
    pub fn target(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The backend config of one resolved address of `pool`: named `<model>-<ip>:<port>`
    /// (`:` never occurs in a configured name, so it cannot collide with a static backend),
    /// with this section's weight and cap and the pool's `profile`, `api_key` and
    /// `served_model_name`.
    pub fn backend(&self, pool: &Pool, addr: SocketAddr) -> Backend {
        let model = &pool.model;
        let host = match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        Backend {
            name: Arc::from(format!("{model}-{host}:{}", addr.port())),
            host,
            port: addr.port(),
            tls: false,
            weight: self.weight,
            max_inflight: self.max_inflight,
            labels: BTreeMap::new(),
            profile: pool.profile,
            kv_events: None,
            ca: None,
            api_key: pool.api_key.clone(),
            served_model_name: pool.served_model_name.clone(),
        }
    }
}

/// A profile hint: the TTFT model's prior before a backend has been measured. Absent fields
/// keep [`Coefficients::default()`]'s value.
///
/// `base_ms` → `base_s = base_ms / 1000`; `prefill_tokens_per_s` →
/// `s_per_token = 1 / prefill_tokens_per_s`; `decode_ms_per_running` →
/// `s_per_decode = decode_ms_per_running / 1000`. Every given value is positive and finite.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProfileHint {
    /// Fixed overhead of a request, milliseconds.
    pub base_ms: Option<f64>,
    /// Prefill throughput, prompt tokens per second.
    pub prefill_tokens_per_s: Option<f64>,
    /// TTFT added by each running decode, milliseconds.
    pub decode_ms_per_running: Option<f64>,
}

impl ProfileHint {
    /// This hint's fields, falling back to `default`'s field by field.
    pub fn or(self, default: ProfileHint) -> ProfileHint {
        ProfileHint {
            base_ms: self.base_ms.or(default.base_ms),
            prefill_tokens_per_s: self.prefill_tokens_per_s.or(default.prefill_tokens_per_s),
            decode_ms_per_running: self.decode_ms_per_running.or(default.decode_ms_per_running),
        }
    }

    /// The TTFT model prior this hint describes.
    pub fn coefficients(&self) -> Coefficients {
        let d = Coefficients::default();
        Coefficients {
            base_s: self.base_ms.map_or(d.base_s, |ms| ms / 1000.0),
            s_per_token: self.prefill_tokens_per_s.map_or(d.s_per_token, |r| 1.0 / r),
            s_per_decode: self
                .decode_ms_per_running
                .map_or(d.s_per_decode, |ms| ms / 1000.0),
            ..d
        }
    }
}

/// One backend server.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// Unique across the file; `[A-Za-z0-9_.-]+`; a metric label value.
    pub name: Arc<str>,
    /// Host as written in the URL: a DNS name, an IPv4 address, or a bracketed IPv6 address
    /// (`[::1]`), so `format!("{host}:{port}")` is always a valid authority.
    pub host: String,
    /// Port, explicit or the scheme's default (80 / 443).
    pub port: u16,
    /// `https` backend.
    pub tls: bool,
    /// Relative weight, >= 1.
    pub weight: u32,
    /// Cap on concurrent requests, >= 1 when set.
    pub max_inflight: Option<u32>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// Profile hint for the TTFT model's cold start, the pool's merged in; `None`: the
    /// generic prior.
    pub profile: Option<ProfileHint>,
    /// The engine's KV-cache event publisher, when configured.
    pub kv_events: Option<KvEvents>,
    /// CAs trusted for this `https` backend instead of the system roots.
    pub ca: Option<super::tls::BackendCa>,
    /// The key sent to this backend (its own or its pool's `api_key`).
    pub api_key: Option<UpstreamKey>,
    /// The model name this backend serves, when it is not the name clients send (its own
    /// `served_model_name` or its pool's): the request's `model` is rewritten to it upstream
    /// and back in the answer (`models::rename`).
    pub served_model_name: Option<ServedName>,
}

/// A `served_model_name`: what a backend calls the model its pool serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServedName {
    /// This name, as written.
    Named(Arc<str>),
    /// `discover`: the one model the backend lists at `GET /v1/models` (or the pool's own
    /// name when it lists several, that one among them); until it is known, the backend is
    /// not routed to (`models::discover`).
    Discover,
}

impl ServedName {
    /// The file keyword that asks the backend for its name.
    pub const DISCOVER: &'static str = "discover";

    /// The file spelling: the name, or `discover`.
    pub fn as_str(&self) -> &str {
        match self {
            ServedName::Named(n) => n,
            ServedName::Discover => ServedName::DISCOVER,
        }
    }
}

/// A key the gateway presents to a backend. Held as written (it must be sent), never
/// printed: `Debug` shows only that one is set.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamKey(Arc<str>, super::edge::SecretFile);

impl UpstreamKey {
    /// Wrap a validated key (visible ASCII, no spaces).
    pub fn new(key: &str) -> UpstreamKey {
        UpstreamKey(
            Arc::from(key),
            super::edge::SecretFile::Inline(key.to_string()),
        )
    }

    /// A key read from `from` (inline, `{env}` or `{file}`).
    pub fn read_from(key: &str, from: super::edge::SecretFile) -> UpstreamKey {
        UpstreamKey(Arc::from(key), from)
    }

    /// Where the key was read from, as written.
    pub fn source(&self) -> &super::edge::SecretFile {
        &self.1
    }

    /// The key itself, for the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for UpstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamKey(..)")
    }
}

/// Where a backend's engine publishes its KV-cache events (see `kv_events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvents {
    /// `tcp://HOST:PORT`, as written.
    pub endpoint: String,
    /// Tokens per engine KV block (16 for vLLM on GPU and the simulator, 128 on CPU).
    pub block_size: usize,
}

impl Backend {
    /// `host:port`, for connecting and for the `Host` header.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8001`.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.authority())
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            first_token_timeout: DEFAULT_FIRST_TOKEN_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            min_send_rate: None,
            max_buffered_bytes: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            max_retries: DEFAULT_MAX_RETRIES,
        }
    }
}

impl Default for Health {
    fn default() -> Health {
        Health {
            path: DEFAULT_HEALTH_PATH.to_string(),
            interval: DEFAULT_HEALTH_INTERVAL,
            timeout: DEFAULT_HEALTH_TIMEOUT,
            eject_after_failures: DEFAULT_EJECT_AFTER_FAILURES,
            readmit_after: DEFAULT_READMIT_AFTER,
            stall: super::progress::Stall::default(),
        }
    }
}

// === impl Config ===

impl Config {
    /// Stable hash of the config's source, as 16 lowercase hex digits.
    ///
    /// For a file this hashes its exact text (FNV-1a, 64 bit: stable across builds and
    /// platforms, not cryptographic), so `/admin/config` can show which file version is live
    /// and a reload of an unchanged file can be recognised. For [`Config::from_backend_urls`]
    /// it hashes the arguments.
    pub fn hash(&self) -> String {
        format!("{:016x}", self.source_hash)
    }

    /// The pool serving `model`, if any.
    pub fn pool(&self, model: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| &*p.model == model)
    }

    /// Total number of static backends across pools (discovered ones are not counted).
    pub fn backend_count(&self) -> usize {
        self.pools.iter().map(|p| p.backends.len()).sum()
    }
}

/// FNV-1a, 64 bit.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_known_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn backend_authority_and_base_url() {
        let b = Backend {
            name: Arc::from("b"),
            host: "[::1]".into(),
            port: 8001,
            tls: false,
            weight: 1,
            max_inflight: None,
            labels: BTreeMap::new(),
            kv_events: None,
            ca: None,
            api_key: None,
            profile: None,
            served_model_name: None,
        };
        assert_eq!(b.authority(), "[::1]:8001");
        assert_eq!(b.base_url(), "http://[::1]:8001");
        let tls = Backend { tls: true, ..b };
        assert_eq!(tls.base_url(), "https://[::1]:8001");
    }
}
