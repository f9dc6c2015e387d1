//! `round_robin`: rotate through eligible backends, weighted.
//!
//! A shared atomic counter advances once per decision; the counter modulo the total weight of
//! the eligible backends picks a slot, and slots are laid out backend by backend in pool order.
//! With equal weights this is plain rotation; ineligible backends are skipped without
//! disturbing the others' shares.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{Decision, NoBackend, Policy, Reason, Snapshot};
use crate::request::RequestFeatures;

/// Weighted round robin.
#[derive(Debug, Default)]
pub(crate) struct RoundRobin {
    next: AtomicU64,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(
        &self,
        _features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        _now: Instant,
    ) -> Result<Decision, NoBackend> {
        let total: u64 = snapshot
            .eligible()
            .map(|(_, b)| u64::from(b.weight.max(1)))
            .sum();
        if total == 0 {
            return Err(NoBackend);
        }
        let mut slot = self.next.fetch_add(1, Ordering::Relaxed) % total;
        for (i, b) in snapshot.eligible() {
            let w = u64::from(b.weight.max(1));
            if slot < w {
                return Ok(Decision {
                    index: i,
                    predicted_ttft_s: None,
                    reason: Reason::RoundRobin,
                });
            }
            slot -= w;
        }
        Err(NoBackend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_support::{features, views};

    #[test]
    fn rotates_evenly_and_skips_ineligible() {
        let rr = RoundRobin::default();
        let mut v = views(3);
        v[1].healthy = false;
        let f = features();
        let now = Instant::now();
        let picks: Vec<usize> = (0..6)
            .map(|_| {
                rr.select(&f, &Snapshot { backends: &v }, now)
                    .unwrap()
                    .index
            })
            .collect();
        assert_eq!(picks.iter().filter(|&&i| i == 0).count(), 3);
        assert_eq!(picks.iter().filter(|&&i| i == 2).count(), 3);
        assert!(!picks.contains(&1));
    }

    #[test]
    fn respects_weights() {
        let rr = RoundRobin::default();
        let mut v = views(2);
        v[0].weight = 3;
        let f = features();
        let now = Instant::now();
        let zeros = (0..400)
            .filter(|_| {
                rr.select(&f, &Snapshot { backends: &v }, now)
                    .unwrap()
                    .index
                    == 0
            })
            .count();
        assert_eq!(zeros, 300);
    }

    #[test]
    fn none_eligible_is_an_error() {
        let rr = RoundRobin::default();
        let mut v = views(2);
        v[0].excluded = true;
        v[1].max_inflight = Some(0);
        let r = rr.select(&features(), &Snapshot { backends: &v }, Instant::now());
        assert_eq!(r, Err(NoBackend));
    }
}
