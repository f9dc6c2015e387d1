//! Offline evaluator speed: virtual-replay requests per second on a generated multi-turn chat
//! workload (shared system prompts, growing conversations) over four bounded H100 backends.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pronto_sim::engine::EngineConfig;
use pronto_sim::evaluate::{apply_load, evaluate, SimBackend};
use pronto_sim::profile::Profile;
use pronto_sim::workload::{spread_ties, SyntheticWorkload};

fn bench(c: &mut Criterion) {
    let mut cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
    cfg.num_kv_blocks = 4000;
    let fleet: Vec<SimBackend> = (0..4)
        .map(|i| SimBackend::new(format!("b{i}"), cfg.clone()))
        .collect();
    let mut reqs = SyntheticWorkload {
        seed: 3,
        conversations: 150,
        ..SyntheticWorkload::default()
    }
    .generate();
    spread_ties(&mut reqs);
    apply_load(&fleet, &mut reqs, 0.8);
    let mut g = c.benchmark_group("evaluate");
    g.throughput(Throughput::Elements(reqs.len() as u64));
    g.sample_size(10);
    for policy in ["round_robin", "least_inflight", "oracle"] {
        g.bench_function(policy, |b| {
            b.iter(|| evaluate(&fleet, "m", &reqs, policy).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
