//! One run of the comparison: a fresh simulated fleet, a fresh gateway in front of it on
//! ephemeral loopback ports with one policy, the seeded workload replayed open loop through
//! it, then both stopped. Also builds that workload and the gateway config the demo uses.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use pronto_bench::client::{http_client, Sender};
use pronto_bench::report::write_report;
use pronto_bench::run::{replay, Progress};
use pronto_bench::RequestRecord;
use pronto_sim::evaluate::{fleet_capacity_rps, SimBackend};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use pronto_sim::workload::{scale_arrivals, SyntheticWorkload, TraceRequest};

/// Longest a single demo request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Conversations generated before the workload is cut (about 9000 requests: more than the
/// demo's windows take, so the cut, not the generator, decides the length).
const CONVERSATIONS: usize = 3000;

/// The demo's workload: the seeded synthetic multi-turn chat (four shared system prompts of
/// three 512-token blocks, up to five turns each) with short answers (the demo is about the
/// first token; long answers would only cost CPU). Its first `load × capacity × window`
/// requests, where capacity is the fleet's for this request mix (`pronto evaluate --load`'s
/// calibration, [`fleet_capacity_rps`]) divided by `time_scale` (a faster fleet takes more),
/// with their arrivals scaled to span `window`: the offered rate over the window is `load ×`
/// capacity. Returns the requests with their trace indices and that capacity (requests per
/// wall-clock second).
pub fn workload(
    seed: u64,
    fleet: &[SimBackend],
    load: f64,
    time_scale: f64,
    window: Duration,
) -> (Vec<(u64, TraceRequest)>, f64) {
    let mut reqs = SyntheticWorkload {
        seed,
        conversations: CONVERSATIONS,
        output_tokens: (16, 64),
        ..SyntheticWorkload::default()
    }
    .generate();
    let capacity = fleet_capacity_rps(fleet, &reqs) / time_scale;
    let n = (load * capacity * window.as_secs_f64()).round().max(1.0) as usize;
    reqs.truncate(n);
    if let Some(last) = reqs.last().map(|r| r.arrival_s).filter(|&t| t > 0.0) {
        scale_arrivals(&mut reqs, window.as_secs_f64() / last);
    }
    ((0u64..).zip(reqs).collect(), capacity)
}

/// The gateway config for `policy` over the fleet's backends. It passes validation without
/// a warning (tested); `explain_headers` makes each answer name its backend. `access_log`:
/// one log line per request (on for the gateway left up for the user, off for the
/// comparison's runs, whose requests the table sums up).
pub fn gateway_config(
    listen: SocketAddr,
    admin_listen: SocketAddr,
    model: &str,
    policy: &str,
    backends: &[(String, String)],
    access_log: bool,
) -> String {
    let mut yaml = format!(
        "listen: {listen}\nadmin_listen: {admin_listen}\ngrace_period: 5s\nexplain_headers: true\n\
         access_log: {{ enabled: {access_log} }}\npools:\n  {model}:\n    policy: {policy}\n    \
         backends:\n"
    );
    for (name, url) in backends {
        yaml.push_str(&format!("      - {{ name: {name}, url: \"{url}\" }}\n"));
    }
    yaml
}

/// Validate `yaml` and refuse any warning: the demo's own config must be clean.
pub fn load_config(yaml: &str) -> anyhow::Result<crate::config::Loaded> {
    let loaded =
        crate::config::Loaded::from_yaml_str(yaml, "demo").map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(w) = loaded.config.warnings.first() {
        anyhow::bail!("the demo's gateway config warns: {}", w.display("demo"));
    }
    Ok(loaded)
}

/// A fleet and the gateway in front of it.
pub struct Stack {
    /// The simulated backends.
    pub fleet: SimFleet,
    /// The gateway.
    pub gateway: crate::server::Handle,
}

impl Stack {
    /// Start `fleet_cfg`'s backends at `time_scale`, then the gateway with `policy` on
    /// `listen` / `admin_listen` in front of them (with its access log or without); returns
    /// once the gateway is ready.
    pub async fn start(
        fleet_cfg: &FleetConfig,
        time_scale: f64,
        policy: &str,
        (listen, admin_listen): (SocketAddr, SocketAddr),
        access_log: bool,
    ) -> anyhow::Result<Stack> {
        let fleet = SimFleet::start(fleet_cfg, time_scale)
            .await
            .context("starting the simulated fleet")?;
        let backends: Vec<(String, String)> = fleet.names().into_iter().zip(fleet.urls()).collect();
        let yaml = gateway_config(
            listen,
            admin_listen,
            &fleet_cfg.model,
            policy,
            &backends,
            access_log,
        );
        let loaded = load_config(&yaml)?;
        let gateway =
            tokio::task::spawn_blocking(move || crate::server::start(loaded, false)).await??;
        wait_ready(gateway.admin).await?;
        Ok(Stack { fleet, gateway })
    }

    /// Stop the gateway (at once: the run's requests have all ended), then the fleet.
    pub async fn stop(self) {
        let gateway = self.gateway;
        gateway.abort();
        let _ = tokio::task::spawn_blocking(move || gateway.wait()).await;
        self.fleet.shutdown().await;
    }
}

/// Poll the admin listener's `/readyz` until it answers 200 (every pool has a healthy backend).
async fn wait_ready(admin: SocketAddr) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let url = format!("http://{admin}/readyz");
    for _ in 0..400 {
        if let Ok(r) = client.get(&url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!("the gateway did not become ready ({url})")
}

/// What one policy's run produced.
pub struct RunOutcome {
    /// One record per request, by index.
    pub records: Vec<RequestRecord>,
    /// Wall-clock seconds from the first send to the last answer.
    pub wall_s: f64,
    /// Seconds the simulated backends fell behind real time, summed (0: the machine kept up).
    pub lag_s: f64,
}

/// Replay `requests` through a fresh fleet and gateway with `policy`; write the run's report
/// (`results.jsonl`, `summary.json`, plots) into `dir`.
pub async fn run_policy(
    policy: &str,
    fleet_cfg: &FleetConfig,
    time_scale: f64,
    requests: &[(u64, TraceRequest)],
    dir: &Path,
) -> anyhow::Result<RunOutcome> {
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let stack = Stack::start(fleet_cfg, time_scale, policy, (any, any), false).await?;
    let client = http_client(1024)?;
    let sender = Arc::new(Sender::new(
        client,
        &format!("http://{}", stack.gateway.listen),
        fleet_cfg.model.clone(),
        REQUEST_TIMEOUT,
        false,
    ));
    let progress = Arc::new(Progress {
        total: requests.len(),
        ..Progress::default()
    });
    let start = Instant::now();
    let records = replay(requests.to_vec(), sender, None, progress).await;
    let wall_s = start.elapsed().as_secs_f64();
    let lag_s = (0..stack.fleet.len())
        .map(|i| stack.fleet.lag_seconds(i))
        .sum();
    stack.stop().await;
    let (dir, title) = (dir.to_path_buf(), format!("pronto demo: {policy}"));
    let recs = records.clone();
    tokio::task::spawn_blocking(move || write_report(&dir, &recs, &title))
        .await?
        .context("writing the run's report")?;
    Ok(RunOutcome {
        records,
        wall_s,
        lag_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_seeded_and_cut_to_its_window() {
        let fleet_cfg = FleetConfig::parse(super::super::DEMO_FLEET, "demo").unwrap();
        let fleet: Vec<SimBackend> = fleet_cfg
            .backends
            .iter()
            .zip(fleet_cfg.engine_configs(Path::new(".")).unwrap())
            .map(|(b, config)| SimBackend {
                name: b.name.clone(),
                config,
                reasoning: fleet_cfg.reasoning,
                stall: None,
                wedge: None,
            })
            .collect();
        let window = Duration::from_secs(10);
        let (a, cap) = workload(1, &fleet, 0.7, 0.25, window);
        let (b, _) = workload(1, &fleet, 0.7, 0.25, window);
        assert_eq!(a, b);
        // The offered rate over the window is the load's share of the capacity.
        let offered = a.len() as f64 / 10.0;
        assert!((offered - 0.7 * cap).abs() <= 0.1, "{offered} vs {cap}");
        assert!(a.iter().all(|(_, r)| r.arrival_s <= 10.0 + 1e-9));
        assert!((a.last().unwrap().1.arrival_s - 10.0).abs() < 1e-9);
        assert!(a.windows(2).all(|w| w[0].1.arrival_s <= w[1].1.arrival_s));
        // The cut keeps the leading indices: every request keeps its prompt.
        assert!(a.iter().enumerate().all(|(i, (idx, _))| *idx == i as u64));
        // A faster fleet has more capacity and gets more requests in the same window.
        let (slow, slow_cap) = workload(1, &fleet, 0.7, 1.0, window);
        assert!((cap / slow_cap - 4.0).abs() < 1e-9, "{cap} {slow_cap}");
        assert!(slow.len() < a.len());
        // A higher load packs more requests in.
        let (heavy, _) = workload(1, &fleet, 1.4, 0.25, window);
        assert!(heavy.len() > a.len());
        assert_ne!(workload(2, &fleet, 0.7, 0.25, window).0, a);
    }

    #[test]
    fn every_policy_config_validates_without_a_warning() {
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        let backends: Vec<(String, String)> = ["h100-a", "a100-a"]
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), format!("http://127.0.0.1:{}", 9000 + i)))
            .collect();
        for policy in pronto_core::routing::PolicyKind::ALL {
            for access_log in [true, false] {
                let yaml = gateway_config(any, any, "llama-3-8b", policy, &backends, access_log);
                let loaded = load_config(&yaml).unwrap_or_else(|e| panic!("{policy}: {e}\n{yaml}"));
                assert!(loaded.config.warnings.is_empty());
                assert_eq!(loaded.config.access_log.enabled, access_log);
            }
        }
        // And a config that does warn is refused.
        let one = &backends[..1];
        let yaml = gateway_config(any, any, "m", "round_robin", one, false);
        let Err(err) = load_config(&yaml) else {
            panic!("one backend with a policy warns, and the demo refuses that");
        };
        assert!(err.to_string().contains("warns"), "{err}");
    }
}
