//! The view builder: one pool's backends → the [`BackendView`]s of one routing decision.
//!
//! The gateway (every proxy attempt) and the evaluator (every simulated arrival) call the same
//! [`build`], so a policy sees the same numbers offline and live. For each backend, in pool
//! order:
//! 1. its [`BackendState::view`]: ledger load, scraped engine load (only while fresh, the
//!    staleness rule of [`crate::engine::EngineState`]), its TTFT model, its KV capacity and
//!    allocation rate; health from the caller; `excluded` when already tried for this request;
//! 2. the leading prompt blocks the approximate index believes it holds
//!    ([`PrefixIndex::match_lengths`], by the backend's slot in the pool's index), shortened to
//!    what its cache still holds after its residency time when the policy asks for that
//!    ([`crate::routing::Policy::limits_prefix_credit_to_residency`]; see
//!    [`BackendView::cache_residency_s`]);
//! 3. replaced by its exact index's answer when the engine publishes KV events and that index
//!    is live and trusted;
//! 4. turned into cached tokens: `blocks × BLOCK_TOKENS × token_ratio`, never the whole prompt
//!    (`apply_prefix_matches`);
//! 5. with the pool's stall rule, a backend silent past its bound is marked stalled in its
//!    ledger and left out while another is eligible ([`crate::stall`]); the backends it newly
//!    marked are in [`Scratch::newly_stalled`], for the caller's log and counters.
//!
//! Slots: a pool's prefix index numbers backends by *slot*, not by position in the pool's
//! list, and a backend keeps its slot for as long as it lives (the gateway's state builder
//! assigns them: a backend a reload keeps keeps its slot and what the index knows of it).
//!
//! Buffers live in a reusable [`Scratch`]: after the first decisions, building views
//! allocates nothing.

use std::sync::Arc;
use std::time::Instant;

use super::{apply_prefix_matches, BackendView};
use crate::affinity::PrefixIndex;
use crate::ids::BackendId;
use crate::load::{Booking, RequestLoad, Storage};
use crate::predict::TtftInputs;
use crate::request::RequestFeatures;
use crate::stall::StallRule;
use crate::state::{BackendState, Settings};
use crate::tokens::BLOCK_TOKENS;

/// One backend as the view builder needs it.
pub trait RoutingBackend {
    /// Its ledger's storage.
    type Storage: Storage;
    /// Its routing state.
    fn state(&self) -> &BackendState<Self::Storage>;
    /// Its static settings.
    fn settings(&self) -> Settings;
    /// Whether it may be routed to at `now` (health checks, ejection).
    fn healthy(&self, now: Instant) -> bool;
}

impl<T: RoutingBackend> RoutingBackend for Arc<T> {
    type Storage = T::Storage;
    fn state(&self) -> &BackendState<T::Storage> {
        (**self).state()
    }
    fn settings(&self) -> Settings {
        (**self).settings()
    }
    fn healthy(&self, now: Instant) -> bool {
        (**self).healthy(now)
    }
}

/// A pool as the view builder needs it.
#[derive(Debug, Clone, Copy)]
pub struct PoolRouting<'a, B> {
    /// Backends in pool order; views come out in this order.
    pub backends: &'a [B],
    /// Each backend's slot in `index` (same order as `backends`).
    pub slots: &'a [usize],
    /// The pool's approximate prefix index.
    pub index: &'a PrefixIndex,
    /// Engine tokens per Pronto token for this model (learned from `usage`; 1 when the pool's
    /// tokenizer is the engine's).
    pub token_ratio: f64,
    /// Progress-based exclusion ([`crate::stall`]); `None`: off.
    pub stall: Option<StallRule>,
}

/// Reusable buffers for [`build`].
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    views: Vec<BackendView>,
    by_slot: Vec<u32>,
    ages: Vec<f64>,
    matched: Vec<u32>,
    held: Vec<u32>,
    newly_stalled: Vec<usize>,
}

impl Scratch {
    /// The views of the last [`build`].
    pub fn views(&self) -> &[BackendView] {
        &self.views
    }

    /// Leading prompt blocks the approximate index held for backend `i` (pool order) in the
    /// last [`build`], before any residency limit: what a [`dispatch`] did not add.
    pub fn held_blocks(&self, i: usize) -> u32 {
        self.held.get(i).copied().unwrap_or(0)
    }

    /// Backends (pool order) the last [`build`] marked stalled ([`crate::stall`]).
    pub fn newly_stalled(&self) -> &[usize] {
        &self.newly_stalled
    }
}

/// What [`dispatch`] booked and recorded for one attempt.
#[derive(Debug)]
pub struct Dispatched {
    /// The ledger entry (release it when the request ends).
    pub booking: Booking,
    /// The prediction inputs the request was routed on (what the model learns from).
    pub inputs: TtftInputs,
    /// Leading blocks the backend already held in the index: [`undo_record`] clears the rest.
    pub held_blocks: u32,
}

/// Send `features` to `pool.backends[i]` at `now`, as decided on view `chosen`: book its load
/// in the backend's ledger (its uncached prompt as prefill, that plus its expected output as KV
/// reservation; `streamed` and `predicted_ttft_s` arm the non-streamed prefill deadline) and
/// record its prefix in the pool's index under the backend's slot — at dispatch, so a second
/// request with the same prefix a moment later already sees it. If the attempt fails before
/// the backend accepted the request, [`undo_record`] takes the record back.
#[allow(clippy::too_many_arguments)]
pub fn dispatch<B: RoutingBackend>(
    pool: &PoolRouting<'_, B>,
    i: usize,
    chosen: &BackendView,
    held_blocks: u32,
    features: &RequestFeatures,
    predicted_ttft_s: Option<f64>,
    streamed: bool,
    now: Instant,
) -> Dispatched {
    let inputs = chosen.ttft_inputs(features);
    let load = RequestLoad {
        prefill_tokens: inputs.uncached_tokens as u32,
        kv_tokens: chosen.kv_need(features),
    };
    let booking = pool.backends[i]
        .state()
        .ledger
        .book(load, now, streamed, predicted_ttft_s);
    pool.index
        .record(pool.slots[i], &features.block_hashes, now);
    Dispatched {
        booking,
        inputs,
        held_blocks,
    }
}

/// Take back what [`dispatch`] recorded in the index for `pool.backends[i]`: the blocks past
/// what it held before (the booking is released by the caller).
pub fn undo_record<B: RoutingBackend>(
    pool: &PoolRouting<'_, B>,
    i: usize,
    features: &RequestFeatures,
    held_blocks: u32,
) {
    let from = (held_blocks as usize).min(features.block_hashes.len());
    pool.index
        .unrecord(pool.slots[i], &features.block_hashes[from..]);
}

/// Record again at `now` what [`undo_record`] took back (a request that was reconsidered and
/// stays, [`crate::cluster::repair`]).
pub fn redo_record<B: RoutingBackend>(
    pool: &PoolRouting<'_, B>,
    i: usize,
    features: &RequestFeatures,
    now: Instant,
) {
    pool.index
        .record(pool.slots[i], &features.block_hashes, now);
}

/// Build the views of `pool` for `features` at `now` into `scratch` (see the module docs).
/// `tried`: backends already tried for this request (excluded). `limit_to_residency`: the
/// policy's [`crate::routing::Policy::limits_prefix_credit_to_residency`].
pub fn build<'s, B: RoutingBackend>(
    pool: &PoolRouting<'_, B>,
    features: &RequestFeatures,
    now: Instant,
    limit_to_residency: bool,
    tried: &[BackendId],
    scratch: &'s mut Scratch,
) -> &'s [BackendView] {
    debug_assert_eq!(pool.backends.len(), pool.slots.len());
    let Scratch {
        views,
        by_slot,
        ages,
        matched,
        held,
        newly_stalled,
    } = scratch;
    held.clear();
    newly_stalled.clear();
    // Written in place: the buffer keeps its views between decisions.
    views.truncate(pool.backends.len());
    views.resize_with(pool.backends.len(), || BackendView::idle(""));
    // `now` on the last backend's epoch: converted again only when a backend has another.
    let mut clock: Option<(Instant, u64)> = None;
    for (v, b) in views.iter_mut().zip(pool.backends) {
        let state = b.state();
        let epoch = state.epoch();
        let now_ns = match clock {
            Some((e, ns)) if e == epoch => ns,
            _ => {
                let ns = state.ns_since_epoch(now);
                clock = Some((epoch, ns));
                ns
            }
        };
        state.write_view_at(v, b.settings(), b.healthy(now), now, now_ns);
        v.excluded = tried.contains(&v.id);
    }
    match &pool.stall {
        Some(rule) => {
            let mark = |i: usize| pool.backends[i].state().ledger.mark_stalled(now);
            crate::stall::apply(rule, views, mark, newly_stalled);
        }
        None => views.iter_mut().for_each(|v| v.stalled = false),
    }
    if features.block_hashes.is_empty() {
        return views;
    }
    let hashes = &features.block_hashes;
    // Only the slots this pool's backends use (the index may number many more): fewer
    // bitset words for the match to carry.
    let slots = pool
        .slots
        .iter()
        .max()
        .map_or(0, |&s| s + 1)
        .min(pool.index.max_backends());
    by_slot.clear();
    by_slot.resize(slots, 0);
    pool.index.match_lengths(hashes, now, by_slot);
    held.extend(
        pool.slots
            .iter()
            .map(|&s| by_slot.get(s).copied().unwrap_or(0)),
    );
    if limit_to_residency {
        // Only backends holding some of the prompt have credit to limit.
        ages.clear();
        ages.resize(slots, f64::INFINITY);
        let mut limited = false;
        for ((v, &s), &h) in views.iter().zip(pool.slots).zip(held.iter()) {
            if h == 0 {
                continue;
            }
            let r = v.cache_residency_s();
            if let Some(a) = ages.get_mut(s).filter(|_| r.is_finite()) {
                *a = r;
                limited = true;
            }
        }
        if limited {
            pool.index.limit_to_recent(hashes, now, ages, by_slot);
        }
    }
    matched.clear();
    matched.extend(
        pool.slots
            .iter()
            .map(|&s| by_slot.get(s).copied().unwrap_or(0)),
    );
    for (m, b) in matched.iter_mut().zip(pool.backends) {
        if let Some(n) = b
            .state()
            .exact
            .as_ref()
            .and_then(|x| x.match_blocks(hashes))
        {
            *m = n;
        }
    }
    apply_prefix_matches(
        views,
        matched,
        BLOCK_TOKENS as f64 * pool.token_ratio,
        features.prompt_tokens,
    );
    views
}

/// A backend for tests of what drives the view builder.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::load::Plain;
    use crate::predict::Coefficients;

    /// A backend's state and whether it is healthy; weight 1, no in-flight cap.
    pub(crate) struct B(pub BackendState<Plain>, pub bool);

    impl RoutingBackend for B {
        type Storage = Plain;
        fn state(&self) -> &BackendState<Plain> {
            &self.0
        }
        fn settings(&self) -> Settings {
            Settings {
                weight: 1,
                max_inflight: None,
            }
        }
        fn healthy(&self, _now: Instant) -> bool {
            self.1
        }
    }

    /// Healthy backend `b{i}` whose TTFT model starts from `prior`.
    pub(crate) fn backend_with(i: u64, t0: Instant, prior: Coefficients) -> B {
        B(
            BackendState::new(BackendId(i), &format!("b{i}"), prior, t0, None),
            true,
        )
    }

    /// Healthy backend `b{i}` with the generic prior.
    pub(crate) fn backend(i: u64, t0: Instant) -> B {
        backend_with(i, t0, Coefficients::default())
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{backend, B};
    use super::*;
    use crate::affinity::IndexConfig;
    use crate::tokens::BlockHash;
    use std::time::Duration;

    #[test]
    fn views_carry_load_health_and_the_prefix_hit_by_slot() {
        let t0 = Instant::now();
        let mut backends = vec![backend(10, t0), backend(11, t0), backend(12, t0)];
        backends[2].1 = false;
        let index = PrefixIndex::new(IndexConfig {
            max_backends: 64,
            ..IndexConfig::default()
        });
        // Slots are not positions: backend 11 lives in slot 5.
        let slots = [0, 5, 1];
        let f = prompt(4);
        index.record(5, &f.block_hashes[..3], t0);
        let mut booking = backends[0].0.ledger.book(
            RequestLoad {
                prefill_tokens: 300,
                kv_tokens: 400,
            },
            t0,
            true,
            None,
        );
        let pool = PoolRouting {
            backends: &backends,
            slots: &slots,
            index: &index,
            token_ratio: 1.0,
            stall: None,
        };
        let mut scratch = Scratch::default();
        let now = t0 + Duration::from_millis(10);
        let v = build(&pool, &f, now, true, &[BackendId(10)], &mut scratch);
        assert_eq!(v.len(), 3);
        assert_eq!(
            (v[0].id, v[0].excluded, v[0].inflight),
            (BackendId(10), true, 1)
        );
        assert_eq!(v[0].outstanding_prefill_tokens, 300);
        assert_eq!(v[1].cached_tokens, 3 * BLOCK_TOKENS as u32);
        assert_eq!((v[0].cached_tokens, v[2].cached_tokens), (0, 0));
        assert!(!v[2].healthy && v[1].healthy);
        // A learnt token ratio scales the hit (capped below the prompt).
        let pool = PoolRouting {
            token_ratio: 2.0,
            ..pool
        };
        let v = build(&pool, &f, now, true, &[], &mut scratch);
        assert_eq!(v[1].cached_tokens, f.prompt_tokens - 1);
        backends[0].0.ledger.release(&mut booking);
    }

    /// Backends counting time from different epochs each get `now` on their own: the same
    /// booking at the same instant reads the same in every view, alone or beside the others.
    #[test]
    fn backends_with_different_epochs_read_the_same_clock() {
        let t0 = Instant::now();
        let epochs = [
            t0,
            t0 + Duration::from_millis(3),
            t0,
            t0 + Duration::from_millis(7),
        ];
        let backends: Vec<B> = epochs
            .iter()
            .enumerate()
            .map(|(i, &e)| backend(i as u64, e))
            .collect();
        let at = t0 + Duration::from_millis(10);
        let load = RequestLoad {
            prefill_tokens: 500,
            kv_tokens: 800,
        };
        let mut bookings: Vec<Booking> = backends
            .iter()
            .map(|b| b.0.ledger.book(load, at, true, None))
            .collect();
        let index = PrefixIndex::new(IndexConfig {
            max_backends: 4,
            ..IndexConfig::default()
        });
        let slots = [0, 1, 2, 3];
        let pool = PoolRouting {
            backends: &backends,
            slots: &slots,
            index: &index,
            token_ratio: 1.0,
            stall: None,
        };
        let now = t0 + Duration::from_millis(1_500);
        let mut scratch = Scratch::default();
        let v = build(&pool, &prompt(2), now, true, &[], &mut scratch).to_vec();
        let rate = v[0].kv_alloc.per_s();
        assert!(rate > 0.0);
        for (i, view) in v.iter().enumerate() {
            let alone = backends[i].0.view(backends[i].settings(), true, now);
            assert_eq!(view.kv_alloc, alone.kv_alloc, "backend {i}");
            assert!(
                (view.kv_alloc.per_s() - rate).abs() <= 1e-9 * rate,
                "backend {i}"
            );
        }
        for (b, booking) in backends.iter().zip(&mut bookings) {
            b.0.ledger.release(booking);
        }
    }

    /// A prompt of `blocks` full blocks, hashed 1..=blocks.
    fn prompt(blocks: u64) -> RequestFeatures {
        let mut f = RequestFeatures::synthetic("m", String::new(), Some(16));
        f.prompt_tokens = blocks as u32 * BLOCK_TOKENS as u32;
        f.block_hashes = (1..=blocks).map(BlockHash).collect();
        f
    }

    /// Two healthy backends in slots 0 and 1 of an empty two-slot index.
    fn pair(t0: Instant) -> (Vec<B>, PrefixIndex, [usize; 2]) {
        let index = PrefixIndex::new(IndexConfig {
            max_backends: 2,
            ..IndexConfig::default()
        });
        (vec![backend(1, t0), backend(2, t0)], index, [0, 1])
    }

    #[test]
    fn a_dispatch_books_and_records_and_an_undo_takes_back_only_what_it_added() {
        let t0 = Instant::now();
        let (backends, index, slots) = pair(t0);
        let f = prompt(6);
        // Backend 2 already holds the first two blocks (a shared system prompt).
        index.record(1, &f.block_hashes[..2], t0);
        let pool = PoolRouting {
            backends: &backends,
            slots: &slots,
            index: &index,
            token_ratio: 1.0,
            stall: None,
        };
        let mut scratch = Scratch::default();
        let chosen = build(&pool, &f, t0, false, &[], &mut scratch)[1];
        let held = scratch.held_blocks(1);
        assert_eq!(held, 2);
        let mut d = dispatch(&pool, 1, &chosen, held, &f, Some(0.2), true, t0);
        assert_eq!(d.inputs.uncached_tokens, f64::from(4 * BLOCK_TOKENS as u32));
        let v = build(&pool, &f, t0, false, &[], &mut scratch)[1];
        assert_eq!(v.cached_tokens, f.prompt_tokens - 1, "recorded at dispatch");
        assert_eq!(v.outstanding_prefill_tokens, 4 * BLOCK_TOKENS as u64);
        // The attempt failed before the backend took it: back to what it held.
        undo_record(&pool, 1, &f, d.held_blocks);
        backends[1].0.ledger.release(&mut d.booking);
        let v = build(&pool, &f, t0, false, &[], &mut scratch)[1];
        assert_eq!(v.cached_tokens, 2 * BLOCK_TOKENS as u32);
        assert_eq!((v.inflight, v.outstanding_prefill_tokens), (0, 0));
    }

    /// Reservations past the capacity (an overloaded backend) keep a fresh prefix credited:
    /// its blocks are pinned while its request is in flight. Only a prefix older than the
    /// window `max(capacity, reserved) / rate` loses its credit.
    #[test]
    fn an_overbooked_backend_keeps_the_credit_of_a_prefix_it_was_just_sent() {
        let t0 = Instant::now();
        let (backends, index, slots) = pair(t0);
        let f = prompt(4);
        let pool = PoolRouting {
            backends: &backends,
            slots: &slots,
            index: &index,
            token_ratio: 1.0,
            stall: None,
        };
        backends[1].0.set_kv_capacity(10_000);
        let mut scratch = Scratch::default();
        let chosen = build(&pool, &f, t0, true, &[], &mut scratch)[1];
        let mut d = dispatch(&pool, 1, &chosen, 0, &f, None, true, t0);
        // Three times the capacity booked beside it at once: the engine queues the overflow.
        let load = RequestLoad {
            prefill_tokens: 0,
            kv_tokens: 30_000,
        };
        let mut other = backends[1].0.ledger.book(load, t0, true, None);
        let soon = t0 + Duration::from_millis(300);
        let v = build(&pool, &f, soon, true, &[], &mut scratch)[1];
        assert!(v.kv_reserved_tokens > 10_000);
        let window = v.cache_residency_s();
        assert!(window > 0.3 && window.is_finite(), "window {window}");
        assert_eq!(
            v.cached_tokens,
            f.prompt_tokens - 1,
            "still pinned in flight"
        );
        // Traffic goes on (30k tokens/s, each request done at once): the prefix, unused,
        // is cycled out once it is older than the window.
        let quick = RequestLoad {
            prefill_tokens: 0,
            kv_tokens: 3_000,
        };
        for k in 4..=50 {
            let at = t0 + Duration::from_millis(100 * k);
            let mut b = backends[1].0.ledger.book(quick, at, true, None);
            backends[1].0.ledger.release(&mut b);
        }
        let late = t0 + Duration::from_secs(5);
        let v = build(&pool, &f, late, true, &[], &mut scratch)[1];
        assert!(
            v.cache_residency_s() < 5.0,
            "window {}",
            v.cache_residency_s()
        );
        assert_eq!(v.cached_tokens, 0, "older than the window");
        backends[1].0.ledger.release(&mut d.booking);
        backends[1].0.ledger.release(&mut other);
    }

    /// A backend holding a silent stream past the bound is marked once, left out while the
    /// other is eligible, and back at its first token; a cancelled stream does not readmit
    /// it while another request is stuck there.
    #[test]
    fn a_silent_backend_is_stalled_until_it_produces() {
        let t0 = Instant::now();
        let (backends, index, slots) = pair(t0);
        let pool = PoolRouting {
            backends: &backends,
            slots: &slots,
            index: &index,
            token_ratio: 1.0,
            stall: Some(StallRule {
                floor: Duration::from_secs(1),
                factor: 2.0,
            }),
        };
        let load = RequestLoad {
            prefill_tokens: 10,
            kv_tokens: 20,
        };
        let ledger = &backends[0].0.ledger;
        let mut a = ledger.book(load, t0, true, None);
        let mut b = ledger.book(load, t0 + Duration::from_millis(500), true, None);
        let mut scratch = Scratch::default();
        let f = prompt(1);
        let at = |ms| t0 + Duration::from_millis(ms);
        let v = build(&pool, &f, at(900), true, &[], &mut scratch);
        assert!(!v[0].stalled && (v[0].silent_s - 0.9).abs() < 1e-6);
        assert!(scratch.newly_stalled().is_empty());
        let v = build(&pool, &f, at(1_100), true, &[], &mut scratch);
        assert!(v[0].stalled && !v[0].eligible() && v[1].eligible());
        assert_eq!(scratch.newly_stalled(), &[0]);
        build(&pool, &f, at(1_200), true, &[], &mut scratch);
        assert!(scratch.newly_stalled().is_empty(), "marked once");
        // One stuck stream cancelled (raced away): still out, the other one is stuck.
        ledger.release(&mut a);
        let v = build(&pool, &f, at(1_300), true, &[], &mut scratch);
        assert!(v[0].stalled);
        // Both gone: no probe before a bound (1 s) since the mark, then one.
        ledger.release(&mut b);
        let v = build(&pool, &f, at(2_000), true, &[], &mut scratch);
        assert!(v[0].stalled);
        let v = build(&pool, &f, at(2_200), true, &[], &mut scratch);
        assert!(!v[0].stalled);
        let mut b = ledger.book(load, at(2_200), true, None);
        let v = build(&pool, &f, at(2_300), true, &[], &mut scratch);
        assert!(v[0].stalled, "the probe is out");
        // A token: back at once, its silence counted from then.
        assert!(ledger.progressed(at(2_400)));
        let v = build(&pool, &f, at(2_500), true, &[], &mut scratch);
        assert!(!v[0].stalled && v[0].eligible());
        assert!((v[0].silent_s - 0.1).abs() < 1e-6);
        ledger.release(&mut b);
        // No stream in flight: no silence; a stream booked later starts its own.
        let v = build(&pool, &f, at(9_000), true, &[], &mut scratch);
        assert_eq!(v[0].silent_s, 0.0);
        let mut c = ledger.book(load, at(9_000), true, None);
        let v = build(&pool, &f, at(9_500), true, &[], &mut scratch);
        assert!(!v[0].stalled && (v[0].silent_s - 0.5).abs() < 1e-6);
        // A non-streamed request is not judged on silence.
        ledger.release(&mut c);
        let mut d = ledger.book(load, at(9_500), false, None);
        let v = build(&pool, &f, at(60_000), true, &[], &mut scratch);
        assert!(!v[0].stalled && v[0].silent_s == 0.0);
        ledger.release(&mut d);
    }
}
