//! Live-fleet capacity probe: how many concurrent streams can N simulated backends serve at a
//! time scale without falling behind real time?
//!
//! Starts an in-process fleet (default 8 × `h100-llama3-8b`, time scale 1.0, ephemeral ports),
//! then for each K in the sweep opens K streaming chat requests at once (spread round-robin
//! over the backends; each prompt has a shared 512-token system part and a unique ~`prompt`
//! token user part; `max_tokens` output), reads every stream to `[DONE]`, and reports the
//! wall time, the tokens/s delivered, the mean client-side TTFT, and the fleet's
//! `sim_lag_seconds_total` growth during that round (lag ≈ 0 means the engines kept real time).
//!
//! ```text
//! cargo run --release --example sim_fleet_load -- [K1,K2,...] [max_tokens] [prompt] [backends] [time_scale]
//! cargo run --release --example sim_fleet_load -- 500,1000,2000,4000 64 256 8 1.0
//! ```

use std::time::{Duration, Instant};

use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::json;

struct Outcome {
    ttft: Option<Duration>,
    tokens: usize,
    ok: bool,
}

/// Chat messages of request `i`: a shared system part and a unique user part.
fn messages(i: usize, prompt: usize) -> serde_json::Value {
    let system: String = (0..512).map(|k| format!(" s{:02}", k % 97)).collect();
    let user: String = (0..prompt)
        .map(|k| format!(" {}", (i * 7919 + k) % 1000))
        .collect();
    json!([{"role": "system", "content": system}, {"role": "user", "content": user}])
}

async fn one(
    client: reqwest::Client,
    url: String,
    i: usize,
    max_tokens: u32,
    prompt: usize,
) -> Outcome {
    let body = json!({"model": "sim-llama", "stream": true, "max_tokens": max_tokens,
        "messages": messages(i, prompt)});
    let start = Instant::now();
    let resp = match client
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r,
        _ => {
            return Outcome {
                ttft: None,
                tokens: 0,
                ok: false,
            }
        }
    };
    let mut stream = resp.bytes_stream();
    let mut ttft = None;
    let mut tokens = 0;
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let Ok(b) = chunk else { break };
        let text = String::from_utf8_lossy(&b);
        let n = text.matches("\"content\":\" ").count();
        if n > 0 && ttft.is_none() {
            ttft = Some(start.elapsed());
        }
        tokens += n;
        done |= text.contains("[DONE]");
    }
    Outcome {
        ttft,
        tokens,
        ok: done,
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ks: Vec<usize> = args
        .first()
        .map_or("250,500,1000,2000".into(), String::clone)
        .split(',')
        .map(|k| k.parse().expect("K list like 500,1000"))
        .collect();
    let max_tokens: u32 = args.get(1).map_or(64, |s| s.parse().expect("max_tokens"));
    let prompt: usize = args
        .get(2)
        .map_or(256, |s| s.parse().expect("prompt tokens"));
    let n: usize = args.get(3).map_or(8, |s| s.parse().expect("backends"));
    let scale: f64 = args.get(4).map_or(1.0, |s| s.parse().expect("time scale"));

    let mut yaml = String::from("model: sim-llama\nbackends:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: h100-{i}, profile: h100-llama3-8b }}\n"
        ));
    }
    let cfg = FleetConfig::parse(&yaml, "sim_fleet_load").expect("fleet");
    let fleet = SimFleet::start(&cfg, scale).await.expect("start fleet");
    let urls = fleet.urls();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .build()
        .expect("client");
    let sample: String = messages(0, prompt)
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            format!(
                "{}: {}\n",
                m["role"].as_str().unwrap_or(""),
                m["content"].as_str().unwrap_or("")
            )
        })
        .collect();
    println!(
        "backends={n} time_scale={scale} max_tokens={max_tokens} prompt={} tokens",
        pronto_core::tokens::count_tokens(sample.as_bytes())
    );
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>12} {:>6}",
        "K", "wall_s", "tok/s", "ttft_ms", "lag_s(sum)", "failed"
    );
    for k in ks {
        let lag0: f64 = (0..n).map(|i| fleet.lag_seconds(i)).sum();
        let start = Instant::now();
        let tasks: Vec<_> = (0..k)
            .map(|i| {
                tokio::spawn(one(
                    client.clone(),
                    urls[i % n].clone(),
                    i,
                    max_tokens,
                    prompt,
                ))
            })
            .collect();
        let mut outs = Vec::with_capacity(k);
        for t in tasks {
            outs.push(t.await.expect("task"));
        }
        let wall = start.elapsed().as_secs_f64();
        let lag: f64 = (0..n).map(|i| fleet.lag_seconds(i)).sum::<f64>() - lag0;
        let tokens: usize = outs.iter().map(|o| o.tokens).sum();
        let ttfts: Vec<f64> = outs
            .iter()
            .filter_map(|o| o.ttft)
            .map(|d| d.as_secs_f64())
            .collect();
        let ttft = ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64;
        let failed = outs.iter().filter(|o| !o.ok).count();
        println!(
            "{k:>6} {wall:>8.2} {:>10.0} {:>10.1} {lag:>12.3} {failed:>6}",
            tokens as f64 / wall,
            ttft * 1e3
        );
    }
    fleet.shutdown().await;
}
