//! Pools whose backends come from DNS (`discover:`), end to end: the real binary resolving
//! `localhost:PORT` to an in-process test backend, an unresolvable name answered with 503 while
//! the gateway stays up, and a reload that keeps the discovered backends.

mod common;

use common::{
    chat_body, config_yaml, metric_value, metrics_when, post_reload, Behavior, Gateway, TestBackend,
};
use serde_json::Value;

/// Pool `m` discovered from `localhost:PORT` (IPv4 only: the test backend listens on
/// 127.0.0.1), pool `dead` from a name that cannot resolve, plus `extra` pools.
fn config(port: u16, extra: &str) -> String {
    config_yaml(
        &format!(
            "  m:\n    discover: {{dns: 'localhost:{port}', interval: 1s, family: ipv4}}\n    \
             profile: {{base_ms: 20}}\n  \
             dead:\n    discover: {{dns: 'no-such-backend.invalid:8000', interval: 1s}}\n{extra}"
        ),
        "retry: {max_retries: 0}\nreload: {watch: false}\n",
    )
}

fn body(model: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&chat_body(64, false)).unwrap();
    v["model"] = Value::from(model);
    serde_json::to_vec(&v).unwrap()
}

async fn chat(gw: &Gateway, model: &str) -> (u16, String) {
    let r = common::client(false)
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body(model))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovered_pool_serves_and_an_unresolvable_one_answers_503() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let port = backend.addr.port();
    let gw = Gateway::start(&config(port, ""));
    let m = metrics_when(&gw, |t| {
        metric_value(t, "pronto_discovery_backends{pool=\"m\"}") == Some(1.0)
            && metric_value(t, "pronto_discovery_errors_total{pool=\"dead\"}")
                .is_some_and(|v| v >= 1.0)
    })
    .await;
    assert_eq!(
        metric_value(&m, "pronto_discovery_backends{pool=\"m\"}"),
        Some(1.0),
        "{m}"
    );
    let name = format!("m-127.0.0.1:{port}");
    assert_eq!(
        metric_value(&m, &format!("pronto_backend_healthy{{backend=\"{name}\"}}")),
        Some(1.0),
        "{m}"
    );

    let (status, text) = chat(&gw, "m").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(backend.requests(), 1);

    let (status, text) = chat(&gw, "dead").await;
    assert_eq!(status, 503, "{text}");
    let err: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(err["error"]["code"], "no_backend_available", "{text}");
    assert!(text.contains("`dead`"), "{text}");
    assert!(metric_value(&m, "pronto_discovery_errors_total{pool=\"dead\"}").unwrap() >= 1.0);

    // The gateway is still up and serving the resolvable pool.
    let (status, _) = chat(&gw, "m").await;
    assert_eq!(status, 200);
    assert_eq!(backend.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_discovered_backends() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let other = TestBackend::start("o", Behavior::default()).await;
    let port = backend.addr.port();
    let gw = Gateway::start(&config(port, ""));
    metrics_when(&gw, |t| {
        metric_value(t, "pronto_discovery_backends{pool=\"m\"}") == Some(1.0)
    })
    .await;
    assert_eq!(chat(&gw, "m").await.0, 200);

    // Add a static pool; the discovered pool must keep serving straight after the reload.
    gw.write_config(&config(
        port,
        &format!(
            "  o:\n    backends: [{{name: o1, url: '{}'}}]\n",
            other.url()
        ),
    ));
    let (_, report) = post_reload(&gw).await;
    assert_eq!(report["result"], "ok", "{report}");
    assert_eq!(
        report["backends_kept"], 1,
        "the discovered backend is kept: {report}"
    );
    assert_eq!(chat(&gw, "m").await.0, 200);
    assert_eq!(chat(&gw, "o").await.0, 200);
    assert_eq!((backend.requests(), other.requests()), (2, 1));
}
