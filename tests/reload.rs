//! Live config reload end to end: the real binary, real loopback backends, the config file in
//! a temp dir rewritten atomically, reloads by `POST /admin/reload`, `SIGHUP` and file watch.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    admin_backends, config_yaml, metric_value, metrics, post_reload, Behavior, Gateway, TestBackend,
};
use futures::StreamExt;
use serde_json::Value;

/// A pool `m` over `backends` (name, url, extra fields).
fn pool_m(policy: &str, backends: &[(&str, String, &str)]) -> String {
    let mut s = format!("  m:\n    policy: {policy}\n    backends:\n");
    for (name, url, extra) in backends {
        s.push_str(&format!("      - {{name: {name}, url: '{url}'{extra}}}\n"));
    }
    s
}

/// A full config (without listeners): explanation headers on, watch as given.
fn config(pools: &str, reload: &str) -> String {
    config_yaml(pools, &format!("explain_headers: true\nreload: {reload}\n"))
}

fn streaming_body() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "stream": true,
        "messages": [{"role": "user", "content": "hello there"}],
    }))
    .unwrap()
}

async fn admin_config(gw: &Gateway) -> Value {
    reqwest::get(gw.admin_url("/admin/config"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn reloads(metrics: &str, result: &str) -> f64 {
    metric_value(
        metrics,
        &format!("pronto_config_reloads_total{{result=\"{result}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Poll `/admin/config` until `done(status)` holds; panics after 15 s.
async fn config_when(gw: &Gateway, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = admin_config(gw).await;
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "gave up waiting: {status:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One streamed chat request: `Ok((backend, saw [DONE]))`, or what went wrong.
async fn stream_once(client: &reqwest::Client, gw: &Gateway) -> Result<(String, bool), String> {
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(streaming_body())
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = r.status();
    let backend = r
        .headers()
        .get("x-pronto-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = r.text().await.map_err(|e| format!("body: {e}"))?;
    if !status.is_success() {
        return Err(format!("{status}: {text}"));
    }
    Ok((backend, text.contains("data: [DONE]")))
}

/// Backend names and their `ttft_samples` from `/admin/backends`.
async fn ttft_samples(gw: &Gateway) -> Vec<(String, u64)> {
    admin_backends(gw)
        .await
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["ttft_samples"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_reloads_under_streaming_load_lose_nothing() {
    let slow = Behavior {
        tokens: 8,
        token_delay: Duration::from_millis(2),
        ..Behavior::default()
    };
    let b0 = TestBackend::start("b0", slow.clone()).await;
    let b1 = TestBackend::start("b1", slow.clone()).await;
    let b2 = TestBackend::start("b2", slow).await;
    // A and B differ in a backend (b1 / b2) and in the policy.
    let a = config(
        &pool_m(
            "least_inflight",
            &[("b0", b0.url(), ""), ("b1", b1.url(), "")],
        ),
        "{watch: false}",
    );
    let b = config(
        &pool_m("round_robin", &[("b0", b0.url(), ""), ("b2", b2.url(), "")]),
        "{watch: false}",
    );
    let gw = Arc::new(Gateway::start(&a));

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let truncated = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for _ in 0..6 {
        let (gw, stop, ok, truncated, failed) = (
            Arc::clone(&gw),
            Arc::clone(&stop),
            Arc::clone(&ok),
            Arc::clone(&truncated),
            Arc::clone(&failed),
        );
        workers.push(tokio::spawn(async move {
            let client = common::client(false);
            while !stop.load(Ordering::SeqCst) {
                match stream_once(&client, &gw).await {
                    Ok((_, true)) => ok.fetch_add(1, Ordering::SeqCst),
                    Ok((_, false)) => truncated.fetch_add(1, Ordering::SeqCst),
                    Err(e) => {
                        failed.lock().unwrap().push(e);
                        0
                    }
                };
            }
        }));
    }

    let started = Instant::now();
    let mut applied = 0;
    for i in 0..100 {
        gw.write_config(if i % 2 == 0 { &b } else { &a });
        let (status, report) = post_reload(&gw).await;
        assert_eq!(status, 200, "{report:#}");
        assert_eq!(report["result"], "ok", "{report:#}");
        applied += 1;
        assert_eq!(report["version"], 1 + applied);
        // Let some requests run on this config before the next swap.
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let reload_phase = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let (ok, truncated) = (ok.load(Ordering::SeqCst), truncated.load(Ordering::SeqCst));
    let failed = failed.lock().unwrap().clone();
    println!(
        "reload under load: {applied} reloads in {:.2}s, {} streamed requests completed, \
         {} truncated, {} failed; backends saw b0={} b1={} b2={}",
        reload_phase.as_secs_f64(),
        ok,
        truncated,
        failed.len(),
        b0.requests(),
        b1.requests(),
        b2.requests()
    );
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert_eq!(truncated, 0, "truncated streams");
    assert!(ok >= 100, "the load generator ran alongside: {ok} requests");
    assert!(
        b1.requests() > 0 && b2.requests() > 0,
        "both configs served traffic"
    );
    let m = metrics(&gw).await;
    assert_eq!(reloads(&m, "ok"), 100.0);
    assert_eq!(reloads(&m, "error"), 0.0);
    assert_eq!(metric_value(&m, "pronto_config_version"), Some(101.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_files_change_nothing_and_say_where() {
    let b0 = TestBackend::start("b0", Behavior::default()).await;
    let good = config(
        &pool_m("round_robin", &[("b0", b0.url(), "")]),
        "{watch: false}",
    );
    let gw = Gateway::start(&good);
    let before = admin_config(&gw).await;
    let head = format!("listen: {}\nadmin_listen: {}\n", gw.listen, gw.admin);
    // (file text, expected `line:col: path: message` fragment)
    let cases = [
        (
            format!("{head}pools:\n  m:\n    backends: [}}\n"),
            ":5:16: did not find expected node content".to_string(),
        ),
        (
            good.replace("name: b0,", "name: b0, wieght: 2,"),
            "pools.m.backends[0].wieght: unknown field `wieght`".to_string(),
        ),
        (
            good.replace(
                "policy: round_robin",
                "policy: {name: cache_aware, cache_threshold: 2}",
            ),
            "pools.m.policy.cache_threshold: must be in 0..=1".to_string(),
        ),
    ];
    let client = common::client(false);
    for (i, (text, expected)) in cases.iter().enumerate() {
        if i == 0 {
            gw.write_raw_config(text);
        } else {
            gw.write_config(text);
        }
        let (status, report) = post_reload(&gw).await;
        assert_eq!(status, 400, "{report:#}");
        assert_eq!(report["result"], "error");
        assert_eq!(report["version"], 1);
        let error = report["error"].as_str().unwrap();
        println!("as a user sees it: {error}");
        let path = gw.config_path.display().to_string();
        assert!(error.starts_with(&format!("{path}:")), "{error}");
        assert!(
            error.contains(expected.as_str()),
            "{error} lacks {expected}"
        );
        let status = admin_config(&gw).await;
        assert_eq!(status["last_error"]["message"], error);
        assert_eq!(status["version"], 1);
        assert_eq!(status["hash"], before["hash"]);
        assert_eq!(status["config"], before["config"]);
        // The old config keeps serving.
        let (backend, done) = stream_once(&client, &gw).await.unwrap();
        assert_eq!((backend.as_str(), done), ("b0", true));
    }
    let m = metrics(&gw).await;
    assert_eq!(reloads(&m, "error"), 3.0);
    assert_eq!(reloads(&m, "ok"), 0.0);
    assert_eq!(
        metric_value(&m, "pronto_config_last_reload_successful"),
        Some(0.0)
    );
    // A fixed file applies and clears the error.
    gw.write_config(&good.replace("round_robin", "least_inflight"));
    let (status, report) = post_reload(&gw).await;
    assert_eq!((status, report["result"].as_str()), (200, Some("ok")));
    assert!(admin_config(&gw).await["last_error"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_backend_of_an_open_stream_lets_it_finish() {
    const TOKENS: usize = 40;
    let slow = TestBackend::start(
        "slow",
        Behavior {
            tokens: TOKENS,
            token_delay: Duration::from_millis(100),
            ..Behavior::default()
        },
    )
    .await;
    let fast = TestBackend::start("fast", Behavior::default()).await;
    let gw = Gateway::start(&config(
        &pool_m("least_inflight", &[("slow", slow.url(), "")]),
        "{watch: false}",
    ));
    let client = common::client(false);
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .body(streaming_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-pronto-backend"], "slow");
    let mut body = r.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));

    gw.write_config(&config(
        &pool_m("least_inflight", &[("fast", fast.url(), "")]),
        "{watch: false}",
    ));
    let (status, report) = post_reload(&gw).await;
    assert_eq!((status, report["result"].as_str()), (200, Some("ok")));
    assert_eq!(report["backends_removed"], serde_json::json!(["slow"]));
    let sent_at_reload = slow.state.seen.tokens_sent.load(Ordering::SeqCst);
    let m = metrics(&gw).await;
    assert_eq!(
        metric_value(&m, "pronto_backend_healthy{backend=\"slow\"}"),
        None,
        "a removed backend's gauges are withdrawn"
    );
    assert_eq!(
        metric_value(&m, "pronto_backend_healthy{backend=\"fast\"}"),
        Some(1.0)
    );
    assert!(
        sent_at_reload < TOKENS,
        "the stream was open across the reload"
    );

    for _ in 0..5 {
        let (backend, done) = stream_once(&client, &gw).await.unwrap();
        assert_eq!((backend.as_str(), done), ("fast", true));
    }
    assert_eq!(
        slow.requests(),
        1,
        "no new request reached the removed backend"
    );

    let mut rest = first.to_vec();
    while let Some(chunk) = body.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(rest).unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "stream completed: {text}"
    );
    assert_eq!(text.matches("\"content\":\"t").count(), TOKENS);
    assert_eq!(slow.state.seen.cancelled.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_once() {
    let b0 = TestBackend::start("b0", Behavior::default()).await;
    let pools = pool_m("round_robin", &[("b0", b0.url(), "")]);
    let gw = Gateway::start_process(&config(&pools, "{watch: false}"));
    gw.write_config(&config(
        &pools.replace("round_robin", "least_inflight"),
        "{watch: false}",
    ));
    gw.signal("HUP");
    let status = config_when(&gw, |s| s["version"] == 2).await;
    assert_eq!(status["last_reload"]["trigger"], "signal");
    assert_eq!(
        status["config"]["pools"]["m"]["policy"]["name"],
        "least_inflight"
    );
    // Unchanged file: the signal is answered, nothing swapped.
    gw.signal("HUP");
    let m = common::metrics_when(&gw, |m| reloads(m, "unchanged") >= 1.0).await;
    assert_eq!(
        (
            reloads(&m, "ok"),
            reloads(&m, "unchanged"),
            reloads(&m, "error")
        ),
        (1.0, 1.0, 0.0)
    );
    assert_eq!(admin_config(&gw).await["version"], 2);
    let (backend, done) = stream_once(&common::client(false), &gw).await.unwrap();
    assert_eq!(
        (backend.as_str(), done),
        ("b0", true),
        "still serving after SIGHUP"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_watch_reloads_each_change_once() {
    let b0 = TestBackend::start("b0", Behavior::default()).await;
    let pools = pool_m("round_robin", &[("b0", b0.url(), "")]);
    let watch = "{watch: true, watch_interval: 100ms}";
    let gw = Gateway::start(&config(&pools, watch));
    gw.write_config(&config(
        &pools.replace("round_robin", "least_inflight"),
        watch,
    ));
    let status = config_when(&gw, |s| s["version"] == 2).await;
    assert_eq!(status["last_reload"]["trigger"], "watch");
    // A broken file is reported once, however many polls see it.
    gw.write_config(&config(
        &pools.replace("round_robin", "no_such_policy"),
        watch,
    ));
    let status = config_when(&gw, |s| !s["last_error"].is_null()).await;
    assert!(
        status["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("pools.m.policy: unknown policy `no_such_policy`"),
        "{status:#}"
    );
    // Ten more polls see the same broken file.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let m = metrics(&gw).await;
    assert_eq!(
        (
            reloads(&m, "ok"),
            reloads(&m, "unchanged"),
            reloads(&m, "error")
        ),
        (1.0, 0.0, 1.0)
    );
    assert_eq!(admin_config(&gw).await["version"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_backends_keep_what_they_learned() {
    let b0 = TestBackend::start("b0", Behavior::default()).await;
    let b1 = TestBackend::start("b1", Behavior::default()).await;
    let b2 = TestBackend::start("b2", Behavior::default()).await;
    let gw = Gateway::start(&config(
        &pool_m("round_robin", &[("b0", b0.url(), ""), ("b1", b1.url(), "")]),
        "{watch: false}",
    ));
    let client = common::client(false);
    for _ in 0..6 {
        assert!(stream_once(&client, &gw).await.unwrap().1);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let learned = loop {
        let s = ttft_samples(&gw).await;
        if s.iter().map(|(_, n)| n).sum::<u64>() == 6 || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(learned, [("b0".to_string(), 3), ("b1".to_string(), 3)]);

    // b0 unchanged, b1's weight edited (a changed backend), b2 added.
    gw.write_config(&config(
        &pool_m(
            "round_robin",
            &[
                ("b0", b0.url(), ""),
                ("b1", b1.url(), ", weight: 2"),
                ("b2", b2.url(), ""),
            ],
        ),
        "{watch: false}",
    ));
    let (status, report) = post_reload(&gw).await;
    assert_eq!(status, 200, "{report:#}");
    assert_eq!(
        (
            report["backends_kept"].as_u64(),
            report["backends_new"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert_eq!(
        ttft_samples(&gw).await,
        [
            ("b0".to_string(), 3),
            ("b1".to_string(), 0),
            ("b2".to_string(), 0)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_file_reload_is_refused_and_sighup_ignored() {
    let b0 = TestBackend::start("b0", Behavior::default()).await;
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    // Free ports can be taken by a parallel test between the check and pronto's bind: a port
    // that answers is only ours once our `/readyz` does and the child is still alive; if pronto
    // exited (bind failed), start again on fresh ports.
    let (mut child, listen, admin) = 'start: {
        for _ in 0..5 {
            let (listen, admin) = (port(), port());
            let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pronto"))
                .args(["serve", "--backend", &b0.url(), "--model", "m"])
                .args([
                    "--listen",
                    &listen.to_string(),
                    "--admin-listen",
                    &admin.to_string(),
                ])
                .env("RUST_LOG", "warn")
                .spawn()
                .expect("spawn pronto");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                let ready = reqwest::get(format!("http://{admin}/readyz"))
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ready && std::net::TcpStream::connect(listen).is_ok() {
                    if child.try_wait().unwrap().is_none() {
                        break 'start (child, listen, admin);
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("gateway did not start on free ports in 5 attempts");
    };
    let r = reqwest::Client::new()
        .post(format!("http://{admin}/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["result"], "error");
    assert!(
        body["error"].as_str().unwrap().contains("--config"),
        "{body}"
    );
    let status: Value = reqwest::get(format!("http://{admin}/admin/config"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(status["path"].is_null());
    assert_eq!(status["version"], 1);
    std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    // Still alive and serving after the signal.
    let r = common::client(false)
        .post(format!("http://{listen}/v1/chat/completions"))
        .body(streaming_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.unwrap().contains("[DONE]"));
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP did not kill it"
    );
    let _ = child.kill();
    let _ = child.wait();
}
