//! A client that opens a long stream and stops reading is released at the write deadline
//! (`limits.write_timeout`, or `limits.min_send_rate`): the gateway resets its connection at
//! once (nothing is left queued for it in the kernel), closes the upstream connection, and the
//! simulated engine aborts the request (`sim_aborted_requests_total`, and
//! `vllm:num_requests_running` back to 0). Counted in `pronto_client_stalled_total`.
//!
//! The clients here are raw sockets with a small receive buffer, so that a stream fills the
//! buffers within a second; every wait is bounded, and time is asserted only as an ordering
//! (the engine's abort cannot precede the deadline).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{config_yaml, metric_value, metrics_when, pool, post_head, Gateway};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MODEL: &str = "sim-model";
/// The simulator's time scale: engine steps well under a millisecond.
const SCALE: f64 = 0.01;
/// Upper bound on every wait: a hang fails the test instead of blocking it.
const BOUND: Duration = Duration::from_secs(20);

async fn fleet() -> SimFleet {
    let yaml = format!(
        "model: {MODEL}\nbackends:\n  - {{ name: b0, profile: h100-llama3-8b, num_kv_blocks: 20000, port: 0 }}\n"
    );
    let config = FleetConfig::parse(&yaml, "test").unwrap();
    SimFleet::start(&config, SCALE).await.unwrap()
}

/// A streamed chat request long enough to outlast any test (the engine stops at its abort;
/// 20,000 KV blocks of 16 tokens hold it).
fn long_stream(tag: &str) -> String {
    serde_json::json!({"model": MODEL, "stream": true, "max_tokens": 300_000,
        "messages": [{"role": "user", "content": format!("tell me everything {tag}")}]})
    .to_string()
}

/// The simulated backend's `/metrics` value of `series` (0 when absent).
async fn sim_metric(url: &str, series: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            let bare = name.split('{').next()?;
            (bare == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// Poll the backend until `ready(aborted, running)` holds (bounded): the values then.
async fn sim_when(url: &str, ready: impl Fn(f64, f64) -> bool) -> (f64, f64) {
    let deadline = Instant::now() + BOUND;
    loop {
        let aborted = sim_metric(url, "sim_aborted_requests_total").await;
        let running = sim_metric(url, "vllm:num_requests_running").await;
        if ready(aborted, running) {
            return (aborted, running);
        }
        assert!(
            Instant::now() < deadline,
            "the backend never got there: aborted {aborted}, running {running}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client with a 4 KiB receive buffer that sends a long streamed request, reads the
/// response head and the first event, then stops reading (keeping the connection open).
async fn stalled_reader(gw: SocketAddr, tag: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(gw).await.unwrap();
    let body = long_stream(tag);
    s.write_all(post_head(body.len()).as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = tokio::time::timeout(BOUND, s.read(&mut chunk))
            .await
            .expect("the stream started")
            .unwrap();
        assert!(n > 0, "closed before the first event");
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(
        String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
    s
}

/// Whether the kernel still has a TCP socket from local port `from` to remote port `to`
/// (`/proc/net/tcp`: the gateway's side of a client connection).
fn socket_exists(from: u16, to: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).any(|line| {
        let mut f = line.split_whitespace().skip(1);
        let port = |a: Option<&str>| {
            a.and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        port(f.next()) == Some(from) && port(f.next()) == Some(to)
    })
}

/// One stalled reader against a gateway with `limits`, whose deadline is `deadline`: the
/// engine aborts the request no earlier than the deadline, the gateway's socket is gone (reset,
/// not draining), the client sees the reset, and the gateway counts one stall.
async fn released(limits: &str, deadline: Duration) {
    let fleet = fleet().await;
    let url = fleet.urls()[0].clone();
    let gw = Gateway::start(&config_yaml(
        &pool(MODEL, "round_robin", std::slice::from_ref(&url)),
        limits,
    ));
    let mut s = stalled_reader(gw.listen, "stalled").await;
    let stopped = Instant::now();
    let client_port = s.local_addr().unwrap().port();
    assert_eq!(sim_metric(&url, "vllm:num_requests_running").await, 1.0);
    let (aborted, running) = sim_when(&url, |a, r| a >= 1.0 && r == 0.0).await;
    assert_eq!((aborted, running), (1.0, 0.0));
    assert!(
        stopped.elapsed() >= deadline,
        "released before the write deadline ({:?})",
        stopped.elapsed()
    );
    // The gateway's socket for this client is gone (reset), although the client has unread
    // data and never closed: nothing stays queued in the kernel for it.
    let gone = Instant::now() + BOUND;
    while socket_exists(gw.listen.port(), client_port) {
        assert!(Instant::now() < gone, "the gateway still holds the socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The client, reading again, sees the reset (never a clean end of the stream).
    let mut rest = Vec::new();
    let read = tokio::time::timeout(BOUND, s.read_to_end(&mut rest))
        .await
        .expect("the connection was closed");
    let err = read.expect_err("the connection was reset, not ended");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    let stalls = format!("pronto_client_stalled_total{{pool=\"{MODEL}\"}}");
    let m = metrics_when(&gw, |m| metric_value(m, &stalls) == Some(1.0)).await;
    assert_eq!(metric_value(&m, &stalls), Some(1.0));
    let gone = format!("pronto_client_disconnects_total{{pool=\"{MODEL}\"}}");
    assert_eq!(metric_value(&m, &gone), Some(0.0));
    let inflight = format!("pronto_backend_inflight{{backend=\"{MODEL}-b0\"}}");
    assert_eq!(metric_value(&m, &inflight), Some(0.0));

    // The gateway serves the next client as before.
    let r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(
            serde_json::json!({"model": MODEL, "stream": true, "max_tokens": 8,
                "messages": [{"role": "user", "content": "hello"}]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stalls_past_write_timeout_is_reset_and_its_request_aborted() {
    released("limits: {write_timeout: 1s}\n", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_slower_than_min_send_rate_is_reset_and_its_request_aborted() {
    // A small write's deadline under `min_send_rate` is pingora's floor, 1 s, well before
    // the 60 s write_timeout.
    released(
        "limits: {write_timeout: 60s, min_send_rate: 64KiB}\n",
        Duration::from_secs(1),
    )
    .await;
}
