//! Choosing a backend: `select(&features, &snapshot, now)`.
//!
//! Routing is pure and synchronous. The caller (the proxy, or the offline evaluator) builds a
//! [`Snapshot`] — one [`BackendView`] per backend of the pool, from the view builder
//! ([`views::build`], the same for both) — and a [`Policy`] picks one; [`decide`] runs it and
//! makes sure the [`Decision`] carries the one prediction the request is judged by. Policies
//! take no locks, do no I/O and never await; what state they keep (a round-robin counter, a
//! seeded random stream) is atomic.
//!
//! Every policy sees only *eligible* backends ([`BackendView::eligible`]): healthy, not already
//! tried for this request, not stalled ([`crate::stall`]), and below their `max_inflight`.
//!
//! One file per policy, each documenting its algorithm and knobs ([`PolicyKind`]:
//! `predicted_ttft`, the default, `round_robin`, `least_inflight`, `random`, `power_of_two`,
//! `cache_aware` as SGLang's, `consistent_hash`). Config names a policy and its parameters as
//! a [`PolicySpec`] (see `spec.rs` for the table of names, parameters and defaults);
//! [`PolicySpec::build`] makes the policy. Every [`Decision`] carries a [`Reason`], a bounded metric label.

mod cache_aware;
mod consistent_hash;
mod least_inflight;
mod power_of_two;
mod predicted_ttft;
mod random;
pub(crate) mod rng;
mod round_robin;
mod spec;
pub mod views;

use std::time::Instant;

pub(crate) use cache_aware::CacheAware;
pub(crate) use consistent_hash::ConsistentHash;
pub(crate) use least_inflight::LeastInflight;
pub(crate) use power_of_two::PowerOfTwo;
pub(crate) use predicted_ttft::PredictedTtft;
pub(crate) use random::Random;
pub(crate) use round_robin::RoundRobin;
pub use spec::{
    CacheAwareParams, ConsistentHashParams, PolicyKind, PolicySpec, PredictedTtftParams,
    SeedParams, SpecError,
};

pub use crate::affinity::residency::AllocRate;
use crate::ids::{BackendId, BackendKey};
use crate::predict::{Coefficients, Quality, TpotCoefficients, TtftInputs};
use crate::request::RequestFeatures;

/// Engine-side load scraped from a backend's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests waiting in the engine's queue.
    pub waiting: f64,
    /// Requests in the engine's running batch.
    pub running: f64,
    /// KV-cache usage, 0..=1.
    pub kv_usage: f64,
    /// Seconds since the scrape that produced these values.
    pub age_s: f64,
}

/// What the router knows about one backend at decision time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackendView {
    /// The backend instance.
    pub id: BackendId,
    /// Stable hash of its name (what a consistent-hash ring is built on).
    pub key: BackendKey,
    /// Passed its health checks and not ejected.
    pub healthy: bool,
    /// Already tried for this request (a retry must go elsewhere).
    pub excluded: bool,
    /// Relative weight from config (>= 1).
    pub weight: u32,
    /// Requests sent and not yet finished (router-side, updated at once).
    pub inflight: u32,
    /// Cap on `inflight` from config.
    pub max_inflight: Option<u32>,
    /// Prompt tokens sent that have not yet produced a first token.
    pub outstanding_prefill_tokens: u64,
    /// Σ over those outstanding prefills of (uncached tokens / 1000)²: their attention work.
    pub outstanding_prefill_sq: f64,
    /// Requests past their first token and still streaming.
    pub running_decodes: u32,
    /// Scraped engine load, when a recent scrape exists.
    pub engine: Option<EngineLoad>,
    /// Prompt tokens of *this* request expected to be in the backend's prefix cache.
    pub cached_tokens: u32,
    /// KV-cache tokens the backend's in-flight requests will add at most: Σ expected uncached
    /// prompt + expected output (router-side, updated at once). Cached prefix blocks are not
    /// counted: they are shared, already resident, and counted once when first sent.
    pub kv_reserved_tokens: u64,
    /// The engine's KV-cache capacity in tokens, when known (config hint or scrape).
    pub kv_capacity_tokens: Option<u64>,
    /// KV-cache tokens the backend allocates per second (its dispatched uncached prompts and
    /// expected outputs, time-averaged; evaluated on demand, [`AllocRate`]). In a steady state
    /// blocks are freed as fast as they are taken, so this is also how fast room appears
    /// (`BackendView::kv_wait_s`), and how fast an unused prefix is evicted
    /// ([`BackendView::cache_residency_s`]).
    pub kv_alloc: AllocRate,
    /// The backend's learned TTFT model, when the caller keeps one.
    pub ttft_model: Option<TtftModelView>,
    /// The backend's learned TPOT model, once it predicts ([`crate::predict::TpotModel`]).
    pub tpot_model: Option<TpotCoefficients>,
    /// Seconds its streams in flight have gone without a token (0: it holds no stream;
    /// [`crate::load::LoadView::silent_s`]).
    pub silent_s: f64,
    /// Taken out of routing for making no progress ([`crate::stall`]); the view builder sets
    /// it only while another backend is eligible.
    pub stalled: bool,
    /// While stalled: seconds since it was marked or last probed.
    pub since_probe_s: f64,
}

/// A backend's TTFT model as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftModelView {
    /// Learned coefficients.
    pub coefficients: Coefficients,
    /// How good its recent predictions were.
    pub quality: Quality,
    /// Seconds since it last learned from an observation (infinite if never).
    pub since_last_observation_s: f64,
}

impl BackendView {
    /// Inputs of a TTFT prediction for `features` on this backend.
    #[inline]
    pub(crate) fn ttft_inputs(&self, features: &RequestFeatures) -> TtftInputs {
        TtftInputs {
            queued_prefill_tokens: self.outstanding_prefill_tokens as f64,
            queued_prefill_sq: self.outstanding_prefill_sq,
            uncached_tokens: f64::from(features.prompt_tokens.saturating_sub(self.cached_tokens)),
            running_decodes: f64::from(self.running_decodes),
            engine_waiting: self.engine.map_or(0.0, |e| e.waiting),
        }
    }

    /// Predicted seconds to first token for `features`, if the backend has a model.
    pub(crate) fn predicted_ttft(&self, features: &RequestFeatures) -> Option<f64> {
        self.ttft_model
            .map(|m| m.coefficients.predict(&self.ttft_inputs(features)))
    }
}

impl BackendView {
    /// A healthy, idle backend with default settings, its key from `name` (tests and tools).
    pub fn idle(name: &str) -> BackendView {
        BackendView {
            id: BackendId(BackendKey::of(name).0),
            key: BackendKey::of(name),
            healthy: true,
            excluded: false,
            weight: 1,
            inflight: 0,
            max_inflight: None,
            outstanding_prefill_tokens: 0,
            outstanding_prefill_sq: 0.0,
            running_decodes: 0,
            engine: None,
            cached_tokens: 0,
            kv_reserved_tokens: 0,
            kv_capacity_tokens: None,
            kv_alloc: AllocRate::NONE,
            ttft_model: None,
            tpot_model: None,
            silent_s: 0.0,
            stalled: false,
            since_probe_s: 0.0,
        }
    }

    /// Predicted seconds per output token for a request sent here now, when the backend has
    /// a TPOT model: every request in flight decoding beside it (`inflight + 1` sequences).
    #[inline]
    pub fn predicted_tpot_s(&self) -> Option<f64> {
        self.tpot_model
            .map(|m| m.predict(f64::from(self.inflight) + 1.0))
    }

    /// [`BackendView::predicted_tpot_s`] from the model's cautious fit
    /// ([`crate::predict::TpotModel`]): what a TPOT objective is checked against.
    #[inline]
    pub(crate) fn cautious_tpot_s(&self) -> Option<f64> {
        self.tpot_model
            .map(|m| m.predict_cautious(f64::from(self.inflight) + 1.0))
    }

    /// Whether a request sent here now is predicted to meet `features.slo`: its TTFT
    /// prediction `predicted_ttft_s` within `ttft_s` and its predicted TPOT within `tpot_s`
    /// (an objective not set, or a TPOT the backend cannot predict yet, counts as met).
    #[inline]
    pub(crate) fn meets_slo(&self, features: &RequestFeatures, predicted_ttft_s: f64) -> bool {
        let slo = &features.slo;
        slo.ttft_s.is_none_or(|s| predicted_ttft_s <= s)
            && slo
                .tpot_s
                .is_none_or(|s| self.cautious_tpot_s().is_none_or(|t| t <= s))
    }

    /// Whether `features` fits in the backend's KV cache next to what its in-flight requests
    /// will hold (true when the capacity is unknown): its uncached prompt here plus its expected
    /// output. A request that does not fit makes the engine queue it or preempt running ones —
    /// a cost the TTFT model cannot see coming.
    pub(crate) fn kv_fits(&self, features: &RequestFeatures) -> bool {
        self.kv_capacity_tokens
            .is_none_or(|cap| self.kv_reserved_tokens + self.kv_need(features) <= cap)
    }

    /// Seconds a prefix stays in the backend's cache after the dispatch that last used it
    /// (infinite: unknown): pinned while that request is in flight, then cycled out of the
    /// evictable part, `max(capacity, reserved) / allocation rate`
    /// (`crate::affinity::residency::residency_s`). Prefix credit older than this is not
    /// given.
    #[inline]
    pub fn cache_residency_s(&self) -> f64 {
        crate::affinity::residency::residency_s(
            self.kv_capacity_tokens.filter(|&c| c > 0).map(|c| c as f64),
            self.kv_reserved_tokens as f64,
            self.kv_alloc,
        )
    }

    /// Expected seconds before `features` has room in this backend's KV cache: 0 when it fits
    /// ([`BackendView::kv_fits`]); else the tokens that do not fit over the rate at which the
    /// backend's cache turns over ([`BackendView::kv_alloc`]); infinite when that rate is
    /// unknown. An engine out of blocks queues the request (or preempts) until running
    /// requests finish, a wait the TTFT model cannot see in its inputs.
    #[inline]
    pub(crate) fn kv_wait_s(&self, features: &RequestFeatures) -> f64 {
        let Some(cap) = self.kv_capacity_tokens else {
            return 0.0;
        };
        let overflow = (self.kv_reserved_tokens + self.kv_need(features)).saturating_sub(cap);
        if overflow == 0 {
            0.0
        } else {
            // Infinite when nothing allocates.
            overflow as f64 * self.kv_alloc.secs_per_token()
        }
    }

    /// KV-cache tokens `features` will add on this backend: its uncached prompt here plus its
    /// expected output (cached prefix blocks are shared and already resident). What a dispatch
    /// reserves in `kv_reserved_tokens` and allocates for the cache-residency estimate.
    #[inline]
    pub(crate) fn kv_need(&self, features: &RequestFeatures) -> u64 {
        let uncached = features.prompt_tokens.saturating_sub(self.cached_tokens);
        u64::from(uncached) + u64::from(expected_output_tokens(features))
    }

    /// Whether a policy may pick this backend.
    #[inline]
    pub fn eligible(&self) -> bool {
        self.healthy
            && !self.excluded
            && !self.stalled
            && self.max_inflight.is_none_or(|m| self.inflight < m)
    }
}

/// Output tokens assumed for a request that does not say (`max_tokens` absent).
pub(crate) const DEFAULT_OUTPUT_TOKENS: u32 = 256;

/// Tokens a request is expected to generate: its `max_tokens`, or
/// [`DEFAULT_OUTPUT_TOKENS`] when it sets none.
#[inline]
pub(crate) fn expected_output_tokens(features: &RequestFeatures) -> u32 {
    features.max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS)
}

/// Set each view's expected prefix-cache hit from the number of leading prompt blocks the
/// backend is believed to hold (`matched_blocks[i]`, e.g. from
/// [`crate::affinity::PrefixIndex::match_lengths`]). A hit never covers the whole prompt: an
/// engine always computes the last prompt token.
pub(crate) fn apply_prefix_matches(
    views: &mut [BackendView],
    matched_blocks: &[u32],
    block_tokens: f64,
    prompt_tokens: u32,
) {
    let cap = prompt_tokens.saturating_sub(1);
    for (v, &m) in views.iter_mut().zip(matched_blocks) {
        v.cached_tokens = (f64::from(m) * block_tokens).min(f64::from(cap)) as u32;
    }
}

/// The pool as the router sees it for one decision.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    /// One view per backend, in pool order; a [`Decision`] names an index into this.
    pub backends: &'a [BackendView],
}

impl<'a> Snapshot<'a> {
    /// Indices of eligible backends.
    pub(crate) fn eligible(&self) -> impl Iterator<Item = (usize, &'a BackendView)> + 'a {
        self.backends
            .iter()
            .enumerate()
            .filter(|(_, b)| b.eligible())
    }
}

/// Why a backend was chosen (a bounded metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Next in rotation.
    RoundRobin,
    /// Fewest requests in flight (`least_inflight`, `consistent_hash` without a session key).
    LeastLoaded,
    /// Lowest predicted TTFT.
    PredictedBest,
    /// A cold or long-unobserved backend probed so its model gets calibrated.
    Explore,
    /// Predictions are missing or poor: least in flight instead.
    Fallback,
    /// Weighted random draw (`random`).
    Random,
    /// The less loaded of two random candidates (`power_of_two`).
    PowerOfTwo,
    /// Best prefix match above the cache threshold (`cache_aware`).
    CacheHit,
    /// No match above the cache threshold, so the least loaded (`cache_aware`).
    CacheMiss,
    /// Load imbalance overrode the cache, so the least loaded (`cache_aware`).
    Imbalanced,
    /// The session key's owner on the ring (`consistent_hash`).
    SessionAffinity,
    /// The owner was ineligible; the next eligible backend on the ring (`consistent_hash`).
    SessionFailover,
}

impl Reason {
    /// Every reason, for registering metric label values up front.
    pub const ALL: &'static [Reason] = &[
        Reason::RoundRobin,
        Reason::LeastLoaded,
        Reason::Random,
        Reason::PowerOfTwo,
        Reason::CacheHit,
        Reason::CacheMiss,
        Reason::Imbalanced,
        Reason::SessionAffinity,
        Reason::SessionFailover,
        Reason::PredictedBest,
        Reason::Explore,
        Reason::Fallback,
    ];

    /// What the reason means (the config reference and the operating guide show it).
    pub fn describe(self) -> &'static str {
        match self {
            Reason::RoundRobin => "next in rotation (`round_robin`)",
            Reason::LeastLoaded => {
                "fewest requests in flight per unit weight (`least_inflight`, and \
                 `consistent_hash` without a session key)"
            }
            Reason::PredictedBest => "lowest predicted TTFT (`predicted_ttft`)",
            Reason::Explore => {
                "a cold or long-unobserved backend probed so its TTFT model gets calibrated \
                 (`predicted_ttft`, within `explore_margin` of the best)"
            }
            Reason::Fallback => {
                "predictions missing or poor (`poor_error`), so the fewest in flight \
                 (`predicted_ttft`)"
            }
            Reason::Random => "weighted random draw (`random`)",
            Reason::PowerOfTwo => "the less loaded of two random candidates (`power_of_two`)",
            Reason::CacheHit => "best prefix match above `cache_threshold` (`cache_aware`)",
            Reason::CacheMiss => {
                "no prefix match above `cache_threshold`, so the least loaded (`cache_aware`)"
            }
            Reason::Imbalanced => {
                "the pool is imbalanced (both balance thresholds exceeded), so the least loaded \
                 whatever the cache (`cache_aware`)"
            }
            Reason::SessionAffinity => "the session key's owner on the ring (`consistent_hash`)",
            Reason::SessionFailover => {
                "the owner was not eligible: the next eligible backend on the ring \
                 (`consistent_hash`)"
            }
        }
    }

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RoundRobin => "round_robin",
            Reason::LeastLoaded => "least_loaded",
            Reason::PredictedBest => "predicted_best",
            Reason::Explore => "explore",
            Reason::Fallback => "fallback",
            Reason::Random => "random",
            Reason::PowerOfTwo => "power_of_two",
            Reason::CacheHit => "cache_hit",
            Reason::CacheMiss => "cache_miss",
            Reason::Imbalanced => "imbalanced",
            Reason::SessionAffinity => "session_affinity",
            Reason::SessionFailover => "session_failover",
        }
    }
}

/// A routing decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Index into [`Snapshot::backends`].
    pub index: usize,
    /// Predicted seconds to first token on the chosen backend, when the policy predicts.
    pub predicted_ttft_s: Option<f64>,
    /// Why.
    pub reason: Reason,
}

/// Run `policy` on `views` and make sure the decision carries a prediction: a policy that
/// predicts ([`PolicyKind::PredictedTtft`]) reports the one it acted on; for any other, the chosen
/// backend's own model prediction plus its wait for KV room (when finite) is filled in. This
/// is *the* prediction of the request — the one the explain header shows, admission compares
/// with the SLO and the accuracy metric scores.
pub fn decide(
    policy: &dyn Policy,
    features: &RequestFeatures,
    views: &[BackendView],
    now: Instant,
) -> Result<Decision, NoBackend> {
    let mut d = policy.select(features, &Snapshot { backends: views }, now)?;
    if d.predicted_ttft_s.is_none() {
        d.predicted_ttft_s = prediction(&views[d.index], features);
    }
    Ok(d)
}

/// What [`decide`] predicts for `features` on `v` when the policy does not: the backend's
/// model prediction plus its wait for KV room (when finite).
fn prediction(v: &BackendView, features: &RequestFeatures) -> Option<f64> {
    let wait = v.kv_wait_s(features);
    v.predicted_ttft(features)
        .map(|p| if wait.is_finite() { p + wait } else { p })
}

/// The backend a decision passed over, for explaining it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunnerUp {
    /// Index into the views the decision was made on.
    pub index: usize,
    /// Its predicted seconds to first token.
    pub predicted_ttft_s: f64,
}

/// The runner-up of a decision for `features` that chose `views[chosen]`: among the other
/// eligible backends, the one predicted to give the first token soonest (the prediction
/// [`decide`] would report for it: model plus KV wait), ties to fewer in flight. `None` when
/// no other backend is eligible or none of them has a model. Explanation only — no policy
/// acts on it (a policy may rank by more than the prediction: distrust, exploration, load).
pub fn runner_up(
    features: &RequestFeatures,
    views: &[BackendView],
    chosen: usize,
) -> Option<RunnerUp> {
    let mut best: Option<RunnerUp> = None;
    for (i, v) in views.iter().enumerate() {
        if i == chosen || !v.eligible() {
            continue;
        }
        let Some(p) = prediction(v, features) else {
            continue;
        };
        let better = best.is_none_or(|b| {
            p < b.predicted_ttft_s
                || (p == b.predicted_ttft_s && v.inflight < views[b.index].inflight)
        });
        if better {
            best = Some(RunnerUp {
                index: i,
                predicted_ttft_s: p,
            });
        }
    }
    best
}

/// No backend could be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no eligible backend")]
pub struct NoBackend;

/// A routing policy.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// Policy name as written in config.
    fn name(&self) -> &'static str;

    /// Pick one eligible backend for `features`. Called once per attempt on the request path:
    /// it must not block, lock across calls or allocate per backend. Returns [`NoBackend`] when
    /// no backend is eligible.
    fn select(
        &self,
        features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        now: Instant,
    ) -> Result<Decision, NoBackend>;

    /// Whether the prefix credit in this policy's views expires with each backend's KV-cache
    /// residency ([`BackendView::cache_residency_s`]). `cache_aware` says no: it keeps SGLang's
    /// semantics (an approximate tree that forgets only by size), so the two compare like for
    /// like.
    fn limits_prefix_credit_to_residency(&self) -> bool {
        true
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub fn features() -> RequestFeatures {
        RequestFeatures::synthetic("m", "hello world".into(), Some(8))
    }

    pub fn views(n: usize) -> Vec<BackendView> {
        (0..n)
            .map(|i| BackendView::idle(&format!("b{i}")))
            .collect()
    }

    /// Indices `p` picks over `v` in `n` decisions on the same features.
    pub(crate) fn picks(p: &dyn Policy, v: &[BackendView], n: usize) -> Vec<usize> {
        let f = features();
        let now = Instant::now();
        (0..n)
            .map(|_| p.select(&f, &Snapshot { backends: v }, now).unwrap().index)
            .collect()
    }

    /// How many of `picks` are `i`.
    pub fn count(picks: &[usize], i: usize) -> usize {
        picks.iter().filter(|&&p| p == i).count()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{features, views};
    use super::*;
    use crate::predict::{Coefficients, Quality};

    fn model(s_per_token: f64) -> Option<TtftModelView> {
        Some(TtftModelView {
            coefficients: Coefficients {
                base_s: 0.01,
                s_per_token,
                s_per_token_sq: 0.0,
                s_per_decode: 0.0,
                s_per_waiting: 0.0,
            },
            quality: Quality {
                samples: 10,
                rel_error: 0.1,
            },
            since_last_observation_s: 1.0,
        })
    }

    #[test]
    fn the_runner_up_is_the_next_soonest_eligible_backend() {
        let f = features();
        let mut v = views(4);
        v[0].ttft_model = model(1e-3);
        v[1].ttft_model = model(2e-3);
        v[2].ttft_model = model(5e-4);
        v[3].ttft_model = model(1e-4);
        v[3].healthy = false;
        let r = runner_up(&f, &v, 2).unwrap();
        assert_eq!(r.index, 0, "the unhealthy fastest one is not a runner-up");
        assert_eq!(Some(r.predicted_ttft_s), v[0].predicted_ttft(&f));
        // Equal predictions: fewer in flight.
        v[1].ttft_model = model(1e-3);
        v[0].inflight = 2;
        assert_eq!(runner_up(&f, &v, 2).unwrap().index, 1);
        // The chosen backend is never its own runner-up; no other eligible one: none.
        v[0].excluded = true;
        v[1].excluded = true;
        assert_eq!(runner_up(&f, &v, 2), None);
        // Others without a model cannot be ranked.
        let mut cold = views(2);
        cold[0].ttft_model = model(1e-3);
        assert_eq!(runner_up(&f, &cold, 0), None);
    }
}
