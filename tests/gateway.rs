//! End-to-end behaviour of the gateway binary against in-process backends.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{
    admin_backends, chat_body, client, config_yaml, fnv64, metric_value, metrics_when, pool,
    Behavior, Gateway, TestBackend,
};
use futures::StreamExt;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

async fn post(gw: &Gateway, path: &str, body: Vec<u8>) -> (u16, String) {
    let r = client(false)
        .post(gw.url(path))
        .body(body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.text().await.unwrap())
}

fn assert_openai_error(text: &str, code: &str) {
    let v = json(text);
    assert_eq!(v["error"]["code"], code, "{text}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(v["error"]["type"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_event_arrives_while_backend_is_still_generating() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            tokens: 6,
            token_delay: Duration::from_millis(300),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    for h2c in [false, true] {
        let resp = client(h2c)
            .post(gw.url("/v1/chat/completions"))
            .body(chat_body(100, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        let mut seen = String::new();
        while !seen.contains("t0 ") {
            let c = body.next().await.expect("stream ended early").unwrap();
            seen.push_str(&String::from_utf8_lossy(&c));
        }
        // The first token reached us while the backend had not yet produced the rest.
        let sent = backend.state.seen.tokens_sent.load(Ordering::SeqCst);
        assert!(sent < 6 * (1 + h2c as usize), "tokens already sent: {sent}");
        while let Some(c) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&c.unwrap()));
        }
        assert!(seen.ends_with("data: [DONE]\n\n"), "{seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_unknown_paths_and_bad_requests() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let pools = format!(
        "{}{}",
        pool("m", "round_robin", &[backend.url()]),
        pool("z-model", "least_inflight", &[backend.url()])
    );
    let gw = Gateway::start(&config_yaml(&pools, "limits:\n  max_body_bytes: 64KiB\n"));
    let c = client(false);

    let models = c.get(gw.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 200);
    let v = json(&models.text().await.unwrap());
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m", "z-model"]);

    let r = c.get(gw.url("/v2/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_openai_error(&r.text().await.unwrap(), "not_found");

    let r = c.get(gw.url("/v1/chat/completions")).send().await.unwrap();
    assert_eq!(r.status(), 405);

    let (s, t) = post(&gw, "/v1/chat/completions", b"{not json".to_vec()).await;
    assert_eq!(s, 400);
    assert_openai_error(&t, "invalid_request");

    let (s, t) = post(&gw, "/v1/chat/completions", br#"{"messages":[]}"#.to_vec()).await;
    assert_eq!(s, 400, "{t}");

    let body = br#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#.to_vec();
    let (s, t) = post(&gw, "/v1/chat/completions", body).await;
    assert_eq!(s, 404);
    assert_openai_error(&t, "model_not_found");

    let (s, t) = post(&gw, "/v1/chat/completions", chat_body(100 << 10, false)).await;
    assert_eq!(s, 413);
    assert_openai_error(&t, "request_too_large");

    // Chunked (no Content-Length) and too large: caught while reading.
    let big = chat_body(100 << 10, false);
    let parts: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(4096).map(|c| Ok(c.to_vec())).collect();
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(parts)))
        .send()
        .await;
    if let Ok(r) = r {
        assert_eq!(r.status(), 413);
    } // else: the gateway closed the connection while the client was still sending: fine.

    let (s, _) = post(
        &gw,
        "/v1/embeddings",
        br#"{"model":"m","input":"hello"}"#.to_vec(),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        backend.requests(),
        1,
        "only the embeddings request reached a backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_5xx_and_connect_failures_on_another_backend() {
    let bad = TestBackend::start(
        "bad",
        Behavior {
            fail_next: 1000,
            ..Behavior::default()
        },
    )
    .await;
    let good = TestBackend::start("good", Behavior::default()).await;
    let dead = TestBackend::start("dead", Behavior::default()).await;
    let urls = [bad.url(), dead.url(), good.url()];
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &urls),
        "health:\n  interval: 60s\n  eject_after_failures: 100\n",
    ));
    // Kill it after the gateway's first active check found it healthy: only connect
    // failures can reveal it now.
    while dead.state.seen.health_checks.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    dead.kill();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let body = chat_body(2000, true);
    for _ in 0..6 {
        let (s, t) = post(&gw, "/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 200, "{t}");
        assert!(t.contains("[DONE]"));
    }
    assert_eq!(good.requests(), 6);
    assert!(bad.requests() >= 2);
    // Every retried attempt sent the full body again.
    for (len, _) in bad.state.seen.bodies.lock().unwrap().iter() {
        assert_eq!(*len, body.len());
    }
    let m = metrics_when(&gw, |m| {
        metric_value(
            m,
            "pronto_requests_total{backend=\"m-b2\",code=\"200\",pool=\"m\"}",
        ) == Some(6.0)
    })
    .await;
    assert!(
        metric_value(&m, "pronto_retries_total{pool=\"m\",reason=\"status_5xx\"}").unwrap() >= 2.0,
        "{m}"
    );
    assert!(
        metric_value(&m, "pronto_retries_total{pool=\"m\",reason=\"connect\"}").unwrap_or(0.0)
            >= 1.0,
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "pronto_requests_total{backend=\"m-b2\",code=\"200\",pool=\"m\"}"
        ),
        Some(6.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_attempt_passes_the_backend_answer_through_and_no_backend_is_503() {
    let bad = TestBackend::start(
        "bad",
        Behavior {
            fail_next: 1000,
            fail_status: 429,
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[bad.url()]),
        "health:\n  interval: 60s\n  eject_after_failures: 100\n",
    ));
    let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
    assert_eq!(s, 429, "a single backend's 429 reaches the client");

    let dead = TestBackend::start("dead", Behavior::default()).await;
    let url = dead.url();
    dead.kill();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[url]),
        "health:\n  interval: 60s\n  eject_after_failures: 100\n",
    ));
    let r = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body(100, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_openai_error(&r.text().await.unwrap(), "no_backend_available");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_a_charged_retry_on_another_backend_and_not_a_fault() {
    let busy = |name| {
        TestBackend::start(
            name,
            Behavior {
                fail_next: 1000,
                fail_status: 429,
                ..Behavior::default()
            },
        )
    };
    let (a, b) = (busy("a").await, busy("b").await);
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[a.url(), b.url()]),
        "retry:\n  max_retries: 2\nhealth:\n  interval: 60s\n  eject_after_failures: 2\n",
    ));
    // Both busy: each is tried once (a 429 marks it tried), the last 429 reaches the client.
    let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
    assert_eq!(s, 429);
    assert_eq!(a.requests() + b.requests(), 2, "one attempt per backend");
    // One busy, one free: the request lands on the free one after one charged retry.
    b.set(|x| x.fail_next = 0);
    for _ in 0..4 {
        let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        assert_eq!(s, 200);
    }
    let m = metrics_when(&gw, |_| true).await;
    let retries = metric_value(&m, "pronto_retries_total{pool=\"m\",reason=\"status_429\"}");
    assert!(retries.is_some_and(|r| r >= 2.0), "{retries:?}");
    // Many 429s, yet no ejection: busy is not broken.
    let backends = common::admin_backends(&gw).await;
    assert!(
        backends.iter().all(|b| b["ejected"] == false),
        "{backends:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_token_timeout_is_504() {
    let slow = TestBackend::start(
        "slow",
        Behavior {
            first_token_delay: Duration::from_secs(30),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[slow.url()]),
        "limits:\n  first_token_timeout: 300ms\nhealth:\n  interval: 60s\n",
    ));
    let started = Instant::now();
    let (s, t) = post(&gw, "/v1/chat/completions", chat_body(100, true)).await;
    assert_eq!(s, 504, "{t}");
    assert_openai_error(&t, "first_token_timeout");
    assert!(started.elapsed() < Duration::from_secs(30), "no hang");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_dying_mid_stream_ends_the_client_stream_cleanly() {
    let crashy = TestBackend::start(
        "crashy",
        Behavior {
            tokens: 10,
            die_after: Some(3),
            token_delay: Duration::from_millis(10),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[crashy.url()]),
        "health:\n  interval: 60s\n",
    ));
    for h2c in [false, true] {
        let r = client(h2c)
            .post(gw.url("/v1/chat/completions"))
            .body(chat_body(100, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = tokio::time::timeout(Duration::from_secs(10), r.text())
            .await
            .expect("client stream must not hang")
            .expect("stream ends cleanly");
        assert!(text.contains("t2 "), "{text}");
        assert!(!text.contains("[DONE]"));
        let last = text.trim_end().lines().last().unwrap();
        assert!(
            last.starts_with("data: {\"error\""),
            "ends with an error event: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hang_up_cancels_the_upstream_request() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            tokens: 100_000,
            token_delay: Duration::from_millis(5),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    let mut lags = Vec::new();
    for (i, h2c) in [false, true, false, true, false].into_iter().enumerate() {
        let r = client(h2c)
            .post(gw.url("/v1/chat/completions"))
            .body(chat_body(100, true))
            .send()
            .await
            .unwrap();
        let mut s = r.bytes_stream();
        s.next().await.unwrap().unwrap();
        s.next().await.unwrap().unwrap();
        let hung_up = Instant::now();
        drop(s);
        backend
            .wait_cancelled(
                i + 1,
                Duration::from_secs(10),
                "backend never saw the cancellation",
            )
            .await;
        let at = backend.state.seen.cancelled_at.lock().unwrap().unwrap();
        lags.push(at.saturating_duration_since(hung_up));
    }
    lags.sort();
    eprintln!("upstream cancellation lag after client hang-up: {lags:?}");
    // The median, robust to one slow run on a shared machine.
    assert!(lags[2] < Duration::from_millis(100), "{lags:?}");
    let m = metrics_when(&gw, |m| {
        metric_value(m, "pronto_client_disconnects_total{pool=\"m\"}") == Some(5.0)
            && metric_value(m, "pronto_backend_inflight{backend=\"m-b0\"}") == Some(0.0)
    })
    .await;
    assert_eq!(
        metric_value(&m, "pronto_client_disconnects_total{pool=\"m\"}"),
        Some(5.0)
    );
    assert_eq!(
        metric_value(&m, "pronto_backend_inflight{backend=\"m-b0\"}"),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_backends_are_ejected_never_picked_and_readmitted() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let b = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[a.url(), b.url()]),
        "",
    ));
    b.set(|x| x.healthy = false);
    // Active checks run every 200 ms: wait until the admin API shows b down.
    let c = client(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = json(
            &c.get(gw.admin_url("/admin/backends"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
        if v["backends"][1]["healthy"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "b never marked unhealthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = b.requests();
    for _ in 0..10 {
        let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        assert_eq!(s, 200);
    }
    assert_eq!(b.requests(), before, "an unhealthy backend was picked");
    let m = c
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric_value(&m, "pronto_backend_healthy{backend=\"m-b1\"}"),
        Some(0.0)
    );
    let r = c.get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "one healthy backend is enough to be ready");

    b.set(|x| x.healthy = true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.requests() == before {
        assert!(Instant::now() < deadline, "b never re-admitted");
        let _ = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Every backend failing its checks: not ready, and requests get 503.
    a.set(|x| x.healthy = false);
    b.set(|x| x.healthy = false);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.get(gw.admin_url("/readyz")).send().await.unwrap();
        if r.status() == 503 {
            assert!(r.text().await.unwrap().contains("\"m\""));
            break;
        }
        assert!(Instant::now() < deadline, "never unready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
    assert_eq!(s, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_ejection_needs_no_health_check() {
    let a = TestBackend::start(
        "a",
        Behavior {
            fail_status: 500,
            fail_next: 1_000,
            ..Behavior::default()
        },
    )
    .await;
    let b = TestBackend::start("b", Behavior::default()).await;
    // Active checks once an hour: only failed requests can eject a.
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[a.url(), b.url()]),
        "health:\n  interval: 1h\n  timeout: 500ms\n  eject_after_failures: 2\n  readmit_after: 1s\n",
    ));
    // The one start-up round of checks, then none for an hour.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.state.seen.health_checks.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no start-up health check");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let checks = a.state.seen.health_checks.load(Ordering::SeqCst);
    let mut ejected = false;
    for _ in 0..10 {
        let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        assert_eq!(s, 200, "retried on b");
        let backends = common::admin_backends(&gw).await;
        if backends[0]["ejected"] == true {
            assert_eq!(backends[0]["healthy"], false, "{backends:?}");
            ejected = true;
            break;
        }
    }
    assert!(ejected, "a was never ejected");
    let tried = a.requests();
    assert!((2..=3).contains(&tried), "{tried} requests reached a");
    for _ in 0..4 {
        let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        assert_eq!(s, 200);
    }
    assert_eq!(a.requests(), tried, "an ejected backend is not picked");
    assert_eq!(
        a.state.seen.health_checks.load(Ordering::SeqCst),
        checks,
        "no health check was involved"
    );
    // Re-admitted after readmit_after, still without a check.
    a.set(|x| x.fail_next = 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.requests() == tried {
        assert!(Instant::now() < deadline, "a never re-admitted");
        let _ = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_clients_can_send_the_next_request_at_once() {
    // A Content-Length response is complete for the client before the gateway has finished
    // the exchange; the next request on the connection must not lose its first bytes to the
    // gateway's hang-up probe.
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "least_inflight", &[backend.url()]),
        "",
    ));
    let c = client(false);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (c, url) = (c.clone(), gw.url("/v1/chat/completions"));
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                let r = c
                    .post(&url)
                    .body(chat_body(200, false))
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                let text = r.text().await.unwrap();
                assert_eq!(status, 200, "{text}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(backend.requests(), 800);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_answer() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(&pool("m", "least_inflight", &[a.url()]), ""));
    let c = client(false);
    assert_eq!(
        c.get(gw.admin_url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(gw.admin_url("/nope")).send().await.unwrap().status(),
        404
    );
    let (s, _) = post(&gw, "/v1/chat/completions", chat_body(100, true)).await;
    assert_eq!(s, 200);
    let m = metrics_when(&gw, |m| m.contains("pronto_requests_total{")).await;
    for family in [
        "pronto_requests_total",
        "pronto_request_duration_seconds",
        "pronto_backend_inflight",
        "pronto_backend_healthy",
        "pronto_ttft_seconds",
    ] {
        assert!(
            m.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{m}"
        );
    }
    assert_eq!(
        metric_value(&m, "pronto_ttft_seconds_count{backend=\"m-b0\"}"),
        Some(1.0)
    );
    let v = json(
        &c.get(gw.admin_url("/admin/backends"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(v["backends"][0]["name"], "m-b0");
    assert_eq!(v["backends"][0]["pool"], "m");
    assert_eq!(v["backends"][0]["inflight"], 0);
}

/// A backend that answers one request per connection and closes the connection when the next
/// one arrives, *without* having said `Connection: close` — a server whose keep-alive timeout
/// fires just as the gateway reuses the pooled connection.
async fn closing_backend() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let count = count.clone();
            tokio::spawn(async move {
                // The first request of each connection is answered and the connection kept
                // open (no `Connection: close`); a second one is read and the connection
                // closed without an answer: the idle-close race a pooled connection meets.
                for nth in 0..2 {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Read the head and the Content-Length body.
                    loop {
                        let n = s.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf);
                        if let Some(end) = text.find("\r\n\r\n") {
                            let len = text[..end]
                                .lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case("content-length")
                                        .then(|| v.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break;
                            }
                        }
                    }
                    if buf.starts_with(b"GET /health") {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                        return;
                    }
                    if !buf.starts_with(b"POST ") {
                        // e.g. the engine-metrics scraper: not an engine.
                        let _ = s
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                    if nth == 1 {
                        return;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}"#;
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if s.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_closing_pooled_connections_cost_no_request() {
    let (url, served) = closing_backend().await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[url]),
        "retry:\n  max_retries: 0\nhealth:\n  interval: 60s\n",
    ));
    for i in 0..30 {
        let (s, t) = post(&gw, "/v1/chat/completions", chat_body(100, false)).await;
        assert_eq!(s, 200, "request {i}: {t}");
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        30,
        "each request served exactly once"
    );
    // The path under test was taken: pooled connections were found closed and resent.
    let m = metrics_when(&gw, |_| true).await;
    let stale = metric_value(
        &m,
        "pronto_upstream_errors_total{backend=\"m-b0\",kind=\"stale_connection\"}",
    )
    .unwrap_or(0.0);
    assert!(stale >= 1.0, "no stale pooled connection was met");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_token_ratio_is_learned_from_usage_without_touching_the_request() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            prompt_token_factor: 1.6,
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "predicted_ttft", &[backend.url()]),
        "",
    ));
    let ratio = |m: &str| metric_value(m, r#"pronto_prompt_token_ratio{pool="m"}"#);
    let c = client(false);
    let mut sent = Vec::new();
    for i in 0..6 {
        // Streams (this backend reports usage on them) and plain responses both teach it.
        let body = chat_body(2000 + 100 * i, i % 2 == 0);
        sent.push((body.len(), fnv64(&body)));
        let resp = c
            .post(gw.url("/v1/chat/completions"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let m = metrics_when(&gw, |m| ratio(m).is_some_and(|r| (r - 1.6).abs() < 0.01)).await;
    assert!((ratio(&m).unwrap() - 1.6).abs() < 0.01, "{:?}", ratio(&m));
    // The requests reached the backend byte for byte: nothing added (no stream_options).
    assert_eq!(*backend.state.seen.bodies.lock().unwrap(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_ttft_tpot_and_e2e_are_exported_per_backend() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            tokens: 5,
            token_delay: Duration::from_millis(20),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    let c = client(false);
    for _ in 0..3 {
        let resp = c
            .post(gw.url("/v1/chat/completions"))
            .body(chat_body(300, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let count = |m: &str, name: &str| metric_value(m, &format!("{name}_count{{backend=\"m-b0\"}}"));
    let m = metrics_when(&gw, |m| count(m, "pronto_e2e_seconds") == Some(3.0)).await;
    assert_eq!(count(&m, "pronto_tpot_seconds"), Some(3.0));
    assert_eq!(count(&m, "pronto_ttft_seconds"), Some(3.0));
    let lat = &admin_backends(&gw).await[0]["latency"];
    let tpot = lat["ewma"]["tpot_s"].as_f64().expect("tpot ewma");
    let e2e = lat["ewma"]["e2e_s"].as_f64().expect("e2e ewma");
    let ttft = lat["ewma"]["ttft_s"].as_f64().expect("ttft ewma");
    // Orderings, not times: a token gap is shorter than the stream, and so is the first token.
    assert!(tpot > 0.0 && tpot < e2e && ttft < e2e, "{lat}");
    assert_eq!(lat["window_60s"]["e2e"]["n"], 3);
}
