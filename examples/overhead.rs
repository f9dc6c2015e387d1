//! Proxy overhead, measured side by side in one run: the same instant local backend is hit
//! directly and through each proxy — Pronto, and when installed nginx (plain `proxy_pass`, the
//! floor for a generic proxy) and the SGLang router (`smg`) — interleaved per round, at 1, 64
//! and 512 concurrent streams (closed loop: each stream sends its next request when the last
//! one ended, so requests/s at 512 streams is the proxy's saturation throughput here). Then
//! Pronto's peak RSS while 10,000 streams are held open through it.
//!
//! Run: `scripts/overhead.sh` (builds, installs nginx when it can, writes
//! `docs/benchmarks/overhead.md`), or
//! `cargo build --release --bin pronto --example overhead && target/release/examples/overhead`.
//! Options: `--requests N` per concurrency level, path and round (default 4000), `--pronto
//! PATH`, `--nginx PATH` (default `/usr/sbin/nginx` if present), `--smg PATH` (default
//! `$PEERS/sglang-router/bin/smg`, `PEERS` defaulting to `~/.cache/pronto-peers`),
//! `--idle-streams N` (default 10000; 0 skips), `--levels 1,64,512`, `--rounds R` (default 2),
//! `--baseline PATH` (another Pronto binary, e.g. the previous commit's, measured in the same
//! rounds as `pronto-baseline`), `--perf PATH` (a `perf record` CPU profile of the first
//! Pronto over the measured rounds, written to PATH; `scripts/flamegraph.sh` uses it).
//! Prints markdown tables. Every process shares this machine's cores: the load generator, the
//! backend and the proxy compete, so compare the rows of one run, not runs across machines.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::routing::{get, post};
use axum::Router;
use hdrhistogram::Histogram;

const SSE: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n"
);
const FIRST: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";

/// The instant backend: answers every chat request at once, and the probes the SGLang router
/// sends at start-up. With `x-hold: 1` it sends the first event and then holds the stream
/// open (for the idle-streams measurement).
async fn instant_backend() -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|headers: axum::http::HeaderMap, _b: Bytes| async move {
                if headers.get("x-hold").is_some() {
                    let s = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from(FIRST)) })
                        .chain(futures::stream::once(async {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            Ok(Bytes::new())
                        }));
                    return axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(Body::from_stream(s))
                        .unwrap();
                }
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from(SSE))
                    .unwrap()
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(serde_json::json!({"object":"list","data":[{"id":"m","object":"model"}]})) }),
        )
        .route(
            "/get_model_info",
            get(|| async { axum::Json(serde_json::json!({"model_path":"m","is_generation":true})) }),
        )
        .route(
            "/get_server_info",
            get(|| async { axum::Json(serde_json::json!({"model_path":"m"})) }),
        )
        .route(
            "/get_load",
            get(|| async { axum::Json(serde_json::json!([{"dp_rank":0,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0}])) }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // No Nagle on the backend's sockets: small SSE writes must not wait for delayed ACKs.
    let l = axum::serve::ListenerExt::tap_io(l, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

use futures::StreamExt;

fn body() -> Bytes {
    let v = serde_json::json!({
        "messages": [{"role": "system", "content": "You are a helpful assistant. ".repeat(30)},
                     {"role": "user", "content": "Say hi."}],
        "model": "m", "stream": true, "max_tokens": 1
    });
    Bytes::from(v.to_string())
}

/// `total` requests over `concurrency` closed-loop streams; latency histogram (µs), req/s,
/// failed requests.
async fn run(url: &str, concurrency: usize, total: usize) -> (Histogram<u64>, f64, usize) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .http1_only()
        .build()
        .unwrap();
    let body = body();
    let per = (total / concurrency).max(1);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.to_string(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).unwrap();
            let mut failed = 0;
            for _ in 0..per {
                let t = Instant::now();
                let req = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone());
                let ok = match req.send().await {
                    Ok(r) if r.status().is_success() => {
                        r.bytes().await.is_ok_and(|b| b.ends_with(b"[DONE]\n\n"))
                    }
                    _ => false,
                };
                if ok {
                    h.record(t.elapsed().as_micros() as u64).unwrap();
                } else {
                    failed += 1;
                }
            }
            (h, failed)
        }));
    }
    let mut all = Histogram::<u64>::new(3).unwrap();
    let mut failed = 0;
    for t in tasks {
        let (h, f) = t.await.unwrap();
        all.add(h).unwrap();
        failed += f;
    }
    let rps = (per * concurrency - failed) as f64 / started.elapsed().as_secs_f64();
    (all, rps, failed)
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A proxy under test.
struct Proxy {
    name: &'static str,
    url: String,
    child: Child,
}

impl Drop for Proxy {
    /// SIGTERM first, so a proxy with worker processes (nginx) takes them down with it; SIGKILL
    /// if it has not exited within 2 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..40 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set of `pid`: (current, peak) in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Wait until `url` serves a chat request; the last error answer when it never does.
async fn wait_ready(url: &str) -> Result<(), String> {
    let client = reqwest::Client::new();
    let mut last = String::from("no answer");
    for _ in 0..400 {
        if let Ok(r) = client
            .post(url)
            .header("content-type", "application/json")
            .body(body())
            .send()
            .await
        {
            if r.status().is_success() {
                return Ok(());
            }
            last = format!("{}: {}", r.status(), r.text().await.unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

fn start_pronto(name: &'static str, bin: &str, backend: SocketAddr) -> Proxy {
    let (listen, admin) = (free_addr(), free_addr());
    let child = Command::new(bin)
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
        .stdout(Stdio::null())
        .spawn()
        .expect("start pronto (build it with --release first)");
    Proxy {
        name,
        url: format!("http://{listen}/v1/chat/completions"),
        child,
    }
}

fn start_nginx(bin: &Path, backend: SocketAddr, dir: &Path) -> Option<Proxy> {
    let listen = free_addr();
    let d = dir.display();
    let conf = format!(
        "worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log error;\n\
         events {{ worker_connections 16384; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
           upstream b {{ server {backend}; keepalive 1024; }}\n\
           server {{\n    listen {listen};\n    location / {{\n      proxy_pass http://b;\n\
               proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).ok()?;
    let child = Command::new(bin)
        .args(["-c", &path.display().to_string(), "-p", &d.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some(Proxy {
        name: "nginx",
        url: format!("http://{listen}/v1/chat/completions"),
        child,
    })
}

fn start_smg(bin: &Path, backend: SocketAddr, dir: &Path) -> Option<Proxy> {
    let (listen, prom) = (free_addr(), free_addr());
    let log = std::fs::File::create(dir.join("smg.log")).ok()?;
    let child = Command::new(bin)
        .args([
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            &listen.port().to_string(),
        ])
        .args(["--worker-urls", &format!("http://{backend}")])
        .args(["--policy", "cache_aware", "--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &prom.port().to_string()])
        .env("NO_COLOR", "1")
        .stdout(log.try_clone().ok()?)
        .stderr(log)
        .spawn()
        .ok()?;
    Some(Proxy {
        name: "sglang-router",
        url: format!("http://{listen}/v1/chat/completions"),
        child,
    })
}

/// Open `n` streams through `url` that the backend holds open after the first event, over
/// HTTP/2 (100 streams per connection, so the client side needs few sockets); returns how many
/// are open once all were attempted. The streams stay open while the returned handles live.
async fn open_idle_streams(url: &str, n: usize) -> (usize, Vec<reqwest::Response>) {
    let per_conn = 100;
    let mut tasks = Vec::new();
    for c in 0..n.div_ceil(per_conn) {
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        for _ in 0..per_conn.min(n - c * per_conn) {
            let (client, url) = (client.clone(), url.to_string());
            tasks.push(tokio::spawn(async move {
                let mut r = client
                    .post(&url)
                    .header("x-hold", "1")
                    .body(body())
                    .send()
                    .await
                    .ok()?;
                // The first event arrived: the stream is open end to end.
                r.chunk().await.ok()??;
                Some(r)
            }));
        }
    }
    let mut open = Vec::new();
    for t in tasks {
        if let Ok(Some(r)) = t.await {
            open.push(r);
        }
    }
    (open.len(), open)
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
    let rounds: usize = arg("--rounds").map_or(2, |v| v.parse().unwrap());
    let idle: usize = arg("--idle-streams").map_or(10_000, |v| v.parse().unwrap());
    let levels: Vec<usize> = arg("--levels")
        .unwrap_or_else(|| "1,64,512".into())
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let exe_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let pronto = arg("--pronto").unwrap_or_else(|| exe_dir.join("pronto").display().to_string());
    let nginx = arg("--nginx")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")))
        .filter(|p| p.exists());
    let peers = std::env::var("PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/pronto-peers")
        });
    let smg = arg("--smg")
        .map(PathBuf::from)
        .or_else(|| Some(peers.join("sglang-router/bin/smg")))
        .filter(|p| p.exists());
    let baseline = arg("--baseline");
    let tmp = std::env::temp_dir().join(format!("pronto-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();

    let backend = instant_backend().await;
    let direct = format!("http://{backend}/v1/chat/completions");
    let mut proxies = vec![start_pronto("pronto", &pronto, backend)];
    if let Some(base) = &baseline {
        proxies.push(start_pronto("pronto-baseline", base, backend));
    }
    match nginx.as_deref().and_then(|n| start_nginx(n, backend, &tmp)) {
        Some(p) => proxies.push(p),
        None => println!("nginx: not installed (apt-get install nginx-light), skipped\n"),
    }
    match smg.as_deref().and_then(|s| start_smg(s, backend, &tmp)) {
        Some(p) => proxies.push(p),
        None => {
            println!("sglang-router: not installed (../shared/peers/install-routers.sh), skipped\n")
        }
    }
    let mut ready = Vec::new();
    for p in proxies {
        match wait_ready(&p.url).await {
            Ok(()) => ready.push(p),
            Err(e) => println!("{}: did not become ready ({e}), skipped\n", p.name),
        }
    }
    let proxies = ready;
    // Warm up every path (connection pools, caches).
    run(&direct, 8, 400).await;
    for p in &proxies {
        run(&p.url, 8, 400).await;
    }
    // `--perf PATH`: a CPU profile of the first Pronto over the measured rounds.
    let mut perf = arg("--perf").map(|out| {
        Command::new("perf")
            .args([
                "record",
                "-F",
                "997",
                "--call-graph",
                "dwarf,16384",
                "-o",
                &out,
            ])
            .args(["-p", &proxies[0].child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start perf (Debian: linux-perf)")
    });
    println!("| streams | path | p50 µs | p99 µs | req/s | failed | added p50 µs | added p99 µs | req/s vs direct |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for &c in &levels {
        let new = || Histogram::<u64>::new(3).unwrap();
        let mut hd = new();
        let mut rd = 0.0;
        let mut fd = 0;
        let mut hs: Vec<(Histogram<u64>, f64, usize)> =
            proxies.iter().map(|_| (new(), 0.0, 0)).collect();
        // Interleave: direct, then each proxy, per round — drift hits every path alike.
        for _ in 0..rounds {
            let (h, r, f) = run(&direct, c, total / rounds).await;
            hd.add(h).unwrap();
            rd += r / rounds as f64;
            fd += f;
            for (p, acc) in proxies.iter().zip(hs.iter_mut()) {
                let (h, r, f) = run(&p.url, c, total / rounds).await;
                acc.0.add(h).unwrap();
                acc.1 += r / rounds as f64;
                acc.2 += f;
            }
        }
        let q = |h: &Histogram<u64>, x: f64| h.value_at_quantile(x);
        println!(
            "| {c} | direct | {} | {} | {rd:.0} | {fd} | | | |",
            q(&hd, 0.5),
            q(&hd, 0.99)
        );
        for (p, (h, r, f)) in proxies.iter().zip(&hs) {
            println!(
                "| {c} | {} | {} | {} | {r:.0} | {f} | {} | {} | {:.2} |",
                p.name,
                q(h, 0.5),
                q(h, 0.99),
                q(h, 0.5) as i64 - q(&hd, 0.5) as i64,
                q(h, 0.99) as i64 - q(&hd, 0.99) as i64,
                r / rd
            );
        }
    }
    if let Some(mut p) = perf.take() {
        // SIGINT: perf writes its data file and exits.
        let _ = Command::new("kill")
            .args(["-INT", &p.id().to_string()])
            .status();
        let _ = p.wait();
    }
    if idle > 0 {
        println!();
        println!("| proxy | idle streams requested | open | RSS before MiB | RSS with streams MiB | peak RSS MiB | KiB per stream |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for p in proxies.iter().filter(|p| p.name.starts_with("pronto")) {
            let pid = p.child.id();
            let (before, _) = rss_kib(pid);
            let (open, held) = open_idle_streams(&p.url, idle).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (now, peak) = rss_kib(pid);
            println!(
                "| {} | {idle} | {open} | {:.1} | {:.1} | {:.1} | {:.1} |",
                p.name,
                before as f64 / 1024.0,
                now as f64 / 1024.0,
                peak as f64 / 1024.0,
                (now.saturating_sub(before)) as f64 / open.max(1) as f64
            );
            drop(held);
            // Let the streams close before the next proxy is measured.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    drop(proxies);
    let _ = std::fs::remove_dir_all(&tmp);
}
