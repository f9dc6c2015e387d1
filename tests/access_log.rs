//! The access log and request ids, end to end.
//!
//! The `pronto` binary with `--log-format json` in front of the in-process simulated fleet:
//! every field of the `pronto::access` line of a success, a gateway error (404 model) and a
//! retried request; `access_log.sample_rate: 0` writes nothing (and a reload to 1 does). The
//! request id round trip runs against backends that record the headers they receive.

mod common;

use common::{config_yaml, pool, Behavior, Gateway, TestBackend};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::{json, Value};

const MODEL: &str = "sim-model";
const KEY: &str = "sk-access-log-test-key";

/// Two simulated backends: `b0` fails every generation with 500, `b1` serves.
async fn fleet() -> SimFleet {
    let yaml = format!(
        "model: {MODEL}\nbackends:\n  \
         - {{ name: b0, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0, faults: {{ error_rate: 1.0 }} }}\n  \
         - {{ name: b1, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n"
    );
    let config = FleetConfig::parse(&yaml, "access-log").unwrap();
    SimFleet::start(&config, 0.05).await.unwrap()
}

/// Route `flaky` (header `x-test: flaky`) goes to a pool whose first backend always fails;
/// route `chat` to a pool of the good one only.
fn gateway_yaml(fleet: &SimFleet, access_log: &str) -> String {
    let urls = fleet.urls();
    format!(
        "threads: 2\ngrace_period: 5s\n\
         health: {{interval: 200ms, timeout: 500ms, eject_after_failures: 1000, readmit_after: 1s}}\n\
         retry: {{max_retries: 1}}\n\
         {access_log}\
         auth:\n  keys:\n    - {{name: team-a, key: {KEY}}}\n\
         routes:\n  \
         - {{name: flaky, match: {{model: {MODEL}, headers: {{x-test: flaky}}}}, pool: flaky}}\n  \
         - {{name: chat, match: {{model: {MODEL}}}, pool: steady, max_retries: 0}}\n\
         pools:\n  \
         steady:\n    policy: predicted_ttft\n    backends:\n      - {{name: good, url: '{u1}'}}\n  \
         flaky:\n    policy: round_robin\n    backends:\n      \
         - {{name: broken, url: '{u0}'}}\n      - {{name: good-too, url: '{u1}'}}\n",
        u0 = urls[0],
        u1 = urls[1],
    )
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 4,
           "messages": [{"role": "user", "content": "the access log, field by field"}]})
}

async fn send(gw: &Gateway, id: &str, body: &Value, flaky: bool) -> (u16, String, Vec<u8>) {
    let mut req = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-request-id", id)
        .json(body);
    if flaky {
        req = req.header("x-test", "flaky");
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let echoed = r.headers()["x-request-id"].to_str().unwrap().to_string();
    (status, echoed, r.bytes().await.unwrap().to_vec())
}

/// The access line (a JSON object) of request `id`.
async fn access_line(gw: &Gateway, id: &str) -> Value {
    let line = gw
        .wait_for_log(|l| l.contains("pronto::access") && l.contains(id))
        .await
        .unwrap_or_else(|| panic!("no access line for {id} in {:#?}", gw.log_lines()));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

fn ms(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_access_log_has_every_field() {
    let fleet = fleet().await;
    let gw = Gateway::start_process_with(&gateway_yaml(&fleet, ""), &["--log-format", "json"]);

    // A streamed success.
    let (status, echoed, body) = send(&gw, "ok-1", &chat(MODEL, true), false).await;
    assert_eq!((status, echoed.as_str()), (200, "ok-1"));
    let v = access_line(&gw, "ok-1").await;
    assert_eq!(v["target"], "pronto::access");
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["message"], "access");
    assert!(v["timestamp"].as_str().is_some_and(|t| t.len() > 10), "{v}");
    assert_eq!(v["request_id"], "ok-1");
    assert_eq!(v["method"], "POST");
    assert_eq!(v["path"], "/v1/chat/completions");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["stream"], true);
    assert_eq!(v["route"], "chat");
    assert_eq!(v["pool"], "steady");
    assert_eq!(v["key"], "team-a");
    assert_eq!(v["backend"], "good");
    assert_eq!(v["attempts"], 1);
    assert_eq!(v["status"], 200);
    assert_eq!(v["end"], "complete");
    let sent = serde_json::to_vec(&chat(MODEL, true)).unwrap().len() as u64;
    assert_eq!(v["request_bytes"], sent);
    assert_eq!(v["response_bytes"], body.len() as u64);
    let (ttft, upstream, total) = (
        ms(&v, "ttft_ms"),
        ms(&v, "upstream_ttft_ms"),
        ms(&v, "duration_ms"),
    );
    assert!(
        0.0 < upstream && upstream <= ttft && ttft <= total,
        "{upstream} {ttft} {total}"
    );
    // No reasoning: the first answer is the first token.
    assert_eq!(ms(&v, "ttfa_ms"), ttft, "{v}");
    assert_eq!(v["reasoning_tokens"], 0, "{v}");
    assert!(["predicted_best", "explore", "fallback"].contains(&v["reason"].as_str().unwrap()));
    assert!(ms(&v, "predicted_ttft_ms") > 0.0, "{v}");
    assert!(v.get("error").is_none(), "{v}");

    // A gateway error: no route for the model.
    let (status, echoed, body) = send(&gw, "err-1", &chat("no-such-model", false), false).await;
    assert_eq!((status, echoed.as_str()), (404, "err-1"));
    let v = access_line(&gw, "err-1").await;
    assert_eq!(v["status"], 404);
    assert_eq!(v["error"], "model_not_found");
    assert_eq!(v["model"], "no-such-model");
    assert_eq!(v["stream"], false);
    assert_eq!(v["key"], "team-a");
    assert_eq!(v["attempts"], 0);
    assert_eq!(v["response_bytes"], body.len() as u64);
    assert!(ms(&v, "duration_ms") >= 0.0);
    for absent in [
        "route",
        "pool",
        "backend",
        "reason",
        "predicted_ttft_ms",
        "ttft_ms",
        "upstream_ttft_ms",
        "ttfa_ms",
        "reasoning_tokens",
        "end",
    ] {
        assert!(v.get(absent).is_none(), "{absent} in {v}");
    }

    // A retried request: `broken` answers 500, `good-too` serves it.
    let (status, echoed, _) = send(&gw, "retry-1", &chat(MODEL, false), true).await;
    assert_eq!((status, echoed.as_str()), (200, "retry-1"));
    let v = access_line(&gw, "retry-1").await;
    assert_eq!(v["route"], "flaky");
    assert_eq!(v["pool"], "flaky");
    assert_eq!(v["backend"], "good-too");
    assert_eq!(v["attempts"], 2);
    assert_eq!(v["reason"], "round_robin");
    assert_eq!(v["status"], 200);
    assert_eq!(v["stream"], false);
    assert!(v.get("ttft_ms").is_none(), "not a stream: {v}");
    assert!(ms(&v, "predicted_ttft_ms") > 0.0, "{v}");
    // The failed attempt is logged with the same request id.
    let failed = gw
        .wait_for_log(|l| l.contains("attempt failed") && l.contains("retry-1"))
        .await;
    assert!(failed.is_some_and(|l| l.contains("broken")));

    // `recent_decisions` on the admin listener has these requests, newest first.
    let b: Value = reqwest::get(gw.admin_url("/admin/backends"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let recent = b["recent_decisions"].as_array().unwrap();
    let ids: Vec<&str> = recent
        .iter()
        .map(|d| d["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["retry-1", "ok-1"], "the 404 made no decision");
    assert_eq!(recent[0]["backend"], "good-too");
    assert_eq!(recent[0]["pool"], "flaky");
    assert!(recent[1]["actual_ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(recent[1]["predicted_ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(recent[1]["at_ms"].as_u64().unwrap() > 1_600_000_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_rate_zero_writes_nothing_until_reloaded_to_one() {
    let fleet = fleet().await;
    let yaml = |log: &str| gateway_yaml(&fleet, log);
    let gw = Gateway::start_process_with(
        &yaml("access_log: {sample_rate: 0}\n"),
        &["--log-format", "json"],
    );
    for i in 0..5 {
        let (status, _, _) =
            send(&gw, &format!("quiet-{i}"), &chat(MODEL, i % 2 == 0), false).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        send(&gw, "quiet-404", &chat("nope", false), false).await.0,
        404
    );
    // A request's line is written before it is counted; the reload's line comes after all.
    common::metrics_when(&gw, |m| {
        common::metric_value(
            m,
            r#"pronto_requests_total{backend="good",code="200",pool="steady"}"#,
        ) == Some(5.0)
            && common::metric_value(
                m,
                r#"pronto_requests_total{backend="none",code="404",pool="none"}"#,
            ) == Some(1.0)
    })
    .await;
    let reloads = |lines: &[String]| lines.iter().filter(|l| l.contains("config reload")).count();
    let before = reloads(&gw.log_lines());
    let (status, _) = common::post_reload(&gw).await;
    assert_eq!(status, 200);
    // The reload logs before it answers; wait for its line to be read.
    assert!(gw.wait_for_lines(|lines| reloads(lines) > before).await);
    let lines = gw.log_lines();
    let logged: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("pronto::access"))
        .collect();
    assert!(logged.is_empty(), "{logged:#?}");

    gw.write_config(&yaml("access_log: {enabled: true, sample_rate: 1}\n"));
    let (status, _) = common::post_reload(&gw).await;
    assert_eq!(status, 200);
    send(&gw, "loud-1", &chat(MODEL, false), false).await;
    assert_eq!(access_line(&gw, "loud-1").await["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_go_upstream_and_come_back_given_or_generated() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let b = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[a.url(), b.url()]),
        "retry: {max_retries: 1}\n",
    ));
    let client = reqwest::Client::new();
    let post = |id: Option<&str>, model: &str| {
        let mut r = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat(model, false));
        if let Some(id) = id {
            r = r.header("x-request-id", id);
        }
        r.send()
    };
    let seen = |backend: &TestBackend| -> Vec<String> {
        backend
            .state
            .seen
            .headers
            .lock()
            .unwrap()
            .iter()
            .map(|h| {
                let all: Vec<_> = h.get_all("x-request-id").iter().collect();
                assert_eq!(all.len(), 1, "one x-request-id upstream: {h:?}");
                all[0].to_str().unwrap().to_string()
            })
            .collect()
    };
    let all_seen = || [seen(&a), seen(&b)].concat();

    // Given: kept, sent upstream, returned.
    let r = post(Some("client-chosen-id.42"), "m").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "client-chosen-id.42");
    assert_eq!(all_seen(), ["client-chosen-id.42"]);

    // None given: generated (32 hex digits), the same upstream and back.
    let r = post(None, "m").await.unwrap();
    let generated = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(generated.len(), 32);
    assert!(generated.bytes().all(|c| c.is_ascii_hexdigit()));
    assert!(all_seen().contains(&generated));

    // Not a valid id (a space; too long): replaced, never forwarded.
    for bad in ["two words".to_string(), "x".repeat(129)] {
        let r = post(Some(&bad), "m").await.unwrap();
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert_ne!(id, bad);
        assert_eq!(id.len(), 32);
        assert!(all_seen().contains(&id) && !all_seen().contains(&bad));
    }

    // Errors carry it too: Pronto's own (404 model, 404 path, 405) and a backend's.
    let r = post(Some("err-id"), "not-served").await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-request-id"], "err-id");
    for (method, path, status) in [
        (reqwest::Method::GET, "/nowhere", 404),
        (reqwest::Method::GET, "/v1/chat/completions", 405),
        (reqwest::Method::GET, "/v1/models", 200),
    ] {
        let r = client
            .request(method, gw.url(path))
            .header("x-request-id", "other-id")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{path}");
        assert_eq!(r.headers()["x-request-id"], "other-id", "{path}");
    }

    // A retried request: both attempts carry the same id.
    let before = all_seen().len();
    a.set(|x| x.fail_next = 5);
    b.set(|x| x.fail_next = 1);
    let r = post(Some("retried-id"), "m").await.unwrap();
    assert_eq!(r.status(), 503, "both attempts failed");
    assert_eq!(r.headers()["x-request-id"], "retried-id");
    let after = all_seen();
    assert_eq!(after.len(), before + 2);
    assert_eq!(
        after.iter().filter(|i| *i == "retried-id").count(),
        2,
        "{after:?}"
    );
}
