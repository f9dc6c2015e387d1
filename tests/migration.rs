//! Stream migration end to end: the `pronto` gateway in front of the in-process simulated
//! fleet, one backend crashing every second under load. The sim's words follow from the text
//! before them (`pronto_sim::fleet_openai`), so a continuation produces exactly what the
//! uninterrupted stream would have: every client's text is compared byte for byte with the
//! same request's answer from a fleet without faults.
//!
//! `MIGRATION` lines (`--nocapture`) carry the counts `scripts/migration-table.sh` tabulates.

mod common;

use std::time::Duration;

use common::{config_yaml, metric_value, metrics_when, Gateway};
use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::{json, Value};

const MODEL: &str = "sim-model";
const STREAMS: usize = 36;
const CONCURRENCY: usize = 9;
const MAX_TOKENS: u32 = 160;
/// Upper bound on any one stream (a hang fails instead of blocking).
const BOUND: Duration = Duration::from_secs(60);

async fn fleet(faults: &str) -> SimFleet {
    let mut yaml = format!("model: {MODEL}\nbackends:\n");
    for i in 0..3 {
        let f = if i == 0 { faults } else { "" };
        yaml.push_str(&format!(
            "  - {{ name: b{i}, profile: h100-llama3-8b, num_kv_blocks: 8000, port: 0{f} }}\n"
        ));
    }
    let config = FleetConfig::parse(&yaml, "migration").unwrap();
    SimFleet::start(&config, 1.0).await.unwrap()
}

fn gateway(fleet: &SimFleet, extra: &str) -> Gateway {
    let mut pool = format!("  {MODEL}:\n    policy: least_inflight\n    backends:\n");
    for (i, u) in fleet.urls().iter().enumerate() {
        pool.push_str(&format!("      - name: b{i}\n        url: {u}\n"));
    }
    Gateway::start(&config_yaml(
        &pool,
        &format!("explain_headers: true\nretry: {{max_retries: 2}}\n{extra}"),
    ))
}

fn body(i: usize, api: &str) -> Value {
    let text: String = (0..30).map(|w| format!(" q{i}w{w}")).collect();
    if api == "chat" {
        json!({"model": MODEL, "messages": [{"role": "user", "content": text}],
               "max_tokens": MAX_TOKENS, "stream": true,
               "stream_options": {"include_usage": true}})
    } else {
        json!({"model": MODEL, "prompt": text, "max_tokens": MAX_TOKENS, "stream": true,
               "stream_options": {"include_usage": true}})
    }
}

fn api_of(i: usize) -> &'static str {
    if i % 3 == 2 {
        "completions"
    } else {
        "chat"
    }
}

/// What one client saw.
#[derive(Debug, Default)]
struct Seen {
    status: u16,
    text: String,
    ids: Vec<String>,
    role_chunks: usize,
    dones: usize,
    errors: usize,
    usage: Option<Value>,
    /// The stream ended with `[DONE]` as its last event.
    clean_end: bool,
}

async fn stream(base: &str, i: usize) -> Seen {
    let api = api_of(i);
    let path = if api == "chat" {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body(i, api))
        .send()
        .await
        .unwrap();
    let mut seen = Seen {
        status: r.status().as_u16(),
        ..Seen::default()
    };
    let mut raw = Vec::new();
    let mut s = r.bytes_stream();
    let read = tokio::time::timeout(BOUND, async {
        while let Some(Ok(chunk)) = s.next().await {
            raw.extend_from_slice(&chunk);
        }
    })
    .await;
    assert!(read.is_ok(), "stream {i} hung");
    let raw = String::from_utf8(raw).unwrap();
    let events: Vec<&str> = raw.split("\n\n").filter(|e| !e.trim().is_empty()).collect();
    for (n, e) in events.iter().enumerate() {
        let data = e
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or("");
        if data == "[DONE]" {
            seen.dones += 1;
            seen.clean_end = n + 1 == events.len();
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_else(|_| panic!("bad event {e:?}"));
        if v.get("error").is_some() || e.starts_with("event: error") {
            seen.errors += 1;
            continue;
        }
        seen.ids
            .push(v["id"].as_str().unwrap_or_default().to_string());
        if v.get("usage").is_some_and(Value::is_object) {
            seen.usage = Some(v["usage"].clone());
        }
        let c = &v["choices"][0];
        if c["delta"].get("role").is_some() {
            seen.role_chunks += 1;
        }
        let piece = if api == "chat" {
            c["delta"]["content"].as_str()
        } else {
            c["text"].as_str()
        };
        seen.text.push_str(piece.unwrap_or_default());
    }
    seen
}

/// Run every stream, `CONCURRENCY` at a time, against `base`.
async fn run_all(base: &str) -> Vec<Seen> {
    futures::stream::iter(0..STREAMS)
        .map(|i| stream(base, i))
        .buffered(CONCURRENCY)
        .collect()
        .await
}

struct Counts {
    errors: usize,
    continued: f64,
    reprefill: f64,
    prompt_tokens: u64,
    completion_tokens: u64,
}

async fn through_gateway(extra: &str) -> (Vec<Seen>, Counts) {
    let fleet = fleet(", faults: { crash_after: 1s, crash_every: 1s, restart_after: 300ms }").await;
    let gw = gateway(&fleet, extra);
    let seen = run_all(&gw.url("")).await;
    // The gateway counts a stream after its client has the last byte: wait for the counts of
    // the streams that failed (none without a failure: then the 5 s bound).
    let m = metrics_when(&gw, |m| {
        ["continued", "finished", "not_continuable", "failed"]
            .iter()
            .filter_map(|o| {
                metric_value(
                    m,
                    &format!("pronto_stream_migrations_total{{outcome=\"{o}\"}}"),
                )
            })
            .sum::<f64>()
            >= 1.0
    })
    .await;
    let counts = Counts {
        errors: seen.iter().filter(|s| s.errors > 0 || s.dones == 0).count(),
        continued: metric_value(&m, "pronto_stream_migrations_total{outcome=\"continued\"}")
            .unwrap_or(0.0),
        reprefill: metric_value(
            &m,
            &format!("pronto_stream_migration_reprefill_tokens_total{{pool=\"{MODEL}\"}}"),
        )
        .unwrap_or(0.0),
        prompt_tokens: seen
            .iter()
            .filter_map(|s| s.usage.as_ref()?["prompt_tokens"].as_u64())
            .sum(),
        completion_tokens: seen
            .iter()
            .filter_map(|s| s.usage.as_ref()?["completion_tokens"].as_u64())
            .sum(),
    };
    (seen, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashing_backend_loses_no_stream_with_migration() {
    // The reference: the same requests on a fleet without faults, directly.
    let clean = fleet("").await;
    let reference = run_all(&clean.urls()[0]).await;
    assert!(reference.iter().all(|s| s.clean_end && s.text.len() > 100));

    let (seen, on) = through_gateway("").await;
    for (i, (s, r)) in seen.iter().zip(&reference).enumerate() {
        assert_eq!(s.status, 200, "stream {i}");
        assert_eq!((s.errors, s.dones), (0, 1), "stream {i}: {s:?}");
        assert!(s.clean_end, "stream {i} ends with [DONE]");
        assert_eq!(
            s.text, r.text,
            "stream {i}: the text is the fault-free run's, byte for byte"
        );
        assert!(
            s.ids.windows(2).all(|w| w[0] == w[1]),
            "stream {i}: one id throughout"
        );
        assert!(s.role_chunks <= 1, "stream {i}: at most one role chunk");
        if api_of(i) == "chat" {
            assert_eq!(s.role_chunks, 1, "stream {i}");
        }
        let u = s.usage.as_ref().expect("usage");
        assert_eq!(u["completion_tokens"], MAX_TOKENS, "stream {i}: {u}");
        assert_eq!(
            u["prompt_tokens"],
            r.usage.as_ref().unwrap()["prompt_tokens"],
            "stream {i}: the prompt counts once"
        );
    }
    assert_eq!(on.errors, 0);
    assert!(
        on.continued >= 1.0,
        "the crashes hit streams in flight: {}",
        on.continued
    );

    let (off_seen, off) = through_gateway("migration: {max_attempts: 0}\n").await;
    assert!(
        off.errors >= 1,
        "without migration the crashes end streams with an error event"
    );
    for s in off_seen.iter().filter(|s| s.errors > 0) {
        assert_eq!(s.dones, 0, "an error event, never a [DONE] after it");
    }
    let ratio = |c: &Counts| c.reprefill / c.prompt_tokens.max(1) as f64;
    println!(
        "MIGRATION on streams={STREAMS} errors={} continued={} reprefill_tokens={} prompt_tokens={} completion_tokens={} reprefill_ratio={:.3}",
        on.errors, on.continued, on.reprefill, on.prompt_tokens, on.completion_tokens, ratio(&on)
    );
    println!(
        "MIGRATION off streams={STREAMS} errors={} continued={} reprefill_tokens={} prompt_tokens={} completion_tokens={} reprefill_ratio={:.3}",
        off.errors, off.continued, off.reprefill, off.prompt_tokens, off.completion_tokens, ratio(&off)
    );
}
