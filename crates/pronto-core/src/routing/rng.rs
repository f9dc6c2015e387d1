//! Seeded, lock-free randomness for policies, and a stable 64-bit hash.
//!
//! [`SplitMix`] is an atomic splitmix64 stream: each draw adds the golden-ratio increment to a
//! shared `AtomicU64` (one `fetch_add`, no lock, no retry loop) and returns the mixed value of
//! the new state. Concurrent callers each get a distinct draw; the sequence of draws for a
//! given seed is fixed, so a single-threaded run (a test, the offline evaluator) is
//! reproducible.
//!
//! [`stable_hash`] (FNV-1a followed by the splitmix64 finalizer) is the same on every machine
//! and every run, unlike `std`'s randomly keyed hasher; the hash ring of `consistent_hash` must
//! place a backend at the same points in every gateway replica.

use std::sync::atomic::{AtomicU64, Ordering};

use super::BackendView;

/// The splitmix64 increment (2^64 / golden ratio).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: a bijective avalanche mix of `z`.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over `bytes`, then [`mix64`] so that similar inputs (`gpu-0#1`, `gpu-0#2`) land far
/// apart. Stable across processes and platforms.
pub(crate) fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h)
}

/// An atomic splitmix64 stream.
#[derive(Debug)]
pub(crate) struct SplitMix {
    state: AtomicU64,
}

impl SplitMix {
    /// A stream starting at `seed`.
    pub(crate) fn new(seed: u64) -> SplitMix {
        SplitMix {
            state: AtomicU64::new(seed),
        }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&self) -> u64 {
        let s = self.state.fetch_add(GAMMA, Ordering::Relaxed);
        mix64(s.wrapping_add(GAMMA))
    }
}

/// Map 64 random bits to `0..n` without modulo bias worth measuring (Lemire's multiply-shift).
pub(crate) fn below(bits: u64, n: u64) -> u64 {
    ((u128::from(bits) * u128::from(n)) >> 64) as u64
}

/// Weight of a backend as used for sampling (`weight`, at least 1).
pub(crate) fn weight(b: &BackendView) -> u64 {
    u64::from(b.weight.max(1))
}

/// Pick an eligible backend with probability proportional to its weight, skipping `skip`.
/// `None` when no eligible backend other than `skip` exists.
pub(crate) fn weighted_pick(
    backends: &[BackendView],
    skip: Option<usize>,
    bits: u64,
) -> Option<usize> {
    let candidates = || {
        backends
            .iter()
            .enumerate()
            .filter(move |&(i, b)| b.eligible() && Some(i) != skip)
    };
    let total: u64 = candidates().map(|(_, b)| weight(b)).sum();
    if total == 0 {
        return None;
    }
    let mut slot = below(bits, total);
    for (i, b) in candidates() {
        let w = weight(b);
        if slot < w {
            return Some(i);
        }
        slot -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_support::views;

    #[test]
    fn same_seed_same_stream_and_seeds_differ() {
        let a = SplitMix::new(7);
        let b = SplitMix::new(7);
        let c = SplitMix::new(8);
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn splitmix_matches_reference_values() {
        // Reference outputs of splitmix64 seeded with 0 (Vigna's C implementation).
        let s = SplitMix::new(0);
        assert_eq!(s.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(s.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_stays_in_range() {
        for bits in [0, 1, u64::MAX / 2, u64::MAX] {
            for n in [1, 2, 3, 1000] {
                assert!(below(bits, n) < n);
            }
        }
        assert_eq!(below(u64::MAX, 10), 9);
    }

    #[test]
    fn weighted_pick_skips_ineligible_and_skip() {
        let mut v = views(3);
        v[0].healthy = false;
        for bits in [0, u64::MAX / 3, u64::MAX] {
            assert_eq!(weighted_pick(&v, Some(1), bits), Some(2));
        }
        v[2].excluded = true;
        assert_eq!(weighted_pick(&v, Some(1), 42), None);
        assert_eq!(weighted_pick(&v, None, 42), Some(1));
    }

    #[test]
    fn stable_hash_is_fixed() {
        assert_eq!(stable_hash(b"gpu-0#1"), stable_hash(b"gpu-0#1"));
        assert_ne!(stable_hash(b"gpu-0#1"), stable_hash(b"gpu-0#2"));
    }
}
