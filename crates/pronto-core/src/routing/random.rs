//! `random`: an eligible backend drawn at random, in proportion to its weight.
//!
//! Each decision takes one draw from an atomic splitmix64 stream (lock-free: one `fetch_add`)
//! and maps it onto the eligible backends laid out by weight, so a backend of weight 3 gets
//! three times the share of a backend of weight 1. Load is ignored; this is the baseline every
//! load-aware policy must beat.
//!
//! Knob: `seed` (default 0). A seed fixes the sequence of draws, so a single-threaded replay
//! (tests, the offline evaluator) is reproducible; under concurrency each decision still gets
//! its own draw.

use std::time::Instant;

use super::rng::{weighted_pick, SplitMix};
use super::{Decision, NoBackend, Policy, Reason, Snapshot};
use crate::request::RequestFeatures;

/// Weighted uniform random choice, seeded.
#[derive(Debug)]
pub(crate) struct Random {
    rng: SplitMix,
}

impl Random {
    /// A policy drawing from the splitmix64 stream that starts at `seed`.
    pub(crate) fn with_seed(seed: u64) -> Random {
        Random {
            rng: SplitMix::new(seed),
        }
    }
}

impl Default for Random {
    /// Seed 0.
    fn default() -> Random {
        Random::with_seed(0)
    }
}

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(
        &self,
        _features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        _now: Instant,
    ) -> Result<Decision, NoBackend> {
        let index = weighted_pick(snapshot.backends, None, self.rng.next_u64()).ok_or(NoBackend)?;
        Ok(Decision {
            index,
            predicted_ttft_s: None,
            reason: Reason::Random,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_support::{count, features, picks, views};

    #[test]
    fn only_eligible_backends_are_picked() {
        let mut v = views(4);
        v[0].healthy = false;
        v[2].excluded = true;
        v[3].max_inflight = Some(2);
        v[3].inflight = 2;
        let p = Random::with_seed(1);
        assert!(picks(&p, &v, 200).iter().all(|&i| i == 1));
    }

    #[test]
    fn none_eligible_is_an_error() {
        let mut v = views(2);
        v[0].healthy = false;
        v[1].excluded = true;
        let p = Random::default();
        let r = p.select(&features(), &Snapshot { backends: &v }, Instant::now());
        assert_eq!(r, Err(NoBackend));
        let r = p.select(&features(), &Snapshot { backends: &[] }, Instant::now());
        assert_eq!(r, Err(NoBackend));
    }

    #[test]
    fn weights_are_respected() {
        // Weights 1:3:6 over 20,000 draws; each share within 2 percentage points.
        let mut v = views(3);
        v[1].weight = 3;
        v[2].weight = 6;
        let got = picks(&Random::with_seed(42), &v, 20_000);
        for (i, expected) in [(0, 0.1), (1, 0.3), (2, 0.6)] {
            let share = count(&got, i) as f64 / got.len() as f64;
            assert!((share - expected).abs() < 0.02, "backend {i}: {share}");
        }
    }

    #[test]
    fn equal_weights_are_uniform() {
        let got = picks(&Random::with_seed(3), &views(4), 8_000);
        for i in 0..4 {
            let c = count(&got, i);
            assert!((1_800..=2_200).contains(&c), "backend {i}: {c}");
        }
    }

    #[test]
    fn a_seed_fixes_the_sequence() {
        let v = views(5);
        let a = picks(&Random::with_seed(9), &v, 100);
        let b = picks(&Random::with_seed(9), &v, 100);
        let c = picks(&Random::with_seed(10), &v, 100);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
