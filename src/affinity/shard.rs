//! One shard of the prefix index: a hash map from block hash to a slot in a flat slab, and the
//! slab itself (`[key, meta, bits…]` per slot), bounded by a fixed capacity with sampled-LRU
//! eviction.
//!
//! `meta` packs the entry's last-used tick and its chain depth so that one integer comparison
//! orders eviction candidates: `meta = tick << 16 | (0xFFFF - depth)`. The smallest `meta` is the
//! least recently used entry, and among entries used in the same tick the *deepest* one (the tail
//! of a chain goes before its head, as in an engine's prefix cache).

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
    pub fn expired(&self, meta: u64) -> bool {
        self.now.saturating_sub(tick_of(meta)) > self.ttl
    }
}

/// One shard: map + slab, at most `cap` entries.
#[derive(Debug)]
pub(super) struct Shard {
    map: Map,
    /// `stride` words per slot: key, meta, then the backend bitset.
    data: Vec<u64>,
    /// Slots in `data` that hold no entry.
    free: Vec<u32>,
    stride: usize,
    cap: usize,
    /// xorshift state for the eviction sample's start.
    rng: u64,
    evictions: u64,
}

impl Shard {
    /// An empty shard of at most `cap` entries whose bitsets are `words` words wide.
    pub fn new(cap: usize, words: usize, seed: u64) -> Shard {
        Shard {
            map: Map::default(),
            data: Vec::new(),
            free: Vec::new(),
            stride: 2 + words,
            cap,
            rng: crate::tokens::mix64(seed) | 1,
            evictions: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Entries evicted for space so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// `[meta, bits…]` of `key`, if present (expired or not).
    #[inline]
    pub fn get(&self, key: u64) -> Option<&[u64]> {
        let slot = *self.map.get(&key)? as usize;
        let base = slot * self.stride;
        Some(&self.data[base + 1..base + self.stride])
    }

    /// Mark `key` (at chain position `depth`) as held by the backend `(word, bit)` and used at
    /// `clock.now`. An expired entry is reset first, so stale backends do not come back. Inserts,
    /// evicting if the shard is full; does nothing in a shard of capacity 0.
    pub fn upsert(&mut self, key: u64, depth: usize, word: usize, bit: u64, clock: Clock) {
        let meta = pack(clock.now, depth);
        if let Some(&slot) = self.map.get(&key) {
            let base = slot as usize * self.stride;
            let entry = &mut self.data[base + 1..base + self.stride];
            if clock.expired(entry[0]) {
                entry.fill(0);
            }
            entry[0] = entry[0].max(meta);
            entry[1 + word] |= bit;
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
    pub fn sweep(&mut self, clock: Clock) -> usize {
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
    pub fn forget(&mut self, word: usize, bit: u64) -> usize {
        let (data, free, stride) = (&mut self.data, &mut self.free, self.stride);
        let before = self.map.len();
        self.map.retain(|_, slot| {
            let base = *slot as usize * stride;
            let bits = &mut data[base + 2..base + stride];
            bits[word] &= !bit;
            let keep = bits.iter().any(|&w| w != 0);
            if !keep {
                free.push(*slot);
            }
            keep
        });
        before - self.map.len()
    }

    /// Heap bytes held by this shard (allocated capacity, not just what is in use).
    pub fn memory_bytes(&self) -> usize {
        // hashbrown: one (key, slot) pair plus one control byte per bucket.
        let bucket = std::mem::size_of::<(u64, u32)>() + 1;
        self.map.capacity() * 8 / 7 * bucket
            + self.data.capacity() * std::mem::size_of::<u64>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}
