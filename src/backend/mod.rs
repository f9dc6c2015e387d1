//! Live state of each backend: health, ejection, and its routing state (the core's
//! [`BackendState`]: ledger, TTFT model, scraped engine state, exact index).
//!
//! A [`Backend`] is shared (`Arc`) between the proxy threads, the health checker and the admin
//! listener. Everything on it that changes per request is atomic, so building a routing
//! [`BackendView`] takes no lock. Load is accounted with an RAII [`InflightGuard`] that lives
//! until the response stream really ends (or the client disconnects): increments and decrements
//! are never paired by hand.
//!
//! Engine-side load scraped from each backend's `/metrics` (`services::scrape`) is kept in
//! the backend's [`EngineState`](pronto_core::engine::EngineState) and enters the routing view only while it is fresh.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod latency;
pub mod lifecycle;
#[cfg(test)]
pub(crate) mod log_capture;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora_core::upstreams::peer::HttpPeer;

pub use latency::LatencyStats;
pub use lifecycle::{CheckFailure, HealthChange, StallChange};
use pronto_core::engine::EngineSample;
use pronto_core::load::RequestLoad;

use crate::config::Backend as BackendConfig;
use crate::telemetry::Metrics;
use pronto_core::ids::BackendId;
use pronto_core::load::{Atomic, Booking};
use pronto_core::predict::Coefficients;
use pronto_core::routing::views::RoutingBackend;
use pronto_core::routing::BackendView;
use pronto_core::state::{BackendState, Settings};

/// The epoch every backend's routing state counts time from: one for the process, so a
/// routing decision converts its clock once for the whole pool (`views::build`).
static ROUTING_EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// One backend and what the gateway knows about it.
#[derive(Debug)]
pub struct Backend {
    /// Static settings from config.
    pub config: BackendConfig,
    /// The pingora peer used to connect (address, TLS, timeouts).
    pub peer: HttpPeer,
    /// `host:port` for the upstream `Host` header.
    pub authority: String,
    /// The same as the header value sent, made once (each request clones a reference); `None`
    /// when it is not a valid header value (each request then fails to build its head).
    pub host_header: Option<http::HeaderValue>,
    /// `Authorization: Bearer <api_key>` for the upstream requests, when the backend has a key.
    pub authorization: Option<http::HeaderValue>,
    /// Client for health checks and metrics scrapes, trusting what the peer trusts.
    pub http: reqwest::Client,
    created: Instant,
    active_ok: AtomicBool,
    /// Passive ejection: nanoseconds since `created` before which the backend is not routed to
    /// (0 = not ejected).
    ejected_until_ns: AtomicU64,
    consecutive_failures: AtomicU32,
    /// The routing side: ledger, TTFT model, scraped engine state, exact prefix index — the
    /// same code the offline evaluator runs.
    pub state: BackendState<Atomic>,
    /// Measured TTFT / TPOT / E2E: EWMAs and sliding-window quantiles.
    pub latency: LatencyStats,
    metrics: Metrics,
    /// The previous health state, so the log shows transitions only ([`lifecycle`]).
    health_log: std::sync::Mutex<lifecycle::HealthTracker>,
    /// When (by this replica's estimate) the latest remote dispatch to this backend that it
    /// heard of was sent: what collision repair waits on (the proxy's `repair`).
    remote_dispatch: tokio::sync::watch::Sender<Option<Instant>>,
}

impl Backend {
    /// A backend that starts healthy (active checks may mark it down), its TTFT model starting
    /// from the config's profile hint ([`BackendConfig::profile`]) or the generic prior.
    pub fn new(
        id: BackendId,
        config: BackendConfig,
        connect_timeout: Duration,
        metrics: Metrics,
    ) -> Backend {
        let addr = format!("{}:{}", config.host, config.port);
        // TLS: the host is the SNI and the name verified; `ca_file` replaces the system roots.
        let mut peer = HttpPeer::new(addr.as_str(), config.tls, crate::tls::sni(&config.host));
        peer.options.ca = crate::tls::peer_ca(&config);
        let http = crate::tls::backend_http_client(&config);
        peer.options.connection_timeout = Some(connect_timeout);
        peer.options.total_connection_timeout = Some(connect_timeout);
        peer.options.tcp_keepalive = None;
        let created = Instant::now();
        let kv_events = config.kv_events.as_ref().map(|k| {
            Arc::new(
                pronto_core::kv_index::ExactIndex::new(k.block_size)
                    .with_sink(metrics.kv_index_sink(&config.name)),
            )
        });
        let prior = config
            .profile
            .map_or_else(Coefficients::default, |p| p.coefficients());
        let epoch = *ROUTING_EPOCH;
        let state = BackendState::new(id, &config.name, prior, epoch, kv_events);
        let authorization = config.api_key.as_ref().and_then(crate::tls::bearer);
        let host_header = http::HeaderValue::from_str(&addr).ok();
        let b = Backend {
            host_header,
            authority: addr,
            authorization,
            peer,
            http,
            config,
            created,
            active_ok: AtomicBool::new(true),
            ejected_until_ns: AtomicU64::new(0),
            consecutive_failures: AtomicU32::new(0),
            state,
            latency: LatencyStats::default(),
            metrics,
            health_log: std::sync::Mutex::default(),
            remote_dispatch: tokio::sync::watch::Sender::new(None),
        };
        b.publish_health(Instant::now());
        b
    }

    /// Count one failure of `kind` (an [`crate::telemetry::UPSTREAM_ERROR_KINDS`] value) in
    /// `pronto_upstream_errors_total` — for failures handled inside an attempt, such as a
    /// stale pooled connection resent on a fresh one.
    pub fn count_upstream_error(&self, kind: &str) {
        self.metrics
            .upstream_errors_total
            .with_label_values(&[self.name(), kind])
            .inc();
    }

    /// This replica heard of another's dispatch to this backend, sent at `sent_at` (its
    /// estimate): wakes the requests waiting on [`Backend::remote_dispatches`].
    pub fn heard_remote_dispatch(&self, sent_at: Instant) {
        self.remote_dispatch.send_replace(Some(sent_at));
    }

    /// The remote dispatches to this backend heard from now on ([`Backend::heard_remote_dispatch`]).
    pub fn remote_dispatches(&self) -> tokio::sync::watch::Receiver<Option<Instant>> {
        self.remote_dispatch.subscribe()
    }

    /// Backend name (a bounded metric label).
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// This backend instance's id (stable across reloads that keep it).
    pub fn id(&self) -> BackendId {
        self.state.id
    }

    /// The exact prefix index fed by the engine's KV-cache events (`kv_events` configured).
    pub fn kv_events(&self) -> Option<&Arc<pronto_core::kv_index::ExactIndex>> {
        self.state.exact.as_ref()
    }

    fn ns_since_created(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.created).as_nanos() as u64
    }

    /// Whether the backend may be routed to at `now`: its active check passes and it is not
    /// passively ejected.
    pub fn is_healthy(&self, now: Instant) -> bool {
        self.active_ok.load(Ordering::Relaxed) && !self.is_ejected(now)
    }

    /// Passively ejected at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        // Never ejected (0): no clock arithmetic on the routing path.
        let until = self.ejected_until_ns.load(Ordering::Relaxed);
        until > 0 && self.ns_since_created(now) < until
    }

    /// Result of an active health check.
    pub fn record_active_check(&self, ok: bool, now: Instant) {
        self.active_ok.store(ok, Ordering::Relaxed);
        if ok && !self.is_ejected(now) {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        self.publish_health(now);
    }

    // === lifecycle (health transitions in the log and in metrics) ===

    fn health_log(&self) -> std::sync::MutexGuard<'_, lifecycle::HealthTracker> {
        // The tracker holds no invariant a panicking holder could break.
        self.health_log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An active health check at `now` came to `result`: recorded as by
    /// [`Backend::record_active_check`], a failure counted in
    /// `pronto_health_check_failures_total{backend,reason}`, and a transition (down, up,
    /// re-admitted, or a rate-limited "still down") logged. Returns the transition.
    pub fn record_check(
        &self,
        result: Result<(), CheckFailure>,
        now: Instant,
    ) -> Option<HealthChange> {
        if let Err(reason) = result {
            self.metrics
                .health_check_failures_total
                .with_label_values(&[self.name(), reason.label()])
                .inc();
        }
        self.record_active_check(result.is_ok(), now);
        let change = self
            .health_log()
            .on_check(result, self.is_ejected(now), now);
        if let Some(c) = change {
            c.log(self.name());
        }
        change
    }

    /// The gateway's metrics (for the background loops that record per-backend series).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    // === end lifecycle ===

    /// A request to this backend failed (connect error, I/O error, 5xx). After `eject_after`
    /// consecutive failures the backend is ejected for `readmit_after`. Returns true when this
    /// failure ejected it.
    pub fn record_failure(&self, now: Instant, eject_after: u32, readmit_after: Duration) -> bool {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= eject_after && !self.is_ejected(now) {
            let until = self.ns_since_created(now) + readmit_after.as_nanos() as u64;
            self.ejected_until_ns.store(until, Ordering::Relaxed);
            self.consecutive_failures.store(0, Ordering::Relaxed);
            self.publish_health(now);
            self.metrics.count_ejection(self.name());
            self.health_log().on_ejected(n).log(self.name());
            return true;
        }
        false
    }

    /// The backend produced at `at`: a token on one of its streams, or a whole non-streamed
    /// answer. Ends a stall ([`pronto_core::stall`]): logged, and the gauge cleared.
    pub fn progressed(&self, at: Instant) {
        if self.state.ledger.progressed(at) {
            self.metrics
                .progress
                .backend_stalled
                .with_label_values(&[self.name()])
                .set(0);
            StallChange::Left.log(self.name());
        }
    }

    /// A routing decision marked the backend stalled, seeing `view` under `rule`: logged and
    /// counted (it stays out of routing until [`Backend::progressed`]).
    pub fn marked_stalled(&self, view: &BackendView, rule: &pronto_core::stall::StallRule) {
        let p = &self.metrics.progress;
        p.backend_stalled.with_label_values(&[self.name()]).set(1);
        p.stall_exclusions_total
            .with_label_values(&[self.name()])
            .inc();
        StallChange::Entered {
            silent_s: view.silent_s,
            bound_s: rule.bound_s(view),
            inflight: view.inflight,
        }
        .log(self.name());
    }

    /// A request to this backend succeeded.
    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    /// Refresh the `pronto_backend_healthy` gauge.
    pub fn publish_health(&self, now: Instant) {
        self.metrics
            .backend_healthy
            .with_label_values(&[self.name()])
            .set(i64::from(self.is_healthy(now)));
    }

    /// Requests in flight.
    pub fn inflight(&self) -> u32 {
        self.state.ledger.inflight()
    }

    /// The routing view of this backend at `now` (no request-specific prefix hit).
    pub fn view(&self, now: Instant) -> BackendView {
        self.state.view(self.settings(), self.is_healthy(now), now)
    }

    /// A scrape of the engine's `/metrics` at `now` parsed as `sample`; trusted for
    /// `stale_after`. Publishes the queue-depth and KV-usage gauges.
    pub fn record_engine_sample(&self, sample: EngineSample, now: Instant, stale_after: Duration) {
        self.state.engine.record_success(sample, now, stale_after);
        if let Some(c) = sample.kv_capacity_tokens {
            self.state.set_kv_capacity(c as u64);
        }
        let m = &self.metrics;
        m.backend_queue_depth
            .with_label_values(&[self.name()])
            .set(sample.waiting);
        m.backend_kv_usage_ratio
            .with_label_values(&[self.name()])
            .set(sample.kv_usage);
    }

    /// A scrape of the engine's `/metrics` failed. Counted; once the data turns stale its
    /// gauges are withdrawn, so dashboards do not show a frozen queue.
    pub fn record_engine_failure(&self, error: &dyn std::fmt::Display) {
        self.metrics
            .engine_scrape_errors_total
            .with_label_values(&[self.name()])
            .inc();
        // The scraper logs the failure's transitions ([`lifecycle`]); this is the routing one.
        if self.state.engine.record_failure() {
            tracing::info!(backend = %self.name(), %error, "engine metrics stale after repeated scrape failures; routing ignores them until a scrape succeeds");
            self.withdraw_engine_gauges();
        }
    }

    /// The backend answered 404 on `/metrics` at `now`: not scraped again before
    /// `now + retry_after`.
    pub fn record_engine_absent(&self, now: Instant, retry_after: Duration) {
        if !self.state.engine.no_metrics() {
            tracing::info!(backend = %self.name(), ?retry_after, "backend exports no /metrics; scraping it rarely");
        }
        self.state.engine.record_no_metrics(now, retry_after);
        self.withdraw_engine_gauges();
    }

    fn withdraw_engine_gauges(&self) {
        let m = &self.metrics;
        // Absent series are not an error: the gauges may never have been set.
        let _ = m.backend_queue_depth.remove_label_values(&[self.name()]);
        let _ = m.backend_kv_usage_ratio.remove_label_values(&[self.name()]);
    }

    /// Book a request being sent at `now` in the ledger (see [`pronto_core::load`]): in
    /// flight, its expected uncached prefill outstanding until its prefill ends, that prefill
    /// plus its expected output reserved in the KV cache until it is released. `streamed` and
    /// the decision's prediction arm the non-streamed prefill deadline.
    pub fn start_request(
        self: &Arc<Self>,
        load: RequestLoad,
        now: Instant,
        streamed: bool,
        predicted_ttft_s: Option<f64>,
    ) -> InflightGuard {
        let booking = self
            .state
            .ledger
            .book(load, now, streamed, predicted_ttft_s);
        InflightGuard::new(Arc::clone(self), booking)
    }

    fn publish_inflight(&self) {
        self.metrics
            .backend_inflight
            .with_label_values(&[self.name()])
            .set(i64::from(self.inflight()));
    }

    fn settings(&self) -> Settings {
        Settings {
            weight: self.config.weight,
            max_inflight: self.config.max_inflight,
        }
    }

    /// JSON state for `GET /admin/backends`.
    pub fn admin_json(&self, now: Instant) -> serde_json::Value {
        let load = self.state.load(now);
        serde_json::json!({
            "name": &*self.config.name,
            "url": self.config.base_url(),
            "weight": self.config.weight,
            "max_inflight": self.config.max_inflight,
            "labels": self.config.labels,
            "healthy": self.is_healthy(now),
            "active_check_ok": self.active_ok.load(Ordering::Relaxed),
            "ejected": self.is_ejected(now),
            "consecutive_failures": self.consecutive_failures.load(Ordering::Relaxed),
            "inflight": load.inflight,
            "outstanding_prefill_tokens": load.outstanding_prefill_tokens,
            "running_decodes": load.running_decodes,
            "kv_reserved_tokens": load.kv_reserved_tokens,
            "streams": load.streams,
            "silent_s": load.silent_s,
            "stalled": load.stalled,
            "engine": self.state.engine.admin_json(now),
            "latency": self.latency.admin_json(now),
        })
    }
}

impl RoutingBackend for Backend {
    type Storage = Atomic;

    fn state(&self) -> &BackendState<Atomic> {
        &self.state
    }

    fn settings(&self) -> Settings {
        Backend::settings(self)
    }

    fn healthy(&self, now: Instant) -> bool {
        self.is_healthy(now)
    }
}

/// Holds one request's booking in its backend's ledger until dropped.
#[derive(Debug)]
pub struct InflightGuard {
    backend: Arc<Backend>,
    booking: Booking,
    /// The other replicas' view of this booking (with `cluster:`); dropped after the release.
    synced: Option<crate::cluster::Tracked>,
}

impl InflightGuard {
    /// A guard over `booking`, made in `backend`'s ledger.
    pub fn new(backend: Arc<Backend>, booking: Booking) -> InflightGuard {
        backend.publish_inflight();
        InflightGuard {
            backend,
            booking,
            synced: None,
        }
    }

    /// Tell the other replicas of this booking's life through `synced`.
    pub fn synced(mut self, synced: Option<crate::cluster::Tracked>) -> InflightGuard {
        self.synced = synced;
        self
    }

    /// The backend this guard accounts on.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// The booking.
    pub fn booking(&self) -> &Booking {
        &self.booking
    }

    /// The backend produced at `at` ([`Backend::progressed`]).
    pub fn progressed(&self, at: Instant) {
        self.backend.progressed(at);
    }

    /// The request's prefill is over without a first token to learn from (a non-streamed
    /// response head, or its predicted TTFT passed). Idempotent.
    pub fn end_prefill(&mut self) {
        if self.backend.state.ledger.end_prefill(&mut self.booking) {
            if let Some(s) = &self.synced {
                s.first_token(None);
            }
        }
    }

    /// The first token arrived at `at`, `actual_s` after sending, while the gateway holds the
    /// response back (a race on the first answer): the prefill ends now, and the model learns
    /// this sample at the next [`InflightGuard::first_token`] (which has the inputs). The
    /// other replicas see the prefill end but not the sample.
    pub fn first_token_held(&mut self, actual_s: f64, at: Instant) {
        self.backend.progressed(at);
        if self
            .backend
            .state
            .hold_first_token(&mut self.booking, actual_s, at)
        {
            if let Some(s) = &self.synced {
                s.first_token(None);
            }
        }
    }

    /// The first token arrived at `at`, `actual_s` after the request was sent: end the prefill
    /// and teach the backend's model (once). Returns the model's own prediction before it
    /// learned, when this call was the one that ended the prefill. After
    /// [`InflightGuard::first_token_held`] the held sample is what is learnt (`actual_s` and
    /// `at` are ignored: a late copy's censored time is not its real TTFT).
    pub fn first_token(
        &mut self,
        inputs: &pronto_core::predict::TtftInputs,
        actual_s: f64,
        at: Instant,
    ) -> Option<f64> {
        let learnt =
            self.backend
                .state
                .observe_first_token(&mut self.booking, inputs, actual_s, at)?;
        if let (false, Some(s)) = (learnt.held, &self.synced) {
            s.first_token(Some(pronto_core::cluster::Observation {
                inputs: *inputs,
                ttft_s: actual_s,
            }));
        }
        Some(learnt.predicted_s)
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        // Drop takes no clock: the release is now.
        self.backend
            .state
            .ledger
            .release_at(&mut self.booking, Instant::now());
        self.backend.publish_inflight();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::log_capture;
    use std::collections::BTreeMap;

    fn backend() -> Arc<Backend> {
        let cfg = BackendConfig {
            name: Arc::from("b0"),
            host: "127.0.0.1".into(),
            port: 1,
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
        Arc::new(Backend::new(
            BackendId(0),
            cfg,
            Duration::from_secs(1),
            Metrics::new(),
        ))
    }

    #[test]
    fn the_profile_hint_is_the_ttft_prior() {
        let now = Instant::now();
        let plain = backend().view(now).ttft_model.unwrap().coefficients;
        assert_eq!(plain, Coefficients::default());
        let hint = crate::config::ProfileHint {
            base_ms: Some(40.0),
            prefill_tokens_per_s: Some(4000.0),
            decode_ms_per_running: None,
        };
        let cfg = BackendConfig {
            profile: Some(hint),
            ..backend().config.clone()
        };
        let b = Backend::new(BackendId(0), cfg, Duration::from_secs(1), Metrics::new());
        let c = b.view(now).ttft_model.unwrap().coefficients;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert!(close(c.base_s, 0.04), "{c:?}");
        assert!(close(c.s_per_token, 2.5e-4), "{c:?}");
        assert!(
            close(c.s_per_decode, Coefficients::default().s_per_decode),
            "{c:?}"
        );
        assert!(
            close(c.s_per_waiting, Coefficients::default().s_per_waiting),
            "{c:?}"
        );
    }

    #[test]
    fn guard_accounts_prefill_then_decode_then_nothing() {
        let b = backend();
        let now = Instant::now();
        let load = RequestLoad {
            prefill_tokens: 100,
            kv_tokens: 150,
        };
        let mut g = b.start_request(load, now, true, None);
        let v = b.view(now);
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (1, 100, 0)
        );
        assert_eq!((v.kv_reserved_tokens, v.kv_capacity_tokens), (150, None));
        assert!(v.cache_residency_s().is_infinite(), "capacity unknown");
        let x = pronto_core::predict::TtftInputs::default();
        assert!(g.first_token(&x, 0.1, now).is_some());
        assert!(g.first_token(&x, 0.1, now).is_none(), "observed once");
        let v = b.view(now);
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (1, 0, 1)
        );
        drop(g);
        let v = b.view(now);
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (0, 0, 0)
        );
        assert_eq!(v.kv_reserved_tokens, 0);
        let g2 = b.start_request(
            RequestLoad {
                prefill_tokens: 7,
                ..load
            },
            now,
            true,
            None,
        );
        drop(g2);
        assert_eq!(b.view(now).outstanding_prefill_tokens, 0);
    }

    #[test]
    fn scraped_capacity_gives_a_finite_cache_residency_that_grows_as_traffic_stops() {
        let b = backend();
        let t0 = Instant::now();
        let sample = |cap| EngineSample {
            waiting: 0.0,
            running: 0.0,
            kv_usage: 0.0,
            prefix_queries: None,
            prefix_hits: None,
            cache_hit_rate: None,
            kv_capacity_tokens: cap,
            flavor: pronto_core::engine::EngineFlavor::Vllm,
        };
        b.record_engine_sample(sample(Some(100_000.0)), t0, Duration::from_secs(1));
        // An unknown capacity in a later scrape keeps the known one.
        b.record_engine_sample(sample(None), t0, Duration::from_secs(1));
        let load = RequestLoad {
            prefill_tokens: 1000,
            kv_tokens: 1000,
        };
        let mut guards = Vec::new();
        for i in 0..100 {
            guards.push(b.start_request(load, t0 + Duration::from_millis(100 * i), true, None));
        }
        let now = t0 + Duration::from_secs(10);
        let busy = b.view(now);
        assert_eq!(busy.kv_capacity_tokens, Some(100_000));
        assert!(busy.cache_residency_s().is_finite());
        guards.truncate(10);
        let calmer = b.view(now);
        assert_eq!(
            calmer.cache_residency_s(),
            busy.cache_residency_s(),
            "up to the capacity, tokens pinned in flight are cycled like the rest"
        );
        let later = b.view(now + Duration::from_secs(60));
        assert!(
            later.cache_residency_s() > calmer.cache_residency_s(),
            "no allocations: the rate decays"
        );
        // 100k tokens over 10 s (averaged over the span observed): the turnover policies see.
        let (busy, later) = (busy.kv_alloc.per_s(), later.kv_alloc.per_s());
        assert!(busy > 5_000.0 && busy < 20_000.0);
        assert!(later < busy / 2.0);
    }

    #[test]
    fn ejects_after_consecutive_failures_and_readmits_after_timeout() {
        let b = backend();
        let t0 = Instant::now();
        let readmit = Duration::from_secs(10);
        assert!(!b.record_failure(t0, 3, readmit));
        b.record_success();
        assert!(!b.record_failure(t0, 3, readmit));
        assert!(!b.record_failure(t0, 3, readmit));
        assert!(b.record_failure(t0, 3, readmit));
        assert!(!b.is_healthy(t0 + Duration::from_secs(9)));
        assert!(b.is_healthy(t0 + Duration::from_secs(11)));
        b.record_active_check(false, t0 + Duration::from_secs(11));
        assert!(!b.is_healthy(t0 + Duration::from_secs(12)));
    }

    /// A routing decision that marks the backend stalled logs one line and sets the gauge; a
    /// token from it clears both, once; a token from a backend not marked logs nothing.
    #[test]
    fn a_stall_is_logged_and_published_on_enter_and_leave() {
        let (log, _guard) = log_capture::capture();
        let b = backend();
        let now = Instant::now();
        let gauge = |b: &Backend| {
            b.metrics
                .progress
                .backend_stalled
                .with_label_values(&["b0"])
                .get()
        };
        b.progressed(now);
        assert_eq!(log.count(&["backend"]), 0, "no stall, no line");
        let mut g = b.start_request(RequestLoad::default(), now, true, None);
        let rule = pronto_core::stall::StallRule::default();
        let later = now + Duration::from_secs(11);
        assert!(b.state.ledger.mark_stalled(later));
        b.marked_stalled(&b.view(later), &rule);
        assert_eq!(gauge(&b), 1);
        assert_eq!(log.count(&["backend stalled", "b0", "bound_s=10"]), 1);
        let excluded = b
            .metrics
            .progress
            .stall_exclusions_total
            .with_label_values(&["b0"])
            .get();
        assert_eq!(excluded, 1);
        b.progressed(later);
        b.progressed(later);
        assert_eq!(gauge(&b), 0);
        assert_eq!(log.count(&["backend producing again", "b0"]), 1, "once");
        g.end_prefill();
        drop(g);
    }
}
