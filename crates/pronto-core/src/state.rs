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
    pub fn kv_capacity(&self) -> Option<u64> {
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
    pub fn write_view(&self, v: &mut BackendView, settings: Settings, healthy: bool, now: Instant) {
        // One clock reading for everything kept on the backend's epoch.
        let now_ns = now.saturating_duration_since(self.epoch).as_nanos() as u64;
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
            kv_alloc_rate,
            ttft_model,
            tpot_model,
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
        *kv_alloc_rate = load.kv_alloc_rate;
        *ttft_model = Some(self.ttft.view_at(now_ns));
        *tpot_model = self.tpot.view();
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
    /// a request already out of prefill, returns `None`.
    pub fn observe_first_token(
        &self,
        booking: &mut Booking,
        inputs: &TtftInputs,
        actual_s: f64,
        at: Instant,
    ) -> Option<f64> {
        self.end_prefill(booking)
            .then(|| self.learn_ttft(inputs, actual_s, at))
    }

    /// The first half of [`observe_first_token`](Self::observe_first_token), for a first
    /// token the router holds back from its client (a race on the first answer): the
    /// booking's prefill ends now; whether this call ended it. The sample is taught later
    /// with [`learn_ttft`](Self::learn_ttft), when the race is decided.
    pub fn end_prefill(&self, booking: &mut Booking) -> bool {
        self.ledger.end_prefill(booking)
    }

    /// The second half: the model learns a TTFT of `actual_s` measured at `at` for a request
    /// routed on `inputs`; returns its prediction before it learned.
    pub fn learn_ttft(&self, inputs: &TtftInputs, actual_s: f64, at: Instant) -> f64 {
        self.ttft.observe(inputs, actual_s, at)
    }
}
