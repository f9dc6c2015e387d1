//! Collision repair in the evaluator (`--collision-repair MARGIN`): what R synced replicas
//! would get if each repaired the collisions a late booking reveals — the rule of
//! [`pronto_core::cluster::repair`]. Evaluator only, like `+hold`: the gateway does not
//! repair collisions yet.
//!
//! When replica A receives another replica's dispatch to backend X (sent at `s`, delivered
//! `delay` later), A takes the decision again for each request it dispatched to X after `s`
//! that has no first token yet: that request could not see the other booking, which the
//! engine now serves first. Its booking and prefix record are taken back
//! ([`Replicas::reconsider`]) and [`relocation`] decides over views without them. A request
//! that moves is aborted in X's engine — whatever X had prefilled of it is lost, as when a
//! gateway closes the upstream connection, since a gateway cannot see whether it had begun —
//! and dispatched to the new backend as any decision: booked, recorded, synced, its TTFT model
//! observation counted from the move. Its TTFT still counts from its arrival.

use std::collections::VecDeque;

use anyhow::ensure;
use pronto_core::cluster::repair::relocation;
use pronto_core::request::RequestFeatures;

use super::race::{id_of, RaceConfig, World};
use super::{submit, Chooser, SimBackend};
use crate::eval_replicas::{Reconsidered, Replication, SyncMode};
use crate::workload::TraceRequest;

/// Collision repair's state over one run.
pub(super) struct Repair {
    margin: f64,
    /// Per replica, what it dispatched within the last `window_s`: (when, request index).
    recent: Vec<VecDeque<(f64, usize)>>,
    /// Requests moved.
    pub moves: u64,
}

impl Repair {
    /// The repair `rep` asks for; `None` when it asks for none. Errors where the run has no
    /// collisions to repair or no policy to repair them with.
    pub fn new(
        rep: &Replication,
        chooser: &Chooser,
        hold: bool,
        races: &RaceConfig,
        fleet: &[SimBackend],
    ) -> anyhow::Result<Option<Repair>> {
        let Some(margin) = rep.repair else {
            return Ok(None);
        };
        ensure!(
            margin.is_finite() && margin >= 0.0,
            "--collision-repair: a margin ≥ 0, such as 0.2"
        );
        ensure!(
            matches!(rep.sync, SyncMode::Delay(_)),
            "--collision-repair needs replicas that sync (--sync DELAY)"
        );
        ensure!(
            rep.replicas >= 2,
            "--collision-repair needs --replicas 2 or more"
        );
        ensure!(
            matches!(chooser, Chooser::Policy(_, false)) && !hold,
            "--collision-repair works with a gateway policy (not the oracle, +exact or +hold)"
        );
        ensure!(
            races.deadline.is_none() && races.hedge.is_none(),
            "--collision-repair does not combine with --first-token-deadline or --hedge"
        );
        // A stalled first token is held by the race model, which a move would not reach.
        ensure!(
            fleet.iter().all(|b| b.stall.is_none()),
            "--collision-repair does not combine with a fleet's stall faults"
        );
        Ok(Some(Repair {
            margin,
            recent: vec![VecDeque::new(); rep.replicas],
            moves: 0,
        }))
    }

    /// Replica `replica` dispatched request `i` at `t`.
    pub fn dispatched(&mut self, replica: usize, i: usize, t: f64) {
        self.recent[replica].push_back((t, i));
    }

    /// Repair what the messages delivered by `t` reveal (see the module docs).
    pub fn run(
        &mut self,
        w: &mut World<'_>,
        reqs: &[TraceRequest],
        features_for: &dyn Fn(&[u32], &TraceRequest) -> RequestFeatures,
        t: f64,
    ) {
        for (r, x, sent_at) in w.router.take_collisions() {
            // Deliveries come in sending order, so what was dispatched before this one was
            // sent can meet no later delivery either.
            let recent = &mut self.recent[r];
            while recent.front().is_some_and(|&(at, _)| at <= sent_at) {
                recent.pop_front();
            }
            let behind: Vec<usize> = recent
                .iter()
                .filter(|&&(at, i)| at > sent_at && w.tracks[i].dispatched_s == at)
                .map(|&(_, i)| i)
                .collect();
            for i in behind {
                if w.tracks[i].backend == x && w.tracks[i].first_token_s.is_none() {
                    self.reconsider(w, reqs, features_for, r, i, x, t);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reconsider(
        &mut self,
        w: &mut World<'_>,
        reqs: &[TraceRequest],
        features_for: &dyn Fn(&[u32], &TraceRequest) -> RequestFeatures,
        replica: usize,
        i: usize,
        x: usize,
        t: f64,
    ) {
        let Chooser::Policy(policy, _) = w.chooser else {
            return;
        };
        let Some(tracked) = w.dispatched[i].take() else {
            return;
        };
        let (r, id) = (&reqs[i], i as u64);
        let mut ids = Vec::new();
        r.prompt_ids(id, &mut ids);
        let mut features = features_for(&ids, r);
        let now = w.base + std::time::Duration::from_secs_f64(t);
        let residency = policy.limits_prefix_credit_to_residency();
        let margin = self.margin;
        let predicted = w.tracks[i].predicted_ttft_s;
        let moved = w
            .router
            .reconsider(tracked, x, predicted, &features, t, residency, |views| {
                relocation(&**policy, &features, views, x, now, margin)
            });
        let (d, view) = match moved {
            Reconsidered::Moves(d, view) => (d, view),
            Reconsidered::Stays(tracked) => {
                w.dispatched[i] = Some(tracked);
                return;
            }
        };
        let y = d.index;
        // Aborted where it was: the step in flight there did its work, but what it made of
        // this request never arrives (the gateway closed that connection).
        w.backends[x].engine.abort(id);
        w.backends[x].pending.retain(|ev| id_of(ev) != id);
        w.per_backend[x] -= 1;
        w.per_backend[y] += 1;
        let thinking = w.fleet[y].reasoning.map_or(0, |c| c.tokens_for(&ids));
        let tr = &mut w.tracks[i];
        (tr.backend, tr.predicted_ttft_s, tr.reason) = (y, d.predicted_ttft_s, Some(d.reason));
        tr.reasoning_tokens = thinking;
        tr.dispatched_s = t;
        w.dispatched[i] =
            Some(
                w.router
                    .on_dispatch(replica, y, d.predicted_ttft_s, &view, &features, t),
            );
        self.recent[replica].push_back((t, i));
        let generated = r.output_tokens.saturating_add(thinking);
        submit(
            &mut w.backends[y],
            id,
            r,
            &mut features,
            &mut ids,
            generated,
            t,
        );
        self.moves += 1;
    }
}
