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
