use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::shard::RECENT;
use super::*;
use crate::tokens::chain_hash;

/// `n` fresh blocks chained after `base`, their ids drawn from `seed`.
fn extend(base: &[BlockHash], seed: u64, n: usize) -> Vec<BlockHash> {
    let mut out = base.to_vec();
    for i in 0..n {
        let ids = [seed as u32, (seed >> 32) as u32, i as u32];
        out.push(chain_hash(out.last().copied(), &ids));
    }
    out
}

fn cfg(max_blocks: usize) -> IndexConfig {
    IndexConfig {
        max_blocks,
        ttl: Duration::from_secs(600),
        max_backends: 256,
    }
}

fn lengths(idx: &PrefixIndex, h: &[BlockHash], now: Instant, n: usize) -> Vec<u32> {
    let mut fast = vec![0; n];
    idx.match_lengths(h, now, &mut fast);
    let mut exact = vec![7; n];
    idx.match_lengths_exact(h, now, &mut exact);
    assert_eq!(fast, exact, "bisection and walk disagree");
    fast
}

#[test]
fn shared_prefix_is_matched_and_divergence_stops_it() {
    let idx = PrefixIndex::new(cfg(100_000));
    let t = Instant::now();
    let sys = extend(&[], 1, 40);
    let conv_a = extend(&sys, 2, 30);
    let conv_b = extend(&sys, 3, 50);
    idx.record(0, &conv_a, t);
    idx.record(1, &conv_b, t);
    // Turn 2 of conversation A: A's history plus a new tail.
    let next = extend(&conv_a, 4, 20);
    assert_eq!(lengths(&idx, &next, t, 3), [70, 40, 0]);
    // A prompt sharing nothing.
    assert_eq!(lengths(&idx, &extend(&[], 9, 30), t, 3), [0, 0, 0]);
    assert_eq!(idx.len(), 40 + 30 + 50);
}

#[test]
fn per_backend_lengths_differ() {
    let idx = PrefixIndex::new(cfg(1 << 20));
    let t = Instant::now();
    let chain = extend(&[], 5, 750);
    let cut = [750, 0, 1, 749, 375, 16, 500, 2];
    for (b, &n) in cut.iter().enumerate() {
        idx.record(b * 36, &chain[..n], t);
    }
    let got = lengths(&idx, &chain, t, 256);
    for (b, &n) in cut.iter().enumerate() {
        assert_eq!(got[b * 36], n as u32, "backend {}", b * 36);
    }
    assert_eq!(got.iter().filter(|&&l| l > 0).count(), 7);
}

#[test]
fn forget_backend_clears_only_that_backend() {
    let idx = PrefixIndex::new(cfg(1 << 20));
    let t = Instant::now();
    let sys = extend(&[], 1, 10);
    let a = extend(&sys, 2, 10);
    idx.record(3, &a, t);
    idx.record(70, &sys, t);
    assert_eq!(idx.len(), 20);
    assert_eq!(idx.forget_backend(3), 10, "a's own tail is left empty");
    assert_eq!(idx.len(), 10);
    let got = lengths(&idx, &a, t, 128);
    assert_eq!((got[3], got[70]), (0, 10));
    assert_eq!(idx.forget_backend(70), 10);
    assert!(idx.is_empty());
    assert_eq!(idx.forget_backend(9999), 0);
}

#[test]
fn entries_expire_after_ttl() {
    let ttl = Duration::from_secs(60); // tick = 100 ms
    let idx = PrefixIndex::new(IndexConfig {
        ttl,
        ..cfg(1 << 20)
    });
    let t0 = Instant::now();
    let old = extend(&[], 1, 30);
    let fresh = extend(&[], 2, 30);
    idx.record(0, &old, t0);
    idx.record(1, &fresh, t0);
    let tick = Duration::from_millis(100);
    assert_eq!(lengths(&idx, &old, t0 + ttl - tick, 2), [30, 0]);
    // Refresh `fresh` half-way; `old` is not refreshed.
    idx.record(1, &fresh, t0 + ttl / 2);
    let later = t0 + ttl + 3 * tick;
    assert_eq!(lengths(&idx, &old, later, 2), [0, 0]);
    assert_eq!(lengths(&idx, &fresh, later, 2), [0, 30]);
    assert_eq!(idx.len(), 60, "expiry is lazy");
    assert_eq!(idx.sweep(later), 30);
    assert_eq!(idx.len(), 30);
    assert_eq!(idx.sweep(t0 + 2 * ttl), 30);
    assert!(idx.is_empty());
}

#[test]
fn limit_to_recent_keeps_only_the_recently_used_head_per_backend() {
    let idx = PrefixIndex::new(IndexConfig {
        ttl: Duration::from_secs(600), // tick = 1 s
        ..cfg(1 << 20)
    });
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    // Backend 0 was sent a 10-block prompt at t0; backend 1 the same prompt's first 4 blocks
    // at t0 + 50 s. That refreshes those 4 blocks for backend 1 only.
    let chain = extend(&[], 1, 10);
    idx.record(0, &chain, t0);
    idx.record(1, &chain[..4], t0 + 50 * s);
    let now = t0 + 60 * s;
    let mut len = lengths(&idx, &chain, now, 3);
    assert_eq!(len, [10, 4, 0]);
    // Residency 30 s: backend 0 last had the prompt 60 s ago, whoever used it since.
    idx.limit_to_recent(&chain, now, &[30.0, 30.0, 30.0], &mut len);
    assert_eq!(len, [0, 4, 0]);
    // Per backend: a long residency keeps everything; an infinite one means "unknown".
    let mut len = lengths(&idx, &chain, now, 2);
    idx.limit_to_recent(&chain, now, &[90.0, 5.0], &mut len);
    assert_eq!(len, [10, 0]);
    let mut len = lengths(&idx, &chain, now, 2);
    idx.limit_to_recent(&chain, now, &[f64::INFINITY, f64::NAN], &mut len);
    assert_eq!(len, [10, 4]);
    // Agrees with a walk over every prefix length.
    for age in [0.0, 5.0, 10.0, 11.0, 59.0, 61.0] {
        let mut len = lengths(&idx, &chain, now, 2);
        idx.limit_to_recent(&chain, now, &[age, age], &mut len);
        let walk0 = if age >= 60.0 { 10 } else { 0 };
        let walk1 = if age >= 10.0 { 4 } else { 0 };
        assert_eq!(len, [walk0, walk1], "age {age}");
    }
    // Backend 0 sends the first 6 blocks again: they are recent for it, the rest are not.
    idx.record(0, &chain[..6], now);
    let mut len = lengths(&idx, &chain, now, 2);
    idx.limit_to_recent(&chain, now, &[30.0, 30.0], &mut len);
    assert_eq!(len, [6, 4]);
}

#[test]
fn a_backend_pushed_out_of_the_recent_recorders_gets_the_oldest_of_them() {
    let idx = PrefixIndex::new(cfg(1 << 20)); // tick = 1 s
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let chain = extend(&[], 1, 8);
    idx.record(0, &chain, t0);
    // RECENT - 1 others use the prompt later: backend 0 keeps its own (old) recorder word.
    for b in 1..RECENT {
        idx.record(b, &chain, t0 + 40 * s + b as u32 * s);
    }
    let now = t0 + 60 * s;
    let mut len = lengths(&idx, &chain, now, RECENT + 1);
    idx.limit_to_recent(&chain, now, &[30.0; RECENT + 1], &mut len);
    assert_eq!(len[0], 0, "its own use is 60 s old");
    assert!(len[1..RECENT].iter().all(|&l| l == 8), "{len:?}");
    // One more: backend 0 is out of the recorder words, so its last use is bounded by the
    // oldest recorder's (t0 + 41 s) and the prompt counts as recent for it again.
    idx.record(RECENT, &chain[..5], t0 + 50 * s);
    let mut len = lengths(&idx, &chain, now, RECENT + 1);
    assert_eq!(len[0], 8);
    idx.limit_to_recent(&chain, now, &[30.0; RECENT + 1], &mut len);
    assert_eq!(len[0], 5, "only the blocks with {RECENT} later recorders");
    assert_eq!(len[RECENT], 5);
    // With a residency shorter than the oldest recorder's age it is stale again.
    let mut len = lengths(&idx, &chain, now, 1);
    idx.limit_to_recent(&chain, now, &[15.0], &mut len);
    assert_eq!(len[0], 0);
}

#[test]
fn forget_backend_frees_its_recorder_word() {
    let idx = PrefixIndex::new(cfg(1 << 20)); // tick = 1 s
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let chain = extend(&[], 1, 8);
    idx.record(0, &chain, t0);
    for b in 1..RECENT {
        idx.record(b, &chain, t0 + 40 * s);
    }
    // Forgetting backend 1 frees its word, so the next recorder takes it instead of pushing
    // backend 0 out: backend 0 keeps its own, old, tick.
    assert_eq!(idx.forget_backend(1), 0);
    idx.record(RECENT, &chain, t0 + 50 * s);
    let now = t0 + 60 * s;
    let mut len = lengths(&idx, &chain, now, RECENT + 1);
    assert_eq!(len[1], 0);
    idx.limit_to_recent(&chain, now, &[30.0; RECENT + 1], &mut len);
    assert_eq!((len[0], len[RECENT]), (0, 8));
    // A forgotten backend that is sent the prompt again starts afresh.
    idx.record(1, &chain[..3], now);
    let mut len = lengths(&idx, &chain, now, 2);
    assert_eq!(len, [8, 3]);
    idx.limit_to_recent(&chain, now, &[0.0, 0.0], &mut len);
    assert_eq!(len, [0, 3]);
}

#[test]
fn records_in_the_same_tick_by_others_do_not_skip_a_backends_write() {
    // The record fast path skips blocks the backend itself used this tick, not blocks anyone
    // used this tick: backend 1's record must make the chain recent for backend 1.
    let idx = PrefixIndex::new(cfg(1 << 20));
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let chain = extend(&[], 1, 30);
    idx.record(1, &chain[..10], t0);
    let now = t0 + 100 * s;
    idx.record(0, &chain, now);
    idx.record(1, &chain[..20], now);
    let mut len = lengths(&idx, &chain, now, 2);
    assert_eq!(len, [30, 20]);
    idx.limit_to_recent(&chain, now, &[1.0, 1.0], &mut len);
    assert_eq!(len, [30, 20]);
}

#[test]
fn expired_entry_does_not_bring_back_old_backends() {
    let ttl = Duration::from_secs(60);
    let idx = PrefixIndex::new(IndexConfig {
        ttl,
        ..cfg(1 << 20)
    });
    let t0 = Instant::now();
    let h = extend(&[], 1, 20);
    idx.record(0, &h, t0);
    let later = t0 + 2 * ttl;
    idx.record(1, &h, later);
    assert_eq!(lengths(&idx, &h, later, 2), [0, 20]);
}

#[test]
fn partial_refresh_keeps_chain_nested() {
    // Recording a longer chain at a later tick rewrites the stale prefix too.
    let idx = PrefixIndex::new(cfg(1 << 20));
    let t0 = Instant::now();
    let short = extend(&[], 1, 40);
    let long = extend(&short, 2, 40);
    idx.record(0, &short, t0);
    idx.record(0, &long, t0 + Duration::from_secs(5));
    // Only `short` entries could have expired first if the prefix had not been refreshed.
    let t = t0 + Duration::from_secs(602);
    assert_eq!(lengths(&idx, &long, t, 1), [80]);
}

#[test]
fn cap_respected_under_churn_across_shards() {
    let max = 5000;
    let idx = PrefixIndex::new(cfg(max));
    assert!(idx.shards.len() > 1, "exercise several shards");
    let mut t = Instant::now();
    let sys = extend(&[], 1, 30);
    for c in 0..600u64 {
        let conv = extend(&sys, 100 + c, 40);
        idx.record((c % 8) as usize, &conv, t);
        assert!(idx.len() <= max);
        t += Duration::from_millis(1500);
    }
    assert!(idx.evictions() > 0);
    assert!(idx.len() > max * 9 / 10, "a full index stays near its cap");
    // The latest conversation survived whole; the hot system prompt too.
    let last = extend(&sys, 699, 40);
    let got = lengths(&idx, &last, t, 8);
    assert_eq!(got[599 % 8], 70);
    assert!(got.iter().all(|&l| l >= 30), "{got:?}");
}

#[test]
fn out_of_range_backends_and_empty_inputs() {
    let idx = PrefixIndex::new(IndexConfig {
        max_backends: 4,
        ..cfg(1000)
    });
    let t = Instant::now();
    let h = extend(&[], 1, 10);
    idx.record(4, &h, t);
    idx.record(0, &[], t);
    assert!(idx.is_empty());
    idx.record(3, &h, t);
    let mut out = vec![9; 8];
    idx.match_lengths(&h, t, &mut out);
    assert_eq!(out, [0, 0, 0, 10, 0, 0, 0, 0]);
    idx.match_lengths(&[], t, &mut out);
    assert_eq!(out, [0; 8]);
    idx.match_lengths(&h, t, &mut []);
}

#[test]
fn zero_capacity_indexes_nothing() {
    let idx = PrefixIndex::new(cfg(0));
    let t = Instant::now();
    let h = extend(&[], 1, 10);
    idx.record(0, &h, t);
    assert!(idx.is_empty());
    assert_eq!(lengths(&idx, &h, t, 1), [0]);
}

#[test]
#[should_panic(expected = "max_backends")]
fn too_many_backends_is_rejected() {
    PrefixIndex::new(IndexConfig {
        max_backends: MAX_BACKENDS + 1,
        ..cfg(10)
    });
}

#[test]
fn memory_grows_with_entries() {
    let idx = PrefixIndex::new(cfg(1 << 20));
    let empty = idx.memory_bytes();
    let t = Instant::now();
    idx.record(0, &extend(&[], 1, 10_000), t);
    let per_block = (idx.memory_bytes() - empty) / idx.len();
    // Slab (key, meta, 4 bitset words, RECENT recorder words) alone is 48 + 8·RECENT bytes;
    // the map adds at least 17.
    let least = 65 + 8 * RECENT;
    assert!(
        (least..=200).contains(&per_block),
        "{per_block} bytes/block"
    );
}

#[test]
fn concurrent_readers_and_writers() {
    let idx = PrefixIndex::new(cfg(1 << 20));
    let t0 = Instant::now();
    let sys = extend(&[], 1, 50);
    std::thread::scope(|s| {
        for w in 0..4usize {
            let (idx, sys) = (&idx, &sys);
            s.spawn(move || {
                let mut out = [0u32; 4];
                for turn in 0..50u64 {
                    let conv = extend(sys, w as u64 * 1000, 10 * (turn as usize + 1));
                    let t = t0 + Duration::from_millis(turn * 10);
                    idx.match_lengths(&conv, t, &mut out);
                    if turn > 0 {
                        assert!(out[w] as usize >= 50 + 10 * turn as usize, "{out:?}");
                    }
                    idx.record(w, &conv, t);
                }
            });
        }
    });
    let t = t0 + Duration::from_secs(1);
    for w in 0..4usize {
        let conv = extend(&sys, w as u64 * 1000, 500);
        assert_eq!(lengths(&idx, &conv, t, 4)[w], 550);
    }
}

// === property tests ===

/// A reference model: exact sets, no bounds; per (block, backend) and per block last-use ticks.
#[derive(Default)]
struct Model {
    held: HashMap<BlockHash, u64>,
    last: HashMap<(BlockHash, usize), u64>,
    any: HashMap<BlockHash, u64>,
}

impl Model {
    fn record(&mut self, b: usize, h: &[BlockHash]) {
        self.record_at(b, h, 0);
    }
    fn record_at(&mut self, b: usize, h: &[BlockHash], tick: u64) {
        for x in h {
            *self.held.entry(*x).or_default() |= 1 << b;
            self.last.insert((*x, b), tick);
            self.any.insert(*x, tick);
        }
    }
    fn forget(&mut self, b: usize) {
        self.held.retain(|_, bits| {
            *bits &= !(1 << b);
            *bits != 0
        });
        self.last.retain(|&(_, x), _| x != b);
        let held = &self.held;
        self.any.retain(|x, _| held.contains_key(x));
    }
    /// Leading blocks of `h` that `b` holds and that were used no more than `age` ticks before
    /// `now`: by `b` itself (`own`) or by anyone.
    fn recent(&self, h: &[BlockHash], b: usize, now: u64, age: u64, own: bool) -> u32 {
        h.iter()
            .take_while(|x| {
                let tick = if own {
                    self.last.get(&(**x, b))
                } else {
                    self.any
                        .get(x)
                        .filter(|_| self.last.contains_key(&(**x, b)))
                };
                tick.is_some_and(|&t| t + age >= now)
            })
            .count() as u32
    }
    fn lengths(&self, h: &[BlockHash], nb: usize) -> Vec<u32> {
        (0..nb)
            .map(|b| {
                h.iter()
                    .take_while(|x| self.held.get(x).is_some_and(|bits| bits & (1 << b) != 0))
                    .count() as u32
            })
            .collect()
    }
}

/// A pool of chains forming a tree: chain `j` shares a prefix of an earlier chain.
fn chain_pool(spec: &[(usize, usize, usize)]) -> Vec<Vec<BlockHash>> {
    let mut pool: Vec<Vec<BlockHash>> = Vec::new();
    for (j, &(parent, split, tail)) in spec.iter().enumerate() {
        let base = match pool.get(parent % pool.len().max(1)) {
            Some(p) => p[..split.min(p.len())].to_vec(),
            None => Vec::new(),
        };
        pool.push(extend(&base, 1000 + j as u64, tail));
    }
    pool
}

#[derive(Debug, Clone)]
enum Op {
    Record {
        backend: usize,
        chain: usize,
        len: usize,
    },
    Forget(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..6usize, 0..8usize, 0..120usize)
            .prop_map(|(backend, chain, len)| Op::Record { backend, chain, len }),
        1 => (0..6usize).prop_map(Op::Forget),
    ]
}

fn pool_spec() -> impl Strategy<Value = Vec<(usize, usize, usize)>> {
    prop::collection::vec((0..8usize, 0..80usize, 1..80usize), 8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_reference_without_eviction(spec in pool_spec(),
                                          ops in prop::collection::vec(op(), 1..40)) {
        let pool = chain_pool(&spec);
        let idx = PrefixIndex::new(IndexConfig { max_backends: 6, ..cfg(1 << 16) });
        let mut model = Model::default();
        let mut t = Instant::now();
        for op in ops {
            match op {
                Op::Record { backend, chain, len } => {
                    let h = &pool[chain][..len.min(pool[chain].len())];
                    idx.record(backend, h, t);
                    model.record(backend, h);
                }
                Op::Forget(b) => {
                    idx.forget_backend(b);
                    model.forget(b);
                }
            }
            t += Duration::from_millis(700);
            for h in &pool {
                let mut got = vec![0; 6];
                idx.match_lengths(h, t, &mut got);
                prop_assert_eq!(&got, &model.lengths(h, 6));
                let mut exact = vec![0; 6];
                idx.match_lengths_exact(h, t, &mut exact);
                prop_assert_eq!(&got, &exact);
            }
            prop_assert_eq!(idx.len(), model.held.len());
        }
        prop_assert_eq!(idx.evictions(), 0);
    }

    #[test]
    fn per_backend_recency_is_bounded_by_the_truth_and_exact_for_few_backends(
        spec in pool_spec(),
        ops in prop::collection::vec((op(), 0..10u64), 1..40),
        few in any::<bool>(),
    ) {
        // With at most RECENT backends every recorder has its own word: exact. With more, a
        // backend pushed out gets an upper bound: never below its own last use, never above
        // the any-backend tick the index used before.
        let nb = if few { RECENT } else { 6 };
        let pool = chain_pool(&spec);
        let idx = PrefixIndex::new(IndexConfig { max_backends: nb, ..cfg(1 << 16) }); // 1 s
        let mut model = Model::default();
        let t0 = Instant::now();
        let mut tick = 0u64;
        for (op, step) in ops {
            tick += step;
            let t = t0 + Duration::from_secs(tick);
            match op {
                Op::Record { backend, chain, len } => {
                    let backend = backend % nb;
                    let h = &pool[chain][..len.min(pool[chain].len())];
                    idx.record(backend, h, t);
                    model.record_at(backend, h, tick);
                }
                Op::Forget(b) => {
                    idx.forget_backend(b % nb);
                    model.forget(b % nb);
                }
            }
            for h in &pool {
                for age in [0u64, 3, 10, 40] {
                    let mut got = vec![0; nb];
                    idx.match_lengths(h, t, &mut got);
                    idx.limit_to_recent(h, t, &vec![age as f64; nb], &mut got);
                    for (b, &g) in got.iter().enumerate() {
                        let own = model.recent(h, b, tick, age, true);
                        let any = model.recent(h, b, tick, age, false);
                        if few {
                            prop_assert_eq!(g, own, "backend {} age {}", b, age);
                        } else {
                            prop_assert!(own <= g && g <= any,
                                "backend {} age {}: {} <= {} <= {}", b, age, own, g, any);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn never_exceeds_max_blocks(max in 0..300usize, spec in pool_spec(),
                                ops in prop::collection::vec(op(), 1..60)) {
        let pool = chain_pool(&spec);
        let idx = PrefixIndex::new(IndexConfig { max_backends: 6, ..cfg(max) });
        let mut t = Instant::now();
        for op in ops {
            match op {
                Op::Record { backend, chain, len } => {
                    idx.record(backend, &pool[chain][..len.min(pool[chain].len())], t);
                }
                Op::Forget(b) => {
                    idx.forget_backend(b);
                }
            }
            prop_assert!(idx.len() <= max, "{} > {}", idx.len(), max);
            t += Duration::from_millis(300);
        }
    }

    #[test]
    fn recorded_chain_matches_in_full(max in 1..400usize, spec in pool_spec(),
                                      prior in prop::collection::vec(op(), 0..30),
                                      backend in 0..6usize, chain in 0..8usize) {
        let pool = chain_pool(&spec);
        let h = &pool[chain][..pool[chain].len().min(max)];
        let idx = PrefixIndex::new(IndexConfig { max_backends: 6, ..cfg(max) });
        let mut t = Instant::now();
        for op in prior {
            if let Op::Record { backend, chain, len } = op {
                idx.record(backend, &pool[chain][..len.min(pool[chain].len())], t);
            }
            t += Duration::from_secs(2);
        }
        idx.record(backend, h, t);
        let mut got = vec![0; 6];
        idx.match_lengths(h, t, &mut got);
        prop_assert_eq!(got[backend] as usize, h.len());
    }
}

#[test]
fn ceil_ticks_is_the_ceiling() {
    for x in [0.0, 0.25, 1.0, 1.5, 2.0 - 1e-12, 1e6 + 0.5, 4.5e15, 9.0e18] {
        assert_eq!(ceil_ticks(x), x.ceil() as u64, "{x}");
    }
    assert_eq!(ceil_ticks(f64::NAN), 0);
    assert_eq!(ceil_ticks(1e30), i64::MAX as u64);
}
