//! `pronto demo`: the gateway in front of a built-in simulated fleet, with a short workload.
//!
//! Starts four simulated backends of mixed GPU profiles (two H100, two A100, bounded KV caches)
//! on ephemeral loopback ports, puts the gateway in front of them on `--listen` (default
//! 127.0.0.1:8080, admin 127.0.0.1:9400), sends a multi-turn chat workload through it — several
//! conversations sharing a long system prompt — and prints, per request, the backend chosen,
//! the TTFT the client saw and every backend's queue. The gateway then stays up for the user's
//! own requests until Ctrl-C.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;

use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;

/// The demo fleet: mixed profiles, bounded caches.
const DEMO_FLEET: &str = "\
model: llama-3-8b
backends:
  - { name: h100-a, profile: h100-llama3-8b, num_kv_blocks: 4000 }
  - { name: h100-b, profile: h100-llama3-8b, num_kv_blocks: 4000 }
  - { name: a100-a, profile: a100-llama3-8b, num_kv_blocks: 4000 }
  - { name: a100-b, profile: a100-llama3-8b, num_kv_blocks: 4000 }
";

/// `pronto demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Client listener of the gateway.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Admin listener of the gateway.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub admin_listen: SocketAddr,
    /// Simulated-time multiplier (0.5 = twice as fast as real GPUs).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Conversations in the workload.
    #[arg(long, default_value_t = 6)]
    pub conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Start the fleet and gateway only; send no workload.
    #[arg(long)]
    pub no_workload: bool,
}

fn gateway_config(args: &DemoArgs, model: &str, names: &[String], urls: &[String]) -> String {
    let mut yaml = format!(
        "listen: {}\nadmin_listen: {}\nthreads: 2\ngrace_period: 5s\nexplain_headers: true\n\
         health:\n  interval: 1s\npools:\n  {model}:\n    policy: predicted_ttft\n    backends:\n",
        args.listen, args.admin_listen
    );
    for (n, u) in names.iter().zip(urls) {
        yaml.push_str(&format!("      - {{ name: {n}, url: \"{u}\" }}\n"));
    }
    yaml
}

/// Run the demo; returns only on error (Ctrl-C ends the process).
pub fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("pronto-demo")
        .build()?;
    let fleet_cfg = FleetConfig::parse(DEMO_FLEET, "built-in demo fleet")?;
    let fleet = rt
        .block_on(SimFleet::start(&fleet_cfg, args.time_scale))
        .context("starting the simulated fleet")?;
    let (names, urls) = (fleet.names(), fleet.urls());
    let yaml = gateway_config(&args, &fleet_cfg.model, &names, &urls);
    let loaded =
        crate::config::Loaded::from_yaml_str(&yaml, "demo").map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("Pronto demo: {} simulated backends", names.len());
    for (n, u) in names.iter().zip(&urls) {
        println!("  {n:<8} {u}");
    }
    println!(
        "gateway: http://{}  (admin: http://{}/metrics)\n",
        args.listen, args.admin_listen
    );
    let model = fleet_cfg.model.clone();
    let a = args.clone();
    std::thread::Builder::new()
        .name("pronto-demo-workload".into())
        .spawn(move || {
            rt.block_on(async move {
                if !a.no_workload {
                    if let Err(e) = workload(&a, &model, &fleet).await {
                        eprintln!("demo workload failed: {e:#}");
                    }
                }
                println!(
                    "\nThe gateway stays up; try:\n  curl -N http://{}/v1/chat/completions \
                     -H 'content-type: application/json' -d '{{\"model\":\"{model}\",\
                     \"stream\":true,\"max_tokens\":16,\"messages\":[{{\"role\":\"user\",\
                     \"content\":\"Hello\"}}]}}'\nCtrl-C to stop.",
                    a.listen
                );
                // Keep the fleet serving until the process exits.
                std::future::pending::<()>().await;
                drop(fleet);
            })
        })?;
    crate::server::run(loaded)
}

async fn wait_for(addr: SocketAddr) {
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// One conversation turn's outcome.
struct Turn {
    backend: String,
    ttft_ms: f64,
    predicted_ms: Option<f64>,
}

async fn send_turn(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
) -> anyhow::Result<Turn> {
    let start = Instant::now();
    let resp = client.post(url).json(&body).send().await?;
    anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
    let backend = resp
        .headers()
        .get("x-pronto-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let predicted_ms = resp
        .headers()
        .get("x-pronto-predicted-ttft-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let mut stream = resp.bytes_stream();
    let mut ttft_ms = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if ttft_ms.is_none() && chunk.windows(11).any(|w| w == b"\"content\":\"") {
            let text = String::from_utf8_lossy(&chunk);
            if !text.contains("\"content\":\"\"") {
                ttft_ms = Some(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok(Turn {
        backend,
        ttft_ms: ttft_ms.unwrap_or(f64::NAN),
        predicted_ms,
    })
}

async fn workload(args: &DemoArgs, model: &str, fleet: &SimFleet) -> anyhow::Result<()> {
    wait_for(args.listen).await;
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/chat/completions", args.listen);
    let system = "You are a meticulous assistant for a GPU fleet operations team. \
                  Answer with precise, numbered steps and cite the relevant metric names. "
        .repeat(40);
    let names = fleet.names();
    println!("conv turn  backend   TTFT ms  predicted   queues (waiting/running per backend)");
    let mut per_backend: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    let mut histories: Vec<Vec<serde_json::Value>> = (0..args.conversations)
        .map(|_| vec![serde_json::json!({"role": "system", "content": system})])
        .collect();
    for turn in 0..args.turns {
        let mut pending = futures::stream::FuturesOrdered::new();
        for (c, history) in histories.iter_mut().enumerate() {
            history.push(serde_json::json!({"role": "user",
                "content": format!("Conversation {c}, question {turn}: how do I read queue depth?")}));
            let body = serde_json::json!({"model": model, "messages": history, "stream": true,
                "max_tokens": 48});
            let (client, url) = (client.clone(), url.clone());
            pending.push_back(async move { (c, send_turn(&client, &url, body).await) });
        }
        while let Some((c, result)) = pending.next().await {
            let t = result?;
            let queues: Vec<String> = (0..names.len())
                .map(|i| {
                    let s = fleet.stats(i);
                    format!("{}={}/{}", names[i], s.waiting, s.running)
                })
                .collect();
            let predicted = t
                .predicted_ms
                .map_or_else(|| "-".to_string(), |p| format!("{p:.1}"));
            println!(
                "{c:>4} {turn:>4}  {:<8} {:>8.1} {predicted:>10}   {}",
                t.backend,
                t.ttft_ms,
                queues.join(" ")
            );
            per_backend.entry(t.backend).or_default().push(t.ttft_ms);
            histories[c].push(serde_json::json!({"role": "assistant", "content": "(answer)"}));
        }
    }
    println!("\nper backend: requests, mean TTFT");
    for (b, v) in &per_backend {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        println!("  {b:<8} {:>3}  {mean:>8.1} ms", v.len());
    }
    Ok(())
}
