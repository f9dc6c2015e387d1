//! `power_of_two`: sample two eligible backends, keep the less loaded one.
//!
//! The "power of two choices": two distinct eligible backends are drawn at random, each in
//! proportion to its weight (the second draw excludes the first), and the one with the lower
//! load wins. Load is the router's own in-flight count per unit weight, `inflight / weight`
//! (plain `inflight` when weights are equal, as in SGLang's `power_of_two`); ties go to the
//! lower `outstanding_prefill_tokens / weight`, then to the first draw. Compared with
//! `least_inflight`, two random candidates avoid every gateway replica herding onto the same
//! least-loaded backend, at the cost of sometimes missing it.
//!
//! Comparisons cross-multiply (`a.inflight * b.weight` vs `b.inflight * a.weight`) so they
//! are exact integers. With a single eligible backend it is picked.
//!
//! Knob: `seed` (default 0) for the atomic splitmix64 stream (two draws per decision).

use std::cmp::Ordering;
use std::time::Instant;

use super::rng::{weight, weighted_pick, SplitMix};
use super::{BackendView, Decision, NoBackend, Policy, Reason, Snapshot};
use crate::request::RequestFeatures;

/// Power of two random choices by in-flight requests, seeded.
#[derive(Debug)]
pub(crate) struct PowerOfTwo {
    rng: SplitMix,
}

impl PowerOfTwo {
    /// A policy drawing from the splitmix64 stream that starts at `seed`.
    pub(crate) fn with_seed(seed: u64) -> PowerOfTwo {
        PowerOfTwo {
            rng: SplitMix::new(seed),
        }
    }
}

impl Default for PowerOfTwo {
    /// Seed 0.
    fn default() -> PowerOfTwo {
        PowerOfTwo::with_seed(0)
    }
}

/// `a` vs `b` by `inflight / weight`, then `outstanding_prefill_tokens / weight`.
fn compare_load(a: &BackendView, b: &BackendView) -> Ordering {
    let (wa, wb) = (u128::from(weight(a)), u128::from(weight(b)));
    let by_inflight = (u128::from(a.inflight) * wb).cmp(&(u128::from(b.inflight) * wa));
    by_inflight.then_with(|| {
        (u128::from(a.outstanding_prefill_tokens) * wb)
            .cmp(&(u128::from(b.outstanding_prefill_tokens) * wa))
    })
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(
        &self,
        _features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        _now: Instant,
    ) -> Result<Decision, NoBackend> {
        let backends = snapshot.backends;
        let first = weighted_pick(backends, None, self.rng.next_u64()).ok_or(NoBackend)?;
        let second = weighted_pick(backends, Some(first), self.rng.next_u64());
        let index = match second {
            Some(second) if compare_load(&backends[second], &backends[first]) == Ordering::Less => {
                second
            }
            _ => first,
        };
        Ok(Decision {
            index,
            predicted_ttft_s: None,
            reason: Reason::PowerOfTwo,
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
        v[1].max_inflight = Some(1);
        v[1].inflight = 1;
        v[2].inflight = 50;
        let got = picks(&PowerOfTwo::with_seed(5), &v, 500);
        assert!(got.iter().all(|&i| i == 2 || i == 3), "{got:?}");
        // Backend 3 (idle) wins every time both are drawn, and both always are.
        assert_eq!(count(&got, 3), 500);
    }

    #[test]
    fn single_eligible_backend_is_picked_and_none_is_an_error() {
        let mut v = views(3);
        v[0].excluded = true;
        v[1].healthy = false;
        v[2].inflight = 100;
        assert!(picks(&PowerOfTwo::default(), &v, 20)
            .iter()
            .all(|&i| i == 2));
        v[2].excluded = true;
        let r =
            PowerOfTwo::default().select(&features(), &Snapshot { backends: &v }, Instant::now());
        assert_eq!(r, Err(NoBackend));
    }

    #[test]
    fn never_picks_the_most_loaded_of_distinct_loads() {
        // With distinct loads the busiest backend can only lose a comparison.
        let mut v = views(5);
        for (i, b) in v.iter_mut().enumerate() {
            b.inflight = i as u32 * 3;
        }
        let got = picks(&PowerOfTwo::with_seed(11), &v, 2_000);
        assert_eq!(count(&got, 4), 0);
        // The least loaded wins whenever it is drawn: with 5 backends, 2 of 5 draws include
        // it, so it gets ~40%.
        let share = count(&got, 0) as f64 / got.len() as f64;
        assert!((share - 0.4).abs() < 0.04, "{share}");
    }

    #[test]
    fn ties_go_to_fewer_outstanding_prefill_tokens() {
        let mut v = views(2);
        v[0].inflight = 3;
        v[1].inflight = 3;
        v[0].outstanding_prefill_tokens = 9_000;
        v[1].outstanding_prefill_tokens = 100;
        assert!(picks(&PowerOfTwo::with_seed(2), &v, 50)
            .iter()
            .all(|&i| i == 1));
    }

    #[test]
    fn load_is_per_unit_of_weight() {
        // 6 in flight on weight 4 (1.5 each) beats 2 in flight on weight 1.
        let mut v = views(2);
        v[0].inflight = 6;
        v[0].weight = 4;
        v[1].inflight = 2;
        assert!(picks(&PowerOfTwo::with_seed(4), &v, 50)
            .iter()
            .all(|&i| i == 0));
    }

    #[test]
    fn weights_are_respected_in_sampling() {
        // Idle, equal loads: the first draw wins ties, so shares follow the weights 1:1:2.
        let mut v = views(3);
        v[2].weight = 2;
        let got = picks(&PowerOfTwo::with_seed(8), &v, 20_000);
        for (i, expected) in [(0, 0.25), (1, 0.25), (2, 0.5)] {
            let share = count(&got, i) as f64 / got.len() as f64;
            assert!((share - expected).abs() < 0.02, "backend {i}: {share}");
        }
    }

    #[test]
    fn a_seed_fixes_the_sequence() {
        let v = views(6);
        let a = picks(&PowerOfTwo::with_seed(1), &v, 100);
        let b = picks(&PowerOfTwo::with_seed(1), &v, 100);
        let c = picks(&PowerOfTwo::with_seed(2), &v, 100);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
