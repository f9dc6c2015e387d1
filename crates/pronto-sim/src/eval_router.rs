//! What the router knows in the offline evaluator: the gateway's own routing state, driven on
//! the virtual clock.
//!
//! Nothing here re-implements the gateway. Each simulated backend is a
//! [`pronto_core::state::BackendState`] (the same ledger, TTFT model and engine-state
//! staleness rule the gateway keeps, in [`Plain`] storage), the pool has the gateway's
//! [`PrefixIndex`] and [`TokenRatio`], views come from the core's view builder
//! ([`pronto_core::routing::views::build`]), a dispatch books and records through
//! [`pronto_core::routing::views::dispatch`], and the first token is observed through
//! [`BackendState::observe_first_token`] — what the gateway calls at the same events. Only
//! what differs by nature stays outside: the evaluator's backends are always healthy, the
//! scrape is simulated every [`DEFAULT_SCRAPE_INTERVAL`] from the engine's true queue, and a
//! simulated request is always streamed (the evaluator learns at its first token).

use std::sync::Arc;
use std::time::Instant;

use pronto_core::affinity::{IndexConfig, PrefixIndex};
use pronto_core::cluster::{repair, BackendRef, Local};
use pronto_core::engine::{stale_after, EngineFlavor, EngineSample, DEFAULT_SCRAPE_INTERVAL};
use pronto_core::ids::BackendId;
use pronto_core::kv_index::{EventBatch, ExactIndex};
use pronto_core::load::Plain;
use pronto_core::predict::Coefficients;
use pronto_core::request::{RequestFeatures, TokenRatio};
use pronto_core::routing::views::{self, Dispatched, PoolRouting, RoutingBackend, Scratch};
use pronto_core::routing::{BackendView, Policy};
use pronto_core::stall::StallRule;
use pronto_core::state::{BackendState, Learnt, Settings};
use pronto_core::tokens::BlockHash;

/// One simulated backend as the router sees it.
#[derive(Debug)]
pub struct SimRouterBackend {
    state: BackendState<Plain>,
}

impl RoutingBackend for SimRouterBackend {
    type Storage = Plain;

    fn state(&self) -> &BackendState<Plain> {
        &self.state
    }

    fn settings(&self) -> Settings {
        Settings {
            weight: 1,
            max_inflight: None,
        }
    }

    fn healthy(&self, _now: Instant) -> bool {
        true
    }
}

/// What the engine's `/metrics` would report at a scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScrapedLoad {
    /// Requests waiting.
    pub waiting: f64,
    /// Requests running.
    pub running: f64,
    /// KV-cache usage, 0..=1.
    pub kv_usage: f64,
}

/// Router-side state of a pool of simulated backends.
#[derive(Debug)]
pub struct RouterSideState {
    names: Vec<Arc<str>>,
    /// Each backend's name among replicas, in pool order (pool `"m"`: every replica of one
    /// evaluation shares the fleet).
    refs: Vec<BackendRef>,
    backends: Vec<SimRouterBackend>,
    slots: Vec<usize>,
    index: PrefixIndex,
    token_ratio: TokenRatio,
    scratch: Scratch,
    /// Progress-based exclusion, as the gateway's `health.stall` ([`pronto_core::stall`]).
    stall: Option<StallRule>,
    /// Times a view build marked a backend stalled.
    stall_marks: u64,
}

impl RouterSideState {
    /// Idle backends with these names, in pool order; times relative to `epoch`. `capacities`:
    /// each engine's KV-cache capacity in tokens, as a scrape of its cache config would report.
    /// `priors`: each backend's TTFT-model prior, as its gateway backend's `profile:` hint
    /// would set it (a backend without one: the generic [`Coefficients::default`]).
    /// `exact`: each engine's block size, when its KV events feed an exact prefix index
    /// ([`RouterSideState::apply_kv_events`]), as a gateway backend with `kv_events:`.
    pub fn new<S: AsRef<str>>(
        names: &[S],
        capacities: &[Option<u64>],
        priors: &[Coefficients],
        epoch: Instant,
        exact: Option<&[usize]>,
    ) -> RouterSideState {
        let backends: Vec<SimRouterBackend> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let index = exact
                    .and_then(|sizes| sizes.get(i))
                    .map(|&bs| Arc::new(ExactIndex::new(bs)));
                let state = BackendState::new(
                    BackendId(i as u64),
                    n.as_ref(),
                    priors.get(i).copied().unwrap_or_default(),
                    epoch,
                    index,
                );
                if let Some(Some(c)) = capacities.get(i) {
                    state.set_kv_capacity(*c);
                }
                SimRouterBackend { state }
            })
            .collect();
        RouterSideState {
            names: names.iter().map(|n| Arc::from(n.as_ref())).collect(),
            refs: names
                .iter()
                .map(|n| BackendRef::of("m", n.as_ref()))
                .collect(),
            slots: (0..backends.len()).collect(),
            index: PrefixIndex::new(IndexConfig {
                max_backends: backends.len().max(1),
                ..IndexConfig::default()
            }),
            backends,
            token_ratio: TokenRatio::default(),
            scratch: Scratch::default(),
            stall: None,
            stall_marks: 0,
        }
    }

    /// One message of `backend`'s KV-event publisher reached this router: its exact index
    /// applies it, as the gateway's subscriber does ([`ExactIndex::apply`]).
    pub fn apply_kv_events(&self, backend: usize, batch: &EventBatch) {
        if let Some(x) = &self.backends[backend].state.exact {
            x.apply(batch);
        }
    }

    /// Exclude backends that make no progress by `rule` (`None`: off), as the gateway does.
    pub fn set_stall_rule(&mut self, rule: Option<StallRule>) {
        self.stall = rule;
    }

    /// Backend `backend` produced a token at `now` ([`pronto_core::load::Ledger::progressed`]):
    /// whether that ended a stall.
    pub fn on_progress(&mut self, backend: usize, now: Instant) -> bool {
        self.backends[backend].state.ledger.progressed(now)
    }

    /// Times a view build marked a backend stalled.
    pub fn stall_marks(&self) -> u64 {
        self.stall_marks
    }

    /// Number of backends.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Backend names, in pool order.
    pub fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.names.iter()
    }

    /// Backend `index`'s name among replicas.
    pub fn sync_ref(&self, index: usize) -> BackendRef {
        self.refs[index]
    }

    /// The backend a peer's [`BackendRef`] names, by its index.
    pub fn index_of(&self, r: &BackendRef) -> Option<usize> {
        self.refs.iter().position(|x| x == r)
    }

    fn pool(&self) -> PoolRouting<'_, SimRouterBackend> {
        PoolRouting {
            backends: &self.backends,
            slots: &self.slots,
            index: &self.index,
            token_ratio: self.token_ratio.ratio(),
            stall: self.stall,
        }
    }

    /// `f` over the pool and the views' scratch (taken out for the call: no copy, its buffers
    /// move), counting the backends the build marked stalled.
    fn building<R>(
        &mut self,
        f: impl FnOnce(&PoolRouting<'_, SimRouterBackend>, &mut Scratch) -> R,
    ) -> R {
        let mut scratch = std::mem::take(&mut self.scratch);
        let out = f(&self.pool(), &mut scratch);
        self.stall_marks += scratch.newly_stalled().len() as u64;
        self.scratch = scratch;
        out
    }

    /// A scrape of `backend`'s engine metrics at `at` read `load`; trusted as the gateway
    /// trusts a scrape taken every [`DEFAULT_SCRAPE_INTERVAL`].
    pub fn on_scrape(&mut self, backend: usize, load: ScrapedLoad, at: Instant) {
        let sample = EngineSample {
            waiting: load.waiting,
            running: load.running,
            kv_usage: load.kv_usage,
            prefix_queries: None,
            prefix_hits: None,
            cache_hit_rate: None,
            kv_capacity_tokens: None,
            flavor: EngineFlavor::Vllm,
        };
        self.backends[backend].state.engine.record_success(
            sample,
            at,
            stale_after(DEFAULT_SCRAPE_INTERVAL),
        );
    }

    /// The views for a decision on `features` at `now` (the core's view builder; `residency`:
    /// the policy's [`pronto_core::routing::Policy::limits_prefix_credit_to_residency`]).
    pub fn views(
        &mut self,
        features: &RequestFeatures,
        now: Instant,
        residency: bool,
    ) -> &[BackendView] {
        self.views_excluding(features, now, residency, &[])
    }

    /// [`RouterSideState::views`] with the backends `tried` excluded (a race's second
    /// decision excludes the first backend, as the gateway's does).
    pub fn views_excluding(
        &mut self,
        features: &RequestFeatures,
        now: Instant,
        residency: bool,
        tried: &[BackendId],
    ) -> &[BackendView] {
        self.building(|pool, scratch| {
            views::build(pool, features, now, residency, tried, scratch);
        });
        self.scratch.views()
    }

    /// Collision repair's decision for `r`, taken again at `now` by `policy`
    /// ([`repair::reconsider`], the gateway's sequence), with the view of the backend a move
    /// goes to (the reconsidered request's own when it stays).
    pub fn reconsider(
        &mut self,
        policy: &dyn Policy,
        r: repair::Booked<'_>,
        now: Instant,
        margin: f64,
    ) -> (repair::Relocation, BackendView) {
        let out = self
            .building(|pool, scratch| repair::reconsider(pool, scratch, policy, r, now, margin));
        let at = match out {
            repair::Relocation::Move(d) => d.index,
            repair::Relocation::Stay(_) => r.backend,
        };
        (out, self.scratch.views()[at])
    }

    /// `features` goes to backend `index` at `now`, decided on `chosen` (the view the policy
    /// saw in the last [`RouterSideState::views`]) with the decision's prediction: booked and
    /// recorded as the gateway does.
    pub fn on_dispatch(
        &mut self,
        index: usize,
        predicted_ttft_s: Option<f64>,
        chosen: &BackendView,
        features: &RequestFeatures,
        now: Instant,
    ) -> Dispatched {
        let held = self.scratch.held_blocks(index);
        views::dispatch(
            &self.pool(),
            index,
            chosen,
            held,
            features,
            predicted_ttft_s,
            true,
            now,
        )
    }

    /// The first token of a dispatched request came back from `backend`, `ttft_s` after
    /// dispatch: observed as the gateway observes it. Returns the model's own prediction
    /// before it learned (and whether the sample was a held one).
    pub fn on_first_token(
        &mut self,
        backend: usize,
        d: &mut Dispatched,
        ttft_s: f64,
        now: Instant,
    ) -> Option<Learnt> {
        self.backends[backend]
            .state
            .observe_first_token(&mut d.booking, &d.inputs, ttft_s, now)
    }

    /// A first token on `backend` held back from the client
    /// ([`BackendState::hold_first_token`]): whether this ended `d`'s prefill.
    pub fn hold_first_token(
        &mut self,
        backend: usize,
        d: &mut Dispatched,
        ttft_s: f64,
        now: Instant,
    ) -> bool {
        self.backends[backend]
            .state
            .hold_first_token(&mut d.booking, ttft_s, now)
    }

    /// An attempt on `backend` was cancelled (it lost a race): take back the prefix its
    /// dispatch recorded ([`views::undo_record`], as the gateway's `Pool::undo_record`). The
    /// booking is released by [`RouterSideState::on_finish`].
    pub fn undo_record(&self, backend: usize, features: &RequestFeatures, held_blocks: u32) {
        views::undo_record(&self.pool(), backend, features, held_blocks);
    }

    /// Record again what [`RouterSideState::undo_record`] took back ([`views::redo_record`]).
    pub fn redo_record(&self, backend: usize, features: &RequestFeatures, now: Instant) {
        views::redo_record(&self.pool(), backend, features, now);
    }

    /// A request's stream on `backend` ended (or it was rejected): released.
    pub fn on_finish(
        &mut self,
        backend: usize,
        d: &mut Dispatched,
        tpot_s: Option<f64>,
        now: Instant,
    ) {
        let state = &self.backends[backend].state;
        if let Some(t) = tpot_s {
            state.observe_tpot(t, now);
        }
        state.ledger.release_at(&mut d.booking, now);
    }
}

/// Other replicas' events change this state through the same core code as the gateway's
/// ([`pronto_core::cluster::Remote`]); a remote booking keeps the backend's position.
impl Local for RouterSideState {
    type Handle = usize;
    type Storage = Plain;

    fn resolve(&self, backend: BackendRef) -> Option<usize> {
        self.refs.iter().position(|&r| r == backend)
    }

    fn state<'a>(&'a self, h: &'a usize) -> &'a BackendState<Plain> {
        &self.backends[*h].state
    }

    fn record(&self, h: &usize, hashes: &[BlockHash], now: Instant) {
        self.index.record(self.slots[*h], hashes, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `+exact`: what an engine's KV events say it holds reaches the views through the shared
    /// view builder, and only for that engine; before any event, the approximate index decides.
    #[test]
    fn kv_events_feed_the_exact_index_the_views_read() {
        use crate::engine::{Engine, EngineConfig, SimRequest};
        use crate::profile::Profile;
        let now = Instant::now();
        let cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
        let sizes = [cfg.block_size, cfg.block_size];
        let s = RouterSideState::new(&["a", "b"], &[None, None], &[], now, Some(&sizes));
        let ids: Vec<u32> = (0..256).collect();
        let mut f = RequestFeatures::synthetic("m", String::new(), None);
        f.prompt_tokens = ids.len() as u32;
        f.block_hashes = pronto_core::tokens::block_hashes(&ids, pronto_core::tokens::BLOCK_TOKENS);
        let mut s = s;
        assert_eq!(s.views(&f, now, false)[0].cached_tokens, 0);
        let mut e = Engine::new(cfg);
        e.enable_kv_events();
        e.add_request(SimRequest {
            id: 1,
            prompt: ids.clone(),
            max_tokens: 2,
        });
        while e.step().is_some() {}
        let events = e.take_kv_events();
        assert!(!events.is_empty(), "the engine logged what it stored");
        let batch = EventBatch {
            seq: 1,
            ts: 0.0,
            events,
            dp_rank: None,
        };
        s.apply_kv_events(0, &batch);
        let v = s.views(&f, now, false);
        assert!(v[0].cached_tokens > 0, "{:?}", v[0].cached_tokens);
        assert_eq!(v[1].cached_tokens, 0, "nothing was routed or stored on b");
    }

    #[test]
    fn counts_follow_the_request_lifecycle_and_the_model_learns() {
        let now = Instant::now();
        let mut s = RouterSideState::new(&["a", "b"], &[None, None], &[], now, None);
        let mut f = RequestFeatures::synthetic("m", "x".into(), None);
        f.prompt_tokens = 100;
        let chosen = s.views(&f, now, true)[1];
        let mut d1 = s.on_dispatch(1, None, &chosen, &f, now);
        f.prompt_tokens = 50;
        let chosen = s.views(&f, now, true)[1];
        let mut d2 = s.on_dispatch(1, None, &chosen, &f, now);
        let v = s.views(&f, now, true)[1];
        assert_eq!((v.inflight, v.outstanding_prefill_tokens), (2, 150));
        assert_eq!(d1.inputs.uncached_tokens, 100.0);
        assert_eq!(d2.inputs.queued_prefill_tokens, 100.0);
        assert!(s.on_first_token(1, &mut d1, 0.2, now).is_some());
        assert!(
            s.on_first_token(1, &mut d1, 0.2, now).is_none(),
            "learns once"
        );
        s.on_finish(1, &mut d2, None, now);
        let v = s.views(&f, now, true)[1];
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (1, 0, 1)
        );
        assert_eq!(v.ttft_model.unwrap().quality.samples, 1);
        s.on_finish(1, &mut d1, Some(0.01), now);
        let v = s.views(&f, now, true)[1];
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
            (0, 0, 0)
        );
    }
}
