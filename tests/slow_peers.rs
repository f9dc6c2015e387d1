//! The edge against slow and hostile peers, on real sockets: each `limits:` deadline ends what
//! it must (and only that), the answers are the gateway's JSON errors, and timeouts that the
//! request itself explains never eject a healthy backend.

mod common;

use std::time::{Duration, Instant};

use common::{admin_backends, config_yaml, pool, post_head, Behavior, Gateway, TestBackend};
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upper bound on every wait: a hang fails the test instead of blocking it.
const BOUND: Duration = Duration::from_secs(20);

fn chat(stream: bool, tag: &str) -> String {
    serde_json::json!({"model": "m", "stream": stream, "max_tokens": 4,
        "messages": [{"role": "user", "content": format!("hello {tag}")}]})
    .to_string()
}

/// Read until the server closes (or BOUND): the response text.
async fn read_all(s: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut out))
        .await
        .expect("the gateway closed the connection")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The OpenAI-style error code of a raw HTTP/1.1 response, asserting the rest of the shape:
/// JSON, no trace of pingora.
fn json_error_code(resp: &str) -> String {
    assert!(
        !resp.to_ascii_lowercase().contains("pingora"),
        "the answer names pingora: {resp}"
    );
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {resp}"));
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_frees_its_upstream_request() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            tokens: 1_000_000,
            token_bytes: 16 * 1024,
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "limits: {write_timeout: 1s}\n",
    ));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(gw.listen).await.unwrap();
    let body = chat(true, "slow reader");
    s.write_all(post_head(body.len()).as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut first = [0u8; 1024];
    let n = s.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // Then the client reads nothing more but keeps the connection open: once the socket
    // buffers are full, the gateway's write waits, and write_timeout ends the stream.
    backend
        .wait_cancelled(1, BOUND, "the upstream stream was never released")
        .await;
    let sent = backend.state.seen.tokens_sent.load(Ordering::SeqCst);
    assert!(sent < 1_000_000, "the stream ran to its end: {sent}");
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_that_trickle_or_never_end_are_closed_with_a_408() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "limits: {header_timeout: 1s}\n",
    ));
    // One header line every 250 ms: 40 lines would take 10 s.
    let s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        let mut sent = 0;
        if wr
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            .await
            .is_err()
        {
            return sent;
        }
        for i in 0..40 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if wr
                .write_all(format!("x-h{i}: v\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
            sent += 1;
        }
        sent
    });
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, rd.read_to_end(&mut out))
        .await
        .expect("closed")
        .ok();
    let closed_after = started.elapsed();
    let resp = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(status_of(&resp), 408, "{resp}");
    assert_eq!(json_error_code(&resp), "request_timeout");
    let sent = writer.await.unwrap();
    assert!(
        sent < 40,
        "the whole trickle was accepted ({closed_after:?})"
    );

    // A request line that never ends, shorter and longer than pingora's h2c peek.
    for garbage in [&b"GARBAGE"[..], &b"GARBAGE-GARBAGE-GARBAGE-GARBAGE"[..]] {
        let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
        s.write_all(garbage).await.unwrap();
        let resp = read_all(&mut s).await;
        assert_eq!(status_of(&resp), 408, "{resp}");
    }
    // A connection that sends nothing is closed too, without an answer.
    let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    assert_eq!(read_all(&mut s).await, "");
    assert_eq!(backend.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_pingora_cannot_parse_get_json_errors() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    let send = |raw: Vec<u8>| async move {
        let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
        s.write_all(&raw).await.unwrap();
        read_all(&mut s).await
    };
    let resp = send(b"\x01\x02\x03 / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()).await;
    assert_eq!(status_of(&resp), 400, "{resp}");
    assert_eq!(json_error_code(&resp), "invalid_request");
    let resp = send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n".to_vec()).await;
    assert_eq!(status_of(&resp), 400, "{resp}");
    assert_eq!(json_error_code(&resp), "invalid_request");

    // More header lines than pingora parses: a 431, not its empty 400.
    let mut many = String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
    for i in 0..300 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("Content-Length: 0\r\n\r\n");
    let resp = send(many.into_bytes()).await;
    assert_eq!(status_of(&resp), 431, "{resp}");
    assert_eq!(json_error_code(&resp), "request_header_fields_too_large");
    // A head longer than the gateway reads (one 200 KiB header).
    let mut huge = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 200 * 1024));
    huge.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
    let resp = send(huge).await;
    assert_eq!(status_of(&resp), 431, "{resp}");
    assert_eq!(json_error_code(&resp), "request_header_fields_too_large");
    // CONNECT is refused as JSON with Allow.
    let resp =
        send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n".to_vec()).await;
    assert_eq!(status_of(&resp), 405, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("\r\nallow: "), "{resp}");
    assert_eq!(json_error_code(&resp), "method_not_allowed");
    assert_eq!(backend.requests(), 0);

    // The listener still serves.
    let body = chat(false, "after");
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let raw = raw.into_bytes();
    let resp = send(raw).await;
    assert_eq!(status_of(&resp), 200, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_after_100_continue_is_not_taken_for_a_head() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    // Larger than the longest head the gateway reads, sent as curl sends large bodies.
    let body = chat(false, &"x".repeat(300 * 1024));
    let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    s.write_all(
        post_head(body.len())
            .replace(
                "\r\n\r\n",
                "\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
            )
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).await.unwrap();
    assert!(
        interim.starts_with(b"HTTP/1.1 100 Continue\r\n"),
        "{interim:?}"
    );
    s.write_all(body.as_bytes()).await.unwrap();
    let resp = read_all(&mut s).await;
    assert_eq!(status_of(&resp), 200, "{resp}");
    assert_eq!(backend.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_within_the_chunk_deadline_but_past_the_total_gets_a_408() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "limits: {body_timeout: 1s, idle_timeout: 10s}\n",
    ));
    let body = chat(false, &"x".repeat(400));
    let s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(post_head(body.len()).as_bytes())
        .await
        .unwrap();
    let bytes = body.into_bytes();
    let writer = tokio::spawn(async move {
        // 8 bytes every 200 ms: each chunk well within idle_timeout, the whole far past 1 s.
        for c in bytes.chunks(8) {
            if wr.write_all(c).await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        true
    });
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, rd.read_to_end(&mut out))
        .await
        .expect("closed")
        .ok();
    let resp = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(status_of(&resp), 408, "{resp}");
    assert_eq!(json_error_code(&resp), "request_timeout");
    writer.abort();
    assert_eq!(backend.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_get_a_503_with_retry_after() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "limits: {max_connections: 2}\n",
    ));
    let a = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    let b = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    // Let the gateway count both before the third arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    let resp = read_all(&mut c).await;
    assert_eq!(status_of(&resp), 503, "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
        "{resp}"
    );
    assert_eq!(json_error_code(&resp), "gateway_busy");
    drop((a, b));
    // Once they are gone, a client is served again.
    let deadline = Instant::now() + BOUND;
    loop {
        let r = reqwest::Client::new()
            .post(gw.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat(false, "again"))
            .send()
            .await
            .expect("an answer: 200, or 503 while the closed connections are still counted");
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_non_streamed_generations_time_out_without_ejecting_the_backend() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            first_token_delay: Duration::from_millis(1500),
            ..Behavior::default()
        },
    )
    .await;
    // eject_after_failures is 2 in the test defaults: three timeouts in a row would eject
    // the backend if they counted.
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "limits: {request_timeout: 500ms}\nretry: {max_retries: 0}\n",
    ));
    let http = reqwest::Client::new();
    for i in 0..3 {
        let r = http
            .post(gw.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat(false, &format!("long {i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 504);
    }
    let b = &admin_backends(&gw).await[0];
    assert_eq!(b["ejected"], false, "{b}");
    assert_eq!(b["healthy"], true, "{b}");
    backend.set(|b| b.first_token_delay = Duration::ZERO);
    let r = http
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(false, "short"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Peak resident memory of `pid` since the last [`reset_peak`], bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

fn current_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Reset the peak-RSS mark of `pid` to its current RSS (Linux: `clear_refs` value 5).
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_large_uploads_stay_within_the_buffer_budget() {
    const BUDGET: u64 = 6 << 20;
    const BODY: usize = 2 << 20;
    const CLIENTS: usize = 32;
    /// What the gateway may hold beyond the budget: socket and parser buffers, allocator
    /// slack, the parsed features of the admitted requests.
    const MARGIN: u64 = 24 << 20;
    let backend = TestBackend::start(
        "b",
        Behavior {
            header_delay: Duration::from_millis(300),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start_process(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        &format!("limits: {{max_body_bytes: 3MiB, max_buffered_bytes: {BUDGET}}}\n"),
    ));
    let http = reqwest::Client::new();
    let body = |i: usize| bytes::Bytes::from(common::chat_body(BODY - 200 - i, false));
    // Warm up (first request allocations, pools), then measure from here.
    let r = http
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body(0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let pid = gw.pid();
    // Every body built before any is sent, so that they arrive together.
    let bodies: Vec<_> = (0..CLIENTS).map(|i| body(i + 1)).collect();
    let before = current_rss(pid);
    reset_peak(pid);
    let mut tasks = Vec::new();
    for b in bodies {
        let (http, url) = (http.clone(), gw.url("/v1/chat/completions"));
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .header("content-type", "application/json")
                .body(b)
                .send()
                .await
                .expect("every request gets an answer");
            let status = r.status().as_u16();
            let retry_after = r.headers().get("retry-after").cloned();
            let text = r.text().await.unwrap();
            (status, retry_after, text)
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for t in tasks {
        let (status, retry_after, text) = t.await.unwrap();
        match status {
            200 => ok += 1,
            503 => {
                assert!(text.contains("\"gateway_busy\""), "{text}");
                assert!(retry_after.is_some());
                busy += 1;
            }
            s => panic!("unexpected {s}: {text}"),
        }
    }
    let peak = peak_rss(pid);
    eprintln!(
        "{ok} served, {busy} refused; RSS before {} MiB, peak {} MiB (budget {} MiB)",
        before >> 20,
        peak >> 20,
        BUDGET >> 20
    );
    assert_eq!(ok + busy, CLIENTS);
    // At most 3 bodies fit the budget at once: most of the burst is refused.
    assert!(
        ok >= 2 && busy >= CLIENTS / 2,
        "{ok} served, {busy} refused"
    );
    assert_eq!(
        backend.requests(),
        ok + 1,
        "only admitted bodies reach the backend"
    );
    assert!(
        peak.saturating_sub(before) <= BUDGET + MARGIN,
        "peak RSS grew by {} MiB, budget {} MiB + margin {} MiB",
        (peak - before) >> 20,
        BUDGET >> 20,
        MARGIN >> 20
    );
}
