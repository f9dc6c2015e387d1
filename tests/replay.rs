//! `pronto replay` end to end over real sockets: the simulated fleet in-process (time scale
//! 0.05, so engine steps take well under a millisecond), the gateway binary in front of it with
//! explanation headers on, and the replay command's entry point sending the seeded synthetic
//! workload through the gateway. Assertions are on counts, contents and orderings only.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use clap::Parser;
use common::{config_yaml, pool, Gateway};
use pronto_bench::{run_replay, ReplayArgs, RequestRecord};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;

const MODEL: &str = "sim-model";
const REQUESTS: usize = 60;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ReplayArgs,
}

struct OutDir(std::path::PathBuf);

impl Drop for OutDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synthetic_replay_through_the_gateway_records_every_request() {
    let mut yaml = format!("model: {MODEL}\nbackends:\n");
    for i in 0..4 {
        yaml.push_str(&format!(
            "  - {{ name: s{i}, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n"
        ));
    }
    let fleet = SimFleet::start(&FleetConfig::parse(&yaml, "test").unwrap(), 0.05)
        .await
        .unwrap();
    let gw = Gateway::start(&config_yaml(
        &pool(MODEL, "predicted_ttft", &fleet.urls()),
        "explain_headers: true\n",
    ));
    let out = OutDir(std::env::temp_dir().join(format!("pronto-replay-{}", std::process::id())));
    let target = gw.url("");
    let limit = REQUESTS.to_string();
    // No --model: the replay asks the gateway's /v1/models.
    let args = Cli::try_parse_from([
        "replay",
        "--target",
        &target,
        "--limit",
        &limit,
        "--load-scale",
        "8",
        "--seed",
        "7",
        "--timeout",
        "20s",
        "--out",
        out.0.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    tokio::task::spawn_blocking(move || run_replay(args))
        .await
        .unwrap()
        .unwrap();

    let records: Vec<RequestRecord> = std::fs::read_to_string(out.0.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), REQUESTS);
    let indices: Vec<u64> = records.iter().map(|r| r.index).collect();
    assert_eq!(indices, (0..REQUESTS as u64).collect::<Vec<_>>());
    let names: BTreeSet<String> = (0..4).map(|i| format!("{MODEL}-b{i}")).collect();
    for r in &records {
        assert!(r.ok(), "request {} failed: {:?}", r.index, r.error);
        assert_eq!(r.status, Some(200));
        let backend = r
            .backend
            .as_deref()
            .expect("x-pronto-backend on every response");
        assert!(names.contains(backend), "unknown backend {backend}");
        assert!(r.predicted_ttft_ms.is_some_and(|p| p >= 0.0), "{r:?}");
        let (ttft, e2e) = (r.ttft_ms.unwrap(), r.e2e_ms.unwrap());
        assert!(0.0 <= ttft && ttft <= e2e, "{r:?}");
        assert_eq!(r.completion_tokens, Some(r.max_tokens), "{r:?}");
        assert!(r.sent_s >= r.scheduled_s);
    }
    // Conversations share system prompts and grow turn by turn: some prompt tokens were cached.
    assert!(records.iter().any(|r| r.cached_tokens.unwrap_or(0) > 0));

    let summary = read_json(&out.0.join("summary.json"));
    for key in [
        "ttft_mean_ms",
        "ttft_p50_ms",
        "ttft_p90_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "throughput_rps",
        "errors",
        "requests",
    ] {
        assert!(summary.get(key).is_some(), "summary.json lacks {key}");
    }
    assert_eq!(summary["requests"], REQUESTS);
    assert_eq!(summary["errors"], 0);
    let p = |k: &str| summary[k].as_f64().unwrap();
    assert!(0.0 <= p("ttft_p50_ms") && p("ttft_p50_ms") <= p("ttft_p90_ms"));
    assert!(p("ttft_p90_ms") <= p("ttft_p99_ms"));
    assert!(p("throughput_rps") > 0.0 && p("tpot_p50_ms") > 0.0);
    let per_backend: u64 = summary["backends"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(per_backend, REQUESTS as u64);
    for f in ["summary.md", "ttft_cdf.svg", "ttft_over_time.svg"] {
        let text = std::fs::read_to_string(out.0.join(f)).unwrap();
        assert!(!text.is_empty(), "{f}");
    }
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_model_replay_records_time_to_first_answer() {
    let yaml = format!(
        "model: {MODEL}\nreasoning: {{ mean_tokens: 30, sigma: 0.5, seed: 3 }}\nbackends:\n  \
         - {{ name: s0, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n  \
         - {{ name: s1, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n"
    );
    let fleet = SimFleet::start(&FleetConfig::parse(&yaml, "test").unwrap(), 0.05)
        .await
        .unwrap();
    let gw = Gateway::start(&config_yaml(
        &pool(MODEL, "predicted_ttft", &fleet.urls()),
        "explain_headers: true\n",
    ));
    let out = OutDir(std::env::temp_dir().join(format!("pronto-replay-r-{}", std::process::id())));
    let target = gw.url("");
    let args = Cli::try_parse_from([
        "replay",
        "--target",
        &target,
        "--limit",
        "20",
        "--load-scale",
        "8",
        "--timeout",
        "20s",
        "--out",
        out.0.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    tokio::task::spawn_blocking(move || run_replay(args))
        .await
        .unwrap()
        .unwrap();
    let records: Vec<RequestRecord> = std::fs::read_to_string(out.0.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 20);
    for r in &records {
        assert!(r.ok(), "request {} failed: {:?}", r.index, r.error);
        assert!(r.reasoning_events > 0, "{r:?}");
        // The answer comes after the reasoning; usage counts both.
        assert!(r.ttfa_ms.unwrap() > r.ttft_ms.unwrap(), "{r:?}");
        assert_eq!(
            r.completion_tokens,
            Some(r.max_tokens + r.reasoning_events),
            "{r:?}"
        );
    }
    let summary = read_json(&out.0.join("summary.json"));
    let p = |k: &str| {
        summary[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k}: {summary}"))
    };
    assert!(p("ttfa_p50_ms") > p("ttft_p50_ms"));
    assert!(p("ttfa_p99_ms") >= p("ttfa_p50_ms"));
    assert!(p("reasoning_tokens_mean") > 0.0);
    let cdf = std::fs::read_to_string(out.0.join("ttft_cdf.svg")).unwrap();
    assert!(cdf.contains("TTFA"), "the CDF plots TTFA beside TTFT");
    let md = std::fs::read_to_string(out.0.join("summary.md")).unwrap();
    assert!(md.contains("TTFA p99 (ms)"), "{md}");
    fleet.shutdown().await;
}
