//! `pronto demo`: why predicting TTFT beats spreading the load evenly, shown live.
//!
//! ## The comparison
//! The demo fleet is heterogeneous: two simulated H100s and two A100s (about 3× slower
//! prefill, 1.5× slower decode) serving Llama-3-8B with bounded KV caches. For each policy
//! (default `round_robin`, `cache_aware`, `predicted_ttft`, in that order) the demo starts a
//! **fresh** fleet and a **fresh gateway** — the real one, [`crate::server::start`], on
//! ephemeral loopback ports, with that policy — and replays the same seeded workload through
//! it open loop ([`pronto_bench::run::replay`]: every request is sent at its scheduled time,
//! whatever the earlier ones are doing, so queueing shows up as TTFT). The workload is the
//! synthetic multi-turn chat (shared system prompts, growing histories): as many requests as
//! `--load` × the fleet's capacity for that request mix (`pronto evaluate --load`'s
//! calibration) takes in `--duration`, paced over it. At the default load the fleet as a
//! whole has spare capacity, but the A100s' even share is more than they can prefill:
//! `round_robin` builds queues there.
//!
//! The fleet runs at the modelled GPUs' speed by default, so the TTFTs the client measures are
//! what those GPUs would give (plus the gateway's and this machine's overhead). `--time-scale
//! 0.5` runs every simulated step in half its modelled time and the workload twice as fast to
//! match (more requests per second through the gateway, the same queueing); the TTFTs are then
//! halved too. Each run reports how far its simulator fell behind real time: on a busy
//! machine that lag is in the TTFTs.
//!
//! Then it prints one table ([`table`]: TTFT mean / p50 / p99, the ratio to `round_robin`,
//! each backend's share) with a legend, and writes into `--out` each run's report
//! (`<policy>/results.jsonl`, `summary.json`, plots), `comparison.md` / `comparison.json`
//! and `ttft_cdf.svg` (every policy's TTFT CDF, [`pronto_bench::compare`]).
//!
//! ## Afterwards
//! Unless `--compare-only`, the gateway stays up on `--listen` (default 127.0.0.1:8080, admin
//! 127.0.0.1:9400) with `predicted_ttft` in front of a fleet of its own for the user's requests
//! until Ctrl-C, its access log on stderr (one line per request; the comparison's gateways
//! write none: the table sums their requests up). It is started *before* the comparison
//! (idle meanwhile), so a port that is taken fails the demo at once rather than after it.

mod run;
mod table;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use pronto_bench::compare::{write_comparison, CompareReportArgs, RunSpec};
use pronto_bench::Summary;
use pronto_sim::evaluate::SimBackend;
use pronto_sim::fleet_config::FleetConfig;

use run::workload;
use table::{legend, table, PolicyRun};

/// The demo fleet: mixed profiles, bounded caches.
pub const DEMO_FLEET: &str = "\
model: llama-3-8b
backends:
  - { name: h100-a, profile: h100-llama3-8b, num_kv_blocks: 4000 }
  - { name: h100-b, profile: h100-llama3-8b, num_kv_blocks: 4000 }
  - { name: a100-a, profile: a100-llama3-8b, num_kv_blocks: 4000 }
  - { name: a100-b, profile: a100-llama3-8b, num_kv_blocks: 4000 }
";

/// The policy the ratio columns divide by.
pub const BASELINE: &str = "round_robin";

/// Simulator lag (seconds, summed over the backends) past which a run says it was slowed.
const LAG_NOTE_S: f64 = 0.5;

/// The policy of the gateway left up for the user.
const SERVING_POLICY: &str = "predicted_ttft";

/// `pronto demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Client listener of the gateway left up after the comparison.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Admin listener of that gateway.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub admin_listen: SocketAddr,
    /// Simulated step-time multiplier (0.5 = twice as fast as the modelled GPUs; the workload
    /// is sped up to match).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Offered load as a fraction of the fleet's capacity for the workload's request mix.
    #[arg(long, default_value_t = 0.75)]
    pub load: f64,
    /// Arrivals of the workload, wall clock, per policy (e.g. `15s`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub duration: Duration,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A policy to compare (repeatable; rows keep this order).
    #[arg(long = "policy", default_values_t = ["round_robin".to_string(), "cache_aware".to_string(), "predicted_ttft".to_string()])]
    pub policies: Vec<String>,
    /// Directory for the reports, comparison.md/json and ttft_cdf.svg (default:
    /// `pronto-demo` in the system's temporary directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Exit after the comparison instead of keeping the gateway up.
    #[arg(long, alias = "exit-after")]
    pub compare_only: bool,
    /// Skip the comparison: only start the fleet and the gateway for your own requests.
    #[arg(long, conflicts_with = "compare_only")]
    pub no_workload: bool,
}

fn sim_backends(cfg: &FleetConfig) -> anyhow::Result<Vec<SimBackend>> {
    let configs = cfg.engine_configs(std::path::Path::new("."))?;
    Ok(cfg
        .backends
        .iter()
        .zip(configs)
        .map(|(b, config)| SimBackend {
            name: b.name.clone(),
            config,
            reasoning: cfg.reasoning,
            stall: None,
            wedge: None,
        })
        .collect())
}

/// The fleet's make-up in words: `2 × h100-llama3-8b + 2 × a100-llama3-8b`.
fn fleet_words(cfg: &FleetConfig) -> String {
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for b in &cfg.backends {
        match groups.iter_mut().find(|(p, _)| *p == b.profile) {
            Some(g) => g.1 += 1,
            None => groups.push((&b.profile, 1)),
        }
    }
    groups
        .iter()
        .map(|(p, n)| format!("{n} × {p}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Run the demo. With `--compare-only` it returns after the comparison; otherwise it serves
/// until Ctrl-C (SIGINT) or SIGTERM.
pub fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "--time-scale must be a positive number, got {}",
        args.time_scale
    );
    anyhow::ensure!(
        args.load.is_finite() && args.load > 0.0,
        "--load must be a positive number, got {}",
        args.load
    );
    for p in &args.policies {
        anyhow::ensure!(
            pronto_core::routing::PolicyKind::parse(p).is_some(),
            "unknown policy `{p}`; expected one of {}",
            pronto_core::routing::PolicyKind::ALL.join(", ")
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("pronto-demo")
        .build()?;
    let fleet_cfg = FleetConfig::parse(DEMO_FLEET, "built-in demo fleet")?;
    // The gateway for the user first: a taken port fails now, not after the comparison.
    let serving = if args.compare_only {
        None
    } else {
        Some(rt.block_on(run::Stack::start(
            &fleet_cfg,
            args.time_scale,
            SERVING_POLICY,
            (args.listen, args.admin_listen),
            true,
        ))?)
    };
    if !args.no_workload {
        rt.block_on(compare(&args, &fleet_cfg))?;
    }
    let Some(stack) = serving else {
        return Ok(());
    };
    println!(
        "\nThe gateway stays up ({SERVING_POLICY}, in front of a fleet of its own: {}), \
         on http://{} (admin: http://{}/metrics, status page http://{}/). Try:\n  \
         curl -N http://{}/v1/chat/completions -H 'content-type: application/json' \
         -d '{{\"model\":\"{}\",\"stream\":true,\"max_tokens\":16,\"messages\":[{{\"role\":\
         \"user\",\"content\":\"Hello\"}}]}}'\nCtrl-C to stop.",
        fleet_words(&fleet_cfg),
        stack.gateway.listen,
        stack.gateway.admin,
        stack.gateway.admin,
        stack.gateway.listen,
        fleet_cfg.model
    );
    rt.block_on(wait_for_signal())?;
    rt.block_on(stack.stop());
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// The comparison: one run per policy, then the table, the legend and the files.
async fn compare(args: &DemoArgs, fleet_cfg: &FleetConfig) -> anyhow::Result<()> {
    let started = Instant::now();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("pronto-demo"));
    let backends = sim_backends(fleet_cfg)?;
    let (a, window) = (args.clone(), args.duration);
    let (requests, capacity) = tokio::task::spawn_blocking(move || {
        workload(a.seed, &backends, a.load, a.time_scale, window)
    })
    .await?;
    anyhow::ensure!(
        !requests.is_empty(),
        "the workload has no request within --duration {}",
        humantime::format_duration(window)
    );
    let offered = requests.len() as f64 / window.as_secs_f64();
    println!(
        "Pronto demo: the same seeded workload through the gateway once per policy.\n\
         Live: each run starts the real gateway on loopback in front of a fresh simulated fleet.\n\
         fleet:    {} ({}), {}\n\
         workload: synthetic multi-turn chat (seed {}), {} requests over {}: {offered:.1} req/s, \
         {:.2} × the fleet's capacity of {capacity:.1} req/s for this request mix\n",
        fleet_words(fleet_cfg),
        fleet_cfg.model,
        speed_words(args.time_scale),
        args.seed,
        requests.len(),
        humantime::format_duration(window),
        offered / capacity,
    );
    let mut runs = Vec::new();
    let mut specs = Vec::new();
    for policy in &args.policies {
        let dir = out.join(policy);
        let outcome = run::run_policy(policy, fleet_cfg, args.time_scale, &requests, &dir)
            .await
            .with_context(|| format!("the {policy} run"))?;
        let summary = Summary::of(&outcome.records);
        println!(
            "  {policy:<16} {} of {} requests answered in {:.1} s; the simulator fell {:.1} s \
             behind real time{}",
            summary.requests - summary.errors,
            summary.requests,
            outcome.wall_s,
            outcome.lag_s,
            if outcome.lag_s > LAG_NOTE_S {
                " (this machine is busy: the TTFTs include that)"
            } else {
                ""
            }
        );
        runs.push(PolicyRun {
            policy: policy.clone(),
            summary,
        });
        specs.push(RunSpec {
            name: policy.clone(),
            dir,
        });
    }
    let baseline = args
        .policies
        .iter()
        .any(|p| p == BASELINE)
        .then_some(BASELINE);
    let report = CompareReportArgs {
        runs: specs,
        out: out.clone(),
        baseline: baseline.map(str::to_string),
        title: "pronto demo".into(),
        ttft_slo: None,
        tpot_slo: None,
        note: Some(format!(
            "{} requests of the seeded synthetic chat workload (seed {}) at {} × the capacity \
             of {} (time scale {}), live through the gateway.",
            requests.len(),
            args.seed,
            args.load,
            fleet_words(fleet_cfg),
            args.time_scale
        )),
    };
    tokio::task::spawn_blocking(move || write_comparison(&report))
        .await?
        .context("writing the comparison")?;
    let names: Vec<String> = fleet_cfg.backends.iter().map(|b| b.name.clone()).collect();
    println!("\n{}", table(&runs, &names, baseline));
    print!("{}", legend(args.time_scale, &names, baseline));
    println!(
        "\nwrote {} (TTFT CDF of every policy), comparison.md, comparison.json and one report \
         per policy; the comparison took {:.1} s",
        out.join("ttft_cdf.svg").display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How fast the fleet runs, in words: `at the modelled GPUs' speed`, `at 4× the modelled
/// GPUs' speed (--time-scale 0.25)`.
fn speed_words(time_scale: f64) -> String {
    if time_scale == 1.0 {
        return "at the modelled GPUs' speed".into();
    }
    let x = format!("{:.2}", 1.0 / time_scale);
    let x = x.trim_end_matches('0').trim_end_matches('.');
    format!("at {x}× the modelled GPUs' speed (--time-scale {time_scale})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_fleet_is_heterogeneous_and_described() {
        let cfg = FleetConfig::parse(DEMO_FLEET, "demo").unwrap();
        assert_eq!(fleet_words(&cfg), "2 × h100-llama3-8b + 2 × a100-llama3-8b");
        assert_eq!(speed_words(1.0), "at the modelled GPUs' speed");
        assert_eq!(
            speed_words(0.25),
            "at 4× the modelled GPUs' speed (--time-scale 0.25)"
        );
        assert!(speed_words(0.3).starts_with("at 3.33× "));
    }
}
