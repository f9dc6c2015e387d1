//! The composition root: builds the pingora server with its services — the proxy listener
//! (plain HTTP/1.1 + h2c, or TLS with h2 by ALPN when the config has `tls:`; see
//! [`crate::services::tls`]), the admin listener, the active health checker, the engine metrics scraper, DNS discovery of
//! `discover:` pools ([`crate::services::discovery`]), and, for a pool serving its backends' models, model
//! discovery ([`crate::services::models`]) — and runs it.
//!
//! Live reload ([`crate::services::reload`]) runs on a thread of its own (`pronto-reload`, a one-thread
//! tokio runtime) that polls the config file and listens for `SIGHUP`; its signal handler is
//! installed here, before any listener opens. Reload applies only to a config loaded from a
//! file ([`crate::config::Config::source_path`]).
//!
//! [`start`] binds both listeners itself (port 0 works: the [`Handle`] says which ports it
//! got, and keeps them), starts everything on a thread of its own and returns a [`Handle`];
//! [`run`] is `start` then wait for a signal, for the binary.
//!
//! Shutdown (SIGTERM, or [`Handle::shutdown`]): the listeners stop accepting at once;
//! in-flight requests keep going until they finish or `grace_period` passes, whichever comes
//! first; then pingora stops its services and [`Handle::wait`] returns. SIGINT (or
//! [`Handle::abort`]) stops at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::apps::HttpServerOptions;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora_core::services::background::background_service;
use tokio::sync::{mpsc, watch};

use crate::admin::Admin;
use crate::config::Loaded;
use crate::listener::{bind, Listening};
use crate::proxy::{App, Proxy};
use crate::services::discovery::{Discovery, SystemResolver};
use crate::services::health::HealthChecker;
use crate::services::models::ModelDiscovery;
use crate::services::reload::{hangup_signal, Reloader};
use crate::services::scrape::EngineScraper;
use crate::state::activity::{ActiveRequests, RecentDecisions};
use crate::state::GatewayState;
use crate::state::StateHandle;
use crate::telemetry::Metrics;

/// How a [`Handle`] asks the server to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Stop accepting, drain in-flight requests (up to the grace period), then stop.
    Graceful,
    /// Stop now.
    Fast,
}

/// A running gateway.
#[derive(Debug)]
pub struct Handle {
    /// Where the client listener listens (the port it got when the config said 0).
    pub listen: SocketAddr,
    /// Where the admin listener listens.
    pub admin: SocketAddr,
    /// The live gateway state (for tests and tools).
    pub state: StateHandle,
    stop: mpsc::UnboundedSender<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Handle {
    /// Begin a graceful shutdown (as SIGTERM does); [`Handle::wait`] for it to end.
    pub fn shutdown(&self) {
        let _ = self.stop.send(Stop::Graceful);
    }

    /// Stop at once (as SIGINT does).
    pub fn abort(&self) {
        let _ = self.stop.send(Stop::Fast);
    }

    /// Wait until the gateway has stopped.
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Whether the gateway has stopped.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.stop.send(Stop::Fast);
            let _ = t.join();
        }
    }
}

/// What pingora waits on for its shutdown: our stop requests (and, for the binary, SIGTERM
/// and SIGINT). A graceful stop drains here, before pingora is told: listeners stop at once,
/// then in-flight requests get up to the grace period.
struct DrainSignal {
    requests: tokio::sync::Mutex<mpsc::UnboundedReceiver<Stop>>,
    signals: bool,
    stop_accepting: watch::Sender<bool>,
    active: Arc<ActiveRequests>,
    grace: Duration,
}

#[async_trait]
impl ShutdownSignalWatch for DrainSignal {
    async fn recv(&self) -> ShutdownSignal {
        let mut requests = self.requests.lock().await;
        let stop = if self.signals {
            use tokio::signal::unix::{signal, SignalKind};
            let (mut term, mut int) = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(t), Ok(i)) => (t, i),
                _ => {
                    tracing::error!("cannot install SIGTERM/SIGINT handlers");
                    return ShutdownSignal::FastShutdown;
                }
            };
            tokio::select! {
                r = requests.recv() => r.unwrap_or(Stop::Fast),
                _ = term.recv() => Stop::Graceful,
                _ = int.recv() => Stop::Fast,
            }
        } else {
            requests.recv().await.unwrap_or(Stop::Fast)
        };
        let _ = self.stop_accepting.send(true);
        if stop == Stop::Fast {
            tracing::info!("stopping now");
            return ShutdownSignal::FastShutdown;
        }
        let start = Instant::now();
        tracing::info!(in_flight = self.active.get(), grace = ?self.grace, "draining");
        while self.active.get() > 0 && start.elapsed() < self.grace {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                r = requests.recv() => if r != Some(Stop::Graceful) { break },
            }
        }
        tracing::info!(in_flight = self.active.get(), elapsed = ?start.elapsed(), "drained; stopping");
        ShutdownSignal::GracefulTerminate
    }
}

/// Start the gateway on a thread of its own; returns once both listeners are bound.
/// `signals`: also stop on SIGTERM (graceful) and SIGINT (at once) — for the binary.
pub fn start(loaded: Loaded, signals: bool) -> anyhow::Result<Handle> {
    let Loaded { config, resources } = loaded;
    let grace = config.grace_period;
    let threads = config.threads;
    let (proxy_listener, listen) = bind(config.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let (admin_listener, admin_listen) = bind(config.admin_listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (admin): {e}", config.admin_listen))?;

    let metrics = Metrics::new();
    let cluster = config.cluster.clone();
    let state = GatewayState::new(Arc::new(config), Arc::new(resources), &metrics);
    let (state, sync) = match cluster {
        Some(c) => {
            let (link, rx) = crate::cluster::Link::new(&metrics, c.collision_repair);
            (state.with_cluster(Arc::clone(&link)), Some((c, link, rx)))
        }
        None => (state, None),
    };
    let state = StateHandle::new(state);
    let active = Arc::new(ActiveRequests::default());
    for w in &state.load().config.warnings {
        tracing::warn!("config: {}", w.display(&state.load().config.origin));
    }
    let (stop_accepting, stop_rx) = watch::channel(false);
    let reloader = Arc::new(Reloader::new(state.clone(), metrics.clone()));
    let reload_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("pronto-reload")
        .build()?;
    let hup = hangup_signal(&reload_runtime)?;
    let watcher = Arc::clone(&reloader);
    let reload_stop = stop_rx.clone();
    std::thread::Builder::new()
        .name("pronto-reload".into())
        .spawn(move || reload_runtime.block_on(watcher.run(hup, reload_stop)))?;

    let conf = ServerConf {
        threads,
        // The drain happens before pingora hears of the shutdown (see `DrainSignal`).
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let decisions = Arc::new(RecentDecisions::default());
    // An HTTP/2 connection with no stream open is closed after the keep-alive timeout, as an
    // idle HTTP/1.1 one is (pingora keeps it forever otherwise: a client that sends the
    // preface and nothing more would hold a connection slot). Read at start.
    let h2_idle = Some(state.load().config.limits.keepalive_timeout);
    let mut opts = HttpServerOptions::default();
    opts.h2c = true;
    opts.h2_idle_timeout = h2_idle;
    let proxy = App::new(
        Proxy::new(
            state.clone(),
            metrics.clone(),
            Arc::clone(&active),
            Arc::clone(&decisions),
        ),
        opts,
    );
    let tls = state.load().resources.tls().cloned();
    let acceptor = match &tls {
        Some(identity) => Some(
            crate::services::tls::listener_settings(state.clone(), Arc::clone(identity))
                .map_err(|e| anyhow::anyhow!("TLS listener: {e}"))?
                .build(),
        ),
        None => None,
    };
    let proxy = Listening::new(
        "pronto-proxy",
        proxy_listener,
        acceptor,
        proxy,
        Some(threads),
        stop_rx.clone(),
    )?
    .with_edge(crate::listener::Edge {
        state: state.clone(),
        metrics: metrics.clone(),
        open: Arc::default(),
    });

    let discovery = background_service(
        "pronto-discovery",
        Discovery::new(state.clone(), metrics.clone(), Arc::new(SystemResolver)),
    );
    // A `--backend` pool without `--model` serves what its backends list, and a
    // `served_model_name: discover` sends each backend the name it lists: asked once before
    // the listeners accept, then by the service (always running: a reload may add such a
    // pool; with none it only looks).
    let models = ModelDiscovery::new(state.clone(), metrics.clone());
    if models.has_work() {
        models.initial_round();
    }
    let models = background_service("pronto-models", models);
    let mut admin_app = pingora_core::apps::http_app::HttpServer::new_app(Admin::new(
        state.clone(),
        metrics.clone(),
        reloader,
        decisions,
    ));
    let mut opts = HttpServerOptions::default();
    opts.h2c = true;
    opts.h2_idle_timeout = h2_idle;
    admin_app.server_options = Some(opts);
    // The admin listener keeps answering during a drain (health probes, metrics).
    let (_admin_stop, admin_stop) = watch::channel(false);
    let admin = Listening::new(
        "pronto-admin",
        admin_listener,
        None,
        admin_app,
        Some(1),
        admin_stop,
    )?;

    let health = background_service("pronto-health", HealthChecker::new(state.clone()));
    let scraper = background_service("pronto-scrape", EngineScraper::new(state.clone()));

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(health);
    server.add_service(scraper);
    server.add_service(background_service(
        "pronto-kv-events",
        crate::services::kv_events::KvEventsService::new(state.clone()),
    ));
    server.add_service(discovery);
    if let Some((config, link, rx)) = sync {
        server.add_service(background_service(
            "pronto-cluster",
            crate::services::cluster::ClusterService::new(
                state.clone(),
                config,
                link,
                rx,
                metrics.clone(),
            ),
        ));
    }
    server.add_service(models);

    let (stop, requests) = mpsc::unbounded_channel();
    let signal = DrainSignal {
        requests: tokio::sync::Mutex::new(requests),
        signals,
        stop_accepting,
        active,
        grace,
    };
    tracing::info!(%listen, %admin_listen, threads, tls = tls.is_some(), "pronto gateway listening");
    let thread = std::thread::Builder::new()
        .name("pronto-server".into())
        .spawn(move || {
            server.run(RunArgs {
                shutdown_signal: Box::new(signal),
            });
            drop(_admin_stop);
        })?;
    Ok(Handle {
        listen,
        admin: admin_listen,
        state,
        stop,
        thread: Some(thread),
    })
}

/// Run the gateway until SIGTERM (graceful) or SIGINT.
pub fn run(loaded: Loaded) -> anyhow::Result<()> {
    start(loaded, true)?.wait();
    Ok(())
}
