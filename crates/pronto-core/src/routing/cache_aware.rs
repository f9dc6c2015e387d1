//! `cache_aware`: SGLang's cache-aware load balancing, over the router's prefix index.
//!
//! The decision, per request, over the eligible backends:
//!
//! 1. **Imbalanced → least loaded.** With `load = inflight / weight`, the pool is imbalanced
//!    when `max_load - min_load > balance_abs_threshold` **and**
//!    `max_load > balance_rel_threshold * min_load` (both strict). Then the least-loaded
//!    backend wins, whatever the cache says ([`Reason::Imbalanced`]).
//! 2. **Good match → best match.** Otherwise each backend's match ratio is
//!    `cached_tokens / prompt_tokens` (0 for an empty prompt). If the best ratio is strictly
//!    greater than `cache_threshold`, the backend with the best ratio wins; among equal best
//!    ratios, the least loaded ([`Reason::CacheHit`]).
//! 3. **Poor match → least loaded** ([`Reason::CacheMiss`]).
//!
//! "Least loaded" means lowest `inflight / weight`, then fewest
//! `outstanding_prefill_tokens / weight`, then pool order.
//!
//! ## Knobs (SGLang's defaults)
//! - `cache_threshold` = 0.3, in `0..=1`: the match ratio that must be exceeded to follow the
//!   cache. 0 follows any non-empty match; 1 never follows the cache.
//! - `balance_abs_threshold` = 64: in-flight requests (per unit weight) between the busiest
//!   and the idlest backend before load overrides the cache.
//! - `balance_rel_threshold` = 1.5, >= 1: how many times the idlest backend's load the busiest
//!   one must carry as well.
//!
//! ## Mapping to SGLang's `CacheAwarePolicy::select_worker` (`sgl-router/src/policies/cache_aware.rs`)
//! - SGLang's `is_imbalanced` uses `worker.load()` (its own count of requests in flight per
//!   worker); ours uses the router's `inflight`, divided by weight (SGLang has no weights, so
//!   with equal weights the two are identical). SGLang takes max and min over all workers of
//!   the model; we take them over eligible backends only, since an unhealthy, already-tried or
//!   capped backend cannot receive the request and its count should not force the balancing
//!   branch.
//! - The imbalanced branch is SGLang's "shortest queue": `min_by_key(load)` over healthy
//!   workers. SGLang still inserts the text into the chosen worker's tree; here the caller
//!   records the routed prefix in its index after the decision, whichever branch chose it.
//! - SGLang's `match_rate` is matched characters / request characters from its approximate
//!   radix tree (`tree.prefix_match`); ours is matched tokens / prompt tokens, where the caller
//!   fills [`BackendView::cached_tokens`](super::BackendView::cached_tokens) by walking the
//!   request's block-hash chain in the prefix index (the router-side approximation of the same
//!   tree, in blocks rather than characters). The comparison `match_rate > cache_threshold`
//!   is the same.
//! - Below the threshold SGLang picks `tree.get_smallest_tenant()` (the worker whose tree holds
//!   the fewest characters, i.e. the most free cache). We pick the least-loaded backend
//!   instead: the index's size per backend is not in the snapshot, and load is what the
//!   router knows exactly.
//! - SGLang's tree is per model; our policy instance is per pool, which is per model.

use std::cmp::Ordering;
use std::time::Instant;

use super::rng::weight;
use super::{BackendView, Decision, NoBackend, Policy, Reason, Snapshot};
use crate::request::RequestFeatures;

/// SGLang's default `cache_threshold`.
pub(crate) const DEFAULT_CACHE_THRESHOLD: f64 = 0.3;
/// SGLang's default `balance_abs_threshold`.
pub(crate) const DEFAULT_BALANCE_ABS_THRESHOLD: u32 = 64;
/// SGLang's default `balance_rel_threshold`.
pub(crate) const DEFAULT_BALANCE_REL_THRESHOLD: f64 = 1.5;

/// Cache-aware routing with load-imbalance override (SGLang semantics).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CacheAware {
    cache_threshold: f64,
    balance_abs_threshold: u32,
    balance_rel_threshold: f64,
}

impl Default for CacheAware {
    /// SGLang's defaults: 0.3, 64, 1.5.
    fn default() -> CacheAware {
        CacheAware::new(
            DEFAULT_CACHE_THRESHOLD,
            DEFAULT_BALANCE_ABS_THRESHOLD,
            DEFAULT_BALANCE_REL_THRESHOLD,
        )
    }
}

impl CacheAware {
    /// A policy with the given knobs (see the module docs; validated by the config layer).
    pub(crate) fn new(
        cache_threshold: f64,
        balance_abs_threshold: u32,
        balance_rel_threshold: f64,
    ) -> CacheAware {
        CacheAware {
            cache_threshold,
            balance_abs_threshold,
            balance_rel_threshold,
        }
    }

    /// Whether loads spanning `min..=max` trigger the balancing branch.
    fn imbalanced(&self, min: f64, max: f64) -> bool {
        max - min > f64::from(self.balance_abs_threshold) && max > self.balance_rel_threshold * min
    }
}

/// In-flight requests per unit weight.
fn load(b: &BackendView) -> f64 {
    f64::from(b.inflight) / weight(b) as f64
}

/// `a` vs `b`: lower `inflight / weight`, then lower `outstanding_prefill_tokens / weight`.
fn by_load(a: &BackendView, b: &BackendView) -> Ordering {
    let (wa, wb) = (u128::from(weight(a)), u128::from(weight(b)));
    (u128::from(a.inflight) * wb)
        .cmp(&(u128::from(b.inflight) * wa))
        .then_with(|| {
            (u128::from(a.outstanding_prefill_tokens) * wb)
                .cmp(&(u128::from(b.outstanding_prefill_tokens) * wa))
        })
}

/// Share of the prompt expected in `b`'s cache, 0..=1.
fn match_ratio(b: &BackendView, prompt_tokens: u32) -> f64 {
    if prompt_tokens == 0 {
        return 0.0;
    }
    f64::from(b.cached_tokens.min(prompt_tokens)) / f64::from(prompt_tokens)
}

/// The least-loaded eligible backend among those `keep` accepts; earliest on ties.
fn least_loaded<'a>(snapshot: &Snapshot<'a>, keep: impl Fn(&BackendView) -> bool) -> Option<usize> {
    let mut best: Option<(usize, &'a BackendView)> = None;
    for (i, b) in snapshot.eligible().filter(|(_, b)| keep(b)) {
        if best.is_none_or(|(_, cur)| by_load(b, cur) == Ordering::Less) {
            best = Some((i, b));
        }
    }
    best.map(|(i, _)| i)
}

impl Policy for CacheAware {
    fn limits_prefix_credit_to_residency(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(
        &self,
        features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        _now: Instant,
    ) -> Result<Decision, NoBackend> {
        let mut min_load = f64::INFINITY;
        let mut max_load = f64::NEG_INFINITY;
        let mut best_ratio = 0.0f64;
        for (_, b) in snapshot.eligible() {
            let l = load(b);
            min_load = min_load.min(l);
            max_load = max_load.max(l);
            best_ratio = best_ratio.max(match_ratio(b, features.prompt_tokens));
        }
        if min_load > max_load {
            return Err(NoBackend);
        }
        let (index, reason) = if self.imbalanced(min_load, max_load) {
            (least_loaded(snapshot, |_| true), Reason::Imbalanced)
        } else if best_ratio > self.cache_threshold {
            let best = |b: &BackendView| match_ratio(b, features.prompt_tokens) >= best_ratio;
            (least_loaded(snapshot, best), Reason::CacheHit)
        } else {
            (least_loaded(snapshot, |_| true), Reason::CacheMiss)
        };
        Ok(Decision {
            index: index.ok_or(NoBackend)?,
            predicted_ttft_s: None,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_support::{features, views};

    /// A request of `prompt_tokens` tokens.
    fn request(prompt_tokens: u32) -> RequestFeatures {
        let mut f = features();
        f.prompt_tokens = prompt_tokens;
        f
    }

    /// Backends with these `(inflight, cached_tokens)`.
    fn pool(spec: &[(u32, u32)]) -> Vec<BackendView> {
        let mut v = views(spec.len());
        for (b, &(inflight, cached)) in v.iter_mut().zip(spec) {
            b.inflight = inflight;
            b.cached_tokens = cached;
        }
        v
    }

    fn decide(p: &CacheAware, f: &RequestFeatures, v: &[BackendView]) -> (usize, Reason) {
        let d = p
            .select(f, &Snapshot { backends: v }, Instant::now())
            .unwrap();
        (d.index, d.reason)
    }

    /// (case, prompt tokens, (inflight, cached) per backend, expected index, reason)
    type Case = (&'static str, u32, &'static [(u32, u32)], usize, Reason);

    #[test]
    fn takes_each_branch_exactly_where_sglang_would() {
        use Reason::{CacheHit, CacheMiss, Imbalanced};
        let p = CacheAware::default();
        let table: &[Case] = &[
            ("idle, no cache", 100, &[(0, 0), (0, 0)], 0, CacheMiss),
            ("idle, one match", 100, &[(0, 0), (0, 80)], 1, CacheHit),
            (
                "ratio exactly at threshold is a miss",
                10,
                &[(5, 0), (6, 3)],
                0,
                CacheMiss,
            ),
            (
                "ratio just above threshold is a hit",
                1000,
                &[(5, 0), (6, 301)],
                1,
                CacheHit,
            ),
            (
                "hit goes to a busier backend",
                100,
                &[(1, 0), (30, 90)],
                1,
                CacheHit,
            ),
            (
                "best match wins over a lesser one",
                100,
                &[(0, 50), (9, 90)],
                1,
                CacheHit,
            ),
            (
                "equal best matches → least loaded",
                100,
                &[(9, 90), (4, 90), (7, 10)],
                1,
                CacheHit,
            ),
            (
                "diff exactly 64 is balanced",
                100,
                &[(0, 0), (64, 100)],
                1,
                CacheHit,
            ),
            (
                "diff 65 from zero is imbalanced",
                100,
                &[(0, 0), (65, 100)],
                0,
                Imbalanced,
            ),
            (
                "diff > 64 but max <= 1.5 min",
                100,
                &[(200, 0), (300, 100)],
                1,
                CacheHit,
            ),
            (
                "diff > 64 and max just > 1.5 min",
                100,
                &[(200, 0), (301, 100)],
                0,
                Imbalanced,
            ),
            (
                "imbalance ignores a perfect match",
                100,
                &[(129, 100), (64, 0)],
                1,
                Imbalanced,
            ),
            (
                "miss picks least loaded",
                100,
                &[(7, 10), (3, 20), (5, 0)],
                1,
                CacheMiss,
            ),
            ("empty prompt is a miss", 0, &[(2, 0), (1, 0)], 1, CacheMiss),
            (
                "cached beyond prompt clamps to 1",
                10,
                &[(0, 0), (1, 50)],
                1,
                CacheHit,
            ),
        ];
        for &(case, prompt, spec, index, reason) in table {
            let got = decide(&p, &request(prompt), &pool(spec));
            assert_eq!(got, (index, reason), "{case}");
        }
    }

    #[test]
    fn knobs_move_the_boundaries() {
        let f = request(100);
        // A 50% match: a hit at threshold 0.49, a miss at 0.5.
        let v = pool(&[(0, 0), (3, 50)]);
        assert_eq!(
            decide(&CacheAware::new(0.49, 64, 1.5), &f, &v).1,
            Reason::CacheHit
        );
        assert_eq!(
            decide(&CacheAware::new(0.5, 64, 1.5), &f, &v).1,
            Reason::CacheMiss
        );
        // Threshold 1 never follows the cache, even on a full match.
        let full = pool(&[(0, 0), (3, 100)]);
        assert_eq!(
            decide(&CacheAware::new(1.0, 64, 1.5), &f, &full),
            (0, Reason::CacheMiss)
        );
        // Loads 10 and 21: imbalanced only once the absolute threshold drops below 11.
        let v = pool(&[(10, 0), (21, 100)]);
        assert_eq!(
            decide(&CacheAware::new(0.3, 11, 1.5), &f, &v).1,
            Reason::CacheHit
        );
        assert_eq!(
            decide(&CacheAware::new(0.3, 10, 1.5), &f, &v).1,
            Reason::Imbalanced
        );
        // ... and, with abs 10, only while 21 > rel * 10.
        assert_eq!(
            decide(&CacheAware::new(0.3, 10, 2.0), &f, &v).1,
            Reason::Imbalanced
        );
        assert_eq!(
            decide(&CacheAware::new(0.3, 10, 2.5), &f, &v).1,
            Reason::CacheHit
        );
    }

    #[test]
    fn only_eligible_backends_count_and_are_picked() {
        let p = CacheAware::default();
        let f = request(100);
        // The full match is unhealthy, the idle one already tried: backend 2 it is.
        let mut v = pool(&[(0, 100), (0, 0), (5, 10)]);
        v[0].healthy = false;
        v[1].excluded = true;
        assert_eq!(decide(&p, &f, &v), (2, Reason::CacheMiss));
        // An ineligible idle backend does not make the pool look imbalanced.
        let mut v = pool(&[(0, 0), (100, 90), (110, 0)]);
        v[0].max_inflight = Some(0);
        assert_eq!(decide(&p, &f, &v), (1, Reason::CacheHit));
        // Nothing eligible.
        v[1].healthy = false;
        v[2].excluded = true;
        let r = p.select(&f, &Snapshot { backends: &v }, Instant::now());
        assert_eq!(r, Err(NoBackend));
        assert_eq!(
            p.select(&f, &Snapshot { backends: &[] }, Instant::now()),
            Err(NoBackend)
        );
    }

    #[test]
    fn least_loaded_ties_break_on_outstanding_prefill() {
        let p = CacheAware::default();
        let mut v = pool(&[(2, 0), (2, 0)]);
        v[0].outstanding_prefill_tokens = 5_000;
        v[1].outstanding_prefill_tokens = 10;
        assert_eq!(decide(&p, &request(100), &v), (1, Reason::CacheMiss));
    }

    #[test]
    fn weights_are_respected() {
        // Simulate a burst with no cache: each pick adds one in flight. Weights 3:1 share
        // 3:1 because load is per unit of weight.
        let p = CacheAware::default();
        let f = request(100);
        let mut v = views(2);
        v[0].weight = 3;
        for _ in 0..400 {
            let (i, _) = decide(&p, &f, &v);
            v[i].inflight += 1;
        }
        assert_eq!((v[0].inflight, v[1].inflight), (300, 100));
    }

    #[test]
    fn deterministic() {
        let p = CacheAware::default();
        let v = pool(&[(3, 40), (2, 40), (9, 0)]);
        let f = request(100);
        let first = decide(&p, &f, &v);
        assert!((0..10).all(|_| decide(&p, &f, &v) == first));
    }
}
