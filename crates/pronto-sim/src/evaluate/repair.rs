//! Collision repair in the evaluator (`--collision-repair`, on by default as in the gateway's
//! `cluster.collision_repair`): what R synced replicas get by repairing the collisions a
//! late booking reveals — the rule of [`pronto_core::cluster::repair`], applied as the
//! gateway applies it (`src/proxy/repair.rs` in the `pronto` crate).
//!
//! When replica A receives another replica's dispatch to backend X (sent at `s`, delivered
//! `delay` later), A takes the decision again for each request it dispatched to X after `s`
//! that has no first token yet: that request could not see the other booking, which the
//! engine now serves first. Its decision is taken again by the core's sequence the gateway
//! runs too ([`pronto_core::cluster::repair::reconsider`], via [`Replicas::reconsider`]):
//! over views without its prefix record and its booking. A request moves
//! [`MAX_MOVES`] times at most. A request
//! that moves is aborted in X's engine — whatever X had prefilled of it is lost, as when a
//! gateway closes the upstream connection, since a gateway cannot see whether it had begun —
//! and dispatched to the new backend as any decision: booked, recorded, synced, its TTFT model
//! observation counted from the move. Its TTFT still counts from its arrival.

use std::collections::VecDeque;

use anyhow::{bail, ensure};
use pronto_core::cluster::repair::{DEFAULT_MARGIN, MAX_MOVES};
use pronto_core::request::RequestFeatures;

use super::race::{id_of, RaceConfig, World};
use super::{submit, Chooser, SimBackend};
use crate::eval_replicas::{Reconsidered, RepairSetting, Replication, SyncMode};
use crate::workload::TraceRequest;

/// Collision repair's state over one run.
pub(super) struct Repair {
    margin: f64,
    /// Per replica, what it dispatched within the last `window_s`: (when, request index).
    recent: Vec<VecDeque<(f64, usize)>>,
    /// Requests moved.
    pub moves: u64,
    /// Moves per request so far.
    moved: Vec<u8>,
}

impl Repair {
    /// The repair `rep` asks for; `None` when it asks for none, or asks for `auto` where the
    /// run cannot repair. Errors where a margin is asked for and the run has no collisions to
    /// repair or no policy to repair them with.
    pub fn new(
        rep: &Replication,
        chooser: &Chooser,
        races: &RaceConfig,
        fleet: &[SimBackend],
    ) -> anyhow::Result<Option<Repair>> {
        // Why this run cannot repair, if it cannot.
        let unable = if !matches!(rep.sync, SyncMode::Delay(_)) {
            Some("needs replicas that sync (--sync DELAY)")
        } else if rep.replicas < 2 {
            Some("needs --replicas 2 or more")
        } else if !matches!(chooser, Chooser::Policy(_, false)) {
            Some("works with a gateway policy (not the oracle or +exact)")
        } else if races.deadline.is_some() || races.hedge.is_some() {
            // The gateway repairs no request on a route that races: it has its own remedy.
            Some("does not combine with --first-token-deadline or --hedge")
        } else if fleet.iter().any(|b| b.stall.is_some()) {
            // A stalled first token is held by the race model, which a move would not reach.
            Some("does not combine with a fleet's stall faults")
        } else {
            None
        };
        let margin = match (rep.repair, unable) {
            (RepairSetting::Off, _) | (RepairSetting::Auto, Some(_)) => return Ok(None),
            (RepairSetting::Auto, None) => DEFAULT_MARGIN,
            (RepairSetting::Margin(_), Some(why)) => bail!("--collision-repair {why}"),
            (RepairSetting::Margin(m), None) => {
                ensure!(
                    m.is_finite() && m >= 0.0,
                    "--collision-repair: a margin ≥ 0, such as 0.2"
                );
                m
            }
        };
        Ok(Some(Repair {
            margin,
            recent: vec![VecDeque::new(); rep.replicas],
            moves: 0,
            moved: Vec::new(),
        }))
    }

    /// The margin in use.
    pub fn margin(&self) -> f64 {
        self.margin
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
        let moved = w
            .router
            .reconsider(tracked, x, &features, t, &**policy, self.margin);
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
        // At most MAX_MOVES times, as in the gateway.
        if self.moved.len() <= i {
            self.moved.resize(i + 1, 0);
        }
        self.moved[i] += 1;
        if u32::from(self.moved[i]) < MAX_MOVES {
            self.recent[replica].push_back((t, i));
        }
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
