//! Collision repair (`cluster.collision_repair`, [`pronto_core::cluster::repair`]): a request
//! this replica sent to backend X moves when X turns out to hold a booking it could not see.
//!
//! ```text
//! replica B: dispatch to X ─────── (sync delay) ──────▶ heard here
//! this one:        dispatch R to X ── waiting for R's first token ── reconsider R ── move?
//! ```
//!
//! Replicas hear of each other's dispatches a sync delay late. When this replica folds
//! another's dispatch to X ([`crate::cluster`]), it estimates when that was sent (now minus
//! the sync delay its own messages take to come back) and wakes the requests waiting on X
//! ([`crate::backend::Backend::remote_dispatches`]). Each one dispatched *after* that estimate
//! queues behind the remote request at the engine, and was routed without knowing of it: its
//! decision is taken again on views without its own prefix record and booking, by the core's
//! sequence the evaluator runs too ([`pronto_core::cluster::repair::reconsider`]).
//! - It stays: its TTFT model observation will use the inputs that show the late booking it
//!   waits behind.
//! - Staying predicts more than the margin over the new decision: its attempt is dropped —
//!   which closes its upstream connection, so the engine aborts it — its booking released, and
//!   it is routed again without X: booked, recorded, synced and counted as any decision. A
//!   request moves [`MAX_MOVES`] times at most; its TTFT still counts from its arrival.
//!
//! Applies to an attempt that does not race (a route with `first_token_deadline` or `hedge`
//! keeps its own remedy for a late first token) and has produced nothing yet: nothing has
//! reached the client, so the move is invisible to it but for the explain header
//! `x-pronto-moved-from` and the access log's `moved_from` (the backend it was first sent
//! to). The offline evaluator applies the same rule the same way (`pronto evaluate
//! --collision-repair`).

use std::future::Future;
use std::time::Instant;

use tokio::sync::watch;

use super::upstream::Attempt;
use crate::state::{Pool, Routed};
use crate::telemetry::{CollisionOutcome, Metrics};
#[cfg(doc)]
use pronto_core::cluster::repair::MAX_MOVES;
use pronto_core::cluster::repair::{Booked, Relocation};
use pronto_core::ids::BackendId;
use pronto_core::load::RequestLoad;
use pronto_core::predict::TtftInputs;
use pronto_core::request::RequestFeatures;
use pronto_core::routing::Policy;

/// One attempt's watch for collisions: set up before its dispatch, so no remote dispatch
/// folded after it is missed.
pub(super) struct Watch {
    rx: watch::Receiver<Option<Instant>>,
    margin: f64,
}

impl Watch {
    /// The watch for an attempt on `pool.backends[i]`, when `pool` repairs collisions.
    pub fn on(pool: &Pool, i: usize) -> Option<Watch> {
        let margin = pool.cluster.as_ref()?.repair_margin()?;
        Some(Watch {
            rx: pool.backends[i].remote_dispatches(),
            margin,
        })
    }

    /// Resolves when a remote dispatch to this backend sent before `at` is heard.
    async fn collision(&mut self, at: Instant) {
        loop {
            if self.rx.changed().await.is_err() {
                // The backend is gone (a reload dropped it): nothing more will be heard.
                return std::future::pending().await;
            }
            if self.rx.borrow_and_update().is_some_and(|sent| sent < at) {
                return;
            }
        }
    }
}

/// What an attempt under a [`Watch`] came to.
pub(super) enum Watched {
    /// It ended (committed or failed) on its backend.
    Done(Attempt),
    /// It was dropped: route it as `Routed` instead, and release its booking (boxed: rare,
    /// and a decision carries a view).
    Moves(Box<Routed>),
}

/// The request an attempt belongs to, and what it was booked with.
pub(super) struct Attempting<'a> {
    pub pool: &'a Pool,
    pub policy: &'a dyn Policy,
    pub features: &'a RequestFeatures,
    pub tried: &'a [BackendId],
    pub explain: bool,
    pub metrics: &'a Metrics,
    pub request_id: &'a str,
    /// Its backend's position.
    pub index: usize,
    /// Its booking's load (in prefill until the attempt ends).
    pub own: RequestLoad,
    /// Leading blocks its backend held in the index before its dispatch.
    pub held_blocks: u32,
    /// When it was dispatched.
    pub at: Instant,
    /// What its TTFT model observation will use: the dispatch's inputs, refreshed when a
    /// late booking shows what it really waits behind ([`Relocation::Stay`]).
    pub inputs: &'a mut TtftInputs,
}

impl Attempting<'_> {
    /// Await `attempt` while `watch` reconsiders it at each collision.
    pub async fn run(
        mut self,
        attempt: impl Future<Output = Attempt>,
        mut watch: Watch,
    ) -> Watched {
        let mut attempt = std::pin::pin!(attempt);
        loop {
            tokio::select! {
                out = &mut attempt => return Watched::Done(out),
                () = watch.collision(self.at) => {
                    if let Some(next) = self.reconsider(watch.margin, Instant::now()) {
                        return Watched::Moves(Box::new(next));
                    }
                }
            }
        }
    }

    /// The decision taken again at `now` (see the module docs): where to go instead, or
    /// `None` to stay (its prefix record restored, its observation's inputs refreshed).
    fn reconsider(&mut self, margin: f64, now: Instant) -> Option<Routed> {
        let (pool, i, features) = (self.pool, self.index, self.features);
        let booked = Booked {
            features,
            backend: i,
            own: self.own,
            held_blocks: self.held_blocks,
            tried: self.tried,
        };
        let moved = match pool.reconsider(self.policy, booked, now, margin) {
            // Routed again without this backend, for the decision the dispatch needs; with
            // nowhere to go after all, it stays and its record goes back.
            Relocation::Move(_) => {
                let mut excluded = self.tried.to_vec();
                excluded.push(pool.backends[i].id());
                let next = pool.route(self.policy, features, now, &excluded, self.explain);
                if next.is_err() {
                    pool.redo_record(i, features, now);
                }
                next.ok()
            }
            Relocation::Stay(inputs) => {
                *self.inputs = inputs;
                None
            }
        };
        let outcome = match moved {
            Some(_) => CollisionOutcome::Moved,
            None => CollisionOutcome::Stayed,
        };
        self.metrics
            .cluster
            .collisions_total
            .with_label_values(&[outcome.label()])
            .inc();
        if let Some(r) = &moved {
            tracing::info!(
                request_id = self.request_id,
                from = %pool.backends[i].name(),
                to = %pool.backends[r.decision.index].name(),
                predicted_s = r.decision.predicted_ttft_s,
                "collision repair: another replica's earlier request was heard on this backend; moving"
            );
        }
        moved
    }
}
