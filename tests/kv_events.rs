//! Engine KV-cache events end to end: the simulated engine's events rebuild its cache exactly,
//! the simulated fleet publishes them over ZMQ, and a gateway with `kv_events` endpoints
//! routes by what each engine really holds (including after an eviction and a gap).

mod common;

use std::time::Duration;

use common::{metric_value, metrics, metrics_when, Gateway};
use pronto_core::kv_index::{decode_message, encode_message, Encoding, ExactIndex, KvEvent};
use pronto_core::tokens::{block_hashes, BLOCK_TOKENS};
use pronto_sim::engine::{Engine, EngineConfig, SimRequest};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use pronto_sim::profile::Profile;
use rand::{Rng, SeedableRng};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kv_events");

/// The fixture files: one message each, as `topic`, `seq` and `payload` files.
fn fixture(name: &str) -> Vec<Vec<u8>> {
    ["topic", "seq", "payload"]
        .iter()
        .map(|part| std::fs::read(format!("{FIXTURES}/{name}.{part}")).unwrap())
        .collect()
}

#[test]
fn fixtures_of_both_encodings_decode_to_the_same_events() {
    let map = decode_message(&fixture("map")).unwrap();
    let array = decode_message(&fixture("array")).unwrap();
    assert_eq!(map.seq, 7);
    assert_eq!(array.seq, 7);
    assert_eq!(map.events, array.events);
    assert_eq!(map.events.len(), 3);
    match &map.events[0] {
        KvEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
        } => {
            assert_eq!(block_hashes.len(), 2);
            assert_eq!(*parent, None);
            assert_eq!(token_ids.len(), 32);
            assert_eq!(*block_size, Some(16));
        }
        other => panic!("expected BlockStored, got {other:?}"),
    }
    assert_eq!(map.events[2], KvEvent::AllBlocksCleared);
    // Feeding a fixture to an index: the stored blocks are Pronto's chain of those ids.
    let ix = ExactIndex::new(16);
    ix.on_message(&fixture("map"));
    assert_eq!(ix.counts().decoded, 1);
    assert_eq!(ix.num_blocks(), 0, "the batch ends with AllBlocksCleared");
}

fn engine(num_kv_blocks: usize) -> Engine {
    let mut cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
    cfg.num_kv_blocks = num_kv_blocks;
    cfg.block_size = BLOCK_TOKENS;
    cfg.max_num_batched_tokens = 256;
    Engine::new(cfg)
}

/// Prompts from a few shared stems plus a private tail, `16k + 1` tokens long (so an
/// engine's cap of `len − 1` computed-from-cache tokens does not hide a block).
fn prompt(rng: &mut rand::rngs::SmallRng) -> Vec<u32> {
    let stem: u32 = rng.gen_range(0..4);
    let stem_blocks = rng.gen_range(1..5);
    let tail_blocks = rng.gen_range(0..3);
    let mut p: Vec<u32> = (0..stem_blocks * 16).map(|i| stem * 10_000 + i).collect();
    let tail: u32 = rng.gen();
    p.extend((0..tail_blocks * 16 + 1).map(|i| tail ^ (i * 7919)));
    p
}

#[test]
fn the_index_mirrors_the_simulated_engines_cache_through_evictions_and_a_crash() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut e = engine(48);
    e.enable_kv_events();
    let ix = ExactIndex::new(16);
    let mut seq = 0u64;
    let probes: Vec<Vec<u32>> = (0..40).map(|_| prompt(&mut rng)).collect();
    let mut checked = 0;
    for round in 0..60u64 {
        for k in 0..3 {
            e.add_request(SimRequest {
                id: round * 3 + k,
                prompt: prompt(&mut rng),
                max_tokens: 3,
            });
        }
        if round == 30 {
            e.clear_cache();
        }
        while e.step().is_some() {
            let events = e.take_kv_events();
            if events.is_empty() {
                continue;
            }
            let enc = if seq % 2 == 0 {
                Encoding::Map
            } else {
                Encoding::Array
            };
            ix.on_message(&encode_message(b"", seq, 0.0, &events, enc));
            seq += 1;
            for p in &probes {
                let hashes = block_hashes(p, BLOCK_TOKENS);
                let want = e.cached_prefix_tokens(p) / BLOCK_TOKENS as u32;
                if let Some(got) = ix.match_blocks(&hashes) {
                    assert_eq!(got, want, "round {round}");
                    checked += 1;
                }
            }
        }
    }
    assert!(e.evictions() > 50, "the cache was under pressure");
    assert!(checked > 1000, "the index answered ({checked} checks)");
    let c = ix.counts();
    assert_eq!((c.errors, c.unmapped, c.resyncs), (0, 0, 0));
}

// === live fleet + gateway ===

const MODEL: &str = "m";

fn chat(tag: &str) -> serde_json::Value {
    // ~70 tokens per repetition of the phrase: 12 blocks or so.
    let text = format!("{tag} ").repeat(1) + &format!("story {tag} about caches. ").repeat(40);
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
    })
}

async fn post(client: &reqwest::Client, base: &str, body: &serde_json::Value) {
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.bytes().await.unwrap();
}

fn decoded(m: &str, backend: usize) -> f64 {
    metric_value(
        m,
        &format!("pronto_kv_events_total{{backend=\"{MODEL}-b{backend}\",result=\"decoded\"}}"),
    )
    .unwrap_or(0.0)
}

/// Wait until backend `b`'s exact index has decoded more than `n` messages.
async fn wait_decoded(gw: &Gateway, b: usize, n: f64) -> f64 {
    let m = metrics_when(gw, |m| decoded(m, b) > n).await;
    let d = decoded(&m, b);
    assert!(d > n, "backend {b}: no new KV events ({d} decoded)");
    d
}

/// Which backend served the last request: the one whose prompt-token counter moved.
fn served(fleet: &SimFleet, before: &[u64]) -> usize {
    let moved: Vec<usize> = (0..fleet.len())
        .filter(|&i| fleet.stats(i).prompt_tokens_total > before[i])
        .collect();
    assert_eq!(moved.len(), 1, "exactly one backend served ({moved:?})");
    moved[0]
}

fn prompt_totals(fleet: &SimFleet) -> Vec<u64> {
    (0..fleet.len())
        .map(|i| fleet.stats(i).prompt_tokens_total)
        .collect()
}

/// A 2-backend fleet (`num_kv_blocks` each) publishing KV events (`opts`), a gateway pool `m`
/// over it with `kv_events` per backend (plus `pool_extra` lines), and each subscriber warmed
/// up: returns them with the messages each backend's index has decoded so far.
async fn fleet_and_gateway(
    num_kv_blocks: usize,
    opts: pronto_sim::fleet::SimFleetOptions,
    pool_extra: &str,
) -> (SimFleet, Gateway, [f64; 2]) {
    let yaml = format!(
        "model: {MODEL}\nbackends:\n{}",
        (0..2)
            .map(|i| format!(
                "  - {{ name: s{i}, profile: h100-llama3-8b, num_kv_blocks: {num_kv_blocks}, \
                 port: 0, kv_events_port: 0 }}\n"
            ))
            .collect::<String>()
    );
    let fleet = SimFleet::start_with(&FleetConfig::parse(&yaml, "test").unwrap(), opts)
        .await
        .unwrap();
    let urls = fleet.urls();
    let eps = fleet.kv_event_endpoints();
    let mut pool = format!("  {MODEL}:\n    policy: cache_aware\n{pool_extra}    backends:\n");
    for i in 0..2 {
        pool.push_str(&format!(
            "      - name: {MODEL}-b{i}\n        url: {}\n        kv_events: {{endpoint: '{}', \
             block_size: 16}}\n",
            urls[i],
            eps[i].as_ref().unwrap()
        ));
    }
    let gw = Gateway::start(&common::config_yaml(&pool, ""));
    let client = reqwest::Client::new();
    // Warm up: until each subscriber receives, poke its engine directly.
    let mut seen = [0.0f64; 2];
    for (b, url) in urls.iter().enumerate() {
        for attempt in 0..100 {
            post(&client, url, &chat(&format!("warm{b}-{attempt}"))).await;
            if decoded(&metrics(&gw).await, b) > 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen[b] = wait_decoded(&gw, b, 0.0).await;
    }
    (fleet, gw, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_routes_by_the_engines_published_cache() {
    let (fleet, gw, mut seen) = fleet_and_gateway(
        60,
        pronto_sim::fleet::SimFleetOptions {
            time_scale: 0.01,
            ..Default::default()
        },
        "",
    )
    .await;
    let urls = fleet.urls();
    let client = reqwest::Client::new();

    // 1. A prefix cached on b1 behind the gateway's back: the exact index knows it (the
    //    approximate index, which only sees routed requests, would not).
    post(&client, &urls[1], &chat("alpha")).await;
    seen[1] = wait_decoded(&gw, 1, seen[1]).await;
    let before = prompt_totals(&fleet);
    post(&client, &gw.url(""), &chat("alpha")).await;
    assert_eq!(
        served(&fleet, &before),
        1,
        "routed to the engine that holds the prefix"
    );

    // 2. b1 evicts it (other prompts fill its small cache) and b0 gets it: the gateway follows.
    for k in 0..6 {
        post(&client, &urls[1], &chat(&format!("filler{k}"))).await;
    }
    post(&client, &urls[0], &chat("alpha")).await;
    seen[1] = wait_decoded(&gw, 1, seen[1] + 5.0).await;
    wait_decoded(&gw, 0, seen[0]).await;
    let before = prompt_totals(&fleet);
    post(&client, &gw.url(""), &chat("alpha")).await;
    assert_eq!(
        served(&fleet, &before),
        0,
        "the route follows the real cache"
    );

    // 3. Messages lost: the next one is a sequence gap and b0's index resyncs.
    fleet.drop_kv_events(0, 1);
    post(&client, &urls[0], &chat("gap-1")).await;
    post(&client, &urls[0], &chat("gap-2")).await;
    let resyncs = |m: &str| {
        metric_value(
            m,
            &format!("pronto_kv_events_resyncs_total{{backend=\"{MODEL}-b0\"}}"),
        )
        .unwrap_or(0.0)
    };
    let m = metrics_when(&gw, |m| resyncs(m) >= 1.0).await;
    assert!(resyncs(&m) >= 1.0, "a gap resyncs the index");
    assert_eq!(
        metric_value(
            &m,
            &format!("pronto_kv_events_resyncs_total{{backend=\"{MODEL}-b1\"}}")
        )
        .unwrap_or(0.0),
        0.0
    );
    fleet.shutdown().await;
}

/// Fleet and gateway both tokenizing with `spec` (a `tokenizer:` value): the engines as a real
/// one does, the gateway's pool through its `tokenizer:`.
async fn fleet_and_gateway_with_tokenizer(spec: &str) -> (SimFleet, Gateway, [f64; 2]) {
    let tokenizer = pronto_tokenizer::ModelTokenizer::from_spec(spec, None).expect(spec);
    fleet_and_gateway(
        2000,
        pronto_sim::fleet::SimFleetOptions {
            time_scale: 0.01,
            tokenizer: Some(std::sync::Arc::new(tokenizer)),
            ..Default::default()
        },
        &format!("    tokenizer: {spec}\n"),
    )
    .await
}

/// POST `body` to `url`; the JSON answer.
async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// With the model's tokenizer on both sides — the engine tokenizing as a real one does (its
/// chat template, its ids), the gateway's pool given the same `tokenizer:` — the engine's
/// events carry ids the built-in estimate could never match, and the exact index matches
/// them: each prefix planted on one engine behind the gateway's back is routed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_models_tokenizer_real_token_ids_are_matched() {
    let tok_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/tokenizer");
    let (fleet, gw, mut seen) = fleet_and_gateway_with_tokenizer(tok_dir).await;
    let urls = fleet.urls();
    let client = reqwest::Client::new();

    // The gateway computes the engine's ids: /admin/tokenize agrees with the engine's /tokenize.
    let body = chat("alpha");
    let ours = post_json(&client, &gw.admin_url("/admin/tokenize"), &body).await;
    let engine = post_json(&client, &format!("{}/tokenize", urls[0]), &body).await;
    assert_eq!(ours["result"], "exact", "{ours}");
    assert_eq!(ours["token_ids"], engine["tokens"]);
    assert_ne!(ours["prompt_tokens"], ours["estimated_prompt_tokens"]);

    // Three prefixes, each planted on one engine directly; through the gateway each goes there.
    for (tag, holder) in [("alpha", 1usize), ("beta", 0), ("gamma", 1)] {
        post(&client, &urls[holder], &chat(tag)).await;
        seen[holder] = wait_decoded(&gw, holder, seen[holder]).await;
        let before = prompt_totals(&fleet);
        post(&client, &gw.url(""), &chat(tag)).await;
        assert_eq!(
            served(&fleet, &before),
            holder,
            "{tag}: routed to its holder"
        );
        // The routed request may be stored again: take in its events before the next tag.
        seen[holder] = decoded(&metrics(&gw).await, holder);
    }
    let m = metrics(&gw).await;
    let exact = metric_value(
        &m,
        &format!("pronto_tokenize_total{{pool=\"{MODEL}\",result=\"exact\"}}"),
    )
    .unwrap_or(0.0);
    assert!(exact >= 3.0, "tokenized exactly: {exact}");
    fleet.shutdown().await;
}

/// A tiktoken encoding on both sides (no files: it is built in): the gateway's
/// `/admin/tokenize` equals the engine's `/tokenize` for a chat body (OpenAI's chat format) and
/// a completions body (ordinary text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_tiktoken_encoding_the_gateway_and_the_engine_agree() {
    let spec = "tiktoken:cl100k_base";
    let (fleet, gw, _) = fleet_and_gateway_with_tokenizer(spec).await;
    let url = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let completion = serde_json::json!({"model": MODEL, "prompt": "hello world"});
    for (endpoint, body) in [("chat", chat("alpha")), ("completions", completion)] {
        let admin = gw.admin_url(&format!("/admin/tokenize?endpoint={endpoint}"));
        let ours = post_json(&client, &admin, &body).await;
        let engine = post_json(&client, &format!("{url}/tokenize"), &body).await;
        assert_eq!(ours["result"], "exact", "{ours}");
        assert_eq!(ours["tokenizer"], spec);
        assert_eq!(ours["token_ids"], engine["tokens"], "{endpoint}");
        assert_eq!(ours["prompt_tokens"], engine["count"], "{endpoint}");
        let ids = ours["token_ids"].as_array().unwrap();
        if endpoint == "chat" {
            // ChatML's `<|im_start|>` opens the turn; the estimate counts otherwise.
            assert_eq!(ids[0], 100264, "{ours}");
            assert_ne!(ours["prompt_tokens"], ours["estimated_prompt_tokens"]);
        } else {
            assert_eq!(ours["token_ids"], serde_json::json!([15339, 1917]));
        }
    }
    fleet.shutdown().await;
}
