//! End to end: the gateway binary scrapes the simulated fleet's vLLM-style `/metrics` and shows
//! engine load in `/admin/backends` and its own `/metrics`.

mod common;

use std::time::Duration;

use common::gateway::TempDir;
use common::{client, config_yaml, metric_value, pool, Gateway};
use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;

/// The H100 profile with a running batch of two, so a third request on a backend waits.
fn small_batch_profile(dir: &TempDir) -> std::path::PathBuf {
    let text = include_str!("../config/sim/h100-llama3-8b.yaml");
    assert!(text.contains("max_num_seqs: 256"), "profile changed");
    let text = text
        .replace("max_num_seqs: 256", "max_num_seqs: 2")
        .replace("name: h100-llama3-8b", "name: h100-batch2");
    let path = dir.0.join("h100-batch2.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn long_stream(url: String, i: usize) -> u16 {
    let body = serde_json::json!({
        "model": "m",
        "stream": true,
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": format!("request {i}: {}", "lorem ipsum ".repeat(40))}],
    });
    let resp = client(false).post(url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let mut s = resp.bytes_stream();
    while let Some(chunk) = s.next().await {
        chunk.unwrap();
    }
    status
}

#[derive(Debug, Default)]
struct Seen {
    fresh_vllm: bool,
    max_running: f64,
    max_waiting: f64,
    max_queue_metric: f64,
    kv_metric: bool,
}

impl Seen {
    fn done(&self) -> bool {
        self.fresh_vllm
            && self.max_running >= 2.0
            && self.max_waiting >= 1.0
            && self.max_queue_metric >= 1.0
            && self.kv_metric
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_and_metrics_show_scraped_engine_load() {
    let dir = TempDir::new("scrape");
    let profile = small_batch_profile(&dir);
    let fleet_yaml = format!(
        "model: m\nbackends:\n  - {{ name: s0, profile: \"{p}\" }}\n  - {{ name: s1, profile: \"{p}\" }}\n",
        p = profile.display()
    );
    let fleet_cfg = FleetConfig::parse(&fleet_yaml, "test fleet").unwrap();
    let fleet = SimFleet::start(&fleet_cfg, 0.05).await.unwrap();
    let gw = Gateway::start(&config_yaml(
        &pool("m", "least_inflight", &fleet.urls()),
        "",
    ));

    // Six long streams over two backends of batch two: each engine runs two, queues one.
    let requests: Vec<_> = (0..6)
        .map(|i| tokio::spawn(long_stream(gw.url("/v1/chat/completions"), i)))
        .collect();

    let c = client(false);
    let mut seen = Seen::default();
    for _ in 0..400 {
        let admin: serde_json::Value = c
            .get(gw.admin_url("/admin/backends"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for b in admin["backends"].as_array().unwrap() {
            let e = &b["engine"];
            if e["status"] == "fresh" && e["flavor"] == "vllm" {
                seen.fresh_vllm = true;
                seen.max_running = seen.max_running.max(e["running"].as_f64().unwrap());
                seen.max_waiting = seen.max_waiting.max(e["waiting"].as_f64().unwrap());
            }
        }
        let text = c
            .get(gw.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for name in ["m-b0", "m-b1"] {
            let q = format!("pronto_backend_queue_depth{{backend=\"{name}\"}}");
            if let Some(v) = metric_value(&text, &q) {
                seen.max_queue_metric = seen.max_queue_metric.max(v);
            }
            let kv = format!("pronto_backend_kv_usage_ratio{{backend=\"{name}\"}}");
            seen.kv_metric |= metric_value(&text, &kv).is_some_and(|v| v > 0.0 && v <= 1.0);
        }
        if seen.done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(seen.done(), "{seen:?}");

    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    let text = c
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric_value(&text, "pronto_engine_scrape_errors_total{backend=\"m-b0\"}"),
        Some(0.0),
        "a healthy engine is scraped without errors (the series exists from start-up)"
    );
    fleet.shutdown().await;
}
