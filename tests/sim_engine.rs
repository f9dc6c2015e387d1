//! Scheduler tests for the simulated engine, on virtual time (sums of step durations).

use pronto_sim::engine::{Engine, EngineConfig, EngineEvent, SimRequest};
use pronto_sim::profile::Profile;

fn engine(num_kv_blocks: usize, budget: usize, max_num_seqs: usize) -> Engine {
    let mut cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
    cfg.num_kv_blocks = num_kv_blocks;
    cfg.max_num_batched_tokens = budget;
    cfg.max_num_seqs = max_num_seqs;
    cfg.block_size = 16;
    Engine::new(cfg)
}

/// Distinct token ids: `n` tokens of stream `seed`.
fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| seed.wrapping_mul(1_000_003) ^ i)
        .collect()
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: u32) -> SimRequest {
    SimRequest {
        id,
        prompt,
        max_tokens,
    }
}

/// Step until idle; every event with the virtual time of its step's end.
fn run(e: &mut Engine) -> Vec<(f64, EngineEvent)> {
    let mut now = 0.0;
    let mut out = Vec::new();
    let mut steps = 0;
    while let Some(s) = e.step() {
        now += s.duration_s;
        out.extend(s.events.into_iter().map(|ev| (now, ev)));
        steps += 1;
        assert!(steps < 100_000, "engine did not drain");
    }
    out
}

fn first_token(events: &[(f64, EngineEvent)], id: u64) -> (f64, u32) {
    events
        .iter()
        .find_map(|&(t, ev)| match ev {
            EngineEvent::FirstToken {
                id: i,
                cached_tokens,
                ..
            } if i == id => Some((t, cached_tokens)),
            _ => None,
        })
        .expect("first token")
}

fn finished(events: &[(f64, EngineEvent)], id: u64) -> u32 {
    events
        .iter()
        .find_map(|&(_, ev)| match ev {
            EngineEvent::Finished {
                id: i,
                output_tokens,
            } if i == id => Some(output_tokens),
            _ => None,
        })
        .expect("finished")
}

#[test]
fn chunked_prefill_splits_a_long_prompt_within_the_budget() {
    let mut e = engine(1000, 512, 256);
    e.add_request(req(1, prompt(1, 1200), 2));
    let mut steps = Vec::new();
    while let Some(s) = e.step() {
        steps.push(s);
    }
    // 512 + 512 + 176 prefill tokens, then one decode step.
    assert_eq!(steps.len(), 4);
    assert!(steps[..2].iter().all(|s| s.events.is_empty()));
    assert!(matches!(
        steps[2].events[..],
        [EngineEvent::FirstToken {
            id: 1,
            prompt_tokens: 1200,
            cached_tokens: 0
        }]
    ));
    // Chunk 2 attends to chunk 1: it costs more than chunk 1; the 176-token tail costs less.
    assert!(steps[1].duration_s > steps[0].duration_s);
    assert!(steps[2].duration_s < steps[0].duration_s);
    assert!(matches!(
        steps[3].events[..],
        [
            EngineEvent::Token { id: 1 },
            EngineEvent::Finished {
                id: 1,
                output_tokens: 2
            }
        ]
    ));
    let st = e.stats();
    assert_eq!(st.prompt_tokens_total, 1200);
    assert_eq!(st.generation_tokens_total, 2);
    assert_eq!(st.kv_usage, 0.0);
}

#[test]
fn prefix_hit_skips_prefill_and_lowers_ttft() {
    let shared = prompt(7, 1000);
    let mut warm = engine(1000, 8192, 256);
    warm.add_request(req(1, shared.clone(), 1));
    run(&mut warm);
    let mut b = shared.clone();
    b.extend(prompt(8, 200));
    assert_eq!(warm.cached_prefix_tokens(&b), 992);
    warm.add_request(req(2, b.clone(), 1));
    let ev = run(&mut warm);
    let (t_warm, cached) = first_token(&ev, 2);
    assert_eq!(cached, 992);

    let mut cold = engine(1000, 8192, 256);
    cold.add_request(req(2, b, 1));
    let (t_cold, cached) = first_token(&run(&mut cold), 2);
    assert_eq!(cached, 0);
    assert!(t_warm < t_cold, "{t_warm} >= {t_cold}");
    let st = warm.stats();
    assert_eq!(st.prefix_queries_tokens, 2200);
    assert_eq!(st.prefix_hits_tokens, 992);
}

#[test]
fn blocks_computed_by_a_running_prefill_are_hits_for_later_arrivals() {
    let mut e = engine(1000, 1024, 256);
    let a = prompt(5, 2000);
    e.add_request(req(1, a.clone(), 1));
    e.step().unwrap();
    // A has computed its first 1024 tokens (64 blocks) and is still prefilling.
    let mut b = a[..1500].to_vec();
    b.extend(prompt(6, 100));
    assert_eq!(e.cached_prefix_tokens(&b), 1024);
    e.add_request(req(2, b, 1));
    let ev = run(&mut e);
    assert_eq!(first_token(&ev, 2).1, 1024);
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let mut e = engine(100, 8192, 256);
    let p = prompt(3, 64);
    e.add_request(req(1, p.clone(), 1));
    run(&mut e);
    // 64 tokens = 4 full blocks, but at most 63 tokens may hit: 3 blocks.
    assert_eq!(e.cached_prefix_tokens(&p), 48);
    e.add_request(req(2, p, 1));
    let ev = run(&mut e);
    assert_eq!(first_token(&ev, 2).1, 48);
}

#[test]
fn lru_evicts_least_recent_and_sequence_tails_first() {
    // 8 blocks; A and B (64 tokens = 4 blocks each, max_tokens 1 so no output block) fill it.
    let mut e = engine(8, 8192, 256);
    let (a, b) = (prompt(1, 64), prompt(2, 64));
    e.add_request(req(1, a.clone(), 1));
    run(&mut e);
    e.add_request(req(2, b.clone(), 1));
    run(&mut e);
    assert_eq!(e.cached_prefix_tokens(&a), 48);
    assert_eq!(e.cached_prefix_tokens(&b), 48);
    // 40 tokens need 3 blocks: A is least recently used and its blocks were freed tail
    // first, so A's blocks 3, 2, 1 are evicted and only its first block survives.
    e.add_request(req(3, prompt(3, 40), 1));
    run(&mut e);
    assert_eq!(e.cached_prefix_tokens(&a), 16);
    assert_eq!(e.cached_prefix_tokens(&b), 48);
    assert_eq!(e.evictions(), 3);
}

#[test]
fn preemption_when_kv_is_exhausted_and_requests_still_finish() {
    let mut e = engine(10, 8192, 256);
    e.add_request(req(1, prompt(1, 32), 100));
    e.add_request(req(2, prompt(2, 32), 100));
    let ev = run(&mut e);
    assert!(e.stats().preemptions_total > 0);
    assert_eq!(finished(&ev, 1), 100);
    assert_eq!(finished(&ev, 2), 100);
    let firsts = ev
        .iter()
        .filter(|(_, x)| matches!(x, EngineEvent::FirstToken { .. }))
        .count();
    assert_eq!(firsts, 2, "a preempted request emits its first token once");
    assert_eq!(e.stats().generation_tokens_total, 200);
    assert_eq!(e.stats().kv_usage, 0.0);
}

#[test]
fn max_num_seqs_caps_the_running_batch() {
    let mut e = engine(1000, 8192, 2);
    for id in 0..5 {
        e.add_request(req(id, prompt(id as u32, 50), 10));
    }
    e.step().unwrap();
    let st = e.stats();
    assert_eq!((st.running, st.waiting), (2, 3));
    let ev = run(&mut e);
    assert_eq!(
        ev.iter()
            .filter(|(_, x)| matches!(x, EngineEvent::Finished { .. }))
            .count(),
        5
    );
    // FCFS: first tokens in arrival order.
    let order: Vec<u64> = ev
        .iter()
        .filter_map(|(_, x)| match x {
            EngineEvent::FirstToken { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(order, [2, 3, 4]);
}

#[test]
fn runs_are_deterministic() {
    let go = || {
        let mut e = engine(60, 256, 4);
        for id in 0..12u64 {
            let mut p = prompt(0, 100);
            p.extend(prompt(id as u32 + 1, 40 + 13 * id as usize));
            e.add_request(req(id, p, 5 + id as u32));
        }
        (run(&mut e), e.stats())
    };
    let (a, sa) = go();
    let (b, sb) = go();
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert!(sa.prefix_hits_tokens > 0);
}

#[test]
fn abort_frees_blocks_and_unknown_ids_are_ignored() {
    let mut e = engine(100, 64, 256);
    e.add_request(req(1, prompt(1, 500), 10));
    e.add_request(req(2, prompt(2, 500), 10));
    e.step().unwrap();
    assert!(e.stats().kv_usage > 0.0);
    e.abort(1);
    e.abort(2);
    e.abort(99);
    assert_eq!(e.stats().kv_usage, 0.0);
    assert!(!e.has_work());
    assert!(e.step().is_none());
}

#[test]
fn a_request_that_can_never_fit_is_rejected() {
    let mut e = engine(4, 8192, 256);
    e.add_request(req(1, prompt(1, 100), 1));
    let s = e.step().unwrap();
    assert_eq!(
        s.events,
        [EngineEvent::Finished {
            id: 1,
            output_tokens: 0
        }]
    );
    assert!(!e.has_work());
}

#[test]
fn clear_cache_loses_every_prefix() {
    let mut e = engine(100, 8192, 256);
    let p = prompt(1, 200);
    e.add_request(req(1, p.clone(), 1));
    run(&mut e);
    assert!(e.cached_prefix_tokens(&p) > 0);
    e.clear_cache();
    assert_eq!(e.cached_prefix_tokens(&p), 0);
}

#[test]
fn decode_step_cost_grows_with_batch_and_context() {
    let mut small = engine(10_000, 8192, 256);
    small.add_request(req(1, prompt(1, 100), 3));
    small.step().unwrap();
    let one = small.step().unwrap().duration_s;
    let mut big = engine(10_000, 8192, 256);
    for id in 0..32 {
        big.add_request(req(id, prompt(id as u32, 2000), 3));
    }
    let mut firsts = 0;
    while firsts < 32 {
        firsts += big
            .step()
            .unwrap()
            .events
            .iter()
            .filter(|x| matches!(x, EngineEvent::FirstToken { .. }))
            .count();
    }
    let many = big.step().unwrap().duration_s;
    assert!(many > one, "{many} <= {one}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the workload and however small the cache, every request gets one first
        /// token and finishes with exactly `max_tokens`, and every block is returned.
        #[test]
        fn every_request_finishes_and_blocks_are_returned(
            blocks in 20usize..200,
            budget in 16usize..2048,
            seqs in 1usize..16,
            reqs in proptest::collection::vec((0u32..4, 1usize..300, 1u32..40), 1..24),
        ) {
            let mut e = engine(blocks, budget, seqs);
            for (i, &(prefix, len, max_tokens)) in reqs.iter().enumerate() {
                let mut p = prompt(prefix, 64);
                p.extend(prompt(100 + i as u32, len));
                e.add_request(req(i as u64, p, max_tokens));
            }
            let ev = run(&mut e);
            for (i, &(_, len, max_tokens)) in reqs.iter().enumerate() {
                let id = i as u64;
                let firsts = ev.iter().filter(|(_, x)| matches!(x, EngineEvent::FirstToken { id: j, .. } if *j == id)).count();
                let fits = (64 + len + max_tokens as usize).div_ceil(16) <= blocks;
                prop_assert_eq!(finished(&ev, id), if fits { max_tokens } else { 0 });
                prop_assert_eq!(firsts, usize::from(fits));
            }
            prop_assert_eq!(e.stats().kv_usage, 0.0);
            prop_assert_eq!(e.num_requests(), 0);
        }
    }
}
