//! Every Prometheus family the gateway exports, registered once in one [`Metrics`] value that is
//! passed to the components that record into it.
//!
//! Label values are bounded: pool and backend names come from config, never from raw user
//! input (a request for an unknown model is counted under pool `none`).
//!
//! Every family with a `backend` label is also listed when it is registered, so
//! [`Metrics::forget_backend`] removes all of a departed backend's series without a list to
//! keep in step by hand.

use std::cell::RefCell;
use std::sync::Arc;

use prometheus::{
    Encoder, GaugeVec, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

mod cluster;
mod families;
mod labels;
mod migrate;
mod progress;
mod race;
pub use cluster::{ClusterMetrics, CollisionOutcome, NatsError, SyncDirection, SyncDrop};
use families::*;
pub use labels::*;
pub use migrate::{MigrationMetrics, MigrationOutcome};
pub use progress::ProgressMetrics;
use pronto_core::admission::ShedReason;
pub use race::{FailoverReason, RaceKind, RaceMetrics};

/// The version and git revision this binary was built from (`build.rs`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git revision (12 hex digits), or `unknown` outside a git checkout.
pub const REVISION: &str = env!("PRONTO_GIT_REVISION");

/// The gateway's metric families.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Every family with a `backend` label (what [`Metrics::forget_backend`] clears).
    per_backend: Arc<Vec<Box<dyn BackendFamily>>>,
    /// `pronto_requests_total{pool,backend,code}`
    pub requests_total: IntCounterVec,
    /// `pronto_request_duration_seconds{pool}`: request arrival to end of response.
    pub request_duration_seconds: HistogramVec,
    /// `pronto_backend_inflight{backend}`
    pub backend_inflight: IntGaugeVec,
    /// `pronto_backend_healthy{backend}`: 1 when eligible for routing.
    pub backend_healthy: IntGaugeVec,
    /// `pronto_retries_total{pool,reason}`
    pub retries_total: IntCounterVec,
    /// `pronto_ttft_seconds{backend}`: upstream send → first generated token.
    pub ttft_seconds: HistogramVec,
    /// `pronto_tpot_seconds{backend}`: mean time per output token after the first.
    pub tpot_seconds: HistogramVec,
    /// `pronto_e2e_seconds{backend}`: upstream send → end of a completed response.
    pub e2e_seconds: HistogramVec,
    /// `pronto_client_ttft_seconds{pool}`: client request arrival → first token forwarded.
    pub client_ttft_seconds: HistogramVec,
    /// `pronto_ttfa_seconds{backend}`: upstream send → first answer token (content or a tool
    /// call, after any reasoning).
    pub ttfa_seconds: HistogramVec,
    /// `pronto_client_ttfa_seconds{pool}`: client request arrival → first answer token
    /// forwarded.
    pub client_ttfa_seconds: HistogramVec,
    /// `pronto_client_disconnects_total{pool}`: clients that hung up before the response ended.
    pub client_disconnects_total: IntCounterVec,
    /// `pronto_client_stalled_total{pool}`: clients that stopped reading mid-response, released
    /// at the write deadline (connection reset, upstream request cancelled).
    pub client_stalled_total: IntCounterVec,
    /// `pronto_upstream_errors_total{backend,kind}`: failures talking to a backend.
    pub upstream_errors_total: IntCounterVec,
    /// `pronto_backend_queue_depth{backend}`: requests waiting in the engine, as last scraped.
    pub backend_queue_depth: GaugeVec,
    /// `pronto_backend_kv_usage_ratio{backend}`: engine KV-cache usage (0..1), as last scraped.
    pub backend_kv_usage_ratio: GaugeVec,
    /// `pronto_engine_scrape_errors_total{backend}`: failed scrapes of an engine's `/metrics`.
    pub engine_scrape_errors_total: IntCounterVec,
    /// `pronto_buffered_request_bytes`: request body bytes held now, over all requests (the
    /// budget is `limits.max_buffered_bytes`).
    pub buffered_request_bytes: IntGauge,
    /// `pronto_capacity_rejections_total{limit}`: requests and connections refused with 503
    /// at a global limit (`buffered_bytes`, `connections`).
    pub capacity_rejections_total: IntCounterVec,
    /// `pronto_open_connections`: client connections open now.
    pub open_connections: IntGauge,
    /// `pronto_ttft_prediction_error_seconds{backend}`: the decision's predicted − actual TTFT.
    pub ttft_prediction_error_seconds: HistogramVec,
    /// `pronto_ttft_prediction_abs_error_seconds{backend}`: |predicted − actual| TTFT (its sum
    /// over its count is the mean absolute error; the signed family's sum can cancel out).
    pub ttft_prediction_abs_error_seconds: HistogramVec,
    /// `pronto_predicted_ttft_seconds{pool}`: the chosen backend's predicted TTFT.
    pub predicted_ttft_seconds: HistogramVec,
    /// `pronto_route_decisions_total{pool,policy,reason}`
    pub route_decisions_total: IntCounterVec,
    /// `pronto_prefix_match_ratio{pool}`: expected cached share of the prompt on the chosen
    /// backend.
    pub prefix_match_ratio: HistogramVec,
    /// `pronto_prompt_token_ratio{pool}`: engine prompt tokens per Pronto-counted token,
    /// learned from responses' `usage` (1 until one reports it).
    pub prompt_token_ratio: GaugeVec,
    /// `pronto_tokenize_total{pool,result}`: requests of a pool with a `tokenizer`, by
    /// outcome: `exact` (ids computed), `skipped` (token-id prompt, or chat without a
    /// template), `body` / `template` / `encode` (failed; the estimate was kept).
    pub tokenize_total: IntCounterVec,
    /// `pronto_discovery_backends{pool}`: backends a pool's `discover.dns` name resolved to
    /// (the last known set; kept when a resolution fails).
    pub discovery_backends: IntGaugeVec,
    /// `pronto_discovery_errors_total{pool}`: failed resolutions of a pool's `discover.dns`.
    pub discovery_errors_total: IntCounterVec,
    /// `pronto_config_reloads_total{result}`: reload attempts by [`ReloadResult`].
    pub config_reloads_total: IntCounterVec,
    /// `pronto_config_version`: the active config's version (1 at start, +1 per applied
    /// reload).
    pub config_version: IntGauge,
    /// `pronto_config_info{hash}`: 1 for the active config's source hash (one series).
    pub config_info: IntGaugeVec,
    /// `pronto_config_last_reload_successful`: 0 after a failed reload attempt, else 1.
    pub config_last_reload_successful: IntGauge,
    /// `pronto_admission_queue_length{route}`: requests waiting in the admission queue.
    pub admission_queue_length: IntGaugeVec,
    /// `pronto_admission_queue_wait_seconds{route}`: time spent in the admission queue.
    pub admission_queue_wait_seconds: HistogramVec,
    /// `pronto_admission_sheds_total{route,reason}`: requests refused with 429 by admission.
    pub admission_sheds_total: IntCounterVec,
    /// `pronto_kv_events_total{backend,result}`: engine KV-event messages `received`,
    /// `decoded`, failed to decode (`error`), and stored blocks that could not be mapped
    /// (`unmapped_block`).
    pub kv_events_total: IntCounterVec,
    /// `pronto_kv_events_resyncs_total{backend}`: exact-index resyncs (sequence gaps).
    pub kv_events_resyncs_total: IntCounterVec,
    /// `pronto_kv_events_blocks{backend}`: blocks in a backend's exact index.
    pub kv_events_blocks: IntGaugeVec,
    /// `pronto_health_check_failures_total{backend,reason}`: failed active health checks by
    /// [`CheckFailure::label`] (`status`, `timeout`, `refused`, `connect`,
    /// `io`).
    pub health_check_failures_total: IntCounterVec,
    /// `pronto_kv_events_connect_failures_total{backend}`: failed connects (or handshakes) to
    /// an engine's KV-event publisher.
    pub kv_events_connect_failures_total: IntCounterVec,
    /// `pronto_kv_events_subscriber_restarts_total{backend}`: KV-event subscriber tasks that
    /// died (panicked or returned) and were restarted.
    pub kv_events_subscriber_restarts_total: IntCounterVec,
    /// `pronto_backend_ejections_total{backend}`: passive ejections (consecutive failures).
    /// Registered at zero for every configured backend ([`Metrics::publish_config`]).
    pub backend_ejections_total: IntCounterVec,
    /// `pronto_rate_limited_total{scope,name,limit}`: requests refused with 429 by a rate
    /// limit ([`RateLimitScope`], the key or route name, [`RateLimitKind`]). Registered at
    /// zero for every configured limit.
    pub rate_limited_total: IntCounterVec,
    /// `pronto_route_ttft_slo_seconds{route,pool}`: each route's `ttft_slo` (routes without
    /// one have no series); set at start and after each reload.
    pub route_ttft_slo_seconds: GaugeVec,
    /// `pronto_build_info{version,revision}`: 1, labelled with what this binary was built
    /// from.
    pub build_info: IntGaugeVec,
    /// `pronto_pool_backends{pool}`: backends of each pool (static and discovered), as of
    /// the scrape ([`Metrics::publish_pools`]).
    pub pool_backends: IntGaugeVec,
    /// `pronto_pool_healthy_backends{pool}`: of those, the ones eligible for routing.
    pub pool_healthy_backends: IntGaugeVec,
    /// The replica-sync families (`pronto_cluster_*`).
    pub cluster: ClusterMetrics,
    /// The failover and hedge families.
    pub race: RaceMetrics,
    /// The stream migration families.
    pub migration: MigrationMetrics,
    /// Progress-based exclusion and first-token keep-alives.
    pub progress: ProgressMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One backend's exact-index series: `pronto_kv_events_total{backend,result}`,
/// `pronto_kv_events_resyncs_total{backend}` and `pronto_kv_events_blocks{backend}`.
#[derive(Debug)]
struct KvIndexSeries {
    received: IntCounter,
    decoded: IntCounter,
    errors: IntCounter,
    unmapped: IntCounter,
    resyncs: IntCounter,
    blocks: IntGauge,
}

impl pronto_core::kv_index::IndexSink for KvIndexSeries {
    fn count(&self, what: &'static str, n: u64) {
        let c = match what {
            "received" => &self.received,
            "decoded" => &self.decoded,
            "error" => &self.errors,
            "unmapped_block" => &self.unmapped,
            "resync" => &self.resyncs,
            _ => return,
        };
        c.inc_by(n);
    }

    fn blocks(&self, blocks: usize) {
        self.blocks.set(blocks as i64);
    }
}

impl Metrics {
    /// Where backend `backend`'s exact prefix index reports its events and size.
    pub fn kv_index_sink(
        &self,
        backend: &str,
    ) -> std::sync::Arc<dyn pronto_core::kv_index::IndexSink> {
        let ev = |r: &str| self.kv_events_total.with_label_values(&[backend, r]);
        std::sync::Arc::new(KvIndexSeries {
            received: ev("received"),
            decoded: ev("decoded"),
            errors: ev("error"),
            unmapped: ev("unmapped_block"),
            resyncs: self.kv_events_resyncs_total.with_label_values(&[backend]),
            blocks: self.kv_events_blocks.with_label_values(&[backend]),
        })
    }

    /// Register every family in a fresh registry.
    pub fn new() -> Metrics {
        let r = Families {
            registry: Registry::new(),
            per_backend: RefCell::default(),
        };
        Metrics {
            requests_total: counter(
                &r,
                "pronto_requests_total",
                "Requests answered, by pool, backend and HTTP status",
                &["pool", "backend", "code"],
            ),
            request_duration_seconds: histogram(
                &r,
                "pronto_request_duration_seconds",
                "Request arrival to end of response",
                &["pool"],
            ),
            backend_inflight: gauge(
                &r,
                "pronto_backend_inflight",
                "Requests in flight to each backend",
                &["backend"],
            ),
            backend_healthy: gauge(
                &r,
                "pronto_backend_healthy",
                "1 when the backend is eligible for routing",
                &["backend"],
            ),
            retries_total: counter(
                &r,
                "pronto_retries_total",
                "Attempts retried on another backend, by reason",
                &["pool", "reason"],
            ),
            ttft_seconds: histogram(
                &r,
                "pronto_ttft_seconds",
                "Upstream request sent to first generated token, per backend",
                &["backend"],
            ),
            tpot_seconds: histogram_with(
                &r,
                "pronto_tpot_seconds",
                "Mean time per output token after the first, per backend",
                &["backend"],
                TPOT_BUCKETS,
            ),
            e2e_seconds: histogram(
                &r,
                "pronto_e2e_seconds",
                "Upstream request sent to the end of a completed response, per backend",
                &["backend"],
            ),
            client_ttft_seconds: histogram(
                &r,
                "pronto_client_ttft_seconds",
                "Client request arrival to first generated token forwarded",
                &["pool"],
            ),
            ttfa_seconds: histogram(
                &r,
                "pronto_ttfa_seconds",
                "Upstream request sent to first answer token (content or tool call, after any reasoning), per backend",
                &["backend"],
            ),
            client_ttfa_seconds: histogram(
                &r,
                "pronto_client_ttfa_seconds",
                "Client request arrival to first answer token (after any reasoning) forwarded",
                &["pool"],
            ),
            client_disconnects_total: counter(
                &r,
                "pronto_client_disconnects_total",
                "Clients that hung up before their response ended",
                &["pool"],
            ),
            client_stalled_total: counter(
                &r,
                "pronto_client_stalled_total",
                "Clients that stopped reading mid-response, released at the write deadline",
                &["pool"],
            ),
            upstream_errors_total: counter(
                &r,
                "pronto_upstream_errors_total",
                "Failures talking to a backend, by kind",
                &["backend", "kind"],
            ),
            backend_queue_depth: float_gauge(
                &r,
                "pronto_backend_queue_depth",
                "Requests waiting in the backend engine's queue, as last scraped",
                &["backend"],
            ),
            backend_kv_usage_ratio: float_gauge(
                &r,
                "pronto_backend_kv_usage_ratio",
                "Backend engine KV-cache usage (0..1), as last scraped",
                &["backend"],
            ),
            engine_scrape_errors_total: counter(
                &r,
                "pronto_engine_scrape_errors_total",
                "Failed scrapes of a backend engine's /metrics",
                &["backend"],
            ),
            ttft_prediction_error_seconds: histogram_with(
                &r,
                "pronto_ttft_prediction_error_seconds",
                "The routing decision's predicted TTFT minus the actual TTFT of each streamed request, per backend",
                &["backend"],
                ERROR_BUCKETS,
            ),
            buffered_request_bytes: plain_gauge(
                &r,
                "pronto_buffered_request_bytes",
                "Request body bytes buffered now, over all requests",
            ),
            capacity_rejections_total: counter(
                &r,
                "pronto_capacity_rejections_total",
                "Requests and connections refused with 503 at a global limit",
                &["limit"],
            ),
            open_connections: plain_gauge(
                &r,
                "pronto_open_connections",
                "Client connections open now",
            ),
            ttft_prediction_abs_error_seconds: histogram(
                &r,
                "pronto_ttft_prediction_abs_error_seconds",
                "Absolute difference between the routing decision's predicted TTFT and the actual TTFT, per backend",
                &["backend"],
            ),
            predicted_ttft_seconds: histogram(
                &r,
                "pronto_predicted_ttft_seconds",
                "Predicted TTFT on the chosen backend at routing time",
                &["pool"],
            ),
            route_decisions_total: counter(
                &r,
                "pronto_route_decisions_total",
                "Routing decisions by pool, policy and reason",
                &["pool", "policy", "reason"],
            ),
            prefix_match_ratio: histogram_with(
                &r,
                "pronto_prefix_match_ratio",
                "Expected prefix-cache share of the prompt on the chosen backend",
                &["pool"],
                RATIO_BUCKETS,
            ),
            prompt_token_ratio: float_gauge(
                &r,
                "pronto_prompt_token_ratio",
                "Engine prompt tokens per Pronto-counted token, learned from usage",
                &["pool"],
            ),
            tokenize_total: counter(
                &r,
                "pronto_tokenize_total",
                "Requests of a pool with a tokenizer, by outcome (exact, skipped, or the failure kept the estimate)",
                &["pool", "result"],
            ),
            discovery_backends: gauge(
                &r,
                "pronto_discovery_backends",
                "Backends a pool's discover.dns name resolved to (last known set), by pool",
                &["pool"],
            ),
            discovery_errors_total: counter(
                &r,
                "pronto_discovery_errors_total",
                "Failed resolutions of a pool's discover.dns name, by pool",
                &["pool"],
            ),
            config_reloads_total: counter(
                &r,
                "pronto_config_reloads_total",
                "Config reload attempts by result (ok, unchanged, error)",
                &["result"],
            ),
            config_version: plain_gauge(
                &r,
                "pronto_config_version",
                "Version of the active config: 1 at start, +1 per applied reload",
            ),
            config_info: gauge(
                &r,
                "pronto_config_info",
                "1 for the source hash of the active config",
                &["hash"],
            ),
            config_last_reload_successful: plain_gauge(
                &r,
                "pronto_config_last_reload_successful",
                "0 when the last reload attempt failed, else 1",
            ),
            admission_queue_length: gauge(
                &r,
                "pronto_admission_queue_length",
                "Requests waiting in the SLO admission queue, by route",
                &["route"],
            ),
            admission_queue_wait_seconds: histogram(
                &r,
                "pronto_admission_queue_wait_seconds",
                "Time requests spent in the SLO admission queue, by route",
                &["route"],
            ),
            admission_sheds_total: counter(
                &r,
                "pronto_admission_sheds_total",
                "Requests refused with 429 by SLO admission, by route and reason",
                &["route", "reason"],
            ),
            kv_events_total: counter(
                &r,
                "pronto_kv_events_total",
                "Engine KV-cache event messages by backend and result",
                &["backend", "result"],
            ),
            kv_events_resyncs_total: counter(
                &r,
                "pronto_kv_events_resyncs_total",
                "Exact prefix index resyncs after a KV-event sequence gap",
                &["backend"],
            ),
            kv_events_blocks: gauge(
                &r,
                "pronto_kv_events_blocks",
                "Blocks a backend's exact prefix index holds",
                &["backend"],
            ),
            health_check_failures_total: counter(
                &r,
                "pronto_health_check_failures_total",
                "Failed active health checks, by backend and reason (status, timeout, refused, connect, io)",
                &["backend", "reason"],
            ),
            kv_events_connect_failures_total: counter(
                &r,
                "pronto_kv_events_connect_failures_total",
                "Failed connects to a backend engine's KV-event publisher",
                &["backend"],
            ),
            kv_events_subscriber_restarts_total: counter(
                &r,
                "pronto_kv_events_subscriber_restarts_total",
                "KV-event subscriber tasks that died (panicked or returned) and were restarted",
                &["backend"],
            ),
            backend_ejections_total: counter(
                &r,
                "pronto_backend_ejections_total",
                "Passive ejections of a backend after consecutive failed requests",
                &["backend"],
            ),
            rate_limited_total: counter(
                &r,
                "pronto_rate_limited_total",
                "Requests refused with 429 by a rate limit, by scope (key, route), key or route name, and limit (requests, tokens, concurrency)",
                &["scope", "name", "limit"],
            ),
            route_ttft_slo_seconds: float_gauge(
                &r,
                "pronto_route_ttft_slo_seconds",
                "The route's configured ttft_slo, by route and target pool",
                &["route", "pool"],
            ),
            build_info: gauge(
                &r,
                "pronto_build_info",
                "1, labelled with the version and git revision of this binary",
                &["version", "revision"],
            ),
            pool_backends: gauge(
                &r,
                "pronto_pool_backends",
                "Backends of each pool (static and discovered), as of the scrape",
                &["pool"],
            ),
            pool_healthy_backends: gauge(
                &r,
                "pronto_pool_healthy_backends",
                "Backends of each pool eligible for routing, as of the scrape",
                &["pool"],
            ),
            cluster: ClusterMetrics::new(&r),
            race: RaceMetrics::new(&r),
            migration: MigrationMetrics::new(&r),
            progress: ProgressMetrics::new(&r),
            per_backend: Arc::new(r.per_backend.take()),
            registry: r.registry,
        }
        .with_start_series()
    }

    /// Series that exist whatever the config: build info, reload results at zero, and the
    /// process collector (Linux).
    fn with_start_series(self) -> Metrics {
        self.build_info
            .with_label_values(&[VERSION, REVISION])
            .set(1);
        for result in ReloadResult::ALL {
            self.config_reloads_total
                .with_label_values(&[result.as_str()]);
        }
        #[cfg(target_os = "linux")]
        self.registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");
        self
    }

    /// Publish what the config `config` declares, at start and after every applied reload:
    /// each route's `ttft_slo` (`pronto_route_ttft_slo_seconds`, replacing the previous
    /// routes' series), and, at zero, the counter series of every label value the config
    /// names — ejections per static backend, retries and client disconnects per pool and
    /// reason, admission sheds (and the admission queue's length and wait) per
    /// admission-controlled route, discovery errors per `discover:` pool, rate-limit
    /// refusals per configured limit, KV-event connect failures and subscriber restarts per
    /// backend with `kv_events:`, and each static backend's [`Metrics::register_backend`]
    /// series — so dashboards and alerts see them before the first event. Existing counts are kept (registering a series that exists is a no-op).
    pub fn publish_config(&self, config: &crate::config::Config) {
        self.route_ttft_slo_seconds.reset();
        for route in &config.routes {
            self.race.publish_route(route);
            self.progress.publish_route(route);
            if let Some(slo) = &route.slo {
                self.route_ttft_slo_seconds
                    .with_label_values(&[&*route.name, &*route.pool])
                    .set(slo.ttft.as_secs_f64());
                for reason in ShedReason::ALL {
                    self.admission_sheds_total
                        .with_label_values(&[&*route.name, reason.as_str()]);
                }
                self.admission_queue_length
                    .with_label_values(&[&*route.name]);
                self.admission_queue_wait_seconds
                    .with_label_values(&[&*route.name]);
            }
        }
        for pool in &config.pools {
            for reason in RetryReason::ALL {
                self.retries_total
                    .with_label_values(&[&*pool.model, reason.as_str()]);
            }
            self.client_disconnects_total
                .with_label_values(&[&*pool.model]);
            self.client_stalled_total.with_label_values(&[&*pool.model]);
            for b in &pool.backends {
                self.register_backend(&b.name);
                if b.kv_events.is_some() {
                    self.kv_events_connect_failures_total
                        .with_label_values(&[&b.name]);
                    self.kv_events_subscriber_restarts_total
                        .with_label_values(&[&b.name]);
                }
            }
            if pool.discover.is_some() {
                self.discovery_errors_total
                    .with_label_values(&[&*pool.model]);
            }
        }
        let limits = &config.rate_limits;
        let zero = |scope: RateLimitScope, name: &str, l: &crate::config::edge::RateLimit| {
            for (kind, set) in [
                (RateLimitKind::Requests, l.requests_per_minute.is_some()),
                (RateLimitKind::Tokens, l.tokens_per_minute.is_some()),
                (RateLimitKind::Concurrency, l.max_concurrent.is_some()),
            ] {
                if set {
                    self.rate_limited_total.with_label_values(&[
                        scope.as_str(),
                        name,
                        kind.as_str(),
                    ]);
                }
            }
        };
        for key in config.auth.iter().flat_map(|a| &a.keys) {
            if let Some(l) = limits.for_key(&key.name) {
                zero(RateLimitScope::Key, &key.name, l);
            }
        }
        for (route, l) in &limits.routes {
            zero(RateLimitScope::Route, route, l);
        }
    }

    /// Register backend `backend`'s counter series at zero: its ejections, engine scrape
    /// errors, failed health checks of every reason ([`CheckFailure::LABELS`])
    /// and upstream errors of every kind ([`UPSTREAM_ERROR_KINDS`]), so that a rate over
    /// them reads 0, not "no data", before the first failure. [`Metrics::publish_config`] does it for static
    /// backends; a backend found by `discover:` needs it when it is created
    /// (`Backend::new`), else its series appear at its first failure.
    pub fn register_backend(&self, backend: &str) {
        self.backend_ejections_total.with_label_values(&[backend]);
        self.progress.register_backend(backend);
        self.engine_scrape_errors_total
            .with_label_values(&[backend]);
        for reason in CheckFailure::LABELS {
            self.health_check_failures_total
                .with_label_values(&[backend, reason]);
        }
        for kind in UPSTREAM_ERROR_KINDS {
            self.upstream_errors_total
                .with_label_values(&[backend, kind]);
        }
    }

    /// Publish each pool's `(name, backends, healthy backends)`, replacing the previous
    /// pools' series (the admin listener calls it on every `/metrics` scrape, so the values
    /// are exact and pools that left the config disappear).
    pub fn publish_pools<'a>(&self, pools: impl IntoIterator<Item = (&'a str, usize, usize)>) {
        self.pool_backends.reset();
        self.pool_healthy_backends.reset();
        for (pool, total, healthy) in pools {
            self.pool_backends
                .with_label_values(&[pool])
                .set(total as i64);
            self.pool_healthy_backends
                .with_label_values(&[pool])
                .set(healthy as i64);
        }
    }

    /// Count a request refused by the `kind` limit of `scope` `name` (a key or route name
    /// from the config).
    pub fn count_rate_limited(&self, scope: RateLimitScope, name: &str, kind: RateLimitKind) {
        self.rate_limited_total
            .with_label_values(&[scope.as_str(), name, kind.as_str()])
            .inc();
    }

    /// Count a passive ejection of `backend`.
    pub fn count_ejection(&self, backend: &str) {
        self.backend_ejections_total
            .with_label_values(&[backend])
            .inc();
    }

    /// Remove every series labelled `backend="<backend>"`, from every family that has a
    /// `backend` label (gauges, counters and histograms alike), so a backend that left the
    /// config (reload or discovery) leaves nothing behind in `/metrics`. A later backend of
    /// the same name starts its series from zero.
    ///
    /// Call it after the state without the backend is swapped in. A component still holding
    /// the departed backend that records afterwards (a draining stream, a probe in flight)
    /// re-creates that one series; the background loops check that their backend is still
    /// current before recording.
    pub fn forget_backend(&self, backend: &str) {
        for family in self.per_backend.iter() {
            family.forget(backend);
        }
    }

    /// How many families have a `backend` label (the ones [`Metrics::forget_backend`] clears).
    pub fn per_backend_families(&self) -> usize {
        self.per_backend.len()
    }

    /// Publish `version` and `hash` as the active config (replacing the previous hash series).
    pub fn set_active_config(&self, version: u64, hash: &str) {
        self.config_version.set(version as i64);
        self.config_info.reset();
        self.config_info.with_label_values(&[hash]).set(1);
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

#[cfg(test)]
mod tests;
