//! Heap allocations per proxied request, and heap bytes held per idle open stream, counted by
//! a counting global allocator (`stats_alloc`) around an in-process gateway.
//!
//! The gateway (`pronto::server::start`, 2 threads) fronts an instant SSE backend written on
//! raw sockets; the client is raw sockets too, one keep-alive connection sending the same
//! streamed chat request (a 900-byte system prompt) again and again. Client and backend
//! allocate almost nothing per request, and what they do allocate is measured the same way
//! on the direct path (client → backend) and subtracted: the `pronto` rows are the gateway's
//! own. Health checks and engine scrapes run once an hour here, so none falls inside a
//! measurement.
//!
//! Idle streams: `IDLE` client connections each hold a stream open through the gateway (the
//! backend sends the first event and then nothing); the heap growth per stream, minus the
//! direct path's, is what the gateway keeps for each (heap only: RSS adds allocator slack and
//! kernel-side nothing; `scripts/overhead.sh` measures RSS at 10,000 streams).
//!
//! Run: `cargo bench --bench allocs` (prints a markdown table; `ALLOCS_REQUESTS`, default
//! 4000, and `ALLOCS_IDLE`, default 500, change the counts).

use std::alloc::System;
use std::net::SocketAddr;
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const FIRST: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const REST: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n"
);
const END: &[u8] = b"0\r\n\r\n";

fn sse_head() -> String {
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        .to_string()
}

fn chunk(data: &str) -> String {
    format!("{:X}\r\n{data}\r\n", data.len())
}

/// The request the client sends (`hold`: the backend keeps the stream open after one event).
fn request(host: SocketAddr, hold: bool) -> Vec<u8> {
    let body = serde_json::json!({
        "messages": [{"role": "system", "content": "You are a helpful assistant. ".repeat(30)},
                     {"role": "user", "content": "Say hi."}],
        "model": "m", "stream": true, "max_tokens": 1
    })
    .to_string();
    let hold = if hold { "x-hold: 1\r\n" } else { "" };
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
         {hold}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Where a head ends in `buf`, and its declared body length.
fn head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    Some((end, len))
}

/// The instant backend: a whole SSE answer in one write; with `x-hold` the first event only,
/// then the stream stays open until the peer closes it. Anything else gets an empty 200.
async fn backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let whole = format!("{}{}{}0\r\n\r\n", sse_head(), chunk(FIRST), chunk(REST)).into_bytes();
    let held = format!("{}{}", sse_head(), chunk(FIRST)).into_bytes();
    // Health checks and scrapes: an empty 200.
    let other = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            let (whole, held, other) = (whole.clone(), held.clone(), other.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut have = 0;
                loop {
                    let Some((end, len)) = head_end(&buf[..have]) else {
                        match s.read(&mut buf[have..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => have += n,
                        }
                        continue;
                    };
                    if have < end + len {
                        match s.read(&mut buf[have..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => have += n,
                        }
                        continue;
                    }
                    let head = &buf[..end];
                    let chat = head.starts_with(b"POST /v1/chat/completions ");
                    let hold = head.windows(7).any(|w| w.eq_ignore_ascii_case(b"x-hold:"));
                    let answer = match (chat, hold) {
                        (true, false) => &whole,
                        (true, true) => &held,
                        (false, _) => &other,
                    };
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                    if chat && hold {
                        let mut rest = [0u8; 64];
                        while matches!(s.read(&mut rest).await, Ok(n) if n > 0) {}
                        return;
                    }
                    buf.copy_within(end + len..have, 0);
                    have -= end + len;
                }
            });
        }
    });
    addr
}

/// Send `req` and read its whole chunked answer, on one keep-alive connection.
async fn exchange(s: &mut TcpStream, req: &[u8], buf: &mut [u8]) {
    s.write_all(req).await.unwrap();
    let mut have = 0;
    loop {
        let n = s.read(&mut buf[have..]).await.unwrap();
        assert!(
            n > 0,
            "connection closed mid-answer: {}",
            String::from_utf8_lossy(&buf[..have])
        );
        have += n;
        if buf[..have].ends_with(END) {
            return;
        }
    }
}

/// Allocations and bytes allocated per request over `n` requests to `addr`.
async fn per_request(addr: SocketAddr, n: usize) -> (f64, f64) {
    let req = request(addr, false);
    let mut buf = vec![0u8; 64 * 1024];
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    for _ in 0..200 {
        exchange(&mut s, &req, &mut buf).await;
    }
    let region = Region::new(GLOBAL);
    for _ in 0..n {
        exchange(&mut s, &req, &mut buf).await;
    }
    let d = region.change();
    (
        (d.allocations + d.reallocations) as f64 / n as f64,
        d.bytes_allocated as f64 / n as f64,
    )
}

/// Heap bytes still allocated per stream while `n` streams are held open through `addr`.
async fn per_idle_stream(addr: SocketAddr, n: usize) -> f64 {
    let req = request(addr, true);
    let want = chunk(FIRST).into_bytes();
    let mut conns = Vec::with_capacity(n);
    let mut buf = vec![0u8; 16 * 1024];
    // Settle: one held stream opened and closed first (lazy statics, pools).
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&req).await.unwrap();
        let _ = s.read(&mut buf).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let region = Region::new(GLOBAL);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&req).await.unwrap();
        let mut have = 0;
        while !buf[..have].ends_with(&want) {
            let r = s.read(&mut buf[have..]).await.unwrap();
            assert!(r > 0, "held stream closed");
            have += r;
        }
        conns.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = region.change();
    let live = d.bytes_allocated as f64 - d.bytes_deallocated as f64 + d.bytes_reallocated as f64;
    drop(conns);
    tokio::time::sleep(Duration::from_millis(500)).await;
    live / n as f64
}

fn gateway(backend: SocketAddr) -> pronto::server::Handle {
    let dir = std::env::temp_dir().join(format!("pronto-allocs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pronto.yaml");
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nthreads: 2\n\
         health:\n  interval: 1h\n\
         pools:\n  m:\n    scrape: {{interval: 1h}}\n    backends:\n      - name: b0\n        url: http://{backend}\n"
    );
    std::fs::write(&path, yaml).unwrap();
    let loaded = pronto::config::Loaded::load(&path).expect("bench config loads");
    let handle = pronto::server::start(loaded, false).expect("gateway starts");
    let _ = std::fs::remove_dir_all(&dir);
    handle
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing and wants a quick run.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (n, idle) = if quick {
        (50, 10)
    } else {
        (env("ALLOCS_REQUESTS", 4000), env("ALLOCS_IDLE", 500))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = backend().await;
        let gw = gateway(backend);
        let through = gw.listen;
        // Ready: the first request answers once the backend is known healthy.
        for _ in 0..100 {
            let mut s = TcpStream::connect(through).await.unwrap();
            let mut buf = vec![0u8; 16 * 1024];
            s.write_all(&request(through, false)).await.unwrap();
            let n = s.read(&mut buf).await.unwrap_or(0);
            if buf[..n].starts_with(b"HTTP/1.1 200") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (da, db) = per_request(backend, n).await;
        let (pa, pb) = per_request(through, n).await;
        let di = per_idle_stream(backend, idle).await;
        let pi = per_idle_stream(through, idle).await;
        println!("| path | allocations per request | bytes allocated per request | heap bytes per idle open stream |");
        println!("|---|---:|---:|---:|");
        println!("| direct (client + backend) | {da:.1} | {db:.0} | {di:.0} |");
        println!("| through pronto | {pa:.1} | {pb:.0} | {pi:.0} |");
        println!(
            "| pronto's own | {:.1} | {:.0} | {:.0} |",
            pa - da,
            pb - db,
            pi - di
        );
        println!("\n{n} requests, one keep-alive connection; {idle} idle streams.");
        gw.shutdown();
    });
}
