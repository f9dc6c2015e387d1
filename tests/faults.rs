//! The fault suite: the `pronto` binary in front of the in-process simulated fleet, driven
//! through the simulator's fault knobs ([`pronto_sim::fleet_faults`]). Each test asserts what
//! the client sees (a clear status or error event, never a hang: every wait is bounded), that
//! healthy backends are not ejected, and the order of recovery. Recovery times are printed
//! (`--nocapture`) for the report and checked against a bound derived from the health
//! settings (`recovery_bound`): what the design promises, with slack for a loaded machine.

mod common;

use std::time::{Duration, Instant};

use common::{admin_backends, config_yaml, Gateway};
use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::{json, Value};

const MODEL: &str = "sim-model";
const SCALE: f64 = 0.05;
/// Upper bound on any wait (a hang fails instead of blocking).
const BOUND: Duration = Duration::from_secs(20);
/// The test defaults' health settings (`common::config_yaml`).
const HEALTH_INTERVAL: Duration = Duration::from_millis(200);
const READMIT_AFTER: Duration = Duration::from_secs(1);

/// How soon a backend must serve again once its fault is gone (`down`: how long the fault
/// itself keeps it unavailable): its restart, the passive re-admission delay, two health
/// rounds to notice it is up, and 3 s of slack for a shared machine.
fn recovery_bound(down: Duration) -> Duration {
    down + READMIT_AFTER + 2 * HEALTH_INTERVAL + Duration::from_secs(3)
}

async fn fleet(n: usize, faults: &str) -> SimFleet {
    let mut yaml = format!("model: {MODEL}\nbackends:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: b{i}, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0, faults: {{ restart_after: 1s{faults} }} }}\n"
        ));
    }
    let config = FleetConfig::parse(&yaml, "faults").unwrap();
    SimFleet::start(&config, SCALE).await.unwrap()
}

fn gateway(fleet: &SimFleet, extra: &str) -> Gateway {
    let mut pool = format!("  {MODEL}:\n    policy: round_robin\n    backends:\n");
    for (i, u) in fleet.urls().iter().enumerate() {
        pool.push_str(&format!("      - name: b{i}\n        url: {u}\n"));
    }
    Gateway::start(&config_yaml(
        &pool,
        &format!("explain_headers: true\nretry: {{max_retries: 2}}\n{extra}"),
    ))
}

fn chat(tag: &str, max_tokens: u32, stream: bool) -> Value {
    let text: String = (0..40).map(|i| format!(" {tag}{i}")).collect();
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}],
           "max_tokens": max_tokens, "stream": stream})
}

#[derive(Debug)]
struct Reply {
    status: u16,
    backend: Option<String>,
    body: String,
}

async fn send(gw: &Gateway, tag: &str) -> Reply {
    send_as(gw, tag, false).await
}

async fn send_as(gw: &Gateway, tag: &str, stream: bool) -> Reply {
    let r = tokio::time::timeout(
        BOUND,
        reqwest::Client::new()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat(tag, 4, stream))
            .send(),
    )
    .await
    .expect("no hang")
    .unwrap();
    let backend = r
        .headers()
        .get("x-pronto-backend")
        .map(|v| v.to_str().unwrap().to_string());
    Reply {
        status: r.status().as_u16(),
        backend,
        body: r.text().await.unwrap(),
    }
}

fn code(body: &str) -> String {
    serde_json::from_str::<Value>(body).unwrap()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `(healthy, ejected)` of every backend, by name, from `/admin/backends`.
async fn backends(gw: &Gateway) -> Vec<(String, bool, bool)> {
    admin_backends(gw)
        .await
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["healthy"].as_bool().unwrap(),
                b["ejected"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Send requests until one is served by `backend` (or BOUND): the time it took.
async fn until_served_by(gw: &Gateway, backend: &str) -> Duration {
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < BOUND {
        let r = send(gw, &format!("probe{i}")).await;
        if r.status == 200 && r.backend.as_deref() == Some(backend) {
            return start.elapsed();
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{backend} never served again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_crash_mid_stream() {
    let fleet = fleet(3, "").await;
    // Without stream migration (tests/migration.rs has it on).
    let gw = gateway(&fleet, "migration: {max_attempts: 0}\n");
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("crash", 4000, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let victim = resp.headers()["x-pronto-backend"]
        .to_str()
        .unwrap()
        .to_string();
    let index: usize = victim[1..].parse().unwrap();
    let mut stream = resp.bytes_stream();
    let mut seen = Vec::new();
    // Crash once the first token has arrived.
    while !String::from_utf8_lossy(&seen).contains("\"content\"") {
        seen.extend_from_slice(&stream.next().await.unwrap().unwrap());
    }
    let crashed_at = Instant::now();
    fleet.faults(index).crash();
    let rest = tokio::time::timeout(BOUND, async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen.extend_from_slice(&chunk);
        }
    })
    .await;
    assert!(rest.is_ok(), "the client stream ended instead of hanging");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        !text.contains("[DONE]"),
        "a cut stream must not look complete"
    );
    // Other backends keep serving at once; none of them is ejected.
    for i in 0..4 {
        let r = send(&gw, &format!("after{i}")).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    for (name, healthy, ejected) in backends(&gw).await {
        if name != victim {
            assert!(healthy && !ejected, "{name} was ejected");
        }
    }
    let back = until_served_by(&gw, &victim).await;
    println!(
        "FAULT crash-mid-stream: client saw a truncated stream without [DONE]; {victim} served again {:.2}s after the crash",
        back.max(crashed_at.elapsed()).as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_before_first_token() {
    let fleet = fleet(3, "").await;
    let gw = gateway(&fleet, "limits: {first_token_timeout: 500ms}\n");
    fleet
        .faults(1)
        .set_stall_first_token(Some(Duration::from_secs(30)));
    let mut statuses = Vec::new();
    for i in 0..6 {
        // Streaming: the first-token deadline applies (a non-streamed answer has only the
        // idle timeout, limits.idle_timeout).
        let r = send_as(&gw, &format!("stall{i}"), true).await;
        if r.status != 200 {
            assert_eq!(
                (r.status, code(&r.body).as_str()),
                (504, "first_token_timeout"),
                "{r:?}"
            );
        } else {
            assert_ne!(r.backend.as_deref(), Some("b1"));
        }
        statuses.push(r.status);
    }
    assert!(
        statuses.contains(&504) && statuses.contains(&200),
        "{statuses:?}"
    );
    for (name, healthy, ejected) in backends(&gw).await {
        if name != "b1" {
            assert!(healthy && !ejected, "{name} was ejected");
        }
    }
    let cleared = Instant::now();
    fleet.faults(1).set_stall_first_token(None);
    let back = until_served_by(&gw, "b1").await;
    println!(
        "FAULT stall-before-first-token: {} of 6 got 504 first_token_timeout after 500ms, the rest 200; b1 served again {:.2}s after the stall cleared",
        statuses.iter().filter(|s| **s == 504).count(),
        cleared.elapsed().max(back).as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_5xx_is_retried_and_the_backend_ejected_then_readmitted() {
    let fleet = fleet(3, "").await;
    let gw = gateway(&fleet, "");
    fleet.faults(0).set_error_rate(1.0);
    for i in 0..9 {
        let r = send(&gw, &format!("burst{i}")).await;
        assert_eq!(r.status, 200, "retried on another backend: {r:?}");
        assert_ne!(r.backend.as_deref(), Some("b0"));
    }
    let state = backends(&gw).await;
    assert!(
        state.iter().any(|(n, _, ejected)| n == "b0" && *ejected),
        "{state:?}"
    );
    assert!(
        state
            .iter()
            .filter(|(n, ..)| n != "b0")
            .all(|(_, h, e)| *h && !*e),
        "{state:?}"
    );
    let cleared = Instant::now();
    fleet.faults(0).set_error_rate(0.0);
    let back = until_served_by(&gw, "b0").await;
    let took = cleared.elapsed().max(back);
    println!(
        "FAULT 5xx-burst: 9/9 clients got 200 (retried), b0 ejected, served again {:.2}s after the burst ended",
        took.as_secs_f64()
    );
    assert!(took <= recovery_bound(Duration::ZERO), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_backend() {
    let fleet = fleet(3, "").await;
    let gw = gateway(&fleet, "");
    let flapper = fleet.faults(2);
    flapper.set_restart_after(Duration::from_millis(300));
    let mut ok = 0;
    let mut other = Vec::new();
    for i in 0..30 {
        if i % 5 == 0 {
            flapper.crash();
        }
        let r = send(&gw, &format!("flap{i}")).await;
        if r.status == 200 {
            ok += 1;
        } else {
            other.push((r.status, code(&r.body)));
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    // Failures before the first byte are retried elsewhere: every client got an answer,
    // errors (if any) are explicit statuses.
    assert!(ok >= 27, "{ok}/30 ok; others {other:?}");
    for (name, healthy, ejected) in backends(&gw).await {
        if name != "b2" {
            assert!(healthy && !ejected, "{name} was ejected");
        }
    }
    let stopped = Instant::now();
    let back = until_served_by(&gw, "b2").await;
    let took = stopped.elapsed().max(back);
    println!(
        "FAULT flapping (crash every 5 requests, 300ms down): {ok}/30 got 200, others {other:?}; b2 served again {:.2}s after flapping stopped",
        took.as_secs_f64()
    );
    assert!(
        took <= recovery_bound(Duration::from_millis(300)),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_backends_down_then_back() {
    let fleet = fleet(3, "").await;
    let gw = gateway(&fleet, "");
    assert_eq!(send(&gw, "warm").await.status, 200);
    let down_at = Instant::now();
    for i in 0..3 {
        fleet.faults(i).crash();
    }
    // Every backend answers 503 while restarting: after the retries the client gets the
    // last 503 with the engine's explanation (or the gateway's own once all are ejected).
    let r = send(&gw, "down").await;
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.body.contains("error"), "{r:?}");
    // Then the fleet restarts (restart_after 1s): the first 200 marks recovery.
    let mut first_ok = None;
    let mut errors = 1;
    while down_at.elapsed() < BOUND {
        let r = send(&gw, "retry").await;
        if r.status == 200 {
            first_ok = Some(down_at.elapsed());
            break;
        }
        assert_eq!(r.status, 503, "{r:?}");
        errors += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = first_ok.expect("the gateway serves again once the fleet is back");
    assert!(
        recovered <= recovery_bound(Duration::from_secs(1)),
        "{recovered:?}"
    );
    for i in 0..6 {
        assert_eq!(send(&gw, &format!("after{i}")).await.status, 200);
    }
    println!(
        "FAULT all-down: {errors} clients got 503 (engine's 'restarting' error, then no_backend_available once ejected) while down; first 200 {:.2}s after the crash (fleet restart 1s)",
        recovered.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_fleet_times_out_without_ejecting_anyone() {
    // Two backends at the modelled GPUs' speed with room for a few long prompts at a time:
    // 24 concurrent 2000-token prompts queue in the engines, and the later ones miss a
    // 300 ms first-token deadline. The queue explains those timeouts: no backend is ejected.
    let mut yaml = format!("model: {MODEL}\nbackends:\n");
    for i in 0..2 {
        yaml.push_str(&format!(
            "  - {{ name: b{i}, profile: h100-llama3-8b, num_kv_blocks: 400, port: 0 }}\n"
        ));
    }
    let config = FleetConfig::parse(&yaml, "overload").unwrap();
    let fleet = SimFleet::start(&config, 1.0).await.unwrap();
    let gw = gateway(&fleet, "limits: {first_token_timeout: 300ms}\n");
    let long = |i: usize| {
        let text: String = (0..1500).map(|w| format!(" o{i}w{w}")).collect();
        json!({"model": MODEL, "messages": [{"role": "user", "content": text}],
               "max_tokens": 64, "stream": true})
    };
    let mut tasks = Vec::new();
    for i in 0..24 {
        let (url, body) = (gw.url("/v1/chat/completions"), long(i));
        tasks.push(tokio::spawn(async move {
            let r =
                tokio::time::timeout(BOUND, reqwest::Client::new().post(url).json(&body).send())
                    .await
                    .expect("no hang")
                    .unwrap();
            let status = r.status().as_u16();
            let _ = r.text().await;
            status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let timeouts = statuses.iter().filter(|&&s| s == 504).count();
    println!("FAULT overload: statuses {statuses:?}");
    assert!(
        statuses.iter().all(|s| matches!(s, 200 | 504)),
        "{statuses:?}"
    );
    assert!(
        timeouts >= 1,
        "the load never queued past the deadline: {statuses:?}"
    );
    for (name, healthy, ejected) in backends(&gw).await {
        assert!(
            healthy && !ejected,
            "{name} was ejected by overload timeouts"
        );
    }
    assert_eq!(send(&gw, "after the storm").await.status, 200);
}
