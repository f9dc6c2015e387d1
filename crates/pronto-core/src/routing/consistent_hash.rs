//! `consistent_hash`: session affinity on a hash ring.
//!
//! Requests carrying a session key ([`RequestFeatures::session_key`]: the `x-session-id`
//! header, else the `user` field) go to the backend that owns the key on a consistent-hash
//! ring, so every turn of a conversation lands where its prefix is cached, without a prefix
//! index.
//!
//! ## The ring
//! Each backend is placed at `virtual_nodes × weight` points (capped at
//! [`MAX_POINTS_PER_BACKEND`]), the `i`-th at `mix64(key + i·γ)` (`key`: the [`crate::ids::BackendKey`] of its name): positions
//! depend only on the backend's *name*, never on its place in the pool, and are the same in
//! every gateway replica and every run. A key hashes to `stable_hash(key)`; its owner is the
//! first point clockwise (at or after the key's hash, wrapping). Adding or removing one of N
//! backends therefore moves only the keys it gains or loses — about 1/N of them — and no key
//! moves between two backends that stayed.
//!
//! ## Failover and fallback
//! - The owner is ineligible (unhealthy, already tried, at its cap): walk on clockwise to the
//!   first eligible backend ([`Reason::SessionFailover`]). The key returns to its owner when
//!   the owner is eligible again; no state is kept per key.
//! - No session key: [`LeastInflight`] decides ([`Reason::LeastLoaded`]).
//!
//! ## State
//! The ring is built from the snapshot's names and weights on first use and cached behind an
//! `ArcSwapOption` with a fingerprint of those names and weights; a snapshot with a different
//! backend set rebuilds it (a config reload builds a new policy anyway). The request path only
//! loads the `Arc` and binary-searches the ring: no lock, no allocation.
//!
//! Knob: `virtual_nodes` (default 160), points per unit of weight. More points spread keys
//! more evenly (standard deviation of a backend's share ≈ share / √points) at the cost of a
//! larger ring.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwapOption;

use super::rng::{mix64, stable_hash, weight};
use super::{BackendView, Decision, LeastInflight, NoBackend, Policy, Reason, Snapshot};
use crate::request::RequestFeatures;

/// Default points per unit of weight.
pub(crate) const DEFAULT_VIRTUAL_NODES: u32 = 160;
/// Most points one backend gets on the ring, whatever its weight.
pub(crate) const MAX_POINTS_PER_BACKEND: u64 = 1 << 16;

/// The splitmix64 increment, spacing a backend's points.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Session affinity on a consistent-hash ring; least in-flight without a session key.
#[derive(Debug)]
pub(crate) struct ConsistentHash {
    virtual_nodes: u32,
    ring: ArcSwapOption<Ring>,
    fallback: LeastInflight,
}

/// Points sorted by position, each naming a backend by its index in the snapshot.
#[derive(Debug)]
struct Ring {
    fingerprint: u64,
    points: Vec<(u64, u32)>,
}

impl Default for ConsistentHash {
    /// 160 virtual nodes per unit of weight.
    fn default() -> ConsistentHash {
        ConsistentHash::new(DEFAULT_VIRTUAL_NODES)
    }
}

/// Identity of a backend set: names and weights in pool order.
fn fingerprint(backends: &[BackendView]) -> u64 {
    let mut h = mix64(backends.len() as u64);
    for b in backends {
        h = mix64(h ^ b.key.0);
        h = mix64(h ^ weight(b));
    }
    h
}

impl Ring {
    fn build(backends: &[BackendView], virtual_nodes: u32) -> Ring {
        let mut points = Vec::new();
        for (i, b) in backends.iter().enumerate() {
            let n = (u64::from(virtual_nodes) * weight(b)).min(MAX_POINTS_PER_BACKEND);
            let base = b.key.0;
            for k in 0..n {
                points.push((mix64(base.wrapping_add(k.wrapping_mul(GAMMA))), i as u32));
            }
        }
        // Ties between positions (vanishingly rare) resolve by pool index, deterministically.
        points.sort_unstable();
        Ring {
            fingerprint: fingerprint(backends),
            points,
        }
    }

    /// The owner of `hash` and the first eligible backend from it clockwise.
    fn lookup(&self, hash: u64, backends: &[BackendView]) -> Option<(usize, usize)> {
        let n = self.points.len();
        let start = self.points.partition_point(|&(p, _)| p < hash);
        let owner = self.points.get(start % n.max(1))?.1 as usize;
        (0..n)
            .map(|k| self.points[(start + k) % n].1 as usize)
            .find(|&i| backends[i].eligible())
            .map(|chosen| (owner, chosen))
    }
}

impl ConsistentHash {
    /// A policy placing each backend at `virtual_nodes × weight` points (at least 1 each).
    pub(crate) fn new(virtual_nodes: u32) -> ConsistentHash {
        ConsistentHash {
            virtual_nodes: virtual_nodes.max(1),
            ring: ArcSwapOption::empty(),
            fallback: LeastInflight::default(),
        }
    }

    /// The ring for this backend set, built on first use or when the set changes.
    fn ring(&self, backends: &[BackendView]) -> Arc<Ring> {
        let fp = fingerprint(backends);
        if let Some(ring) = self.ring.load_full() {
            if ring.fingerprint == fp {
                return ring;
            }
        }
        let ring = Arc::new(Ring::build(backends, self.virtual_nodes));
        self.ring.store(Some(Arc::clone(&ring)));
        ring
    }
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent_hash"
    }

    fn select(
        &self,
        features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        now: Instant,
    ) -> Result<Decision, NoBackend> {
        let Some(key) = features.session_key.as_deref() else {
            return self.fallback.select(features, snapshot, now);
        };
        let backends = snapshot.backends;
        let (owner, index) = self
            .ring(backends)
            .lookup(stable_hash(key.as_bytes()), backends)
            .ok_or(NoBackend)?;
        Ok(Decision {
            index,
            predicted_ttft_s: None,
            reason: if owner == index {
                Reason::SessionAffinity
            } else {
                Reason::SessionFailover
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_support::{features, views};
    use proptest::prelude::*;

    fn session(key: &str) -> RequestFeatures {
        let mut f = features();
        f.session_key = Some(key.to_string());
        f
    }

    fn pick(p: &ConsistentHash, key: &str, v: &[BackendView]) -> Decision {
        p.select(&session(key), &Snapshot { backends: v }, Instant::now())
            .unwrap()
    }

    fn named(names: &[String]) -> Vec<BackendView> {
        names.iter().map(|n| BackendView::idle(n)).collect()
    }

    /// Owner (its name's key) of each of `keys` keys.
    fn owners(p: &ConsistentHash, v: &[BackendView], keys: usize) -> Vec<crate::ids::BackendKey> {
        (0..keys)
            .map(|k| v[pick(p, &format!("session-{k}"), v).index].key)
            .collect()
    }

    #[test]
    fn same_key_same_backend_across_instances() {
        let v = views(5);
        let a = ConsistentHash::default();
        let b = ConsistentHash::default();
        for k in 0..200 {
            let key = format!("user-{k}");
            let d = pick(&a, &key, &v);
            assert_eq!(d.reason, Reason::SessionAffinity);
            assert_eq!(d.index, pick(&a, &key, &v).index);
            assert_eq!(d.index, pick(&b, &key, &v).index);
        }
    }

    #[test]
    fn position_in_the_pool_does_not_matter() {
        let p = ConsistentHash::default();
        let v = views(4);
        let mut reversed = v.clone();
        reversed.reverse();
        for k in 0..200 {
            let key = format!("k{k}");
            assert_eq!(
                v[pick(&p, &key, &v).index].key,
                reversed[pick(&p, &key, &reversed).index].key
            );
        }
    }

    #[test]
    fn ineligible_owner_fails_over_to_the_next_on_the_ring_and_comes_back() {
        let p = ConsistentHash::default();
        let mut v = views(4);
        let keys: Vec<String> = (0..300).map(|k| format!("s{k}")).collect();
        let before: Vec<usize> = keys.iter().map(|k| pick(&p, k, &v).index).collect();
        v[2].healthy = false;
        for (k, &owner) in keys.iter().zip(&before) {
            let d = pick(&p, k, &v);
            if owner == 2 {
                assert_ne!(d.index, 2);
                assert_eq!(d.reason, Reason::SessionFailover);
                // Failover is where the ring would send the key without backend 2.
                let without: Vec<BackendView> = v
                    .iter()
                    .filter(|b| b.key != crate::ids::BackendKey::of("b2"))
                    .cloned()
                    .collect();
                let q = ConsistentHash::default();
                assert_eq!(v[d.index].key, without[pick(&q, k, &without).index].key);
            } else {
                assert_eq!((d.index, d.reason), (owner, Reason::SessionAffinity));
            }
        }
        v[2].healthy = true;
        let after: Vec<usize> = keys.iter().map(|k| pick(&p, k, &v).index).collect();
        assert_eq!(before, after);
        assert!(before.contains(&2));
    }

    #[test]
    fn none_eligible_is_an_error_with_or_without_a_key() {
        let p = ConsistentHash::default();
        let mut v = views(3);
        for b in &mut v {
            b.excluded = true;
        }
        let snap = Snapshot { backends: &v };
        assert_eq!(
            p.select(&session("x"), &snap, Instant::now()),
            Err(NoBackend)
        );
        assert_eq!(p.select(&features(), &snap, Instant::now()), Err(NoBackend));
        let empty = Snapshot { backends: &[] };
        assert_eq!(
            p.select(&session("x"), &empty, Instant::now()),
            Err(NoBackend)
        );
    }

    #[test]
    fn no_session_key_falls_back_to_least_inflight() {
        let p = ConsistentHash::default();
        let mut v = views(3);
        v[0].inflight = 4;
        v[1].inflight = 1;
        v[2].inflight = 9;
        let d = p
            .select(&features(), &Snapshot { backends: &v }, Instant::now())
            .unwrap();
        assert_eq!((d.index, d.reason), (1, Reason::LeastLoaded));
    }

    #[test]
    fn weights_scale_the_share_of_keys() {
        let p = ConsistentHash::default();
        let mut v = views(2);
        v[1].weight = 3;
        let got = owners(&p, &v, 8_000);
        let share = got
            .iter()
            .filter(|n| **n == crate::ids::BackendKey::of("b1"))
            .count() as f64
            / 8_000.0;
        assert!((share - 0.75).abs() < 0.05, "{share}");
    }

    #[test]
    fn a_changed_backend_set_rebuilds_the_ring() {
        let p = ConsistentHash::default();
        let two = views(2);
        let three = views(3);
        let on_two = owners(&p, &two, 500);
        let on_three = owners(&p, &three, 500);
        assert!(on_three
            .iter()
            .any(|n| *n == crate::ids::BackendKey::of("b2")));
        // Back to two: exactly the original assignment.
        assert_eq!(owners(&p, &two, 500), on_two);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Removing one of N backends moves only its own keys (~1/N of them); adding one moves
        /// keys only onto the new backend (~1/(N+1) of them).
        #[test]
        fn adding_or_removing_one_backend_moves_about_one_nth(
            n in 2usize..10,
            removed in 0usize..10,
            salt in "[a-z]{1,6}",
        ) {
            const KEYS: usize = 3_000;
            let removed = removed % n;
            let names: Vec<String> = (0..n).map(|i| format!("{salt}-{i}")).collect();
            let all = named(&names);
            let fewer: Vec<BackendView> =
                all.iter().enumerate().filter(|&(i, _)| i != removed).map(|(_, b)| *b).collect();
            let p = ConsistentHash::default();
            let before = owners(&p, &all, KEYS);
            let after = owners(&p, &fewer, KEYS);
            let gone = all[removed].key;
            let mut moved = 0;
            for (b, a) in before.iter().zip(&after) {
                if *b == gone {
                    moved += 1;
                } else {
                    prop_assert_eq!(b, a, "a key moved between two backends that stayed");
                }
            }
            let share = moved as f64 / KEYS as f64;
            let ideal = 1.0 / n as f64;
            prop_assert!(share > ideal * 0.6 && share < ideal * 1.5, "removed: {} vs {}", share, ideal);

            // Adding: `fewer` → `all` moves keys only onto the added backend.
            let added = owners(&p, &all, KEYS);
            let mut gained = 0;
            for (f, a) in after.iter().zip(&added) {
                if f != a {
                    prop_assert_eq!(a, &gone, "a key moved to a backend that was already there");
                    gained += 1;
                }
            }
            prop_assert_eq!(gained, moved);
        }
    }
}
