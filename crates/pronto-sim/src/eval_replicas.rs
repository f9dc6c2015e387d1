//! R router replicas in the offline evaluator: what a fleet behind several Pronto replicas
//! sees, with the replicas synced after a delay, or not at all.
//!
//! Each replica is a whole [`RouterSideState`] (its own ledger, prefix index, TTFT models and
//! scrapes of every engine). Arrivals are spread across replicas by [`Spread`] (a load
//! balancer in front: round robin, or seeded random). What a replica dispatches, the first
//! tokens and finishes of its requests and, every [`HEARTBEAT_S`], the snapshot of its live
//! bookings go through the routing core's replica sync exactly as in the gateway —
//! [`Outbox::note`] on the way out, [`Remote::apply`] on the way in — except that the channel
//! is a queue delivering each message to every other replica [`SyncMode::Delay`] later
//! (NATS's fan-out) instead of a socket. [`SyncMode::Off`]: no messages, R independent
//! routers. Messages are delivered before any simulated event at or after their delivery
//! time ([`Replicas::deliver_until`]), so every decision sees exactly the messages delivered
//! by its arrival.
//!
//! One replica (`R = 1`) behaves exactly as the single router. The bytes a replica would
//! publish (the gateway's wire format, [`wire`], one message per event, no batching) are
//! counted: [`Replicas::sync_bytes`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use pronto_core::cluster::repair::{Booked, Relocation};
use pronto_core::cluster::{wire, Observation, ObserveLimit, Outbox, Remote, ReplicaId, SyncEvent};
use pronto_core::load::RequestLoad;
use pronto_core::request::RequestFeatures;
use pronto_core::routing::views::Dispatched;
use pronto_core::routing::{BackendView, Decision, Policy};

use super::eval_router::{RouterSideState, ScrapedLoad};

/// Seconds between two snapshots of a replica (the gateway's default `cluster.heartbeat`).
pub const HEARTBEAT_S: f64 = 1.0;
/// A replica silent this long is expired (the gateway's default `cluster.peer_timeout`).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// How arrivals are spread across replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Spread {
    /// Request `i` to replica `i mod R`.
    RoundRobin,
    /// Each request to a replica drawn from a seeded hash of its index.
    Random,
}

/// Whether and how late replicas hear of each other.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyncMode {
    /// Never: R independent routers.
    Off,
    /// Every message reaches every other replica this much later.
    Delay(Duration),
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<SyncMode, String> {
        if s == "off" {
            return Ok(SyncMode::Off);
        }
        humantime::parse_duration(s)
            .map(SyncMode::Delay)
            .map_err(|e| format!("`{s}`: `off` or a delay such as `5ms` ({e})"))
    }
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncMode::Off => f.write_str("off"),
            SyncMode::Delay(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// Collision repair in an evaluation (`--collision-repair`, `crate::evaluate::repair`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RepairSetting {
    /// As the gateway: on with [`DEFAULT_MARGIN`] wherever the run can repair (replicas that
    /// sync, a gateway policy, no races or stall faults), off elsewhere.
    ///
    /// [`DEFAULT_MARGIN`]: pronto_core::cluster::repair::DEFAULT_MARGIN
    #[default]
    Auto,
    /// Never.
    Off,
    /// With this margin; a run that cannot repair is refused.
    Margin(f64),
}

impl std::str::FromStr for RepairSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<RepairSetting, String> {
        match s {
            "auto" => Ok(RepairSetting::Auto),
            "off" => Ok(RepairSetting::Off),
            _ => s
                .parse::<f64>()
                .ok()
                .filter(|m| m.is_finite() && *m >= 0.0)
                .map(RepairSetting::Margin)
                .ok_or_else(|| format!("`{s}`: `auto`, `off` or a margin ≥ 0 such as 0.2")),
        }
    }
}

/// The replica set-up of one evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replication {
    /// Router replicas (≥ 1).
    pub replicas: usize,
    /// How arrivals reach them.
    pub spread: Spread,
    /// How they sync.
    pub sync: SyncMode,
    /// Seed of [`Spread::Random`].
    pub seed: u64,
    /// Collision repair (`--collision-repair`, `crate::evaluate`'s module docs).
    pub repair: RepairSetting,
}

impl Default for Replication {
    fn default() -> Self {
        Replication {
            replicas: 1,
            spread: Spread::RoundRobin,
            sync: SyncMode::Off,
            seed: 1,
            repair: RepairSetting::Auto,
        }
    }
}

/// One dispatched request: its booking on the replica that routed it.
#[derive(Debug)]
pub struct Tracked {
    /// The booking and prediction inputs.
    pub dispatched: Dispatched,
    replica: usize,
    seq: u64,
}

/// What [`Replicas::reconsider`] found.
#[derive(Debug)]
pub enum Reconsidered {
    /// The request moves to the decision's backend, whose view comes with it; the other
    /// replicas heard of its release. Book it there with [`Replicas::on_dispatch`].
    Moves(Decision, BackendView),
    /// It stays: its booking kept and its prefix recorded again, under the booking number
    /// the others already hold (they hear nothing); its first token will teach its TTFT
    /// model on the inputs [`Relocation::Stay`] gave.
    Stays(Tracked),
}

struct Replica {
    router: RouterSideState,
    id: ReplicaId,
    remote: Remote<usize>,
    outbox: Outbox,
    next_seq: u64,
    next_heartbeat_s: f64,
}

/// A message on its way: delivered at `.0`, in sending order `.1`.
type InFlight = Reverse<(OrdF64, u64, usize, usize)>;

#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
#[allow(clippy::derive_ord_xor_partial_ord)]
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The R replicas of one evaluation (see the module docs).
pub struct Replicas {
    replicas: Vec<Replica>,
    cfg: Replication,
    base: Instant,
    queue: BinaryHeap<InFlight>,
    /// Payloads of the messages in `queue`, by sending order, with the deliveries left.
    payloads: std::collections::HashMap<u64, (Rc<Vec<SyncEvent>>, usize)>,
    sent: u64,
    sync_bytes: u64,
    /// With collision repair: the remote dispatches delivered since the last
    /// [`Replicas::take_collisions`], as (receiving replica, backend, sent at).
    collisions: Option<Vec<(usize, usize, f64)>>,
}

impl Replicas {
    /// `cfg.replicas` idle routers over backends `names` (see [`RouterSideState::new`]).
    pub fn new<S: AsRef<str>>(
        names: &[S],
        capacities: &[Option<u64>],
        priors: &[pronto_core::predict::Coefficients],
        base: Instant,
        cfg: Replication,
        exact: Option<&[usize]>,
    ) -> Replicas {
        let replicas = (0..cfg.replicas.max(1))
            .map(|i| Replica {
                router: RouterSideState::new(names, capacities, priors, base, exact),
                id: ReplicaId(i as u64),
                remote: Remote::new(PEER_TIMEOUT),
                outbox: Outbox::new(ObserveLimit::DEFAULT),
                next_seq: 1,
                next_heartbeat_s: HEARTBEAT_S,
            })
            .collect();
        Replicas {
            replicas,
            cfg,
            base,
            queue: BinaryHeap::new(),
            payloads: std::collections::HashMap::new(),
            sent: 0,
            sync_bytes: 0,
            collisions: None,
        }
    }

    /// The replica the load balancer sends request `index` to.
    pub fn pick(&self, index: usize) -> usize {
        let r = self.replicas.len();
        match self.cfg.spread {
            Spread::RoundRobin => index % r,
            Spread::Random => {
                let mut z = (index as u64) ^ self.cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                ((z ^ (z >> 31)) % r as u64) as usize
            }
        }
    }

    /// Every replica excludes backends that make no progress by `rule` (`None`: off).
    pub fn set_stall_rule(&mut self, rule: Option<pronto_core::stall::StallRule>) {
        for rep in &mut self.replicas {
            rep.router.set_stall_rule(rule);
        }
    }

    /// `backend` produced a token at `t`: every replica hears it (each gateway replica sees
    /// only the tokens of its own streams; with the wedge faults modelled here every stream
    /// on a wedged engine stops at once, so the difference is not one a rule can see).
    pub fn on_progress(&mut self, backend: usize, t: f64) {
        let now = self.at(t);
        for rep in &mut self.replicas {
            rep.router.on_progress(backend, now);
        }
    }

    /// Times a replica marked a backend stalled, summed over the replicas.
    pub fn stall_exclusions(&self) -> u64 {
        self.replicas.iter().map(|r| r.router.stall_marks()).sum()
    }

    /// Replica `r`'s router.
    pub fn router(&mut self, r: usize) -> &mut RouterSideState {
        &mut self.replicas[r].router
    }

    /// Every replica scrapes every engine.
    pub fn on_scrape(&mut self, backend: usize, load: ScrapedLoad, at: Instant) {
        for rep in &mut self.replicas {
            rep.router.on_scrape(backend, load, at);
        }
    }

    /// Replica `r` dispatches `features` to backend `index` at `t` (see
    /// [`RouterSideState::on_dispatch`]) and tells the others.
    pub fn on_dispatch(
        &mut self,
        r: usize,
        index: usize,
        predicted_ttft_s: Option<f64>,
        chosen: &BackendView,
        features: &RequestFeatures,
        t: f64,
    ) -> Tracked {
        let now = self.at(t);
        let rep = &mut self.replicas[r];
        let dispatched = rep
            .router
            .on_dispatch(index, predicted_ttft_s, chosen, features, now);
        let seq = rep.next_seq;
        rep.next_seq += 1;
        let load: RequestLoad = dispatched.booking.load();
        let ev = SyncEvent::Dispatch {
            seq,
            backend: rep.router.sync_ref(index),
            load,
            hashes: features.block_hashes.clone(),
        };
        self.send(r, ev, t);
        Tracked {
            dispatched,
            replica: r,
            seq,
        }
    }

    /// The first token of `tr` came back from `backend`, `ttft_s` after dispatch, at `t`.
    pub fn on_first_token(&mut self, tr: &mut Tracked, backend: usize, ttft_s: f64, t: f64) {
        let now = self.at(t);
        let rep = &mut self.replicas[tr.replica];
        // A held sample was synced as a prefill end already.
        if rep
            .router
            .on_first_token(backend, &mut tr.dispatched, ttft_s, now)
            .is_some_and(|l| !l.held)
        {
            let observed = Some(Observation {
                inputs: tr.dispatched.inputs,
                ttft_s,
            });
            let seq = tr.seq;
            self.send(tr.replica, SyncEvent::FirstToken { seq, observed }, t);
        }
    }

    /// `tr`'s first token arrived on `backend` at `t`, `ttft_s` after dispatch, and is held
    /// back from the client (a race on the first answer): its prefill ends now, the other
    /// replicas hear of that but not of the sample, which [`Replicas::on_first_token`] teaches
    /// later — the gateway's `InflightGuard::first_token_held`.
    pub fn on_first_token_held(&mut self, tr: &mut Tracked, backend: usize, ttft_s: f64, t: f64) {
        let now = self.at(t);
        let rep = &mut self.replicas[tr.replica];
        if rep
            .router
            .hold_first_token(backend, &mut tr.dispatched, ttft_s, now)
        {
            let seq = tr.seq;
            let observed = None;
            self.send(tr.replica, SyncEvent::FirstToken { seq, observed }, t);
        }
    }

    /// `tr`'s stream on `backend` ended at `t`.
    pub fn on_finish(&mut self, mut tr: Tracked, backend: usize, tpot_s: Option<f64>, t: f64) {
        let now = self.at(t);
        self.replicas[tr.replica]
            .router
            .on_finish(backend, &mut tr.dispatched, tpot_s, now);
        self.send(tr.replica, SyncEvent::Release { seq: tr.seq }, t);
    }

    /// `tr`'s attempt on `backend` lost a race at `t` and was aborted: what the gateway does
    /// for a cancelled attempt (`proxy::race`), in its order — a late first attempt observes
    /// `late_s`, the time it was given (a censored TTFT sample); its prefix record is undone;
    /// its booking released.
    pub fn on_cancel(
        &mut self,
        mut tr: Tracked,
        backend: usize,
        late_s: Option<f64>,
        features: &RequestFeatures,
        t: f64,
    ) {
        if let Some(waited) = late_s {
            self.on_first_token(&mut tr, backend, waited, t);
        }
        let held = tr.dispatched.held_blocks;
        self.replicas[tr.replica]
            .router
            .undo_record(backend, features, held);
        self.on_finish(tr, backend, None, t);
    }

    /// A KV-event message of `backend`'s engine: every replica's exact index applies it (each
    /// gateway replica subscribes to every engine's publisher).
    pub fn apply_kv_events(&self, backend: usize, batch: &pronto_core::kv_index::EventBatch) {
        for rep in &self.replicas {
            rep.router.apply_kv_events(backend, batch);
        }
    }

    /// Replica `r`'s views for `features` at `t` without the backends `tried`.
    pub fn views_excluding(
        &mut self,
        r: usize,
        features: &RequestFeatures,
        t: f64,
        residency: bool,
        tried: &[pronto_core::ids::BackendId],
    ) -> &[BackendView] {
        let now = self.at(t);
        self.replicas[r]
            .router
            .views_excluding(features, now, residency, tried)
    }

    /// Send the snapshots due and deliver every message due by `t`; expire silent replicas.
    pub fn deliver_until(&mut self, t: f64) {
        if self.replicas.len() < 2 || self.cfg.sync == SyncMode::Off {
            return;
        }
        for r in 0..self.replicas.len() {
            while self.replicas[r].next_heartbeat_s <= t {
                let at = self.replicas[r].next_heartbeat_s;
                self.replicas[r].next_heartbeat_s += HEARTBEAT_S;
                let snap = self.replicas[r].outbox.snapshot();
                self.send(r, snap, at);
            }
        }
        while let Some(&Reverse((OrdF64(at), order, to, from))) = self.queue.peek() {
            if at > t {
                break;
            }
            self.queue.pop();
            let now = self.at(at);
            let Some((events, left)) = self.payloads.get_mut(&order) else {
                continue;
            };
            let events = Rc::clone(events);
            *left -= 1;
            if *left == 0 {
                self.payloads.remove(&order);
            }
            let sender = self.replicas[from].id;
            if let (Some(c), SyncMode::Delay(d)) = (self.collisions.as_mut(), self.cfg.sync) {
                for ev in events.iter() {
                    if let SyncEvent::Dispatch { backend, .. } = ev {
                        if let Some(b) = self.replicas[to].router.index_of(backend) {
                            c.push((to, b, at - d.as_secs_f64()));
                        }
                    }
                }
            }
            let rep = &mut self.replicas[to];
            rep.remote.apply(&rep.router, sender, 1, &events, now);
        }
        let now = self.at(t);
        for rep in &mut self.replicas {
            rep.remote.expire(&rep.router, now);
        }
    }

    /// Keep the remote dispatches delivered for [`Replicas::take_collisions`] (collision
    /// repair is on).
    pub fn collect_collisions(&mut self) {
        self.collisions.get_or_insert_with(Vec::new);
    }

    /// The remote dispatches delivered since the last call (receiving replica, backend, when
    /// sent), when collision repair is on.
    pub fn take_collisions(&mut self) -> Vec<(usize, usize, f64)> {
        self.collisions
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Collision repair: `tr`'s replica takes its decision on `backend` again at `t` with
    /// `policy` and `margin`, by the core's sequence the gateway runs too
    /// ([`pronto_core::cluster::repair::reconsider`]); see [`Reconsidered`].
    pub fn reconsider(
        &mut self,
        mut tr: Tracked,
        backend: usize,
        features: &RequestFeatures,
        t: f64,
        policy: &dyn Policy,
        margin: f64,
    ) -> Reconsidered {
        let now = self.at(t);
        let booked = Booked {
            features,
            backend,
            own: tr.dispatched.booking.load(),
            held_blocks: tr.dispatched.held_blocks,
            tried: &[],
        };
        let rep = &mut self.replicas[tr.replica];
        match rep.router.reconsider(policy, booked, now, margin) {
            (Relocation::Move(d), view) => {
                rep.router.on_finish(backend, &mut tr.dispatched, None, now);
                self.send(tr.replica, SyncEvent::Release { seq: tr.seq }, t);
                Reconsidered::Moves(d, view)
            }
            (Relocation::Stay(inputs), _) => {
                tr.dispatched.inputs = inputs;
                Reconsidered::Stays(tr)
            }
        }
    }

    /// Bytes the replicas published in all (the gateway's wire format; each message counted
    /// once, as NATS's fan-out to the other replicas is not the sender's).
    pub fn sync_bytes(&self) -> u64 {
        self.sync_bytes
    }

    /// Backend names, in pool order.
    pub fn names(&self) -> impl Iterator<Item = &std::sync::Arc<str>> {
        self.replicas[0].router.names()
    }

    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t.max(0.0))
    }

    fn send(&mut self, from: usize, ev: SyncEvent, t: f64) {
        let SyncMode::Delay(delay) = self.cfg.sync else {
            return;
        };
        if self.replicas.len() < 2 {
            return;
        }
        let now = self.at(t);
        let ev = self.replicas[from].outbox.note(ev, now);
        self.sync_bytes += (wire::HEADER_BYTES + wire::event_len(&ev)) as u64;
        let order = self.sent;
        self.sent += 1;
        let at = t + delay.as_secs_f64();
        let events = Rc::new(vec![ev]);
        for to in (0..self.replicas.len()).filter(|&to| to != from) {
            self.queue.push(Reverse((OrdF64(at), order, to, from)));
        }
        self.payloads
            .insert(order, (events, self.replicas.len() - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held first token ends the prefill at once and is learnt, at its own time, when the
    /// race is decided: the later call's TTFT (a censored wait, or the release) is not.
    #[test]
    fn a_held_first_token_is_learnt_as_it_arrived() {
        let base = Instant::now();
        let features = RequestFeatures::synthetic("m", String::new(), Some(16));
        let model_after = |calls: &[(bool, f64, f64)]| {
            let mut r = Replicas::new(&["b0"], &[None], &[], base, Replication::default(), None);
            let view = r.views_excluding(0, &features, 0.0, false, &[])[0];
            let mut tr = r.on_dispatch(0, 0, Some(0.1), &view, &features, 0.0);
            for &(held, ttft_s, t) in calls {
                if held {
                    r.on_first_token_held(&mut tr, 0, ttft_s, t);
                    let v = r.views_excluding(0, &features, t, false, &[])[0];
                    assert_eq!(v.outstanding_prefill_tokens, 0, "the prefill ended");
                    assert_eq!(
                        v.ttft_model.unwrap().quality.samples,
                        0,
                        "nothing learnt yet"
                    );
                } else {
                    r.on_first_token(&mut tr, 0, ttft_s, t);
                }
            }
            r.views_excluding(0, &features, 9.0, false, &[])[0]
                .ttft_model
                .unwrap()
        };
        let held = model_after(&[(true, 0.2, 0.2), (false, 5.0, 5.0)]);
        assert_eq!(held.quality.samples, 1);
        assert_eq!(held, model_after(&[(false, 0.2, 0.2)]));
        assert_ne!(held, model_after(&[(false, 5.0, 5.0)]));
    }
}
