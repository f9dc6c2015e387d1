//! One whole routing decision, as the proxy makes it (`Pool::route` then `Pool::dispatch`):
//! build the pool's views with the core's view builder (ledger load, engine stats, TTFT
//! models, the prefix-index match for this prompt limited to each backend's cache residency),
//! `predicted_ttft`'s `select()` with its KV-wait term, then the dispatch: the booking in the
//! ledger and the prompt's prefix recorded in the index (released again at once). Every
//! backend has a known KV capacity and requests in flight, so the residency and KV-wait paths
//! run; a quarter of them are too full for the prompt. At 8 / 64 / 256 backends with ~1M
//! blocks indexed and a 750-block (12k-token) prompt. Target: < 5 µs at 64 backends.
//! Explain headers off (the default): with them on, the decision also finds the runner-up,
//! one more prediction per backend.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use pronto::config::Config;
use pronto::state::GatewayState;
use pronto::telemetry::Metrics;
use pronto_core::engine::{EngineFlavor, EngineSample};
use pronto_core::load::RequestLoad;
use pronto_core::request::RequestFeatures;
use pronto_core::tokens::{chain_hash, BlockHash};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PROMPT_BLOCKS: usize = 750;
const INDEXED_BLOCKS: usize = 1 << 20;

fn chain(seed: u64, n: usize, out: &mut Vec<BlockHash>) {
    for i in 0..n {
        let ids = [seed as u32, (seed >> 32) as u32, i as u32];
        out.push(chain_hash(out.last().copied(), &ids));
    }
}

fn state(backends: usize) -> GatewayState {
    let mut yaml = String::from("pools:\n  m:\n    policy: predicted_ttft\n    backends:\n");
    for i in 0..backends {
        yaml.push_str(&format!(
            "      - {{ name: b{i}, url: \"http://127.0.0.1:{}\" }}\n",
            10_000 + i
        ));
    }
    let config = Config::from_yaml_str(&yaml, "bench").expect("valid config");
    GatewayState::new(Arc::new(config), Default::default(), &Metrics::new())
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("routing_decision");
    for n in [8usize, 64, 256] {
        let st = state(n);
        let pool = st.pool("m").expect("pool");
        let now = Instant::now();
        let mut rng = SmallRng::seed_from_u64(1);
        // Conversations sharing 32 system prompts, spread over the backends.
        let mut indexed = 0;
        let mut last = Vec::new();
        while indexed < INDEXED_BLOCKS {
            let mut h = Vec::new();
            chain(rng.gen_range(0..32), 100, &mut h);
            let len = rng.gen_range(200..PROMPT_BLOCKS);
            // Continue the system chain with the conversation's own blocks.
            let tail: u64 = rng.gen();
            for i in 0..len - 100 {
                let ids = [tail as u32, (tail >> 32) as u32, i as u32];
                h.push(chain_hash(h.last().copied(), &ids));
            }
            pool.index.record(rng.gen_range(0..n), &h, now);
            indexed += len - 100;
            last = h;
        }
        let mut features = RequestFeatures::synthetic("m", String::new(), Some(64));
        let ids = [9u32, 9, 9];
        while last.len() < PROMPT_BLOCKS {
            last.push(chain_hash(last.last().copied(), &ids));
        }
        features.block_hashes = last;
        features.prompt_tokens = (PROMPT_BLOCKS * 16) as u32;
        // Known KV capacities, and load in flight on every backend (a quarter nearly full).
        let mut guards = Vec::new();
        for (i, b) in pool.backends.iter().enumerate() {
            let sample = EngineSample {
                waiting: 1.0,
                running: 4.0,
                kv_usage: 0.5,
                prefix_queries: None,
                prefix_hits: None,
                cache_hit_rate: None,
                kv_capacity_tokens: Some(200_000.0),
                flavor: EngineFlavor::Vllm,
            };
            b.record_engine_sample(sample, now, std::time::Duration::from_secs(3600));
            let kv = if i % 4 == 0 { 195_000 } else { 40_000 };
            let load = RequestLoad {
                prefill_tokens: 2_000,
                kv_tokens: kv,
            };
            guards.push(b.start_request(load, now, true, None));
        }
        let policy = &pool.policy;
        group.bench_function(format!("{n}_backends"), |b| {
            b.iter(|| {
                let routed = pool
                    .route(&**policy, black_box(&features), now, &[], false)
                    .expect("a backend");
                black_box(pool.dispatch(&routed, &features, true, now))
            })
        });
        drop(guards);
        eprintln!("{n} backends: {} blocks indexed", pool.index.len());
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
