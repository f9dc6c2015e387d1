//! A bounded, concurrent index of which backends were sent which prompt blocks.
//!
//! The router uses it to estimate, per backend, how many leading tokens of a new prompt are
//! likely still in that backend's prefix (KV) cache: `match_lengths × BLOCK_TOKENS`. The gateway
//! (many proxy threads) and the offline evaluator (one thread) share this code.
//!
//! ## Data
//! Prompt blocks are identified by their chained [`BlockHash`] (see [`crate::tokens`]): the hash
//! at position `i` identifies the whole prompt prefix up to block `i`. So an entry is keyed by the
//! hash alone and holds a bitset of the backends that were sent that prefix, a last-used tick and
//! the block's chain depth, plus the last-use ticks of its `RECENT` (= 4) most
//! recent distinct recorders (see *Per-backend recency*). Entries live in [`IndexConfig::max_blocks`]-bounded shards (a power
//! of two, up to 64, chosen from the hash bits), each a `std::sync::RwLock` over a map and a flat
//! slab; lookups take read locks only, so reads never wait on reads.
//!
//! ## Matching: a search over chain positions, not a walk
//! Let `S(i)` be the set of backends holding block `i` of the prompt. Because a block is only
//! ever recorded together with all its ancestors, `S` is *nested*: `S(0) ⊇ S(1) ⊇ …`, and a
//! backend's match length is the number of positions whose set contains it. A walk would cost
//! one lookup per block (750 for a 12k-token prompt). Instead [`PrefixIndex::match_lengths`]
//! bisects: it probes the last block, then recursively the midpoint of every interval whose end
//! sets differ, and stops where they are equal. The cost is `O(d · log n)` lookups for `d`
//! distinct match lengths among the backends — about 10–30 for a typical prompt.
//!
//! The result equals the exact walk ([`PrefixIndex::match_lengths_exact`]) whenever the sets
//! are nested, which holds as long as no entry was evicted for space: whole chains are recorded,
//! TTL expiry drops a descendant no later than its ancestors (see *Time* below), and
//! [`PrefixIndex::forget_backend`] clears a backend from every entry. Capacity eviction and
//! concurrent writers can leave a hole in a chain; the search then credits a backend with the
//! blocks past the hole when it probes past it, or stops early when it probes the hole itself.
//! The index is a guess about engine caches anyway; the bench reports how often this happens.
//!
//! ## Time
//! `now` is passed in; times are counted in ticks of `ttl / 600` (clamped to 1 ms..=1 s) since
//! the first call. An entry is expired, and reads treat it as absent, once it is more than
//! `ttl` old (it may survive up to two ticks longer). Expired entries are dropped lazily (reset
//! on the next record, evicted first) and by [`PrefixIndex::sweep`].
//!
//! [`PrefixIndex::record`] refreshes every block of the chain it is given, and never lowers a
//! tick, so an ancestor is always at least as recent as its descendants: expiry and eviction
//! (which prefers, among equally old entries, the deepest) remove tails before heads. This is
//! also why matching does not touch entries: the router records the routed prompt right after
//! matching it, which refreshes a superset of what any backend matched, and a read path without
//! writes keeps the hot shared-system-prompt entries free of cache-line contention.
//!
//! Recording is cheap for the common case of a prompt extending a recent one: a bisection finds
//! the first block that is not already held by the backend *and* used by that backend in the
//! current tick (both are prefix properties by the invariant above and its per-backend form
//! under *Per-backend recency*), and only the blocks from there on are written,
//! grouped by shard so each shard is locked once.
//!
//! ## Per-backend recency
//! An engine evicts a prefix it was not sent for longer than its residency time, even if other
//! backends keep that prefix hot, so `PrefixIndex::limit_to_recent` needs each backend's own
//! last use. Exact per-backend ticks would cost a word per backend per block; instead an entry
//! keeps `RECENT` words `tick << 16 | (backend + 1)` for its most recent distinct recorders
//! (a record refreshes the backend's own word, else fills an empty one, else replaces the
//! oldest). A backend that holds the block and has a word gets that word's tick: exact. One
//! without a word was pushed out by `RECENT` later recorders, so its last use is no later than
//! the oldest of them: that tick is used, an upper bound — generous only for blocks at least
//! `RECENT + 1` backends share, such as system prompts, which every backend keeps hot anyway.
//! [`PrefixIndex::forget_backend`] clears the backend's words too (if every word is cleared,
//! the any-backend tick is the bound). Expiry and eviction still use the any-backend tick.
//!
//! These per-backend ticks keep the chain property of the any-backend tick: along a chain they
//! never increase, for every backend (a descendant's recorders are a subset of its ancestor's,
//! each at most as recent, so the ancestor's `k`-th most recent recorder is at least as recent
//! as the descendant's). `limit_to_recent`'s bisection and the record fast path rely on it.
//!
//! ## Bounds
//! At most `max_blocks` entries in all (each shard holds its share). A full shard evicts by
//! sampled LRU: the smallest (tick, −depth) of 8 consecutive slots from a pseudo-random start.
//! Memory: a slab slot of `2 + ⌈max_backends / 64⌉ + RECENT` words plus the map's ~19 bytes
//! in use: about 97 bytes per block for 256 backends (65 without the recorder words). Allocated
//! capacity adds slack as the slab and map grow by doubling: `benches/affinity.rs` measures
//! 121 / 126 / 168 bytes per block at 8 / 64 / 256 backends with 1M blocks (66 / 66 / 115
//! without the recorder words).

pub(crate) mod residency;
mod shard;
#[cfg(test)]
mod tests;

use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub use residency::Residency;
use shard::{spread, Clock, Shard};

use crate::tokens::BlockHash;

/// Largest supported [`IndexConfig::max_backends`].
pub const MAX_BACKENDS: usize = MAX_WORDS * 64;

const MAX_WORDS: usize = 16;
const MAX_SHARDS: usize = 64;
/// Smallest share of `max_blocks` per shard: small indexes use fewer shards.
const MIN_BLOCKS_PER_SHARD: usize = 1024;

/// Size and lifetime bounds of a [`PrefixIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Most blocks indexed at once (memory cap); least recently used go first.
    pub max_blocks: usize,
    /// Entries not used for this long are dropped.
    pub ttl: Duration,
    /// Backends are numbered `0..max_backends` (at most [`MAX_BACKENDS`]).
    pub max_backends: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            max_blocks: 4 << 20,
            ttl: Duration::from_secs(600),
            max_backends: 256,
        }
    }
}

/// A backend bitset (only the first `words` words are used).
type Bits = [u64; MAX_WORDS];

/// The bounded prefix-affinity index. `Send + Sync`; see the module docs.
#[derive(Debug)]
pub struct PrefixIndex {
    shards: Box<[RwLock<Shard>]>,
    /// `shards.len() - 1`; the shard of a key is `(spread(key) >> 32) & shard_mask`.
    shard_mask: usize,
    max_backends: usize,
    tick_nanos: u128,
    ttl_ticks: u64,
    epoch: OnceLock<Instant>,
}

// === impl PrefixIndex ===

impl PrefixIndex {
    /// An empty index.
    ///
    /// # Panics
    /// If `max_backends` is 0 or above [`MAX_BACKENDS`].
    pub fn new(cfg: IndexConfig) -> Self {
        assert!(
            (1..=MAX_BACKENDS).contains(&cfg.max_backends),
            "max_backends must be in 1..={MAX_BACKENDS}, got {}",
            cfg.max_backends
        );
        let mut n_shards = 1;
        while n_shards < MAX_SHARDS && cfg.max_blocks / (n_shards * 2) >= MIN_BLOCKS_PER_SHARD {
            n_shards *= 2;
        }
        let words = cfg.max_backends.div_ceil(64);
        let shards = (0..n_shards)
            .map(|i| {
                let cap = cfg.max_blocks / n_shards + usize::from(i < cfg.max_blocks % n_shards);
                RwLock::new(Shard::new(cap, words, i as u64))
            })
            .collect();
        let tick = (cfg.ttl / 600).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let tick_nanos = tick.as_nanos();
        PrefixIndex {
            shards,
            shard_mask: n_shards - 1,
            max_backends: cfg.max_backends,
            tick_nanos,
            ttl_ticks: u64::try_from(cfg.ttl.as_nanos() / tick_nanos).unwrap_or(u64::MAX),
            epoch: OnceLock::new(),
        }
    }

    /// Record that `backend` was sent a prompt with these chained block hashes (at `now`).
    ///
    /// Refreshes every block of the chain; writes only from the first block the backend does
    /// not already hold in the current tick. Backends at or above `max_backends` are ignored.
    pub fn record(&self, backend: usize, hashes: &[BlockHash], now: Instant) {
        if backend >= self.max_backends || hashes.is_empty() {
            return;
        }
        let clock = self.clock(now);
        // First position that is not (held by `backend` and used by it this tick): a prefix
        // property, as the backend's ticks never increase along a chain.
        let done = |i: usize| {
            let key = hashes[i].0;
            self.read(key)
                .held_tick(key, backend)
                .is_some_and(|t| t >= clock.now)
        };
        // The common repeat: the whole chain is done when its last block is.
        if done(hashes.len() - 1) {
            return;
        }
        let (mut lo, mut hi) = (0, hashes.len() - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if done(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let todo = &hashes[lo..];
        if todo.is_empty() {
            return;
        }
        if self.shard_mask == 0 {
            let mut shard = self.write_shard(0);
            for (i, h) in todo.iter().enumerate() {
                shard.upsert(h.0, lo + i, backend, clock);
            }
            return;
        }
        // Counting sort of positions by shard, so each shard is locked once.
        let mut starts = [0u32; MAX_SHARDS + 1];
        for h in todo {
            starts[self.shard_of(h.0) + 1] += 1;
        }
        for s in 0..MAX_SHARDS {
            starts[s + 1] += starts[s];
        }
        let mut order = vec![0u32; todo.len()];
        let mut fill = starts;
        for (i, h) in todo.iter().enumerate() {
            let s = self.shard_of(h.0);
            order[fill[s] as usize] = i as u32;
            fill[s] += 1;
        }
        for s in 0..self.shards.len() {
            let run = &order[starts[s] as usize..starts[s + 1] as usize];
            if run.is_empty() {
                continue;
            }
            let mut shard = self.write_shard(s);
            for &i in run {
                let i = i as usize;
                shard.upsert(todo[i].0, lo + i, backend, clock);
            }
        }
    }

    /// For each backend `b < out.len()`: the number of leading blocks of `hashes` that `b` holds
    /// (longest chain match), found by bisection over positions (see the module docs). Slots at
    /// or above `max_backends` get 0. Read-only: takes read locks, writes nothing.
    pub fn match_lengths(&self, hashes: &[BlockHash], now: Instant, out: &mut [u32]) {
        out.fill(0);
        let nb = out.len().min(self.max_backends);
        if hashes.is_empty() || nb == 0 {
            return;
        }
        let mut search = Search {
            index: self,
            hashes,
            clock: self.clock(now),
            words: nb.div_ceil(64),
            out,
        };
        let all = search.all(nb);
        let n = hashes.len();
        let last = search.probe(n - 1, &all, &[0; MAX_WORDS]);
        search.assign(&last, &[0; MAX_WORDS], n);
        search.solve(0, n, &all, &last);
    }

    /// Shorten each backend's match in `lengths` (from [`match_lengths`](Self::match_lengths))
    /// to the leading blocks used within `max_age_s[b]` seconds of `now`: an engine's LRU cache
    /// has long evicted a prefix nobody sent for longer than its residency time, whatever the
    /// index remembers. A non-finite or negative age leaves that backend's length as it is.
    ///
    /// A block's age for backend `b` is the time since `b` itself was last sent it (or, for a
    /// block more than `RECENT` backends share, an upper bound on that: see
    /// *Per-backend recency* in the module docs), so a prefix kept hot by other backends does
    /// not count as cached on one that has not seen it for longer than its residency.
    /// Because an ancestor is always at least as recent as its descendants for each backend,
    /// the recent blocks of a chain are a prefix of it: one lookup checks the last matched
    /// block, and only a backend whose match ends in a stale block pays a bisection over its
    /// length.
    pub(crate) fn limit_to_recent(
        &self,
        hashes: &[BlockHash],
        now: Instant,
        max_age_s: &[f64],
        lengths: &mut [u32],
    ) {
        let clock = self.clock(now);
        // Ticks per second: one division per call, not per backend.
        let ticks_per_s = 1e9 / self.tick_nanos as f64;
        let mut memo = EntryMemo::new(self.max_backends.div_ceil(64));
        for (b, (len, &age)) in lengths.iter_mut().zip(max_age_s).enumerate() {
            if *len == 0 || !(age.is_finite() && age >= 0.0) || b >= self.max_backends {
                continue;
            }
            let mut tick_at = |i: usize| memo.held_tick(self, hashes[i].0, b).unwrap_or(0);
            let cutoff = clock.now.saturating_sub(ceil_ticks(age * ticks_per_s));
            let n = (*len as usize).min(hashes.len());
            if tick_at(n - 1) >= cutoff {
                continue;
            }
            // Largest `k` with block `k - 1` recent (ticks never increase along a chain).
            let (mut lo, mut hi) = (0, n - 1);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if tick_at(mid - 1) >= cutoff {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            *len = lo as u32;
        }
    }

    /// The exact longest-leading-run walk: one lookup per block until no backend is left. The
    /// reference [`match_lengths`](Self::match_lengths) is measured against; `O(n)`, so not for
    /// the request path.
    pub fn match_lengths_exact(&self, hashes: &[BlockHash], now: Instant, out: &mut [u32]) {
        out.fill(0);
        let nb = out.len().min(self.max_backends);
        let clock = self.clock(now);
        let mut alive = vec![true; nb];
        for (i, h) in hashes.iter().enumerate() {
            let shard = self.read(h.0);
            let entry = shard.get(h.0).filter(|e| !clock.expired(e[0]));
            let mut any = false;
            for (b, live) in alive.iter_mut().enumerate() {
                if *live && entry.is_some_and(|e| e[1 + b / 64] & (1 << (b % 64)) != 0) {
                    out[b] = i as u32 + 1;
                    any = true;
                } else {
                    *live = false;
                }
            }
            if !any {
                break;
            }
        }
    }

    /// Forget everything about `backend` (ejected, restarted or removed): clears its bit in
    /// every entry and removes entries left empty. `O(entries)`; returns entries removed.
    pub fn forget_backend(&self, backend: usize) -> usize {
        if backend >= self.max_backends {
            return 0;
        }
        (0..self.shards.len())
            .map(|s| self.write_shard(s).forget(backend))
            .sum()
    }

    /// Take back a [`record`](Self::record) whose request never reached the backend: clear
    /// `backend` from these blocks (the part of the chain it did not hold before; the blocks it
    /// did hold keep the refreshed recency, which only helps them). `O(hashes)`.
    pub(crate) fn unrecord(&self, backend: usize, hashes: &[BlockHash]) {
        if backend >= self.max_backends {
            return;
        }
        for h in hashes {
            self.write_shard(self.shard_of(h.0)).clear(h.0, backend);
        }
    }

    /// Drop every entry older than the TTL at `now`; returns how many. Call periodically.
    pub fn sweep(&self, now: Instant) -> usize {
        let clock = self.clock(now);
        (0..self.shards.len())
            .map(|s| self.write_shard(s).sweep(clock))
            .sum()
    }

    /// Blocks indexed (expired entries not yet dropped included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| read_lock(s).len()).sum()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries evicted for space since creation.
    pub fn evictions(&self) -> u64 {
        self.shards.iter().map(|s| read_lock(s).evictions()).sum()
    }

    /// Backend slots the index holds (`0..max_backends`).
    pub fn max_backends(&self) -> usize {
        self.max_backends
    }

    /// Heap and inline bytes held: allocated map and slab capacity, not just what is in use.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.shards.len() * std::mem::size_of::<RwLock<Shard>>()
            + self
                .shards
                .iter()
                .map(|s| read_lock(s).memory_bytes())
                .sum::<usize>()
    }

    fn clock(&self, now: Instant) -> Clock {
        let epoch = *self.epoch.get_or_init(|| now);
        let ticks = now.saturating_duration_since(epoch).as_nanos() / self.tick_nanos;
        Clock {
            now: u64::try_from(ticks).unwrap_or(u64::MAX),
            ttl: self.ttl_ticks,
        }
    }

    #[inline]
    fn shard_of(&self, key: u64) -> usize {
        (spread(key) >> 32) as usize & self.shard_mask
    }

    #[inline]
    fn read(&self, key: u64) -> RwLockReadGuard<'_, Shard> {
        read_lock(&self.shards[self.shard_of(key)])
    }

    fn write_shard(&self, s: usize) -> RwLockWriteGuard<'_, Shard> {
        // A panic while holding a shard lock leaves at worst a half-updated entry: still usable.
        self.shards[s].write().unwrap_or_else(|e| e.into_inner())
    }
}

#[inline]
fn read_lock(lock: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

/// `x.ceil() as u64` for `x ≥ 0` without a libm call (the baseline x86-64 target has no
/// rounding instruction), and through `i64`, whose conversions are one instruction each there
/// (the unsigned ones are sequences). Saturates at `i64::MAX` ticks, far beyond any age.
#[inline]
fn ceil_ticks(x: f64) -> u64 {
    let t = x as i64;
    t.saturating_add(i64::from((t as f64) < x)).max(0) as u64
}

// === impl EntryMemo ===

/// Entries one [`PrefixIndex::limit_to_recent`] has read, copied out of their shards: most
/// backends' matches end at the same few blocks (a shared system prompt, the whole prompt), so
/// one shard lookup serves all of them.
struct EntryMemo {
    words: usize,
    keys: [Option<u64>; MEMO],
    entries: [[u64; ENTRY_WORDS]; MEMO],
    present: [bool; MEMO],
    next: usize,
}

/// Entries an [`EntryMemo`] keeps (replaced round robin).
const MEMO: usize = 4;
/// Longest `[meta, bits…, recent…]`.
const ENTRY_WORDS: usize = 1 + MAX_WORDS + shard::RECENT;

impl EntryMemo {
    fn new(words: usize) -> EntryMemo {
        EntryMemo {
            words,
            keys: [None; MEMO],
            entries: [[0; ENTRY_WORDS]; MEMO],
            present: [false; MEMO],
            next: 0,
        }
    }

    /// [`Shard::held_tick`] of `key` for `backend`, from the memo or one shard lookup.
    fn held_tick(&mut self, index: &PrefixIndex, key: u64, backend: usize) -> Option<u64> {
        let m = match self.keys.iter().position(|&k| k == Some(key)) {
            Some(m) => m,
            None => {
                let m = self.next;
                self.next = (m + 1) % MEMO;
                let shard = index.read(key);
                let entry = shard.get(key);
                self.present[m] = entry.is_some();
                if let Some(e) = entry {
                    self.entries[m][..e.len()].copy_from_slice(e);
                }
                self.keys[m] = Some(key);
                m
            }
        };
        if !self.present[m] {
            return None;
        }
        let e = &self.entries[m];
        (e[1 + backend / 64] & (1 << (backend % 64)) != 0)
            .then(|| shard::backend_tick(e, self.words, backend))
    }
}

// === impl Search ===

/// State of one [`PrefixIndex::match_lengths`] bisection.
struct Search<'a> {
    index: &'a PrefixIndex,
    hashes: &'a [BlockHash],
    clock: Clock,
    words: usize,
    out: &'a mut [u32],
}

impl Search<'_> {
    /// The set of backends `0..nb`.
    fn all(&self, nb: usize) -> Bits {
        let mut all = [0; MAX_WORDS];
        for (w, word) in all.iter_mut().enumerate().take(self.words) {
            let left = nb - w * 64;
            *word = if left >= 64 { !0 } else { (1 << left) - 1 };
        }
        all
    }

    /// Backends holding block `i`, forced between `inner` and `outer` (`inner ⊆ S ⊆ outer`) so
    /// that the sets stay nested even where a chain has holes.
    fn probe(&self, i: usize, outer: &Bits, inner: &Bits) -> Bits {
        let key = self.hashes[i].0;
        let mut set = *inner;
        let shard = self.index.read(key);
        if let Some(e) = shard.get(key).filter(|e| !self.clock.expired(e[0])) {
            for w in 0..self.words {
                set[w] |= e[1 + w] & outer[w];
            }
        }
        set
    }

    /// Give length `len` to the backends in `outer \ inner`.
    fn assign(&mut self, outer: &Bits, inner: &Bits, len: usize) {
        for w in 0..self.words {
            let mut d = outer[w] & !inner[w];
            while d != 0 {
                self.out[w * 64 + d.trailing_zeros() as usize] = len as u32;
                d &= d - 1;
            }
        }
    }

    /// Backends in `t_lo \ t_hi` hold exactly `lo..hi-1` leading blocks; find each one's count.
    /// `t_lo` is the set holding the first `lo` blocks (all backends for `lo = 0`), `t_hi` the
    /// set holding the first `hi`.
    fn solve(&mut self, lo: usize, hi: usize, t_lo: &Bits, t_hi: &Bits) {
        if (0..self.words).all(|w| t_lo[w] == t_hi[w]) {
            return;
        }
        if hi - lo == 1 {
            if lo > 0 {
                self.assign(t_lo, t_hi, lo);
            }
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let t_mid = self.probe(mid - 1, t_lo, t_hi);
        self.solve(lo, mid, t_lo, &t_mid);
        self.solve(mid, hi, &t_mid, t_hi);
    }
}
