//! One shard of the prefix index: a hash map from block hash to a slot in a flat slab, and the
//! slab itself (`[key, meta, bits…, recent…]` per slot), bounded by a fixed capacity with
//! sampled-LRU eviction.
//!
//! `meta` packs the entry's last-used tick and its chain depth so that one integer comparison
//! orders eviction candidates: `meta = tick << 16 | (0xFFFF - depth)`. The smallest `meta` is the
//! least recently used entry, and among entries used in the same tick the *deepest* one (the tail
//! of a chain goes before its head, as in an engine's prefix cache).
//!
//! `recent` is [`RECENT`] words: the most recent distinct recorders of the entry, each
//! `tick << 16 | (backend + 1)` (0 = empty), in no particular order. A record by a backend
//! refreshes its own word, or fills an empty one, or replaces the oldest. See
//! [`backend_tick`] for how a backend's last use is read back.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Odd multiplier (2^64 / φ) spreading keys over all 64 bits: a bijection, so no collisions are
/// added, and both the map's bucket bits (low) and control bits (high) vary even for keys that
/// are not already well mixed.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// Consecutive slots examined per eviction.
const SAMPLE: usize = 8;

/// Depth bits in `meta`.
const DEPTH_BITS: u32 = 16;
const DEPTH_MAX: u64 = (1 << DEPTH_BITS) - 1;

/// Recent-recorder words per entry (see the module docs and [`backend_tick`]).
pub(super) const RECENT: usize = 4;

/// Backend-id bits in a recent-recorder word.
const WHO_BITS: u32 = 16;
const WHO_MASK: u64 = (1 << WHO_BITS) - 1;

/// The spread form of a key; the shard is chosen from its middle bits, the map uses all of it.
#[inline]
pub(super) fn spread(key: u64) -> u64 {
    key.wrapping_mul(SPREAD)
}

/// `meta` for an entry used at `tick` at chain position `depth`.
#[inline]
pub(super) fn pack(tick: u64, depth: usize) -> u64 {
    (tick << DEPTH_BITS) | (DEPTH_MAX - (depth as u64).min(DEPTH_MAX))
}

/// Last-used tick of a `meta`.
#[inline]
pub(super) fn tick_of(meta: u64) -> u64 {
    meta >> DEPTH_BITS
}

/// Backend `b`'s last-use tick of an entry `[meta, bits…, recent…]` (`words` bitset words),
/// assuming `b` holds it: its own recent-recorder word if it has one; otherwise at least
/// [`RECENT`] other backends used the entry after `b` did, so `b`'s last use is no later than the
/// oldest of them — that tick, an upper bound. With no recorder words left (all forgotten), the
/// entry's any-backend tick, also an upper bound.
///
/// Along a chain this is non-increasing for every backend, as the any-backend tick is: a
/// descendant's recorders are a subset of its ancestor's, each no more recent, so the ancestor's
/// `k`-th most recent recorder is at least as recent as the descendant's for every `k`.
#[inline]
pub(super) fn backend_tick(entry: &[u64], words: usize, backend: usize) -> u64 {
    let who = backend as u64 + 1;
    let mut oldest = u64::MAX;
    for &r in &entry[1 + words..1 + words + RECENT] {
        if r == 0 {
            continue;
        }
        if r & WHO_MASK == who {
            return r >> WHO_BITS;
        }
        oldest = oldest.min(r >> WHO_BITS);
    }
    if oldest == u64::MAX {
        tick_of(entry[0])
    } else {
        oldest
    }
}

/// Hasher for keys that are hashes already: one multiply, no SipHash rounds.
#[derive(Default, Clone, Copy)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by the map's `u64` keys; fold anything else in for safety.
        for &b in bytes {
            self.0 = spread(self.0 ^ u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = spread(x);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type Map = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

/// Time parameters of one operation, in ticks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    /// The current tick.
    pub now: u64,
    /// Entries whose last-used tick is more than this many ticks old are expired.
    pub ttl: u64,
}

impl Clock {
    /// Whether an entry with this `meta` has expired.
    #[inline]
    pub(crate) fn expired(&self, meta: u64) -> bool {
        self.now.saturating_sub(tick_of(meta)) > self.ttl
    }
}

/// Put a recorder word `mark` (`tick << 16 | who`) into `recent`: refresh the recorder's own
/// word (never lowering it), else fill an empty word, else replace the oldest if `mark` is newer.
#[inline]
fn note_recent(recent: &mut [u64], mark: u64) {
    let who = mark & WHO_MASK;
    let mut target = 0;
    for (i, &r) in recent.iter().enumerate() {
        if r & WHO_MASK == who {
            recent[i] = r.max(mark);
            return;
        }
        if r < recent[target] {
            target = i;
        }
    }
    // Empty words (0) sort first; a tie in ticks keeps the incumbent.
    if recent[target] >> WHO_BITS < mark >> WHO_BITS || recent[target] == 0 {
        recent[target] = mark;
    }
}

/// One shard: map + slab, at most `cap` entries.
#[derive(Debug)]
pub(super) struct Shard {
    map: Map,
    /// `stride` words per slot: key, meta, the backend bitset, then [`RECENT`] recorder words.
    data: Vec<u64>,
    /// Slots in `data` that hold no entry.
    free: Vec<u32>,
    stride: usize,
    /// Bitset words per slot.
    words: usize,
    cap: usize,
    /// xorshift state for the eviction sample's start.
    rng: u64,
    evictions: u64,
}

impl Shard {
    /// An empty shard of at most `cap` entries whose bitsets are `words` words wide.
    pub(crate) fn new(cap: usize, words: usize, seed: u64) -> Shard {
        Shard {
            map: Map::default(),
            data: Vec::new(),
            free: Vec::new(),
            stride: 2 + words + RECENT,
            words,
            cap,
            rng: crate::tokens::mix64(seed) | 1,
            evictions: 0,
        }
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Entries evicted for space so far.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// `[meta, bits…, recent…]` of `key`, if present (expired or not).
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&[u64]> {
        let slot = *self.map.get(&key)? as usize;
        let base = slot * self.stride;
        Some(&self.data[base + 1..base + self.stride])
    }

    /// Backend `backend`'s last-use tick of `key` ([`backend_tick`]) if the entry is present
    /// (expired or not) and the backend holds it.
    #[inline]
    pub(crate) fn held_tick(&self, key: u64, backend: usize) -> Option<u64> {
        let e = self.get(key)?;
        (e[1 + backend / 64] & (1 << (backend % 64)) != 0)
            .then(|| backend_tick(e, self.words, backend))
    }

    /// Mark `key` (at chain position `depth`) as held by `backend` and used by it at
    /// `clock.now`. An expired entry is reset first, so stale backends do not come back. Inserts,
    /// evicting if the shard is full; does nothing in a shard of capacity 0.
    pub(crate) fn upsert(&mut self, key: u64, depth: usize, backend: usize, clock: Clock) {
        let meta = pack(clock.now, depth);
        let (word, bit) = (backend / 64, 1u64 << (backend % 64));
        let mark = (clock.now << WHO_BITS) | (backend as u64 + 1);
        let words = self.words;
        if let Some(&slot) = self.map.get(&key) {
            let base = slot as usize * self.stride;
            let entry = &mut self.data[base + 1..base + self.stride];
            if clock.expired(entry[0]) {
                entry.fill(0);
            }
            entry[0] = entry[0].max(meta);
            entry[1 + word] |= bit;
            note_recent(&mut entry[1 + words..], mark);
            return;
        }
        if self.cap == 0 {
            return;
        }
        let slot = if let Some(slot) = self.free.pop() {
            slot as usize
        } else if self.map.len() < self.cap {
            let slot = self.data.len() / self.stride;
            self.data.resize(self.data.len() + self.stride, 0);
            slot
        } else {
            self.evict(clock.now)
        };
        let base = slot * self.stride;
        let entry = &mut self.data[base..base + self.stride];
        entry.fill(0);
        entry[0] = key;
        entry[1] = meta;
        entry[2 + word] = bit;
        entry[2 + words] = mark;
        self.map.insert(key, slot as u32);
    }

    /// Free one slot of a full shard and return it. Examines [`SAMPLE`] consecutive slots from a
    /// pseudo-random start and takes the smallest `meta` (least recently used, deepest first).
    /// If every sampled entry was used in the current tick, keeps scanning for an older one, so
    /// a chain being recorded does not evict its own blocks while older entries exist.
    fn evict(&mut self, now: u64) -> usize {
        let slots = self.data.len() / self.stride;
        debug_assert!(slots > 0 && self.free.is_empty());
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let start = (self.rng % slots as u64) as usize;
        let meta_at = |s: usize| self.data[s * self.stride + 1];
        let mut victim = start;
        for k in 1..SAMPLE.min(slots) {
            let s = (start + k) % slots;
            if meta_at(s) < meta_at(victim) {
                victim = s;
            }
        }
        if tick_of(meta_at(victim)) >= now {
            if let Some(older) = (SAMPLE..slots)
                .map(|k| (start + k) % slots)
                .find(|&s| tick_of(meta_at(s)) < now)
            {
                victim = older;
            }
        }
        let key = self.data[victim * self.stride];
        self.map.remove(&key);
        self.evictions += 1;
        victim
    }

    /// Remove every expired entry; returns how many were removed.
    pub(crate) fn sweep(&mut self, clock: Clock) -> usize {
        let (data, free, stride) = (&self.data, &mut self.free, self.stride);
        let before = self.map.len();
        self.map.retain(|_, slot| {
            let keep = !clock.expired(data[*slot as usize * stride + 1]);
            if !keep {
                free.push(*slot);
            }
            keep
        });
        before - self.map.len()
    }

    /// Clear the backend `(word, bit)` everywhere, removing entries left with no backend;
    /// returns how many entries were removed.
    pub(crate) fn forget(&mut self, backend: usize) -> usize {
        let (word, bit) = (backend / 64, 1u64 << (backend % 64));
        let who = backend as u64 + 1;
        let (data, free, stride, words) = (&mut self.data, &mut self.free, self.stride, self.words);
        let before = self.map.len();
        self.map.retain(|_, slot| {
            let base = *slot as usize * stride;
            let (bits, recent) = data[base + 2..base + stride].split_at_mut(words);
            bits[word] &= !bit;
            for r in recent.iter_mut().filter(|r| **r & WHO_MASK == who) {
                *r = 0;
            }
            let keep = bits.iter().any(|&w| w != 0);
            if !keep {
                free.push(*slot);
            }
            keep
        });
        before - self.map.len()
    }

    /// Clear `backend` from `key`'s entry (and its recorder word), removing the entry if no
    /// backend is left. Does nothing when the entry is absent.
    pub(crate) fn clear(&mut self, key: u64, backend: usize) {
        let Some(&slot) = self.map.get(&key) else {
            return;
        };
        let (word, bit) = (backend / 64, 1u64 << (backend % 64));
        let who = backend as u64 + 1;
        let base = slot as usize * self.stride;
        let (bits, recent) = self.data[base + 2..base + self.stride].split_at_mut(self.words);
        bits[word] &= !bit;
        for r in recent.iter_mut().filter(|r| **r & WHO_MASK == who) {
            *r = 0;
        }
        if bits.iter().all(|&w| w == 0) {
            self.map.remove(&key);
            self.free.push(slot);
        }
    }

    /// Heap bytes held by this shard (allocated capacity, not just what is in use).
    pub(crate) fn memory_bytes(&self) -> usize {
        // hashbrown: one (key, slot) pair plus one control byte per bucket.
        let bucket = std::mem::size_of::<(u64, u32)>() + 1;
        self.map.capacity() * 8 / 7 * bucket
            + self.data.capacity() * std::mem::size_of::<u64>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}
