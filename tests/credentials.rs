//! Credentials at the edge: a client's key is its credential for the gateway and never
//! reaches a backend while `auth:` is on; a pool or backend `api_key` is what backends get,
//! on requests and on health checks alike. Backends here record the headers they receive.

mod common;

use std::time::{Duration, Instant};

use common::{config_yaml, Behavior, Gateway, TestBackend};

fn chat() -> String {
    serde_json::json!({"model": "m", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]})
    .to_string()
}

/// The `Authorization` of every request `backend` received, in order (`None`: absent).
fn seen_auth(backend: &TestBackend) -> Vec<Option<String>> {
    backend
        .state
        .seen
        .headers
        .lock()
        .unwrap()
        .iter()
        .map(|h| {
            h.get("authorization")
                .map(|v| v.to_str().unwrap().to_string())
        })
        .collect()
}

/// The `Authorization` of `backend`'s latest health check, once it has had one.
async fn health_auth(backend: &TestBackend) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(h) = backend
            .state
            .seen
            .last_health_headers
            .lock()
            .unwrap()
            .as_ref()
        {
            return h
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_string());
        }
        assert!(Instant::now() < deadline, "no health check arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send(gw: &Gateway, key: Option<&str>) -> u16 {
    let mut r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat());
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_get_their_own_keys_and_never_the_clients() {
    let pooled = TestBackend::start("pooled", Behavior::default()).await;
    let own = TestBackend::start("own", Behavior::default()).await;
    let dir = common::gateway::TempDir::new("credentials");
    let key_file = dir.0.join("pool.key");
    std::fs::write(&key_file, "pool-secret-key\n").unwrap();
    let pools = format!(
        "  m:\n    policy: round_robin\n    api_key: {{file: {}}}\n    backends:\n      \
         - {{name: b0, url: '{}'}}\n      - {{name: b1, url: '{}', api_key: own-secret-key}}\n",
        key_file.display(),
        pooled.url(),
        own.url()
    );
    let gw = Gateway::start(&config_yaml(
        &pools,
        "auth:\n  keys:\n    - {name: client, key: client-key-0123}\n",
    ));
    for _ in 0..4 {
        assert_eq!(send(&gw, Some("client-key-0123")).await, 200);
    }
    assert_eq!(send(&gw, Some("wrong-key-0123")).await, 401);
    assert_eq!(
        seen_auth(&pooled),
        vec![Some("Bearer pool-secret-key".to_string()); 2]
    );
    assert_eq!(
        seen_auth(&own),
        vec![Some("Bearer own-secret-key".to_string()); 2]
    );
    assert_eq!(
        health_auth(&pooled).await.as_deref(),
        Some("Bearer pool-secret-key")
    );
    assert_eq!(
        health_auth(&own).await.as_deref(),
        Some("Bearer own-secret-key")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_and_no_backend_key_the_clients_key_is_dropped() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &common::pool("m", "round_robin", &[backend.url()]),
        "auth:\n  keys:\n    - {name: client, key: client-key-0123}\n",
    ));
    assert_eq!(send(&gw, Some("client-key-0123")).await, 200);
    assert_eq!(seen_auth(&backend), vec![None]);
    assert_eq!(health_auth(&backend).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auth_or_backend_keys_the_client_talks_to_the_backend_with_its_own() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &common::pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    assert_eq!(send(&gw, Some("backend-native-key")).await, 200);
    assert_eq!(
        seen_auth(&backend),
        vec![Some("Bearer backend-native-key".to_string())]
    );
}

/// `send` for `model` with `key` (if any): the status.
async fn send_model(gw: &Gateway, model: &str, key: Option<&str>) -> u16 {
    let body = serde_json::json!({"model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]});
    let mut r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .json(&body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_a_route_matched_stays_with_the_gateway_and_others_pass_through() {
    // With `auth:` off, a route's `match.api_keys` (or a `match.headers` condition on
    // `authorization`) is the gateway's use of the client's key: it must not reach the
    // backend. A key no route used is the client's own business with its backend.
    let keyed = TestBackend::start("keyed", Behavior::default()).await;
    let by_header = TestBackend::start("by-header", Behavior::default()).await;
    let open = TestBackend::start("open", Behavior::default()).await;
    let pools = [
        common::pool("pk", "round_robin", &[keyed.url()]),
        common::pool("ph", "round_robin", &[by_header.url()]),
        common::pool("po", "round_robin", &[open.url()]),
    ]
    .concat();
    let routes = "routes:\n  \
        - {name: keyed, match: {api_keys: [sk-route-gold-0123]}, pool: pk}\n  \
        - {name: pinned, match: {model: pinned, headers: {authorization: Bearer sk-pinned-0123}}, pool: ph}\n  \
        - {name: rest, pool: po}\n";
    let gw = Gateway::start(&config_yaml(&pools, routes));
    assert_eq!(send_model(&gw, "m", Some("sk-route-gold-0123")).await, 200);
    assert_eq!(send_model(&gw, "pinned", Some("sk-pinned-0123")).await, 200);
    // Not the route's key: it falls through to `rest`, which uses no key.
    assert_eq!(send_model(&gw, "m", Some("sk-not-a-route-key")).await, 200);
    assert_eq!(send_model(&gw, "m", None).await, 200);
    assert_eq!(
        seen_auth(&keyed),
        vec![None],
        "the matched key was forwarded"
    );
    assert_eq!(
        seen_auth(&by_header),
        vec![None],
        "the matched header was forwarded"
    );
    assert_eq!(
        seen_auth(&open),
        vec![Some("Bearer sk-not-a-route-key".to_string()), None]
    );
}
