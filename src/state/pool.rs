//! One model's pool: its backends, prefix index and policy, and the routing decision on it
//! (the core's view builder and [`decide`], then the dispatch that books and records).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use pronto_core::cluster::{repair, BackendRef};
use pronto_core::ids::BackendId;
use pronto_core::routing::views::{self, PoolRouting, Scratch};
use pronto_core::stall::StallRule;

use crate::backend::{Backend, InflightGuard};
use crate::cluster::Link;
use crate::models::rename;
use crate::models::served::ServedModels;
use pronto_core::affinity::PrefixIndex;
use pronto_core::predict::{ReasoningLengths, TtftInputs};
use pronto_core::request::{RequestFeatures, TokenRatio};
use pronto_core::routing::{decide, runner_up, BackendView, Decision, NoBackend, Policy, RunnerUp};
use pronto_tokenizer::ModelTokenizer;

thread_local! {
    /// Each proxy thread's view buffers: building views allocates nothing after warm-up.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// One routing decision on a pool, with what dispatching it needs.
#[derive(Debug, Clone, Copy)]
pub struct Routed {
    /// The decision (its index is the backend's position in [`Pool::backends`]).
    pub decision: Decision,
    /// The chosen backend's view, as the policy saw it.
    pub chosen: BackendView,
    /// Leading prompt blocks the index already held for it (what an undo leaves).
    pub held_blocks: u32,
    /// Whether another backend was eligible (a retry has somewhere to go).
    pub others_left: bool,
    /// The other eligible backend predicted soonest, and its prediction (the explain
    /// headers; [`pronto_core::routing::runner_up`]); `None` unless routed with `explain`.
    pub runner_up: Option<RunnerUp>,
}

/// A dispatched attempt: its load booked, its prefix recorded.
#[derive(Debug)]
pub struct Attempted {
    /// The booking, released when dropped.
    pub guard: InflightGuard,
    /// The prediction inputs it was routed on.
    pub inputs: TtftInputs,
    /// See [`Routed::held_blocks`].
    pub held_blocks: u32,
}

/// One model's pool.
#[derive(Debug)]
pub struct Pool {
    /// The model name clients send (also the pool's metric label).
    pub model: Arc<str>,
    /// The routing policy.
    pub policy: Arc<dyn Policy>,
    /// Backends, in config order.
    pub backends: Vec<Arc<Backend>>,
    /// Each backend's slot in `index` (kept for as long as the backend lives).
    pub slots: Vec<usize>,
    /// Which backend was sent which prompt prefixes (by slot); shared with the previous state
    /// when a reload keeps it.
    pub index: Arc<PrefixIndex>,
    /// Engine tokens per Pronto token for this model, learned from `usage`; kept across
    /// reloads with the pool's model name (and tokenizer).
    pub token_ratio: Arc<TokenRatio>,
    /// Reasoning tokens this model spends before its answers, learned per `reasoning_effort`
    /// from the streams relayed (what `objective: ttfa` expects); kept across reloads with the
    /// pool's model name.
    pub reasoning: Arc<ReasoningLengths>,
    /// The model's tokenizer (`tokenizer:`): exact prompt tokens and engine-matching block
    /// hashes instead of the estimate.
    pub tokenizer: Option<Arc<ModelTokenizer>>,
    /// For a pool that serves its backends' models, which backend serves which.
    pub served: Option<ServedModels>,
    /// What each backend is sent as `model` when that is not the client's name (same order
    /// as `backends`; [`crate::models::rename`]).
    pub upstream_models: Vec<Option<Arc<str>>>,
    /// Backends whose name for the model is not known yet (`served_model_name: discover`,
    /// no usable list): never routed to.
    pub unnamed: Vec<BackendId>,
    /// Each backend's name among replicas (same order as `backends`).
    pub sync_refs: Vec<BackendRef>,
    /// Where dispatches are told to the other replicas (with `cluster:`).
    pub cluster: Option<Arc<Link>>,
    /// Progress-based exclusion (`health.stall`, [`pronto_core::stall`]); `None`: off.
    pub stall: Option<StallRule>,
}

impl Pool {
    fn routing(&self) -> PoolRouting<'_, Arc<Backend>> {
        PoolRouting {
            backends: &self.backends,
            slots: &self.slots,
            index: &self.index,
            token_ratio: self.token_ratio.ratio(),
            stall: self.stall,
        }
    }

    /// Routing views of every backend at `now` for `features` (the core's view builder),
    /// `tried` backends excluded, for a decision by `policy` (a route's own may differ from the
    /// pool's; it decides whether prefix credit expires with cache residency).
    /// `features.prompt_tokens` is in the engine's tokens (see [`Pool::token_ratio`]).
    pub fn views(
        &self,
        policy: &dyn Policy,
        features: &RequestFeatures,
        now: Instant,
        tried: &[BackendId],
    ) -> Vec<BackendView> {
        let mut scratch = Scratch::default();
        let limit = policy.limits_prefix_credit_to_residency();
        let mut joined = Vec::new();
        let tried = self.and_unnamed(tried, &mut joined);
        views::build(&self.routing(), features, now, limit, tried, &mut scratch).to_vec()
    }

    /// Collision repair's decision for a request booked on this pool, taken again at `now`
    /// by `policy` ([`repair::reconsider`]: the core's sequence, as the evaluator runs it);
    /// [`Pool::unnamed`] backends are excluded as in [`Pool::views`].
    pub fn reconsider(
        &self,
        policy: &dyn Policy,
        r: repair::Booked<'_>,
        now: Instant,
        margin: f64,
    ) -> repair::Relocation {
        let mut joined = Vec::new();
        let tried = self.and_unnamed(r.tried, &mut joined);
        let r = repair::Booked { tried, ..r };
        let mut scratch = Scratch::default();
        repair::reconsider(&self.routing(), &mut scratch, policy, r, now, margin)
    }

    /// `tried` and the [`Pool::unnamed`] backends (no copy when there are none).
    fn and_unnamed<'a>(
        &'a self,
        tried: &'a [BackendId],
        joined: &'a mut Vec<BackendId>,
    ) -> &'a [BackendId] {
        if self.unnamed.is_empty() {
            return tried;
        }
        *joined = [tried, &self.unnamed].concat();
        joined
    }

    /// Whether a backend of the pool could serve a request at `now`, load aside: it is
    /// healthy, not ejected, and neither `excluded` nor [`Pool::unnamed`]. `false` is an
    /// outage (503), not an overload (429).
    pub fn any_up(&self, now: Instant, excluded: &[BackendId]) -> bool {
        self.backends.iter().any(|b| {
            let id = b.id();
            b.is_healthy(now) && !excluded.contains(&id) && !self.unnamed.contains(&id)
        })
    }

    /// What backend `i` (a position) is sent as `model`, when not the client's name.
    pub fn upstream_model(&self, i: usize) -> Option<&str> {
        self.upstream_models.get(i).and_then(|m| m.as_deref())
    }

    /// The body of a request with `features` for backend `i` (a position): the client's,
    /// or with `model` spliced to the backend's name ([`rename::body_for`]).
    pub fn body_for(&self, i: usize, body: &Bytes, features: &RequestFeatures) -> Bytes {
        let span = features.model_span.as_ref();
        rename::body_for(body, span, &features.model, self.upstream_model(i))
    }

    /// What rewrites backend `i`'s answer to a request sent [`Pool::body_for`].
    pub fn answer_for(
        &self,
        i: usize,
        body: &Bytes,
        features: &RequestFeatures,
    ) -> Option<rename::Unrename> {
        let span = features.model_span.as_ref();
        rename::answer_for(body, span, &features.model, self.upstream_model(i))
    }

    /// Decide where `features` goes at `now` with `policy` ([`decide`]: the decision carries
    /// its prediction), `tried` backends excluded. `explain`: also find the runner-up (for the
    /// explain headers; a second prediction per backend, so only when they are on).
    pub fn route(
        &self,
        policy: &dyn Policy,
        features: &RequestFeatures,
        now: Instant,
        tried: &[BackendId],
        explain: bool,
    ) -> Result<Routed, NoBackend> {
        let mut joined = Vec::new();
        let tried = self.and_unnamed(tried, &mut joined);
        SCRATCH.with_borrow_mut(|scratch| {
            let limit = policy.limits_prefix_credit_to_residency();
            views::build(&self.routing(), features, now, limit, tried, scratch);
            if let Some(rule) = &self.stall {
                for &i in scratch.newly_stalled() {
                    self.backends[i].marked_stalled(&scratch.views()[i], rule);
                }
            }
            let views = scratch.views();
            let decision = decide(policy, features, views, now)?;
            let others_left = views
                .iter()
                .enumerate()
                .any(|(i, v)| i != decision.index && v.eligible());
            let chosen = views[decision.index];
            let runner_up = explain
                .then(|| runner_up(features, views, decision.index))
                .flatten();
            Ok(Routed {
                decision,
                chosen,
                held_blocks: scratch.held_blocks(decision.index),
                others_left,
                runner_up,
            })
        })
    }

    /// Send the request as `routed` decided, at `now`: its load booked in the backend's
    /// ledger until the returned guard drops, its prefix recorded in the index at once
    /// ([`views::dispatch`]). `streamed: false` arms the non-streamed prefill deadline at the
    /// decision's prediction.
    pub fn dispatch(
        &self,
        routed: &Routed,
        features: &RequestFeatures,
        streamed: bool,
        now: Instant,
    ) -> Attempted {
        let i = routed.decision.index;
        let d = views::dispatch(
            &self.routing(),
            i,
            &routed.chosen,
            routed.held_blocks,
            features,
            routed.decision.predicted_ttft_s,
            streamed,
            now,
        );
        let synced = self
            .cluster
            .as_ref()
            .map(|c| c.dispatch(self.sync_refs[i], d.booking.load(), &features.block_hashes));
        Attempted {
            guard: InflightGuard::new(Arc::clone(&self.backends[i]), d.booking).synced(synced),
            inputs: d.inputs,
            held_blocks: d.held_blocks,
        }
    }

    /// The attempt on backend `i` (a position) failed before the backend accepted the
    /// request: take back the prefix its dispatch recorded.
    pub fn undo_record(&self, i: usize, features: &RequestFeatures, held_blocks: u32) {
        views::undo_record(&self.routing(), i, features, held_blocks);
    }

    /// Record again at `now` what [`Pool::undo_record`] took back (a request reconsidered by
    /// collision repair that stays).
    pub fn redo_record(&self, i: usize, features: &RequestFeatures, now: Instant) {
        views::redo_record(&self.routing(), i, features, now);
    }

    /// Forget what the index believes `backend` (a position) holds (it was ejected or
    /// restarted). The scan visits every shard under its write lock, so inside a tokio
    /// runtime it runs on the blocking pool, never on the proxy thread that saw the failure;
    /// the backend is not routed to meanwhile, so nothing new is recorded for it.
    pub fn forget(&self, backend: usize) {
        let index = Arc::clone(&self.index);
        let slot = self.slots[backend];
        let name = self.backends[backend].config.name.clone();
        let forget = move || {
            let n = index.forget_backend(slot);
            tracing::info!(backend = %name, entries = n, "prefix index forgot backend");
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(forget)),
            Err(_) => forget(),
        }
    }
}
