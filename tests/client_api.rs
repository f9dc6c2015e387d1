//! The client-facing API around inference: the explain headers, `GET /health`,
//! `GET /v1/models` (per key, free of quota), `GET /v1/models/{id}`, and `pronto serve
//! --backend` serving the models its backends list.

mod common;

use common::{config_yaml, pool, Behavior, Gateway, TestBackend};
use serde_json::{json, Value};

fn chat(model: &str) -> Value {
    json!({"model": model, "max_tokens": 4,
           "messages": [{"role": "user", "content": "why did it route there?"}]})
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

fn ms(r: &reqwest::Response, name: &str) -> f64 {
    header(r, name)
        .unwrap_or_else(|| panic!("no {name}: {:?}", r.headers()))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_headers_name_the_reason_the_runner_up_and_the_attempts() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let b = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[a.url(), b.url()]),
        "explain_headers: true\nretry: {max_retries: 1}\n",
    ));
    let client = reqwest::Client::new();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let chosen = header(&r, "x-pronto-backend").unwrap().to_string();
    let other = if chosen == "m-b0" { "m-b1" } else { "m-b0" };
    assert_eq!(header(&r, "x-pronto-reason"), Some("round_robin"));
    assert_eq!(header(&r, "x-pronto-attempts"), Some("1"));
    assert_eq!(header(&r, "x-pronto-runner-up"), Some(other));
    assert!(ms(&r, "x-pronto-predicted-ttft-ms") > 0.0);
    assert!(ms(&r, "x-pronto-runner-up-predicted-ttft-ms") > 0.0);

    // The next request starts on the other backend (round robin); make it fail once there.
    let next = if chosen == "m-b0" { &b } else { &a };
    next.set(|x| x.fail_next = 1);
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-pronto-attempts"), Some("2"));
    assert_eq!(header(&r, "x-pronto-backend"), Some(chosen.as_str()));
    // The retry's decision had no other eligible backend: no runner-up.
    assert_eq!(header(&r, "x-pronto-runner-up"), None);
    assert_eq!(header(&r, "x-pronto-runner-up-predicted-ttft-ms"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_on_the_main_listener_follows_the_backends() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(&pool("m", "round_robin", &[a.url()]), ""));
    let client = reqwest::Client::new();
    let get = || async {
        let r = client.get(gw.url("/health")).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    };
    assert_eq!(get().await, (200, json!({"status": "ok"})));
    a.set(|x| x.healthy = false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = get().await;
    while last.0 == 200 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        last = get().await;
    }
    // Up or down only: which pools are down is the admin listener's to say.
    assert_eq!(last, (503, json!({"status": "unavailable"})));
    let ready = client.get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(
        ready["pools_without_healthy_backend"],
        json!(["m"]),
        "{ready}"
    );
    let r = client.post(gw.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(header(&r, "allow"), Some("GET"));
}

const KEYS: &str = "auth:\n  keys:\n    \
    - {name: every, key: sk-client-api-every}\n    \
    - {name: llama-only, key: sk-client-api-llama, models: ['meta-llama/*']}\n\
    rate_limits:\n  per_key: {requests_per_minute: 1}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_per_key_retrieved_by_id_and_free_of_quota() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let pools = format!(
        "  meta-llama/Llama-3.1-8B:\n    backends: [{{name: llama, url: '{}'}}]\n{}",
        a.url(),
        pool("qwen", "round_robin", &[a.url()])
    );
    let gw = Gateway::start(&config_yaml(&pools, KEYS));
    let client = reqwest::Client::new();
    let get = |path: &str, key: Option<&str>| {
        let mut r = client.get(gw.url(path));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let ids = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };

    // Listing many times costs none of the key's one request per minute.
    for _ in 0..3 {
        let r = get("/v1/models", Some("sk-client-api-every"))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(header(&r, "x-ratelimit-remaining-requests").is_none());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(ids(&v), ["meta-llama/Llama-3.1-8B", "qwen"]);
    }
    let r = get("/v1/models", Some("sk-client-api-llama"))
        .await
        .unwrap();
    assert_eq!(ids(&r.json().await.unwrap()), ["meta-llama/Llama-3.1-8B"]);
    let r = get("/v1/models", None).await.unwrap();
    assert_eq!(r.status(), 401);
    let r = get("/v1/models", Some("sk-not-a-key-at-all"))
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // By id, with the slash raw or escaped.
    for path in [
        "/v1/models/meta-llama/Llama-3.1-8B",
        "/v1/models/meta-llama%2FLlama-3.1-8B",
    ] {
        let r = get(path, Some("sk-client-api-llama")).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v,
            json!({"id": "meta-llama/Llama-3.1-8B", "object": "model", "created": 0, "owned_by": "pronto"})
        );
    }
    // Unknown, or not for this key: the same 404.
    for (path, key) in [
        ("/v1/models/nope", "sk-client-api-every"),
        ("/v1/models/qwen", "sk-client-api-llama"),
    ] {
        let r = get(path, Some(key)).await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let r = client
        .delete(gw.url("/v1/models/qwen"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(header(&r, "allow"), Some("GET"));

    // The quota is intact for inference: one request, then 429.
    let post = || {
        client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth("sk-client-api-every")
            .json(&chat("qwen"))
            .send()
    };
    assert_eq!(post().await.unwrap().status(), 200);
    assert_eq!(post().await.unwrap().status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_explain_headers_turns_them_on_for_a_backend_flag_pool() {
    let a = TestBackend::start("a", Behavior::default()).await;
    let url = a.url();
    let listen = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
    let mut args = vec!["serve", "--backend", &url, "--model", "m"];
    args.extend(listen);
    let plain = Gateway::start_cli(&args);
    args.push("--explain-headers");
    let explained = Gateway::start_cli(&args);
    let client = reqwest::Client::new();
    for (gw, on) in [(&plain, false), (&explained, true)] {
        let r = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("m"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-pronto-backend").is_some(), on);
        assert_eq!(header(&r, "x-pronto-reason").is_some(), on);
        assert_eq!(header(&r, "x-pronto-attempts"), on.then_some("1"));
    }
    // With a config file the file decides.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pronto"))
        .args(["serve", "--config", "x.yaml", "--explain-headers"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--explain-headers"));
}

/// A gateway as `pronto serve --backend URL...` without `--model` builds it, in-process, with
/// explain headers and quick health checks.
fn serving_listed(urls: &[String]) -> pronto::server::Handle {
    let mut config = pronto::config::Config::from_backend_urls_serving_listed(
        urls,
        pronto_core::routing::PolicyKind::RoundRobin,
    )
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    config.explain_headers = true;
    config.health.interval = std::time::Duration::from_millis(200);
    config.health.timeout = std::time::Duration::from_millis(500);
    let loaded = pronto::config::Loaded {
        config,
        resources: Default::default(),
    };
    pronto::server::start(loaded, false).unwrap()
}

async fn listed(client: &reqwest::Client, base: &str) -> Vec<String> {
    let v: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_flag_pool_serves_the_models_its_backends_list() {
    let llama = TestBackend::start(
        "llama",
        Behavior {
            models: Some(vec!["llama".into(), "llama-lora".into()]),
            ..Behavior::default()
        },
    )
    .await;
    // Loading: its list answers 503 until it is ready.
    let qwen = TestBackend::start("qwen", Behavior::default()).await;
    let down = TestBackend::start("down", Behavior::default()).await;
    let down_url = down.url();
    down.kill();
    let gw = serving_listed(&[llama.url(), qwen.url(), down_url]);
    let base = format!("http://{}", gw.listen);
    let client = reqwest::Client::new();
    let post = |model: &'static str| {
        client
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat(model))
            .send()
    };

    // Asked before the listener accepted: the first request finds its model.
    assert_eq!(listed(&client, &base).await, ["llama", "llama-lora"]);
    for _ in 0..4 {
        let r = post("llama-lora").await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-pronto-backend"), Some("backend-0"));
    }
    let r = post("qwen").await.unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    let r = client
        .get(format!("{base}/v1/models/llama"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The loading backend becomes ready: asked again, its model is served, on it alone.
    qwen.set(|b| b.models = Some(vec!["qwen".into()]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !listed(&client, &base).await.contains(&"qwen".to_string()) {
        assert!(std::time::Instant::now() < deadline, "qwen never listed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        listed(&client, &base).await,
        ["llama", "llama-lora", "qwen"]
    );
    for _ in 0..4 {
        let r = post("qwen").await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-pronto-backend"), Some("backend-1"));
        // The only backend serving it: no runner-up.
        assert_eq!(header(&r, "x-pronto-runner-up"), None);
    }
    assert_eq!(qwen.requests(), 4);
    assert_eq!(llama.requests(), 4);
    // The pool's own name still reaches any backend.
    assert_eq!(post("default").await.unwrap().status(), 200);
    gw.abort();
    gw.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_backend_without_model_lists_the_backends_models() {
    let a = TestBackend::start(
        "a",
        Behavior {
            models: Some(vec!["sim-model".into()]),
            ..Behavior::default()
        },
    )
    .await;
    let url = a.url();
    // A second backend that is down does not keep the gateway from starting.
    let gw = Gateway::start_cli(&[
        "serve",
        "--backend",
        &url,
        "--backend",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let client = reqwest::Client::new();
    assert_eq!(listed(&client, &gw.url("")).await, ["sim-model"]);
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("sim-model"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(gw
        .wait_for_log(
            |l| l.contains("cannot list the backend's models yet") && l.contains("backend-1")
        )
        .await
        .is_some());
}
