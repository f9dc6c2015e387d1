//! `served_model_name`, end to end: a pool serves the name clients send in front of simulated
//! engines that serve the model under another name (and answer 404 to any other), by a name
//! written in the config and by `discover`; every answer — a JSON body, every SSE chunk —
//! says the client's name, and `GET /v1/models` lists the pool's.

mod common;

use std::time::Duration;

use common::{config_yaml, Behavior, Gateway, TestBackend};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::{json, Value};

/// A stock vLLM's name for its model when started without `--served-model-name`.
const ENGINE_MODEL: &str = "/models/tiny-llama";

async fn fleet(n: usize) -> SimFleet {
    let mut yaml = format!("model: {ENGINE_MODEL}\nbackends:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: e{i}, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n"
        ));
    }
    SimFleet::start(&FleetConfig::parse(&yaml, "model-names").unwrap(), 0.05)
        .await
        .unwrap()
}

async fn chat(gw: &Gateway, model: &str, stream: bool) -> (u16, String) {
    let body = json!({"model": model, "stream": stream, "max_tokens": 3,
                      "messages": [{"role": "user", "content": "hello there"}]});
    let r = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The `model` of every SSE chunk of a stream (`[DONE]` aside).
fn chunk_models(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"));
            v["model"].as_str().unwrap().to_string()
        })
        .collect()
}

async fn wait_routable(gw: &Gateway, model: &str) {
    for _ in 0..100 {
        if chat(gw, model, false).await.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("`{model}` never became routable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_serves_its_name_in_front_of_engines_that_call_the_model_otherwise() {
    let fleet = fleet(2).await;
    let urls = fleet.urls();
    // `chat` names the engines' model; `auto` discovers it; `plain` sends the name as is.
    let pools = format!(
        "  chat:\n    policy: round_robin\n    served_model_name: {ENGINE_MODEL}\n    backends:\n      \
         - {{name: c0, url: '{u0}'}}\n      - {{name: c1, url: '{u1}'}}\n  \
         auto:\n    policy: round_robin\n    backends:\n      \
         - {{name: a0, url: '{u0}', served_model_name: discover}}\n      \
         - {{name: a1, url: '{u1}', served_model_name: discover}}\n  \
         plain:\n    backends:\n      - {{name: p0, url: '{u0}'}}\n",
        u0 = urls[0],
        u1 = urls[1],
    );
    let gw = Gateway::start(&config_yaml(&pools, "retry: {max_retries: 0}\n"));
    wait_routable(&gw, "auto").await;
    for model in ["chat", "auto"] {
        for _ in 0..2 {
            let (status, text) = chat(&gw, model, false).await;
            assert_eq!(status, 200, "{model}: {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["model"], model, "{text}");
            assert!(!v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .is_empty());
            let (status, text) = chat(&gw, model, true).await;
            assert_eq!(status, 200, "{model}: {text}");
            let models = chunk_models(&text);
            assert!(models.len() >= 3, "{text}");
            assert!(models.iter().all(|m| m == model), "{models:?}");
        }
    }
    // Without a served_model_name the engine gets the pool's name, and refuses it.
    let (status, text) = chat(&gw, "plain", false).await;
    assert_eq!(status, 404, "{text}");
    let listed: Value = reqwest::get(gw.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["auto", "chat", "plain"]);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovered_backend_is_not_routed_to_until_its_name_is_known() {
    let fleet = fleet(1).await;
    // `late` is up but answers 503 at GET /v1/models (an engine still loading): nothing
    // says what to send it, so it gets nothing until it lists its model.
    let late = TestBackend::start("late", Behavior::default()).await;
    let pools = format!(
        "  auto:\n    policy: round_robin\n    served_model_name: discover\n    backends:\n      \
         - {{name: e0, url: '{}'}}\n      - {{name: late, url: '{}'}}\n",
        fleet.urls()[0],
        late.url()
    );
    let gw = Gateway::start(&config_yaml(&pools, "retry: {max_retries: 0}\n"));
    wait_routable(&gw, "auto").await;
    for _ in 0..6 {
        let (status, text) = chat(&gw, "auto", false).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(late.requests(), 0);
    late.set(|b| b.models = Some(vec![ENGINE_MODEL.to_string()]));
    for _ in 0..100 {
        if late.requests() > 0 {
            break;
        }
        let (status, text) = chat(&gw, "auto", false).await;
        assert_eq!(status, 200, "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        late.requests() > 0,
        "asked again while unknown, then routed to"
    );
    fleet.shutdown().await;
}
