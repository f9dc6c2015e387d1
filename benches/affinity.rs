//! Prefix-index speed and size: `match_lengths` for 750-block (12k-token) prompts over 8, 64 and
//! 256 backends with 1M blocks indexed, built from synthetic multi-turn conversations over 32
//! shared system prompts. Also prints bytes per indexed block, the build rate, and how often the
//! bisection differs from the exact walk when the index runs 4× over its cap (eviction holes).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pronto_core::affinity::{IndexConfig, PrefixIndex};
use pronto_core::tokens::{chain_hash, BlockHash};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PROMPT_BLOCKS: usize = 750;
const TARGET_BLOCKS: usize = 1 << 20;

fn extend(out: &mut Vec<BlockHash>, seed: u64, n: usize) {
    for i in 0..n {
        let ids = [seed as u32, (seed >> 32) as u32, i as u32, 7];
        out.push(chain_hash(out.last().copied(), &ids));
    }
}

/// A built index plus 512 query prompts (the next turn of an indexed conversation).
struct Fixture {
    index: PrefixIndex,
    queries: Vec<Vec<BlockHash>>,
    now: Instant,
    records: usize,
    build: Duration,
}

/// Feed conversations until `target` distinct blocks were generated. Each conversation starts
/// from one of 32 system prompts (64–128 blocks), grows by 20–60 blocks a turn up to 720, and
/// is sent to a sticky backend that moves with probability 0.1 per turn.
fn build(backends: usize, max_blocks: usize, target: usize, seed: u64) -> Fixture {
    let mut rng = SmallRng::seed_from_u64(seed);
    let index = PrefixIndex::new(IndexConfig {
        max_blocks,
        ttl: Duration::from_secs(600),
        max_backends: backends,
    });
    let systems: Vec<Vec<BlockHash>> = (0..32)
        .map(|s| {
            let mut h = Vec::new();
            extend(&mut h, s, rng.gen_range(64..=128));
            h
        })
        .collect();
    let t0 = Instant::now();
    let mut now = t0;
    let (mut generated, mut records) = (0usize, 0usize);
    let mut finished = Vec::new();
    let started = Instant::now();
    for conv in 0u64.. {
        if generated >= target {
            break;
        }
        let mut h = systems[rng.gen_range(0..systems.len())].clone();
        let mut backend = rng.gen_range(0..backends);
        let mut turn = 0;
        while h.len() < PROMPT_BLOCKS - 30 {
            let add = rng.gen_range(20..=60).min(PROMPT_BLOCKS - 30 - h.len());
            extend(&mut h, (conv << 8) | turn, add);
            generated += add;
            turn += 1;
            if rng.gen_bool(0.1) {
                backend = rng.gen_range(0..backends);
            }
            index.record(backend, &h, now);
            records += 1;
            now += Duration::from_millis(15);
        }
        finished.push(h);
    }
    let build = started.elapsed();
    let queries = (0..512)
        .map(|q| {
            let mut h = finished[rng.gen_range(0..finished.len())].clone();
            let tail = PROMPT_BLOCKS - h.len();
            extend(&mut h, u64::MAX - q, tail);
            h
        })
        .collect();
    Fixture {
        index,
        queries,
        now,
        records,
        build,
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("affinity_match_750_blocks");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for backends in [8usize, 64, 256] {
        let f = build(backends, 4 << 20, TARGET_BLOCKS, 11);
        let len = f.index.len();
        println!(
            "{backends} backends: {len} blocks, {:.1} bytes/block, {:.1} MiB per 1M blocks; \
             built with {} records in {:.2?} ({:.2} µs/record)",
            f.index.memory_bytes() as f64 / len as f64,
            f.index.memory_bytes() as f64 / len as f64 * 1e6 / (1 << 20) as f64,
            f.records,
            f.build,
            f.build.as_secs_f64() * 1e6 / f.records as f64,
        );
        let mut out = vec![0u32; backends];
        let mut q = 0;
        g.bench_function(format!("bisect/{backends}"), |b| {
            b.iter(|| {
                q = (q + 1) % f.queries.len();
                f.index.match_lengths(&f.queries[q], f.now, &mut out);
                black_box(&out);
            })
        });
        if backends == 64 {
            g.bench_function(format!("walk/{backends}"), |b| {
                b.iter(|| {
                    q = (q + 1) % f.queries.len();
                    f.index.match_lengths_exact(&f.queries[q], f.now, &mut out);
                    black_box(&out);
                })
            });
        }
    }
    g.finish();
    accuracy_under_churn();
}

/// The bisection's approximation, measured: index capped at 256k blocks, fed 1M.
fn accuracy_under_churn() {
    let backends = 64;
    let f = build(backends, 1 << 18, TARGET_BLOCKS, 12);
    let (mut fast, mut exact) = (vec![0u32; backends], vec![0u32; backends]);
    let (mut pairs, mut differ, mut abs_diff, mut matched) = (0u64, 0u64, 0u64, 0u64);
    for h in &f.queries {
        f.index.match_lengths(h, f.now, &mut fast);
        f.index.match_lengths_exact(h, f.now, &mut exact);
        for (a, e) in fast.iter().zip(&exact) {
            pairs += 1;
            matched += u64::from(*e);
            if a != e {
                differ += 1;
                abs_diff += u64::from(a.abs_diff(*e));
            }
        }
    }
    println!(
        "churn (cap 256k, fed 1M, {} evictions): bisection differs from the walk on {differ} of \
         {pairs} (query, backend) pairs ({:.2} %), |error| {abs_diff} blocks = {:.2} % of the \
         {matched} matched blocks",
        f.index.evictions(),
        100.0 * differ as f64 / pairs as f64,
        100.0 * abs_diff as f64 / matched.max(1) as f64,
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
