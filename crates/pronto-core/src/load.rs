//! The load ledger: what the router has sent each backend and not yet seen answered.
//!
//! Scraped engine metrics lag (a scrape every 250 ms, and the engine's own accounting); the
//! router's own bookkeeping is exact and immediate, so a burst cannot herd onto one backend
//! between two scrapes. The gateway and the offline evaluator keep it with the *same* code:
//! one [`Ledger`] per backend, generic over its [`Storage`] — [`Atomic`] in the gateway (shared
//! by every proxy thread, read lock-free by routing), [`Plain`] in the single-threaded
//! evaluator (`Cell`s, no atomics).
//!
//! ## One request's life
//! ```text
//!   book ──► Prefill ──end_prefill──► Decode ──release──► Released
//!              └──────────────release───────────────────────┘
//! ```
//! - [`Ledger::book`] (dispatch): the request is in flight; its expected *uncached* prompt
//!   tokens are outstanding prefill work (and their square, for attention:
//!   [`LoadView::outstanding_prefill_sq`]); its uncached prompt plus expected output is
//!   reserved in the KV cache ([`RequestLoad::kv_tokens`]) and counted into the cache's
//!   allocation rate ([`crate::affinity::Residency`]).
//! - [`Ledger::end_prefill`]: the prefill is over, the request decodes. **When:** a streamed
//!   request at its first token; a non-streamed one (whose first byte is the whole answer) at
//!   its response head *or* once its predicted TTFT has passed, whichever comes first — so a
//!   long non-streamed generation does not count as queued prefill for its whole life and
//!   inflate every prediction on that backend. The caller arms the timer
//!   ([`Booking::prefill_ends_by`]); the transition happens once.
//! - `Ledger::release` (finished, failed, cancelled): nothing of it is left. Releasing from
//!   `Prefill` returns its prefill charge too.
//!
//! Every transition checks the booking's phase, so none is counted twice; a counter never goes
//! below zero.
//!
//! ## Progress
//! The ledger also knows whether a backend is *producing*: the streams this router sent it
//! and holds in flight ([`LoadView::streams`]; another replica's bookings are not counted,
//! their tokens are not seen here) and how long they have gone without a token
//! ([`LoadView::silent_s`]): the time since the last [`Ledger::progressed`] during which it
//! held streams — idle gaps pause the clock, so streams that each wait a short while (raced
//! away before a token) add up. A stream released without a time (`Ledger::release`) ends
//! its stretch uncounted. [`crate::stall`] judges a backend wedged on these and marks it
//! ([`Ledger::mark_stalled`]) until it produces again.

use std::cell::Cell;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::affinity::residency::AllocRate;
use crate::affinity::Residency;
use crate::seq_cell::SeqCell;

// === storage ===

/// How a [`Ledger`]'s numbers are stored: [`Atomic`] or [`Plain`].
pub trait Storage: Debug + 'static {
    /// A non-negative integer counter.
    type Counter: Counter;
    /// The KV-cache allocation-rate state.
    type Alloc: AllocCell;
}

/// Shared, lock-free storage (the gateway).
#[derive(Debug)]
pub struct Atomic;

/// Single-threaded storage (the evaluator).
#[derive(Debug)]
pub struct Plain;

impl Storage for Atomic {
    type Counter = AtomicU64;
    type Alloc = AtomicAlloc;
}

impl Storage for Plain {
    type Counter = Cell<u64>;
    type Alloc = Cell<Residency>;
}

/// A counter updated through a shared reference.
pub trait Counter: Debug + Default {
    /// The value.
    fn get(&self) -> u64;
    /// Add `n`.
    fn add(&self, n: u64);
    /// Subtract `n`, never below zero.
    fn sub(&self, n: u64);
    /// Replace the value.
    fn set(&self, n: u64);
}

impl Counter for AtomicU64 {
    #[inline]
    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
    #[inline]
    fn add(&self, n: u64) {
        self.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    fn sub(&self, n: u64) {
        // Bookings never release more than they added; saturate anyway rather than wrap.
        let _ = self.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(n))
        });
    }
    #[inline]
    fn set(&self, n: u64) {
        self.store(n, Ordering::Relaxed);
    }
}

impl Counter for Cell<u64> {
    #[inline]
    fn get(&self) -> u64 {
        Cell::get(self)
    }
    #[inline]
    fn add(&self, n: u64) {
        Cell::set(self, Cell::get(self) + n);
    }
    #[inline]
    fn sub(&self, n: u64) {
        Cell::set(self, Cell::get(self).saturating_sub(n));
    }
    #[inline]
    fn set(&self, n: u64) {
        Cell::set(self, n);
    }
}

/// The allocation-rate state behind a shared reference.
pub trait AllocCell: Debug {
    /// Empty; times are kept relative to `epoch`.
    fn new(epoch: Instant) -> Self;
    /// `tokens` were allocated at `now` (`Residency::on_alloc`).
    fn on_alloc(&self, tokens: f64, now: Instant);
    /// The allocation rate at `now` (`Residency::alloc_rate`); `now_ns` is `now` in
    /// nanoseconds since the cell's epoch (the atomic cell reads that, the plain one `now`).
    fn rate(&self, now: Instant, now_ns: u64) -> AllocRate;
}

impl AllocCell for Cell<Residency> {
    fn new(_epoch: Instant) -> Self {
        Cell::new(Residency::default())
    }
    fn on_alloc(&self, tokens: f64, now: Instant) {
        let mut r = Cell::get(self);
        r.on_alloc(tokens, now);
        Cell::set(self, r);
    }
    fn rate(&self, now: Instant, _now_ns: u64) -> AllocRate {
        Cell::get(self).alloc_rate(now)
    }
}

/// The gateway's allocation-rate state: updated under a small mutex at dispatch (held for a
/// few arithmetic operations, never across an await), published through a `SeqCell` so a
/// routing view reads it without a lock.
#[derive(Debug)]
pub struct AtomicAlloc {
    epoch: Instant,
    state: Mutex<Residency>,
    published: SeqCell<4>,
}

impl AllocCell for AtomicAlloc {
    fn new(epoch: Instant) -> Self {
        AtomicAlloc {
            epoch,
            state: Mutex::new(Residency::default()),
            published: SeqCell::new(Residency::default().to_words(epoch)),
        }
    }
    fn on_alloc(&self, tokens: f64, now: Instant) {
        let mut r = self.state.lock().unwrap_or_else(|e| e.into_inner());
        r.on_alloc(tokens, now);
        self.published.store(r.to_words(self.epoch));
    }
    #[inline]
    fn rate(&self, _now: Instant, now_ns: u64) -> AllocRate {
        crate::affinity::residency::alloc_rate_from_words(self.published.load(), now_ns)
    }
}

// === the ledger ===

/// What one request will cost a backend, known at dispatch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestLoad {
    /// Prompt tokens expected to need prefill (not in the backend's prefix cache).
    pub prefill_tokens: u32,
    /// KV-cache tokens it will add: its uncached prompt plus its expected output
    /// (`BackendView::kv_need`).
    pub kv_tokens: u64,
}

impl RequestLoad {
    /// Its prefill's attention work as [`LoadView::outstanding_prefill_sq`] counts it.
    pub(crate) fn prefill_sq(&self) -> f64 {
        sq_units(self.prefill_tokens) as f64 / 1000.0
    }
}

/// Where a booked request is in its life (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Sent; its prompt is (expected to be) in prefill.
    Prefill,
    /// Past its prefill: generating.
    Decode,
    /// Finished, failed or cancelled: nothing of it is counted any more.
    Released,
}

/// One request's entry in a backend's ledger. Must end in [`Ledger::release_at`] (the gateway's
/// RAII guard does it on drop).
#[derive(Debug, PartialEq)]
#[must_use = "a booking must be released"]
pub struct Booking {
    load: RequestLoad,
    phase: Phase,
    prefill_ends_by: Option<Instant>,
    /// Watched for progress: counted in [`LoadView::streams`] until released.
    watched: bool,
    /// A first token held back from the client, not learnt yet: `(seconds after sending,
    /// when)` ([`crate::state::BackendState::hold_first_token`]).
    pub(crate) held_first_token: Option<(f64, Instant)>,
}

impl Booking {
    /// What was booked.
    pub fn load(&self) -> RequestLoad {
        self.load
    }

    /// For a non-streamed request: when its prefill counts as over at the latest (its booking
    /// time plus its predicted TTFT); `None` for a streamed request or without a prediction.
    pub fn prefill_ends_by(&self) -> Option<Instant> {
        self.prefill_ends_by
    }
}

/// A backend's load as routing sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadView {
    /// Requests booked and not released.
    pub inflight: u32,
    /// Uncached prompt tokens of requests still in prefill.
    pub outstanding_prefill_tokens: u64,
    /// Σ over those of (tokens / 1000)²: their attention work.
    pub outstanding_prefill_sq: f64,
    /// Requests past their prefill and not released.
    pub running_decodes: u32,
    /// KV-cache tokens the in-flight requests will hold at most.
    pub kv_reserved_tokens: u64,
    /// KV-cache tokens allocated per second (time-averaged; evaluated on demand).
    pub kv_alloc: AllocRate,
    /// Watched streams booked and not released (see the module docs).
    pub streams: u32,
    /// Seconds the backend has held streams without a token on any of them since its last
    /// token (0 without a stream; see the module docs).
    pub silent_s: f64,
    /// Marked stalled ([`Ledger::mark_stalled`]) and not producing since.
    pub stalled: bool,
    /// While marked: seconds since the mark or the last request sent since (a probe).
    pub since_probe_s: f64,
}

/// One backend's ledger (see the module docs).
#[derive(Debug)]
pub struct Ledger<S: Storage> {
    inflight: S::Counter,
    prefill_tokens: S::Counter,
    /// Σ tokens² / 1000 over prefills in flight, in integers so it can be summed atomically:
    /// (tokens / 1000)² = units / 1000.
    prefill_sq_units: S::Counter,
    decoding: S::Counter,
    kv_reserved: S::Counter,
    alloc: S::Alloc,
    /// Watched (streamed, own) bookings not released.
    streams: S::Counter,
    /// Nanoseconds since `epoch` of the last progress, or of the stream booking that found
    /// the backend holding no stream: where the current silent stretch started.
    quiet_since_ns: S::Counter,
    /// Silence of earlier stretches since the last progress, nanoseconds.
    silent_acc_ns: S::Counter,
    /// 1 while marked stalled ([`Ledger::mark_stalled`]).
    stalled: S::Counter,
    /// Nanoseconds since `epoch` of the mark, or of the last request booked while marked (a
    /// probe).
    probed_ns: S::Counter,
    epoch: Instant,
}

/// A prefill's attention work in integer units of tokens² / 1000.
fn sq_units(tokens: u32) -> u64 {
    u64::from(tokens) * u64::from(tokens) / 1000
}

impl<S: Storage> Ledger<S> {
    /// An empty ledger; times are kept relative to `epoch`.
    pub(crate) fn new(epoch: Instant) -> Ledger<S> {
        Ledger {
            inflight: S::Counter::default(),
            prefill_tokens: S::Counter::default(),
            prefill_sq_units: S::Counter::default(),
            decoding: S::Counter::default(),
            kv_reserved: S::Counter::default(),
            alloc: S::Alloc::new(epoch),
            streams: S::Counter::default(),
            quiet_since_ns: S::Counter::default(),
            silent_acc_ns: S::Counter::default(),
            stalled: S::Counter::default(),
            probed_ns: S::Counter::default(),
            epoch,
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The backend produced at `at`: a token on one of its streams (or a whole non-streamed
    /// answer). Ends a stall; returns whether it did.
    pub fn progressed(&self, at: Instant) -> bool {
        let ns = self.ns(at);
        // Progress reported out of order (two proxy threads) keeps the later one.
        if ns > self.quiet_since_ns.get() {
            self.quiet_since_ns.set(ns);
        }
        self.silent_acc_ns.set(0);
        let was = self.stalled.get() != 0;
        if was {
            self.stalled.set(0);
        }
        was
    }

    /// Mark the backend stalled at `now` (by [`crate::stall::StallRule`]) until it
    /// progresses; returns whether this call marked it.
    pub fn mark_stalled(&self, now: Instant) -> bool {
        let was = self.stalled.get() != 0;
        if !was {
            self.stalled.set(1);
            self.probed_ns.set(self.ns(now));
        }
        !was
    }

    /// A request with `load` is dispatched at `now`. `streamed: false` with a prediction arms
    /// [`Booking::prefill_ends_by`] at `now + predicted_ttft`. A stream is watched for
    /// progress (see the module docs).
    pub fn book(
        &self,
        load: RequestLoad,
        now: Instant,
        streamed: bool,
        predicted_ttft_s: Option<f64>,
    ) -> Booking {
        self.book_watched(load, now, streamed, predicted_ttft_s, streamed)
    }

    /// Another replica's stream, dispatched at `now` ([`crate::cluster`]): booked as a
    /// stream, not watched for progress (its tokens are not seen here).
    pub(crate) fn book_remote(&self, load: RequestLoad, now: Instant) -> Booking {
        self.book_watched(load, now, true, None, false)
    }

    fn book_watched(
        &self,
        load: RequestLoad,
        now: Instant,
        streamed: bool,
        predicted_ttft_s: Option<f64>,
        watched: bool,
    ) -> Booking {
        self.inflight.add(1);
        self.prefill_tokens.add(u64::from(load.prefill_tokens));
        self.prefill_sq_units.add(sq_units(load.prefill_tokens));
        self.kv_reserved.add(load.kv_tokens);
        self.alloc.on_alloc(load.kv_tokens as f64, now);
        if self.stalled.get() != 0 {
            // Sent to a stalled backend: a probe.
            self.probed_ns.set(self.ns(now));
        }
        if watched {
            // A silent stretch of a backend that held no stream starts with this one.
            if self.streams.get() == 0 {
                self.quiet_since_ns.set(self.ns(now));
            }
            self.streams.add(1);
        }
        let prefill_ends_by = (!streamed)
            .then_some(predicted_ttft_s)
            .flatten()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .map(|p| now + Duration::from_secs_f64(p.min(86_400.0)));
        Booking {
            load,
            phase: Phase::Prefill,
            prefill_ends_by,
            watched,
            held_first_token: None,
        }
    }

    /// The booking's prefill is over (first token; or, non-streamed, response head or
    /// predicted TTFT passed). Returns whether this call made the transition.
    pub fn end_prefill(&self, b: &mut Booking) -> bool {
        if b.phase != Phase::Prefill {
            return false;
        }
        b.phase = Phase::Decode;
        self.prefill_tokens.sub(u64::from(b.load.prefill_tokens));
        self.prefill_sq_units.sub(sq_units(b.load.prefill_tokens));
        self.decoding.add(1);
        true
    }

    /// `release` at `now`: a stream that leaves the backend holding none
    /// adds its silent stretch to the backend's silence (see the module docs).
    pub fn release_at(&self, b: &mut Booking, now: Instant) {
        if b.watched && b.phase != Phase::Released && self.streams.get() == 1 {
            let stretch = self.ns(now).saturating_sub(self.quiet_since_ns.get());
            self.silent_acc_ns.add(stretch);
        }
        self.release(b);
    }

    /// The request finished, failed or was cancelled: release all of it. Idempotent.
    pub(crate) fn release(&self, b: &mut Booking) {
        match b.phase {
            Phase::Released => return,
            Phase::Prefill => {
                self.prefill_tokens.sub(u64::from(b.load.prefill_tokens));
                self.prefill_sq_units.sub(sq_units(b.load.prefill_tokens));
            }
            Phase::Decode => self.decoding.sub(1),
        }
        b.phase = Phase::Released;
        self.kv_reserved.sub(b.load.kv_tokens);
        self.inflight.sub(1);
        if b.watched {
            self.streams.sub(1);
        }
    }

    /// Requests in flight.
    pub fn inflight(&self) -> u32 {
        self.inflight.get() as u32
    }

    /// The load at `now`.
    pub(crate) fn view(&self, now: Instant) -> LoadView {
        self.view_at(
            now,
            now.saturating_duration_since(self.epoch).as_nanos() as u64,
        )
    }

    /// [`view`](Self::view), `now_ns` being `now` in nanoseconds since the ledger's epoch
    /// (computed once per routing view for everything a backend keeps on that epoch).
    #[inline]
    pub(crate) fn view_at(&self, now: Instant, now_ns: u64) -> LoadView {
        let streams = self.streams.get() as u32;
        let silent_ns = match streams {
            0 => 0,
            _ => self.silent_acc_ns.get() + now_ns.saturating_sub(self.quiet_since_ns.get()),
        };
        LoadView {
            streams,
            silent_s: silent_ns as f64 * 1e-9,
            stalled: self.stalled.get() != 0,
            since_probe_s: now_ns.saturating_sub(self.probed_ns.get()) as f64 * 1e-9,
            inflight: self.inflight.get() as u32,
            outstanding_prefill_tokens: self.prefill_tokens.get(),
            outstanding_prefill_sq: self.prefill_sq_units.get() as f64 / 1000.0,
            running_decodes: self.decoding.get() as u32,
            kv_reserved_tokens: self.kv_reserved.get(),
            kv_alloc: self.alloc.rate(now, now_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle<S: Storage>() {
        let t0 = Instant::now();
        let l = Ledger::<S>::new(t0);
        let load = RequestLoad {
            prefill_tokens: 2000,
            kv_tokens: 2256,
        };
        let mut a = l.book(load, t0, true, Some(0.5));
        assert_eq!(
            a.prefill_ends_by(),
            None,
            "a stream leaves prefill at its first token"
        );
        let mut b = l.book(load, t0, false, Some(0.5));
        assert_eq!(b.prefill_ends_by(), Some(t0 + Duration::from_millis(500)));
        let v = l.view(t0);
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (2, 4000, 0)
        );
        assert!((v.outstanding_prefill_sq - 8.0).abs() < 1e-9);
        assert_eq!(v.kv_reserved_tokens, 4512);
        assert!(l.end_prefill(&mut a));
        assert!(!l.end_prefill(&mut a), "once");
        let v = l.view(t0);
        assert_eq!((v.outstanding_prefill_tokens, v.running_decodes), (2000, 1));
        // `b` is released straight from prefill (failed before any token).
        l.release(&mut b);
        l.release(&mut b);
        let v = l.view(t0);
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (1, 0, 1)
        );
        assert_eq!(v.kv_reserved_tokens, 2256);
        assert!(
            !l.end_prefill(&mut b),
            "a released booking has no prefill to end"
        );
        l.release(&mut a);
        let v = l.view(t0 + Duration::from_secs(1));
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (0, 0, 0)
        );
        assert_eq!((v.kv_reserved_tokens, v.outstanding_prefill_sq), (0, 0.0));
        assert!(v.kv_alloc.per_s() > 0.0, "the allocations stay in the rate");
    }

    #[test]
    fn both_storages_follow_the_same_lifecycle() {
        lifecycle::<Atomic>();
        lifecycle::<Plain>();
    }

    #[test]
    fn both_storages_report_the_same_rate() {
        let t0 = Instant::now();
        let a = Ledger::<Atomic>::new(t0);
        let p = Ledger::<Plain>::new(t0);
        for i in 0..50u64 {
            let now = t0 + Duration::from_millis(100 * i);
            let load = RequestLoad {
                prefill_tokens: 100,
                kv_tokens: 1000 + i,
            };
            let mut x = a.book(load, now, true, None);
            let mut y = p.book(load, now, true, None);
            a.release(&mut x);
            p.release(&mut y);
        }
        for s in [5u64, 10, 60] {
            let now = t0 + Duration::from_secs(s);
            let (va, vp) = (a.view(now), p.view(now));
            // The atomic cell counts nanoseconds from its epoch, the plain one reads `Instant`s:
            // the same rate to rounding.
            let (ra, rp) = (va.kv_alloc.per_s(), vp.kv_alloc.per_s());
            assert!(ra > 0.0 && (ra - rp).abs() <= 1e-12 * rp, "{ra} vs {rp}");
            let alloc = AllocRate::NONE;
            assert_eq!(
                LoadView {
                    kv_alloc: alloc,
                    ..va
                },
                LoadView {
                    kv_alloc: alloc,
                    ..vp
                }
            );
        }
    }

    #[test]
    fn a_non_streamed_prefill_deadline_needs_a_finite_prediction() {
        let t0 = Instant::now();
        let l = Ledger::<Plain>::new(t0);
        for p in [None, Some(f64::INFINITY), Some(f64::NAN), Some(-1.0)] {
            let mut b = l.book(RequestLoad::default(), t0, false, p);
            assert_eq!(b.prefill_ends_by(), None, "{p:?}");
            l.release(&mut b);
        }
    }

    /// Silence counts only while streams are held, adds up over short stretches (streams
    /// raced away before a token), and ends at a token; remote and non-streamed bookings
    /// are not watched.
    #[test]
    fn silence_adds_up_over_held_streams_and_ends_at_a_token() {
        let t0 = Instant::now();
        let l = Ledger::<Plain>::new(t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        let load = RequestLoad::default();
        // Three streams, each held 500 ms with a 1 s idle gap between them.
        for k in 0..3u64 {
            let mut b = l.book(load, at(1500 * k), true, None);
            assert!((l.view(at(1500 * k + 250)).silent_s - (0.5 * k as f64 + 0.25)).abs() < 1e-6);
            l.release_at(&mut b, at(1500 * k + 500));
            assert_eq!(
                l.view(at(1500 * k + 1000)).silent_s,
                0.0,
                "idle: nothing held"
            );
        }
        let mut b = l.book(load, at(4500), true, None);
        assert!((l.view(at(4600)).silent_s - 1.6).abs() < 1e-6);
        assert!(!l.progressed(at(4700)), "not marked");
        assert!((l.view(at(4800)).silent_s - 0.1).abs() < 1e-6);
        assert!(l.mark_stalled(at(4800)) && !l.mark_stalled(at(4800)));
        let v = l.view(at(5800));
        assert!(v.stalled && (v.since_probe_s - 1.0).abs() < 1e-6);
        assert!(l.progressed(at(5900)), "a token ends the stall");
        assert!(!l.view(at(5900)).stalled);
        l.release_at(&mut b, at(6000));
        // Not watched: another replica's stream, a non-streamed request.
        let mut r = l.book_remote(load, at(7000));
        let mut n = l.book(load, at(7000), false, Some(1.0));
        let v = l.view(at(9000));
        assert_eq!((v.streams, v.silent_s, v.inflight), (0, 0.0, 2));
        l.release(&mut r);
        l.release(&mut n);
    }
}
