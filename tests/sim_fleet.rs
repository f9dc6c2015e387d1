//! The live simulated fleet over real sockets on 127.0.0.1 (ephemeral ports), with a small
//! time scale so engine steps take well under a millisecond. Assertions are on contents,
//! counts and orderings only; every wait is bounded.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::{json, Value};

const MODEL: &str = "sim-model";
const SCALE: f64 = 0.05;
/// Upper bound on any single test's waiting (a hang fails instead of blocking CI).
const BOUND: Duration = Duration::from_secs(20);

fn config(n: usize, extra: &str) -> FleetConfig {
    let mut yaml = format!("model: {MODEL}\nbackends:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: b{i}, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0{extra} }}\n"
        ));
    }
    FleetConfig::parse(&yaml, "test").unwrap()
}

async fn fleet(n: usize) -> SimFleet {
    SimFleet::start(&config(n, ""), SCALE).await.unwrap()
}

/// A long, distinctive chat prompt (several 16-token blocks).
fn messages(tag: &str) -> Value {
    let text: String = (0..120).map(|i| format!(" {tag}{i}")).collect();
    json!([{"role": "system", "content": "You are a simulator."},
           {"role": "user", "content": text}])
}

fn chat_body(tag: &str, max_tokens: u32, stream: bool) -> Value {
    json!({"model": MODEL, "messages": messages(tag), "max_tokens": max_tokens,
           "stream": stream, "stream_options": {"include_usage": true}})
}

/// What a streaming response delivered: its `data:` payloads, and whether the body ended
/// cleanly (no transport error).
struct Sse {
    events: Vec<String>,
    clean: bool,
}

impl Sse {
    fn json(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.as_str() != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }

    fn done(&self) -> bool {
        self.events.last().map(String::as_str) == Some("[DONE]")
    }
}

/// Read SSE payloads until the body ends (or errors).
async fn read_sse(resp: reqwest::Response) -> Sse {
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    let mut clean = true;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => buf.extend_from_slice(&b),
            Err(_) => {
                clean = false;
                break;
            }
        }
        while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..pos + 2).collect();
            let line = std::str::from_utf8(&ev).unwrap().trim();
            let data = line
                .strip_prefix("data: ")
                .expect("every event is a data line");
            events.push(data.to_string());
        }
    }
    Sse { events, clean }
}

/// Label name → value of one series.
type Labels = BTreeMap<String, String>;
/// Metric name → its series.
type Metrics = BTreeMap<String, Vec<(Labels, f64)>>;

/// Prometheus text → `name → [(labels, value)]`.
fn parse_metrics(text: &str) -> Metrics {
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect("numeric value"),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = BTreeMap::new();
                let mut rest = body;
                while !rest.is_empty() {
                    let (k, v) = rest.split_once("=\"").expect("label=\"value\"");
                    let end = v.find('"').expect("closing quote");
                    labels.insert(k.to_string(), v[..end].to_string());
                    rest = v[end + 1..].trim_start_matches(',');
                }
                (name, labels)
            }
        };
        out.entry(name.to_string())
            .or_default()
            .push((labels, value));
    }
    out
}

async fn metrics(client: &reqwest::Client, url: &str) -> Metrics {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    parse_metrics(&text)
}

fn value(m: &Metrics, name: &str) -> f64 {
    m.get(name).unwrap_or_else(|| panic!("{name} missing"))[0].1
}

/// Poll `/metrics` until `name` reaches `want` (bounded).
async fn wait_metric(client: &reqwest::Client, url: &str, name: &str, want: f64) {
    let t = tokio::time::timeout(BOUND, async {
        loop {
            if value(&metrics(client, url).await, name) >= want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    t.await
        .unwrap_or_else(|_| panic!("{name} never reached {want}"));
}

#[tokio::test]
async fn streaming_chat_has_role_tokens_usage_and_done_and_caches_the_prefix() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let mut cached = Vec::new();
    for _ in 0..2 {
        let resp = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat_body("alpha", 5, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let sse = tokio::time::timeout(BOUND, read_sse(resp)).await.unwrap();
        assert!(sse.clean && sse.done(), "stream ends with [DONE]");
        let chunks = sse.json();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chunks[0]["choices"][0]["delta"]["content"], "");
        let content: Vec<&Value> = chunks
            .iter()
            .filter(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
            .collect();
        assert_eq!(content.len(), 5, "one content chunk per token");
        assert_eq!(content[4]["choices"][0]["finish_reason"], "length");
        assert!(content[..4]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null()));
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(chunks.last().unwrap()["choices"], json!([]));
        assert_eq!(usage["completion_tokens"], 5);
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 100);
        assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + 5);
        cached.push(
            usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(cached[0], 0, "cold cache");
    assert!(cached[1] > 0, "a repeated prompt hits the prefix cache");
    fleet.shutdown().await;
}

#[tokio::test]
async fn non_streaming_chat_and_completions_include_usage() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let v: Value = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": MODEL, "messages": messages("beta"), "max_completion_tokens": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.split_whitespace().count(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 3);

    let v: Value = client
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": ["one two", "three"], "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        2
    );
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        pronto_core::tokens::count_tokens(b"one two\nthree")
    );

    // Streaming completions: text chunks, no role chunk.
    let resp = client
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": true}))
        .send()
        .await
        .unwrap();
    let sse = tokio::time::timeout(BOUND, read_sse(resp)).await.unwrap();
    assert!(sse.done());
    let chunks = sse.json();
    assert_eq!(chunks.len(), 4, "no usage chunk unless asked for");
    assert!(chunks.iter().all(|c| c["choices"][0]["text"].is_string()));
    fleet.shutdown().await;
}

#[tokio::test]
async fn errors_are_openai_shaped() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let post = |path: &str, body: &'static str| {
        client
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = post("/v1/chat/completions", "{not json").await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string());
    assert_eq!(v["error"]["code"], 400);
    let r = post(
        "/v1/chat/completions",
        r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 404);
    // Longer than the KV pool can ever hold (4000 blocks × 16 tokens).
    let r = post(
        "/v1/completions",
        r#"{"model":"sim-model","prompt":"x","max_tokens":100000}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    fleet.shutdown().await;
}

#[tokio::test]
async fn metrics_have_every_vllm_family_with_model_and_engine_labels() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    for tag in ["m1", "m1", "m2"] {
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat_body(tag, 3, true))
            .send()
            .await
            .unwrap();
        assert!(read_sse(r).await.done());
    }
    let m = metrics(&client, url).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
        "vllm:num_preemptions_total",
        "vllm:cache_config_info",
        "sim_lag_seconds_total",
        "sim_aborted_requests_total",
    ] {
        let series = m.get(name).unwrap_or_else(|| panic!("{name} missing"));
        for (labels, _) in series {
            assert_eq!(
                labels.get("model_name").map(String::as_str),
                Some(MODEL),
                "{name}"
            );
            assert_eq!(
                labels.get("engine").map(String::as_str),
                Some("0"),
                "{name}"
            );
        }
    }
    assert_eq!(value(&m, "vllm:time_to_first_token_seconds_count"), 3.0);
    assert_eq!(value(&m, "vllm:generation_tokens_total"), 9.0);
    assert!(value(&m, "vllm:prefix_cache_hits_total") > 0.0);
    assert!(value(&m, "vllm:prefix_cache_queries_total") >= value(&m, "vllm:prompt_tokens_total"));
    assert_eq!(value(&m, "vllm:num_requests_running"), 0.0);
    let info = &m["vllm:cache_config_info"][0];
    assert_eq!(info.0["block_size"], "16");
    assert_eq!(info.0["num_gpu_blocks"], "4000");
    assert_eq!(info.1, 1.0);
    let buckets = &m["vllm:time_to_first_token_seconds_bucket"];
    assert_eq!(buckets.last().unwrap().0["le"], "+Inf");
    assert_eq!(buckets.last().unwrap().1, 3.0);
    fleet.shutdown().await;
}

#[tokio::test]
async fn client_hang_up_aborts_the_request_in_the_engine() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body("gamma", 20_000, true))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let first = tokio::time::timeout(BOUND, stream.next()).await.unwrap();
    assert!(first.unwrap().is_ok());
    assert_eq!(
        value(&metrics(&client, url).await, "sim_aborted_requests_total"),
        0.0
    );
    drop(stream);
    wait_metric(&client, url, "sim_aborted_requests_total", 1.0).await;
    let m = metrics(&client, url).await;
    assert_eq!(value(&m, "vllm:num_requests_running"), 0.0);
    assert!(
        value(&m, "vllm:generation_tokens_total") < 20_000.0,
        "generation stopped early"
    );
    // Non-streaming: dropping the request future aborts too.
    let pending = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body("delta", 20_000, false))
        .send();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), pending)
            .await
            .is_err(),
        "a 20k-token answer is not ready yet"
    );
    wait_metric(&client, url, "sim_aborted_requests_total", 2.0).await;
    fleet.shutdown().await;
}

#[tokio::test]
async fn error_rate_one_answers_500_from_yaml_and_from_the_handle() {
    let fleet = SimFleet::start(&config(2, ", faults: { error_rate: 1.0 }"), SCALE)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    for url in fleet.urls() {
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat_body("e", 2, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], 500);
        assert_eq!(
            value(&metrics(&client, &url).await, "sim_injected_errors_total"),
            1.0
        );
    }
    fleet.faults(1).set_error_rate(0.0);
    let r = client
        .post(format!("{}/v1/chat/completions", fleet.urls()[1]))
        .json(&chat_body("e", 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    fleet.shutdown().await;
}

#[tokio::test]
async fn crash_cuts_open_streams_and_the_backend_restarts_cold() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let faults = fleet.faults(0);
    faults.set_restart_after(Duration::from_millis(300));
    let client = reqwest::Client::new();
    // Warm the cache.
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body("omega", 1, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // An open stream, cut off mid-flight.
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body("omega", 20_000, true))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut seen = Vec::new();
    let needle = b"\"content\":\" ";
    while !seen.windows(needle.len()).any(|w| w == needle) {
        let b = tokio::time::timeout(BOUND, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.extend_from_slice(&b);
    }
    faults.crash();
    let rest = tokio::time::timeout(BOUND, async {
        let mut rest = Vec::new();
        let mut errored = false;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(b) => rest.extend_from_slice(&b),
                Err(_) => {
                    errored = true;
                    break;
                }
            }
        }
        (rest, errored)
    })
    .await
    .unwrap();
    assert!(rest.1, "the stream ends with a transport error");
    let all = [seen, rest.0].concat();
    assert!(!String::from_utf8_lossy(&all).contains("[DONE]"));
    assert!(!String::from_utf8_lossy(&all).contains("\"finish_reason\":\"length\""));
    // Down: 503 everywhere, including /health.
    assert!(faults.is_down());
    let r = client.get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    // Back after restart_after, with a cold cache.
    tokio::time::timeout(BOUND, async {
        while client
            .get(format!("{url}/health"))
            .send()
            .await
            .unwrap()
            .status()
            != 200
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let v: Value = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body("omega", 1, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let m = metrics(&client, url).await;
    assert_eq!(value(&m, "sim_crashes_total"), 1.0);
    assert_eq!(
        value(&m, "sim_aborted_requests_total"),
        0.0,
        "a crash is not a client abort"
    );
    fleet.shutdown().await;
}

#[tokio::test]
async fn stalled_first_token_arrives_after_an_unstalled_one_sent_later() {
    let fleet = SimFleet::start(&config(2, ""), SCALE).await.unwrap();
    fleet
        .faults(0)
        .set_stall_first_token(Some(Duration::from_millis(400)));
    let client = reqwest::Client::new();
    let urls = fleet.urls();
    let first_token = |url: String, tag: &'static str| {
        let client = client.clone();
        async move {
            let resp = client
                .post(format!("{url}/v1/chat/completions"))
                .json(&chat_body(tag, 2, true))
                .send()
                .await
                .unwrap();
            read_sse(resp).await;
            tag
        }
    };
    let stalled = tokio::spawn(first_token(urls[0].clone(), "slow"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let fast = tokio::spawn(first_token(urls[1].clone(), "fast"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for h in [stalled, fast] {
        let tx = tx.clone();
        tokio::spawn(async move { tx.send(h.await.unwrap()).unwrap() });
    }
    let order = tokio::time::timeout(BOUND, async {
        vec![rx.recv().await.unwrap(), rx.recv().await.unwrap()]
    })
    .await
    .unwrap();
    assert_eq!(order, ["fast", "slow"]);
    fleet.shutdown().await;
}

#[tokio::test]
async fn probes_answer_load_tokenize_render_models_over_h1_and_h2c() {
    let fleet = fleet(1).await;
    let url = &fleet.urls()[0];
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for client in [reqwest::Client::new(), h2] {
        let load: Value = client
            .get(format!("{url}/get_load"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(load[0]["dp_rank"], 0);
        assert_eq!(load[0]["num_reqs"], 0);
        assert!(load[0]["num_waiting_reqs"].is_u64() && load[0]["num_tokens"].is_u64());

        let tok: Value = client
            .post(format!("{url}/tokenize"))
            .json(&json!({"prompt": "hello world"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<u32> = serde_json::from_value(tok["tokens"].clone()).unwrap();
        assert_eq!(ids, pronto_core::tokens::token_ids(b"hello world"));
        assert_eq!(tok["count"], ids.len());

        let msgs = json!([{"role": "user", "content": "hi"}]);
        let r: Value = client
            .post(format!("{url}/v1/chat/completions/render"))
            .json(&json!({"model": MODEL, "messages": msgs}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r[0], msgs);
        assert_eq!(r[1][0]["prompt"], "user: hi\n");
        let ids: Vec<u32> = serde_json::from_value(r[1][0]["prompt_token_ids"].clone()).unwrap();
        assert_eq!(ids, pronto_core::tokens::token_ids(b"user: hi\n"));
        let r: Value = client
            .post(format!("{url}/v1/completions/render"))
            .json(&json!({"prompt": "abc"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r[0]["prompt"], "abc");

        let models: Value = client
            .get(format!("{url}/v1/models"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], MODEL);
        for path in [
            "/health",
            "/get_model_info",
            "/model_info",
            "/get_server_info",
            "/server_info",
        ] {
            let r = client.get(format!("{url}{path}")).send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
        }
        // Streaming works on both protocols.
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat_body("proto", 3, true))
            .send()
            .await
            .unwrap();
        assert!(tokio::time::timeout(BOUND, read_sse(r))
            .await
            .unwrap()
            .done());
    }
    fleet.shutdown().await;
}

#[tokio::test]
async fn ports_are_distinct_and_shutdown_closes_them() {
    let fleet = fleet(3).await;
    let addrs = fleet.addrs();
    assert_eq!(addrs.len(), 3);
    assert!(addrs[0] != addrs[1] && addrs[1] != addrs[2]);
    assert_eq!(fleet.names(), ["b0", "b1", "b2"]);
    let url = fleet.urls()[2].clone();
    fleet.shutdown().await;
    assert!(reqwest::get(format!("{url}/health")).await.is_err());
}

#[test]
fn fleet_files_with_faults_load() {
    let cfg = config(1, ", faults: { stall_first_token: 250ms, slowdown: 2, restart_after: 1.5, crash_after: 10s, crash_every: 1m, seed: 3 }");
    let f = &cfg.backends[0].faults;
    assert_eq!(f.stall_first_token, Some(Duration::from_millis(250)));
    assert_eq!(f.slowdown, 2.0);
    assert_eq!(f.restart_after, Duration::from_millis(1500));
    assert_eq!(f.crash_every, Some(Duration::from_secs(60)));
    for bad in [
        "{ error_rate: 2 }",
        "{ slowdown: 0 }",
        "{ crash_every: 1s }",
        "{ stall_first_token: soon }",
        "{ typo: 1 }",
    ] {
        let yaml =
            format!("model: m\nbackends:\n  - {{ name: a, profile: cpu-tiny, faults: {bad} }}\n");
        let err = FleetConfig::parse(&yaml, "t").unwrap_err().to_string();
        assert!(!err.is_empty(), "{bad}");
    }
}

#[tokio::test]
async fn time_scale_zero_runs_as_fast_as_possible_without_starving_the_server() {
    // Steps take no time at all: the engine task must still yield to the HTTP tasks (this
    // test runs on a single-threaded runtime).
    let fleet = SimFleet::start(&config(1, ""), 0.0).await.unwrap();
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let streams: Vec<_> = (0..4)
        .map(|i| {
            client
                .post(format!("{url}/v1/chat/completions"))
                .json(&chat_body(if i % 2 == 0 { "z0" } else { "z1" }, 200, true))
                .send()
        })
        .collect();
    let sses = tokio::time::timeout(BOUND, async {
        let mut out = Vec::new();
        for s in streams {
            out.push(read_sse(s.await.unwrap()).await);
        }
        out
    })
    .await
    .unwrap();
    for sse in sses {
        assert!(sse.done());
        assert_eq!(
            sse.json().last().unwrap()["usage"]["completion_tokens"],
            200
        );
    }
    fleet.shutdown().await;
}
