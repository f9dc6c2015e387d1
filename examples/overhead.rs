//! Proxy overhead, measured side by side in one run: the same instant local backend is hit
//! directly and through the `pronto` gateway, interleaved, at 1 and 64 concurrent streams.
//!
//! Run: `cargo build --release --bin pronto --example overhead && target/release/examples/overhead`
//! Options: `--requests N` per concurrency level and path (default 4000), `--pronto PATH`.
//! Prints p50/p99 latency (request sent → last byte of a short SSE stream) for both paths and
//! the added latency, plus requests/s.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::{get, post};
use axum::Router;
use hdrhistogram::Histogram;

const SSE: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n"
);

async fn instant_backend() -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|_b: Bytes| async { ([("content-type", "text/event-stream")], SSE) }),
        )
        .route("/health", get(|| async { "ok" }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

fn body() -> Bytes {
    let v = serde_json::json!({
        "messages": [{"role": "system", "content": "You are a helpful assistant. ".repeat(30)},
                     {"role": "user", "content": "Say hi."}],
        "model": "m", "stream": true, "max_tokens": 1
    });
    Bytes::from(v.to_string())
}

async fn run(url: &str, concurrency: usize, total: usize) -> (Histogram<u64>, f64) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .http1_only()
        .build()
        .unwrap();
    let body = body();
    let per = total / concurrency;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.to_string(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).unwrap();
            for _ in 0..per {
                let t = Instant::now();
                let r = client.post(&url).body(body.clone()).send().await.unwrap();
                if !r.status().is_success() {
                    let status = r.status();
                    panic!("{status}: {}", r.text().await.unwrap_or_default());
                }
                let b = r.bytes().await.unwrap();
                assert!(b.ends_with(b"[DONE]\n\n"));
                h.record(t.elapsed().as_micros() as u64).unwrap();
            }
            h
        }));
    }
    let mut all = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        all.add(t.await.unwrap()).unwrap();
    }
    let rps = (per * concurrency) as f64 / started.elapsed().as_secs_f64();
    (all, rps)
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .map(|i| args[i + 1].clone())
    };
    let total: usize = arg("--requests").map_or(4000, |v| v.parse().unwrap());
    let pronto = arg("--pronto").unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap();
        exe.parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("pronto")
            .display()
            .to_string()
    });
    let backend = instant_backend().await;
    let (listen, admin) = (free_addr(), free_addr());
    let mut child = std::process::Command::new(&pronto)
        .args([
            "serve",
            "--backend",
            &format!("http://{backend}"),
            "--model",
            "m",
        ])
        .args([
            "--listen",
            &listen.to_string(),
            "--admin-listen",
            &admin.to_string(),
        ])
        .env("RUST_LOG", "error")
        .spawn()
        .expect("start pronto (build it with --release first)");
    for _ in 0..200 {
        if std::net::TcpStream::connect(listen).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let direct = format!("http://{backend}/v1/chat/completions");
    let via = format!("http://{listen}/v1/chat/completions");
    // Warm up both paths (connection pools, caches).
    run(&direct, 8, 400).await;
    run(&via, 8, 400).await;
    println!("| streams | path | p50 µs | p99 µs | req/s |");
    println!("|---|---|---|---|---|");
    for c in [1usize, 64] {
        let mut rows = Vec::new();
        // Interleave: direct, gateway, direct, gateway — halves each, so drift hits both.
        let (mut hd, mut hg) = (
            Histogram::<u64>::new(3).unwrap(),
            Histogram::<u64>::new(3).unwrap(),
        );
        let (mut rd, mut rg) = (0.0, 0.0);
        for _ in 0..2 {
            let (h, r) = run(&direct, c, total / 2).await;
            hd.add(h).unwrap();
            rd += r / 2.0;
            let (h, r) = run(&via, c, total / 2).await;
            hg.add(h).unwrap();
            rg += r / 2.0;
        }
        rows.push(("direct", &hd, rd));
        rows.push(("pronto", &hg, rg));
        for (name, h, rps) in rows {
            println!(
                "| {c} | {name} | {} | {} | {rps:.0} |",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99)
            );
        }
        println!(
            "| {c} | added | {} | {} | {:.2}× |",
            hg.value_at_quantile(0.5) as i64 - hd.value_at_quantile(0.5) as i64,
            hg.value_at_quantile(0.99) as i64 - hd.value_at_quantile(0.99) as i64,
            rg / rd
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}
