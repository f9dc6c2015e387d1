//! The short version of `scripts/live-vs-offline.sh`: the first requests of the Mooncake
//! conversation trace at 0.8 × capacity, (a) through `pronto evaluate`'s code and (b) live —
//! the gateway in-process in front of a fresh in-process sim fleet per policy (same profiles),
//! replayed by `pronto replay`'s code. Per policy the live TTFT mean is within 15 % of the
//! offline one and the p90 within 25 % — the bounds of the agreement table
//! (`docs/benchmarks/live-vs-offline/`, `scripts/live-vs-offline.sh`, which runs the full
//! slice) — and both rank the policies the same. The bounds are tight enough that the
//! disagreement the shared core removed (live ÷ offline 1.20 mean / 1.68 p90 for
//! `predicted_ttft`) fails them, and so does an evaluator that skips the TTFT model's
//! observation.

mod common;

use clap::Parser;
use common::{config_yaml, pool, Gateway};
use pronto_bench::{run_replay, ReplayArgs};
use pronto_sim::evaluate::{evaluate, load_fleet, prepare_trace, EvaluateArgs};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use pronto_sim::workload::TraceFormat;

const MODEL: &str = "llama-3-8b";
const LIMIT: usize = 480;
const LOAD: f64 = 0.8;
/// Live mean TTFT ÷ offline mean TTFT stays within 1 ± this (the agreement table's bound).
const MEAN_BOUND: f64 = 0.15;
/// Live p90 TTFT ÷ offline p90 TTFT stays within 1 ± this (the agreement table's bound).
const P90_BOUND: f64 = 0.25;
const POLICIES: [&str; 3] = ["predicted_ttft", "cache_aware", "round_robin"];

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ReplayArgs,
}

/// Eight H100 backends with the default fleet's KV capacity, on free ports.
fn fleet_yaml() -> String {
    let mut y = format!("model: {MODEL}\nbackends:\n");
    for i in 0..8 {
        y.push_str(&format!(
            "  - {{ name: h100-{i}, profile: h100-llama3-8b, num_kv_blocks: 24000, port: 0 }}\n"
        ));
    }
    y
}

/// TTFT mean and p90, ms.
type Ttft = (f64, f64);

async fn live(policy: &str, trace: &str, fleet_file: &str, out: &std::path::Path) -> Ttft {
    let cfg = FleetConfig::parse(&fleet_yaml(), "test").unwrap();
    let fleet = SimFleet::start(&cfg, 1.0).await.unwrap();
    // Health checks patient enough for a loaded test host: an ejection the offline run
    // cannot have would be a disagreement of the host's, not of the router's.
    let health = "health:\n  interval: 1s\n  timeout: 3s\n  eject_after_failures: 3\n";
    let gw = Gateway::start(&config_yaml(&pool(MODEL, policy, &fleet.urls()), health));
    let limit = LIMIT.to_string();
    let load = LOAD.to_string();
    let dir = out.join(policy);
    let target = gw.url("");
    let args = Cli::try_parse_from([
        "replay",
        "--target",
        &target,
        "--model",
        MODEL,
        "--trace",
        trace,
        "--spread",
        "--limit",
        &limit,
        "--load",
        &load,
        "--fleet",
        fleet_file,
        "--timeout",
        "2m",
        "--out",
        dir.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    tokio::task::spawn_blocking(move || run_replay(args))
        .await
        .unwrap()
        .unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["errors"], 0, "{policy}: {summary}");
    fleet.shutdown().await;
    (
        summary["ttft_mean_ms"].as_f64().unwrap(),
        summary["ttft_p90_ms"].as_f64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_and_offline_agree_on_a_short_trace_slice() {
    let Some(trace) = pronto_sim::testing::shared("traces/mooncake/conversation_trace.jsonl")
    else {
        return;
    };
    let dir = common::gateway::TempDir::new("lvo");
    let fleet_file = dir.0.join("fleet.yaml");
    std::fs::write(&fleet_file, fleet_yaml()).unwrap();
    let args = EvaluateArgs {
        trace: Some(trace.clone()),
        format: TraceFormat::Mooncake,
        trace_block_tokens: pronto_sim::workload::TRACE_BLOCK_TOKENS as u32,
        workload: pronto_sim::evaluate::Generated::Chat,
        fleet: fleet_file.clone(),
        policies: Vec::new(),
        load: Some(LOAD),
        limit: Some(LIMIT),
        seed: 1,
        arrival_seed: None,
        json: true,
        requests_csv: None,
        replicas: 1,
        spread: pronto_sim::eval_replicas::Spread::RoundRobin,
        sync: pronto_sim::eval_replicas::SyncMode::Off,
        collision_repair: pronto_sim::eval_replicas::RepairSetting::Auto,
        migration: 1,
        ttft_slo: pronto_sim::evaluate::SloLimit(None),
        tpot_slo: pronto_sim::evaluate::SloLimit(None),
        on_slo_miss: None,
        objective: pronto_sim::evaluate::EvalObjective::Ttft,
        first_token_deadline: None,
        hedge: None,
        race_on: pronto_sim::eval_args::EvalRaceOn::Ttft,
        failover_oracle: false,
        stall_floor: pronto_core::stall::DEFAULT_FLOOR,
        stall_factor: pronto_core::stall::DEFAULT_FACTOR,
        no_stall: false,
    };
    let fleet = load_fleet(&fleet_file).unwrap();
    let (reqs, _) = prepare_trace(&args, &fleet).unwrap();
    let mut rows = Vec::new();
    for p in POLICIES {
        let report = evaluate(&fleet, MODEL, &reqs, p).unwrap();
        let offline = (report.ttft_mean_ms, report.ttft_p90_ms);
        let live = live(
            p,
            trace.to_str().unwrap(),
            fleet_file.to_str().unwrap(),
            &dir.0,
        )
        .await;
        eprintln!(
            "{p}: offline {:.0} / {:.0} ms, live {:.0} / {:.0} ms (mean / p90)",
            offline.0, offline.1, live.0, live.1
        );
        rows.push((p, offline.0, live.0, offline.1, live.1));
    }
    // Every policy checked before any assertion, so a failure shows the whole table.
    let misses: Vec<String> = rows
        .iter()
        .flat_map(|&(p, om, lm, o9, l9)| {
            [("mean", om, lm, MEAN_BOUND), ("p90", o9, l9, P90_BOUND)]
                .into_iter()
                .filter(|&(_, o, l, bound)| (l / o - 1.0).abs() > bound)
                .map(move |(what, o, l, bound)| {
                    format!(
                        "{p} {what}: live {l:.0} ms vs offline {o:.0} ms (ratio {:.2}, bound ±{bound})",
                        l / o
                    )
                })
        })
        .collect();
    assert!(misses.is_empty(), "live and offline disagree: {misses:#?}");
    let order = |k: fn(&(&str, f64, f64, f64, f64)) -> f64| {
        let mut v = rows.clone();
        v.sort_by(|a, b| k(a).total_cmp(&k(b)));
        v.iter().map(|r| r.0).collect::<Vec<_>>()
    };
    assert_eq!(
        order(|r| r.1),
        order(|r| r.2),
        "the same ordering: {rows:?}"
    );
}
