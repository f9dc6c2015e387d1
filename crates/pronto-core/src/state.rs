//! What the router keeps per backend, in one place for the gateway and the evaluator: the
//! load [`Ledger`], the learned TTFT model, the scraped engine state and, when the engine
//! publishes KV events, its exact prefix index. Health and endpoints are not here: the gateway
//! keeps them beside it, and the evaluator's backends are always healthy.
//!
//! The one observation: [`BackendState::observe_first_token`] is called when a request's first
//! token arrives (not when its stream ends): it ends the booking's prefill and teaches the
//! model the TTFT it measured, from the inputs it was routed on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::engine::EngineState;
use crate::ids::{BackendId, BackendKey};
use crate::kv_index::ExactIndex;
use crate::load::{Booking, Ledger, LoadView, Storage};
use crate::predict::{Coefficients, TpotModel, TtftInputs, TtftModel};
use crate::routing::BackendView;

/// The routing side of one backend (see the module docs).
#[derive(Debug)]
pub struct BackendState<S: Storage> {
    /// Stable identity of this backend instance.
    pub id: BackendId,
    /// Stable hash of its name (consistent-hash rings).
    pub key: BackendKey,
    /// What it has been sent and not yet answered.
    pub ledger: Ledger<S>,
    /// Its learned TTFT model.
    pub ttft: TtftModel,
    /// Its learned TPOT model (decode load → time per output token).
    pub tpot: TpotModel,
    /// What its engine's `/metrics` last said, with the staleness rule.
    pub engine: EngineState,
    /// The exact prefix index fed by its engine's KV events, when configured.
    pub exact: Option<Arc<ExactIndex>>,
    /// The epoch its ledger, model and engine state count time from.
    epoch: Instant,
    /// The engine's KV-cache capacity in tokens (0: unknown).
    kv_capacity_tokens: AtomicU64,
}

/// Static facts about a backend that enter its view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Relative weight (>= 1).
    pub weight: u32,
    /// Cap on requests in flight.
    pub max_inflight: Option<u32>,
}

impl<S: Storage> BackendState<S> {
    /// A backend with nothing learnt, its model starting at `prior`; times relative to
    /// `epoch`.
    pub fn new(
        id: BackendId,
        name: &str,
        prior: Coefficients,
        epoch: Instant,
        exact: Option<Arc<ExactIndex>>,
    ) -> BackendState<S> {
        BackendState {
            id,
            key: BackendKey::of(name),
            ledger: Ledger::new(epoch),
            ttft: TtftModel::new(prior, epoch),
            tpot: TpotModel::new(epoch),
            engine: EngineState::new(epoch),
            exact,
            epoch,
            kv_capacity_tokens: AtomicU64::new(0),
        }
    }

    /// The engine's KV-cache capacity became known (a scrape of its cache config, or the
    /// simulator's block count). 0 is ignored: an unknown capacity in a later scrape keeps
    /// the known one.
    pub fn set_kv_capacity(&self, tokens: u64) {
        if tokens > 0 {
            self.kv_capacity_tokens.store(tokens, Ordering::Relaxed);
        }
    }

    /// The KV-cache capacity in tokens, when known.
    #[inline]
    pub(crate) fn kv_capacity(&self) -> Option<u64> {
        Some(self.kv_capacity_tokens.load(Ordering::Relaxed)).filter(|&c| c > 0)
    }

    /// The load at `now`.
    pub fn load(&self, now: Instant) -> LoadView {
        self.ledger.view(now)
    }

    /// This backend's routing view at `now`, before any request-specific part (its prefix
    /// hit for a prompt is filled in by [`crate::routing::views`]).
    pub fn view(&self, settings: Settings, healthy: bool, now: Instant) -> BackendView {
        let mut v = BackendView::idle("");
        self.write_view(&mut v, settings, healthy, now);
        v
    }

    /// [`view`](Self::view), written field by field into `v` (the view builder's reused
    /// buffer: a view is a few hundred bytes, and building it elsewhere to copy it in cost
    /// two copies per backend per decision). Every field is written.
    #[inline]
    pub(crate) fn write_view(
        &self,
        v: &mut BackendView,
        settings: Settings,
        healthy: bool,
        now: Instant,
    ) {
        self.write_view_at(v, settings, healthy, now, self.ns_since_epoch(now));
    }

    /// The epoch this backend's ledger, model and engine state count time from: backends
    /// that share one let a caller convert `now` once for all of them
    /// ([`write_view_at`](Self::write_view_at)).
    #[inline]
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    /// `now` in nanoseconds since [`epoch`](Self::epoch).
    #[inline]
    pub(crate) fn ns_since_epoch(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// [`write_view`](Self::write_view) with `now_ns` = [`ns_since_epoch`](Self::ns_since_epoch)`(now)`
    /// already known.
    #[inline]
    pub(crate) fn write_view_at(
        &self,
        v: &mut BackendView,
        settings: Settings,
        healthy: bool,
        now: Instant,
        now_ns: u64,
    ) {
        debug_assert_eq!(now_ns, self.ns_since_epoch(now));
        let load = self.ledger.view_at(now, now_ns);
        // Exhaustive: a field added to the view does not compile until it is written here.
        let BackendView {
            id,
            key,
            healthy: is_healthy,
            excluded,
            weight,
            inflight,
            max_inflight,
            outstanding_prefill_tokens,
            outstanding_prefill_sq,
            running_decodes,
            engine,
            cached_tokens,
            kv_reserved_tokens,
            kv_capacity_tokens,
            kv_alloc,
            ttft_model,
            tpot_model,
            silent_s,
            stalled,
            since_probe_s,
        } = v;
        *id = self.id;
        *key = self.key;
        *is_healthy = healthy;
        *excluded = false;
        *weight = settings.weight;
        *inflight = load.inflight;
        *max_inflight = settings.max_inflight;
        *outstanding_prefill_tokens = load.outstanding_prefill_tokens;
        *outstanding_prefill_sq = load.outstanding_prefill_sq;
        *running_decodes = load.running_decodes;
        *engine = self.engine.load_at(now_ns);
        *cached_tokens = 0;
        *kv_reserved_tokens = load.kv_reserved_tokens;
        *kv_capacity_tokens = self.kv_capacity();
        *kv_alloc = load.kv_alloc;
        *ttft_model = Some(self.ttft.view_at(now_ns));
        *tpot_model = self.tpot.view();
        *silent_s = load.silent_s;
        *stalled = load.stalled;
        *since_probe_s = load.since_probe_s;
    }

    /// A stream on this backend ended at `at` having seen `tpot_s` seconds per output token
    /// after its first: the TPOT model learns it against the decode batch the ledger counts
    /// now (its running decodes, this request included — call before releasing its booking).
    pub fn observe_tpot(&self, tpot_s: f64, at: Instant) {
        let batch = self.ledger.view(at).running_decodes.max(1);
        self.tpot.observe(f64::from(batch), tpot_s, at);
    }

    /// A request's first token arrived at `at`, `actual_s` after it was sent: its prefill is
    /// over, and the model learns from the inputs it was routed on. Returns the model's own
    /// prediction for those inputs before it learned (what the fit is judged on); the
    /// *decision's* prediction, which the gateway reports, may include more (a wait for KV
    /// room). Only the call that ends the booking's prefill learns: a second one, or one for
    /// a request already out of prefill, returns `None`. After
    /// [`hold_first_token`](Self::hold_first_token) the held sample is what is learnt
    /// (`actual_s` and `at` are ignored: a late copy's censored time is not its real TTFT).
    /// Not progress ([`crate::load::Ledger::progressed`]): a late copy cancelled by a race is
    /// observed here with the time it was given, though it produced nothing.
    pub fn observe_first_token(
        &self,
        booking: &mut Booking,
        inputs: &TtftInputs,
        actual_s: f64,
        at: Instant,
    ) -> Option<Learnt> {
        if let Some((held_s, held_at)) = booking.held_first_token.take() {
            let predicted_s = self.ttft.observe(inputs, held_s, held_at);
            return Some(Learnt {
                predicted_s,
                held: true,
            });
        }
        self.ledger.end_prefill(booking).then(|| Learnt {
            predicted_s: self.ttft.observe(inputs, actual_s, at),
            held: false,
        })
    }

    /// The first token arrived at `at`, `actual_s` after sending, while the router holds the
    /// response back from its client (a race on the first answer): the prefill ends now, and
    /// the model learns this sample at the next
    /// [`observe_first_token`](Self::observe_first_token) (which has the inputs). Whether
    /// this call ended the prefill.
    pub fn hold_first_token(&self, booking: &mut Booking, actual_s: f64, at: Instant) -> bool {
        let ended = booking.held_first_token.is_none() && self.ledger.end_prefill(booking);
        if ended {
            booking.held_first_token = Some((actual_s, at));
        }
        ended
    }
}

/// What [`BackendState::observe_first_token`] taught the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learnt {
    /// The model's prediction for the request's inputs before it learned.
    pub predicted_s: f64,
    /// The sample was a held first token ([`BackendState::hold_first_token`]): the other
    /// replicas already heard its prefill end, and do not get the sample.
    pub held: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Plain, RequestLoad};
    use std::time::Duration;

    /// A held first token ends the prefill at once and is what the model learns at the next
    /// observation, not that call's time; it is learnt once.
    #[test]
    fn a_held_first_token_ends_the_prefill_and_is_learnt_later() {
        let t0 = Instant::now();
        let s = BackendState::<Plain>::new(BackendId(0), "b", Coefficients::default(), t0, None);
        let load = RequestLoad {
            prefill_tokens: 1000,
            kv_tokens: 1100,
        };
        let inputs = TtftInputs {
            queued_prefill_tokens: 0.0,
            queued_prefill_sq: 0.0,
            uncached_tokens: 1000.0,
            running_decodes: 0.0,
            engine_waiting: 0.0,
        };
        let mut b = s.ledger.book(load, t0, true, None);
        let t1 = t0 + Duration::from_millis(200);
        assert!(s.hold_first_token(&mut b, 0.2, t1));
        assert!(!s.hold_first_token(&mut b, 0.3, t1), "once");
        assert_eq!(s.load(t1).outstanding_prefill_tokens, 0);
        assert_eq!(s.ttft.view(t1).quality.samples, 0, "not learnt yet");
        let t2 = t0 + Duration::from_secs(5);
        let learnt = s.observe_first_token(&mut b, &inputs, 5.0, t2).unwrap();
        assert!(learnt.held);
        assert!(s.observe_first_token(&mut b, &inputs, 5.0, t2).is_none());
        // The same as learning 0.2 s at t1 directly.
        let direct =
            BackendState::<Plain>::new(BackendId(0), "b", Coefficients::default(), t0, None);
        let mut d = direct.ledger.book(load, t0, true, None);
        let l = direct
            .observe_first_token(&mut d, &inputs, 0.2, t1)
            .unwrap();
        assert!(!l.held);
        assert_eq!(s.ttft.view(t2), direct.ttft.view(t2));
        s.ledger.release(&mut b);
        direct.ledger.release(&mut d);
    }
}
