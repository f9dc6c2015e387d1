//! One whole routing decision, as the proxy makes it: build the pool's views (load counters,
//! engine stats, TTFT models, and the prefix-index match for this prompt), then
//! `predicted_ttft`'s `select()`. At 8 / 64 / 256 backends with ~1M blocks indexed and a
//! 750-block (12k-token) prompt. Target: < 5 µs at 64 backends.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use pronto::config::Config;
use pronto::gateway::GatewayState;
use pronto::request::RequestFeatures;
use pronto::routing::Snapshot;
use pronto::telemetry::Metrics;
use pronto::tokens::{chain_hash, BlockHash};
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
    GatewayState::new(Arc::new(config), &Metrics::new())
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
        group.bench_function(format!("{n}_backends"), |b| {
            b.iter(|| {
                let views = pool.views(black_box(&features), now, &[]);
                let snap = Snapshot { backends: &views };
                black_box(
                    pool.policy
                        .select(&features, &snap, now)
                        .expect("a backend"),
                )
            })
        });
        eprintln!("{n} backends: {} blocks indexed", pool.index.len());
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
