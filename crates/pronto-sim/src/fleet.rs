//! The live simulated fleet: N OpenAI-compatible HTTP backends, each driving its own engine
//! model in (scaled) real time.
//!
//! Each backend is an axum server (HTTP/1.1 and h2c) bound once to its port (port 0 →
//! ephemeral; the bound listener is kept, so there is no bind/drop/rebind race) and one tokio
//! task that owns its [`Engine`] (see the private `fleet_driver` module for the step loop and
//! `fleet_http` for the routes). Simulated step durations are multiplied by `time_scale`
//! (0.1 = ten times faster than the profiled GPU) and by the backend's `slowdown` fault knob.
//!
//! With a `kv_events_port` per backend (or `--kv-events-base-port`), each backend also
//! publishes its KV-cache events on a ZMQ PUB socket, as vLLM does (see the private
//! `fleet_kv_events` module).
//!
//! Use it from code with [`SimFleet::start`] (tests, demos) or from the command line with
//! [`SimFleetArgs`] and [`run_sim_fleet`]. Each backend has a [`FaultControl`] to inject
//! errors, first-token stalls, slowdowns and crashes at run time; the fleet file's `faults:`
//! sets their initial values and may schedule crashes (`crash_after`, `crash_every`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::engine::{Engine, EngineStats};
use super::fleet_config::{FleetConfig, FleetConfigError, SimBackendConfig};
use super::fleet_driver::Driver;
pub use super::fleet_faults::FaultControl;
use super::fleet_http::{router, BackendShared};
use super::fleet_kv_events::KvPublisher;
use super::fleet_metrics::BackendMetrics;
pub use super::fleet_openai::DEFAULT_MAX_TOKENS;
use pronto_core::tokens::mix64;
use pronto_tokenizer::ModelTokenizer;

/// How long [`SimFleet::shutdown`] waits for connections to close before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// `pronto sim-fleet`: serve a simulated fleet until Ctrl-C / SIGTERM.
#[derive(Debug, Clone, clap::Args)]
pub struct SimFleetArgs {
    /// Fleet file (e.g. config/sim/fleet.yaml); replaces --backends/--profile/--base-port.
    #[arg(long, conflicts_with_all = ["backends", "profile", "base_port", "num_kv_blocks"])]
    pub config: Option<PathBuf>,
    /// Number of identical backends (without --config).
    #[arg(long, required_unless_present = "config")]
    pub backends: Option<usize>,
    /// Built-in profile name or profile YAML path (without --config).
    #[arg(long, default_value = "h100-llama3-8b")]
    pub profile: String,
    /// Port of the first backend; backend i listens on base-port + i (0: ephemeral ports).
    #[arg(long, default_value_t = 8201)]
    pub base_port: u16,
    /// Served model name (overrides the fleet file's).
    #[arg(long)]
    pub model: Option<String>,
    /// KV blocks per backend (overrides the profile's).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// Multiplier of simulated step durations (0.1 = ten times faster than the real GPU).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Publish KV-cache events: backend i's ZMQ PUB socket listens on this port + i
    /// (overrides the fleet file's `kv_events_port`s; 0: ephemeral ports).
    #[arg(long)]
    pub kv_events_base_port: Option<u16>,
    /// Tokenize prompts with this model tokenizer (a `tokenizer.json` or a directory with one
    /// and its chat template, or `tiktoken:<encoding or OpenAI model>`), as a real engine
    /// does, instead of Pronto's built-in mapping:
    /// the KV events then carry that tokenizer's ids (test a gateway pool's `tokenizer:`).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

/// Model name of a fleet built from command-line flags when `--model` is absent.
pub const DEFAULT_MODEL: &str = "sim-llama";

impl SimFleetArgs {
    /// The fleet these arguments describe and the directory relative profile paths resolve
    /// against.
    pub fn fleet_config(&self) -> Result<(FleetConfig, PathBuf), SimFleetError> {
        let (mut cfg, base_dir) = match &self.config {
            Some(path) => {
                let cfg = FleetConfig::load(path)?;
                let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
                (cfg, dir)
            }
            None => {
                let n = self.backends.unwrap_or(0);
                if n == 0 {
                    return Err(SimFleetError::Invalid(
                        "--backends must be at least 1".into(),
                    ));
                }
                let backends = (0..n)
                    .map(|i| {
                        let port = match self.base_port {
                            0 => 0,
                            p => u16::try_from(usize::from(p) + i).map_err(|_| {
                                SimFleetError::Invalid(format!(
                                    "--base-port {p} + {i} is not a port"
                                ))
                            })?,
                        };
                        Ok(SimBackendConfig {
                            name: format!("sim-{i}"),
                            profile: self.profile.clone(),
                            num_kv_blocks: self.num_kv_blocks,
                            max_num_seqs: None,
                            port: Some(port),
                            kv_events_port: None,
                            faults: Default::default(),
                        })
                    })
                    .collect::<Result<Vec<_>, SimFleetError>>()?;
                let cfg = FleetConfig {
                    model: DEFAULT_MODEL.to_string(),
                    reasoning: None,
                    backends,
                };
                (cfg, PathBuf::from("."))
            }
        };
        if let Some(m) = &self.model {
            cfg.model = m.clone();
        }
        if let Some(base) = self.kv_events_base_port {
            for (i, b) in cfg.backends.iter_mut().enumerate() {
                b.kv_events_port = Some(match base {
                    0 => 0,
                    p => u16::try_from(usize::from(p) + i).map_err(|_| {
                        SimFleetError::Invalid(format!(
                            "--kv-events-base-port {p} + {i} is not a port"
                        ))
                    })?,
                });
            }
        }
        Ok((cfg, base_dir))
    }
}

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimFleetError {
    /// The fleet file or a profile is invalid.
    #[error(transparent)]
    Config(#[from] FleetConfigError),
    /// A backend's port could not be bound.
    #[error("backend {backend}: cannot bind {addr}: {source}")]
    Bind {
        /// Backend name.
        backend: String,
        /// Address tried.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Bad options.
    #[error("{0}")]
    Invalid(String),
}

/// How to run a fleet.
#[derive(Debug, Clone)]
pub struct SimFleetOptions {
    /// Multiplier of simulated step durations.
    pub time_scale: f64,
    /// Address to bind every backend on.
    pub host: String,
    /// Directory that relative profile paths in the fleet file resolve against.
    pub base_dir: PathBuf,
    /// The model tokenizer every backend tokenizes prompts with (`None`: [`pronto_core::tokens`]).
    pub tokenizer: Option<Arc<ModelTokenizer>>,
}

impl Default for SimFleetOptions {
    fn default() -> SimFleetOptions {
        SimFleetOptions {
            time_scale: 1.0,
            host: "127.0.0.1".into(),
            base_dir: PathBuf::from("."),
            tokenizer: None,
        }
    }
}

struct Backend {
    name: String,
    addr: SocketAddr,
    shared: Arc<BackendShared>,
    kv_events: Option<KvPublisher>,
}

/// A running simulated fleet. Dropping it stops every task at once; [`SimFleet::shutdown`]
/// stops it gracefully.
pub struct SimFleet {
    backends: Vec<Backend>,
    servers: Vec<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for SimFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.backends.iter().map(|b| (&b.name, b.addr)))
            .finish()
    }
}

impl SimFleet {
    /// Start every backend of `config` on 127.0.0.1 with the given time scale.
    pub async fn start(config: &FleetConfig, time_scale: f64) -> Result<SimFleet, SimFleetError> {
        SimFleet::start_with(
            config,
            SimFleetOptions {
                time_scale,
                ..SimFleetOptions::default()
            },
        )
        .await
    }

    /// Start every backend of `config` with explicit options.
    pub async fn start_with(
        config: &FleetConfig,
        opts: SimFleetOptions,
    ) -> Result<SimFleet, SimFleetError> {
        if !(opts.time_scale.is_finite() && opts.time_scale >= 0.0) {
            return Err(SimFleetError::Invalid(format!(
                "time scale must be a finite number >= 0, got {}",
                opts.time_scale
            )));
        }
        let engines = config.engine_configs(&opts.base_dir)?;
        let (stop, _) = watch::channel(false);
        let mut fleet = SimFleet {
            backends: Vec::with_capacity(engines.len()),
            servers: Vec::new(),
            tasks: Vec::new(),
            stop,
        };
        for (index, (b, ecfg)) in config.backends.iter().zip(engines).enumerate() {
            let addr = format!("{}:{}", opts.host, b.port.unwrap_or(0));
            let listener =
                TcpListener::bind(&addr)
                    .await
                    .map_err(|source| SimFleetError::Bind {
                        backend: b.name.clone(),
                        addr: addr.clone(),
                        source,
                    })?;
            let local = listener
                .local_addr()
                .map_err(|source| SimFleetError::Bind {
                    backend: b.name.clone(),
                    addr,
                    source,
                })?;
            let (cmd, cmd_rx) = mpsc::unbounded_channel();
            let seed = mix64(b.faults.seed ^ (index as u64).wrapping_mul(0x9e37_79b9));
            let faults = FaultControl::new(&b.faults, seed, cmd.clone());
            let shared = Arc::new(BackendShared {
                name: b.name.clone(),
                model: config.model.clone(),
                profile: ecfg.profile.name.clone(),
                block_size: ecfg.block_size,
                num_kv_blocks: ecfg.num_kv_blocks,
                max_num_seqs: ecfg.max_num_seqs,
                cmd,
                next_id: AtomicU64::new(0),
                metrics: BackendMetrics::new(&config.model, ecfg.block_size, ecfg.num_kv_blocks),
                faults: faults.clone(),
                stats: Mutex::new(EngineStats::default()),
                tokenizer: opts.tokenizer.clone(),
                timer: Default::default(),
                reasoning: config.reasoning,
            });
            let mut driver = Driver::new(Engine::new(ecfg), shared.clone(), opts.time_scale);
            let kv_events = match b.kv_events_port {
                Some(port) => {
                    let (publisher, tx, task) = KvPublisher::start(&opts.host, port)
                        .await
                        .map_err(|source| SimFleetError::Bind {
                            backend: b.name.clone(),
                            addr: format!("tcp://{}:{port}", opts.host),
                            source,
                        })?;
                    driver.publish_kv_events(tx);
                    fleet.tasks.push(task);
                    Some(publisher)
                }
                None => None,
            };
            fleet.tasks.push(tokio::spawn(driver.run(cmd_rx)));
            if let Some(after) = b.faults.wedge_after {
                fleet.tasks.push(tokio::spawn(wedge_schedule(
                    faults.clone(),
                    after,
                    b.faults.wedge_for,
                )));
            }
            if let Some(first) = b.faults.crash_after {
                fleet.tasks.push(tokio::spawn(crash_schedule(
                    faults,
                    first,
                    b.faults.crash_every,
                )));
            }
            let mut stop_rx = fleet.stop.subscribe();
            let app = router(shared.clone());
            fleet.servers.push(tokio::spawn(async move {
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    // Either a stop signal or the fleet dropped its sender.
                    let _ = stop_rx.wait_for(|s| *s).await;
                });
                if let Err(e) = serve.await {
                    tracing::warn!(error = %e, "simulated backend server failed");
                }
            }));
            fleet.backends.push(Backend {
                name: b.name.clone(),
                addr: local,
                shared,
                kv_events,
            });
        }
        Ok(fleet)
    }

    /// Number of backends.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether the fleet has no backends (never true for a started fleet).
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Backend names, in pool order.
    pub fn names(&self) -> Vec<String> {
        self.backends.iter().map(|b| b.name.clone()).collect()
    }

    /// Bound addresses, in pool order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.backends.iter().map(|b| b.addr).collect()
    }

    /// Base URLs (`http://127.0.0.1:PORT`), in pool order.
    pub fn urls(&self) -> Vec<String> {
        self.backends
            .iter()
            .map(|b| format!("http://{}", b.addr))
            .collect()
    }

    /// KV-event publisher endpoints (`tcp://HOST:PORT`), in pool order; `None` for a backend
    /// that publishes none.
    pub fn kv_event_endpoints(&self) -> Vec<Option<String>> {
        self.backends
            .iter()
            .map(|b| b.kv_events.as_ref().map(|k| k.endpoint.clone()))
            .collect()
    }

    /// Make backend `index`'s publisher skip its next `n` messages (they are numbered but
    /// never sent, as if lost): subscribers see a sequence gap.
    pub fn drop_kv_events(&self, index: usize, n: u64) {
        if let Some(k) = &self.backends[index].kv_events {
            k.drop_next
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Fault handle of backend `index` (panics when out of range).
    pub fn faults(&self, index: usize) -> FaultControl {
        self.backends[index].shared.faults.clone()
    }

    /// Engine stats of backend `index` as last published by its engine task.
    pub fn stats(&self, index: usize) -> EngineStats {
        *self.backends[index]
            .shared
            .stats
            .lock()
            .expect("stats lock")
    }

    /// Seconds backend `index` has fallen behind real time (`sim_lag_seconds_total`).
    pub fn lag_seconds(&self, index: usize) -> f64 {
        self.backends[index].shared.metrics.lag.get()
    }

    /// Stop accepting, cut open requests off, and wait (briefly) for the servers to finish.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            t.abort();
        }
        for s in self.servers.drain(..) {
            let abort = s.abort_handle();
            if tokio::time::timeout(SHUTDOWN_GRACE, s).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(self.servers.iter()) {
            t.abort();
        }
    }
}

async fn wedge_schedule(faults: FaultControl, after: Duration, wedged_for: Option<Duration>) {
    tokio::time::sleep(after).await;
    faults.set_wedged(true);
    if let Some(d) = wedged_for {
        tokio::time::sleep(d).await;
        faults.set_wedged(false);
    }
}

async fn crash_schedule(faults: FaultControl, first: Duration, every: Option<Duration>) {
    tokio::time::sleep(first).await;
    loop {
        faults.crash();
        match every {
            Some(d) => tokio::time::sleep(d).await,
            None => return,
        }
    }
}

/// Serve the fleet described by `args` until Ctrl-C or SIGTERM.
pub async fn run_sim_fleet(args: SimFleetArgs) -> anyhow::Result<()> {
    let (cfg, base_dir) = args.fleet_config()?;
    let tokenizer = match &args.tokenizer {
        Some(path) => Some(Arc::new(
            ModelTokenizer::from_spec(
                path.to_str()
                    .ok_or_else(|| anyhow::anyhow!("--tokenizer: not UTF-8: {}", path.display()))?,
                None,
            )
            .map_err(|e| anyhow::anyhow!("--tokenizer: {e}"))?,
        )),
        None => None,
    };
    let fleet = SimFleet::start_with(
        &cfg,
        SimFleetOptions {
            time_scale: args.time_scale,
            host: args.host.clone(),
            base_dir,
            tokenizer,
        },
    )
    .await?;
    let kv = fleet.kv_event_endpoints();
    for (i, (name, url)) in fleet.names().iter().zip(fleet.urls()).enumerate() {
        tracing::info!(backend = %name, %url, profile = %cfg.backends[i].profile, "serving");
        match &kv[i] {
            Some(ep) => println!("{name}\t{url}\t{}\t{ep}", cfg.backends[i].profile),
            None => println!("{name}\t{url}\t{}", cfg.backends[i].profile),
        }
    }
    wait_for_signal().await?;
    tracing::info!("shutting down the simulated fleet");
    fleet.shutdown().await;
    Ok(())
}

#[cfg(unix)]
async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimFleetArgs,
    }

    #[test]
    fn flags_build_a_fleet_of_identical_backends() {
        let cli = Cli::try_parse_from([
            "x",
            "--backends",
            "3",
            "--base-port",
            "9000",
            "--num-kv-blocks",
            "100",
            "--model",
            "m",
        ])
        .unwrap();
        let (cfg, _) = cli.args.fleet_config().unwrap();
        assert_eq!(cfg.model, "m");
        assert_eq!(cfg.backends.len(), 3);
        assert_eq!(cfg.backends[2].port, Some(9002));
        assert_eq!(cfg.backends[1].name, "sim-1");
        assert_eq!(cfg.backends[0].num_kv_blocks, Some(100));
        assert!(
            Cli::try_parse_from(["x"]).is_err(),
            "needs --config or --backends"
        );
        assert!(Cli::try_parse_from(["x", "--config", "f.yaml", "--backends", "2"]).is_err());
        let cli = Cli::try_parse_from(["x", "--backends", "2", "--base-port", "65535"]).unwrap();
        assert!(cli.args.fleet_config().is_err());
    }
}
