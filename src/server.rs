//! The composition root: builds the pingora server with its services — the proxy listener
//! (plain HTTP/1.1 + h2c, or TLS with h2 by ALPN when the config has `tls:`; see
//! [`crate::tls`]), the admin listener, the active health checker, the engine metrics scraper, DNS discovery of
//! `discover:` pools ([`crate::discovery`]) — and runs it.
//!
//! Live reload ([`crate::reload`]) runs on a thread of its own (`pronto-reload`, a one-thread
//! tokio runtime) that polls the config file and listens for `SIGHUP`; its signal handler is
//! installed here, before any listener opens. Reload applies only to a config loaded from a
//! file ([`Config::source_path`]).
//!
//! Shutdown: SIGTERM stops the listeners; in-flight requests keep going until they finish or
//! `grace_period` passes, whichever comes first, then the process exits. SIGINT exits at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use pingora_core::apps::HttpServerOptions;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{ExecutionPhase, RunArgs, Server};
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;

use crate::admin::Admin;
use crate::backend::{EngineScraper, HealthChecker};
use crate::config::Config;
use crate::discovery::{Discovery, SystemResolver};
use crate::gateway::GatewayState;
use crate::proxy::Proxy;
use crate::reload::{hangup_signal, Reloader};
use crate::telemetry::Metrics;

/// Requests currently being handled, across all proxy threads.
#[derive(Debug, Default)]
pub struct ActiveRequests(AtomicUsize);

impl ActiveRequests {
    /// Count one request until the guard drops.
    pub fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(Arc::clone(self))
    }

    /// Requests in progress.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One request in progress.
#[derive(Debug)]
pub struct ActiveGuard(Arc<ActiveRequests>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Run the gateway until shut down. Never returns on success (the process exits).
pub fn run(config: Config) -> anyhow::Result<()> {
    let grace = config.grace_period;
    let listen = config.listen;
    let admin_listen = config.admin_listen;
    let threads = config.threads;

    let metrics = Metrics::new();
    let state = Arc::new(ArcSwap::from_pointee(GatewayState::new(
        Arc::new(config),
        &metrics,
    )));
    let active = Arc::new(ActiveRequests::default());
    for w in &state.load().config.warnings {
        tracing::warn!("config: {}", w.display(&state.load().config.origin));
    }
    let reloader = Arc::new(Reloader::new(Arc::clone(&state), metrics.clone()));
    let reload_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("pronto-reload")
        .build()?;
    let hup = hangup_signal(&reload_runtime)?;
    let watcher = Arc::clone(&reloader);
    std::thread::Builder::new()
        .name("pronto-reload".into())
        .spawn(move || reload_runtime.block_on(watcher.run(hup)))?;

    let conf = ServerConf {
        threads,
        // Pingora sleeps the whole grace period; the drain watcher below exits earlier once
        // nothing is in flight.
        grace_period_seconds: Some(grace.as_secs().max(1)),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        Proxy::new(Arc::clone(&state), metrics.clone(), Arc::clone(&active)),
        "pronto-proxy",
    );
    let tls = state.load().config.tls.clone();
    match &tls {
        Some(identity) => {
            let settings = crate::tls::listener_settings(Arc::clone(&state), identity)
                .map_err(|e| anyhow::anyhow!("TLS listener: {e}"))?;
            proxy.add_tls_with_settings(&listen.to_string(), None, settings);
        }
        None => proxy.add_tcp(&listen.to_string()),
    }
    if let Some(app) = proxy.app_logic_mut() {
        let mut opts = HttpServerOptions::default();
        opts.h2c = true;
        app.server_options = Some(opts);
    }

    let discovery = background_service(
        "pronto-discovery",
        Discovery::new(
            Arc::clone(&state),
            metrics.clone(),
            Arc::new(SystemResolver),
        ),
    );
    let mut admin_app = pingora_core::apps::http_app::HttpServer::new_app(Admin::new(
        Arc::clone(&state),
        metrics,
        reloader,
    ));
    let mut opts = HttpServerOptions::default();
    opts.h2c = true;
    admin_app.server_options = Some(opts);
    let mut admin = Service::new("pronto-admin".to_string(), admin_app);
    admin.add_tcp(&admin_listen.to_string());
    admin.threads = Some(1);

    let health = background_service("pronto-health", HealthChecker::new(Arc::clone(&state)));
    let scraper = background_service("pronto-scrape", EngineScraper::new(Arc::clone(&state)));

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(health);
    server.add_service(scraper);
    server.add_service(background_service(
        "pronto-kv-events",
        crate::kv_events::KvEventsService::new(Arc::clone(&state)),
    ));
    server.add_service(discovery);

    let mut phases = server.watch_execution_phase();
    std::thread::Builder::new()
        .name("pronto-drain".into())
        .spawn(move || drain_watcher(&mut phases, &active, grace))?;

    tracing::info!(%listen, %admin_listen, threads, tls = tls.is_some(), "pronto gateway starting");
    server.run(RunArgs::default());
    Ok(())
}

/// After SIGTERM, exit as soon as no request is in flight (or when the grace period ends).
fn drain_watcher(
    phases: &mut tokio::sync::broadcast::Receiver<ExecutionPhase>,
    active: &ActiveRequests,
    grace: Duration,
) {
    loop {
        match phases.blocking_recv() {
            Ok(ExecutionPhase::GracefulTerminate) => break,
            Ok(_) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
    let start = Instant::now();
    tracing::info!(in_flight = active.get(), ?grace, "draining");
    // Let listeners close and connections that were mid-accept register their request.
    std::thread::sleep(Duration::from_millis(100));
    while active.get() > 0 && start.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::info!(in_flight = active.get(), elapsed = ?start.elapsed(), "drained; exiting");
    std::process::exit(0);
}
