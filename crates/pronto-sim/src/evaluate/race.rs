//! The evaluator's model of the gateway's race before the first token (`proxy::race`:
//! failover on a missed first-token deadline, bounded hedging) and of the sim fleet's
//! first-token stall fault (`fleet_faults`), on the virtual clock.
//!
//! ## The stall fault
//! A fleet file backend's `faults: {stall_first_token: D, stall_probability: p}` stalls a
//! request with probability `p`, drawn from a splitmix hash of the fault seed, the backend's
//! index and the engine request id (deterministic; not the live fleet's sequential stream, so
//! which requests stall differs, the share does not). As in the live fleet, where the HTTP
//! handler sleeps `D` on receiving the first token while the engine task keeps stepping
//! (`fleet_http`), the stall is not the engine's: prefill and decode run as usual, KV stays
//! allocated, and only what the client (the router) sees is shifted. The first token is
//! delivered `D` after the step that produced it ended; each later event of the request at
//! `max(its step end, first token + D)` — the tokens generated during the stall arrive as one
//! burst at the release, as the live handler flushes its channel. The router observes the
//! stalled TTFT, as the gateway does. `D` is virtual seconds (the live fleet's stall is wall
//! time, unscaled: the same at `--time-scale 1`).
//!
//! ## Failover and hedging (`--first-token-deadline`, `--hedge`)
//! The sequencing — when the second copy goes out, what the loser does — is not written here:
//! it is [`pronto_core::race::Race`]'s, the state machine the gateway's `proxy::race` drives
//! too; this module schedules its triggers on the virtual clock and carries out its actions
//! on the simulated engines and the router's ledger. Every evaluator request is streamed. At dispatch, [`pronto_core::race::plan`] gives the
//! request's triggers from its decision's prediction, exactly as the gateway's `Plan::of`: the
//! hedge delay (the budget, a [`HedgeBucket`] per run, earned by every routed request) and the
//! deadline. At a trigger (an event of the simulation, processed after step ends and before
//! arrivals at the same instant, in the order scheduled), if the request's first token has not
//! been delivered and it has no second copy (and, for a hedge, the bucket grants one): the
//! decision is taken again through `pronto_core::routing::decide` on views with the first
//! backend excluded — booked, recorded and counted per backend like any decision — and the
//! copy goes to that engine under the request id with [`SECOND`] set. The first copy whose
//! first token is delivered wins; the other is aborted in its engine ([`Engine::abort`],
//! counting the prompt tokens it had prefilled as extra prefill), its router booking released
//! and its prefix record undone ([`Replicas::on_cancel`], the gateway's cancelled attempt),
//! and a first copy that loses a failover observes the time it was given as its TTFT (a
//! censored sample). A copy the engine rejects during a race is dropped (its booking released,
//! its record undone) and the other awaited alone. The request's TTFT, TTFA, TPOT and E2E are
//! its winner's, counted from the original arrival. The oracle never races.
//!
//! ## The failover oracle (`--failover-oracle`)
//! A reference, not a gateway setting: each stalled copy fails over at the instant its engine
//! produced the first token the stall then holds — the earliest moment at which any deadline
//! could tell a stall from a slow start — and no healthy copy ever does. Its second copy is
//! chosen, booked, raced and cancelled as a deadline's is (with `--first-token-deadline` or
//! `--hedge` as well, whichever comes first sends it). So its p99 is the least any deadline
//! rule can reach without false alarms, and its extra prefill is the floor every rule pays:
//! the prefill the stalled copies had done.
//!
//! ## `--race-on ttfa`
//! As a route's `race_on: ttfa`: a relative deadline or a quantile hedge scales the predicted
//! TTFA ([`RaceOn::prediction`]: the decision's TTFT plus the reasoning length learned so far
//! at the chosen backend's predicted TPOT), and a copy wins at its first *answer* token. Until
//! the race is decided, each copy's events are held (not delivered): its first token ends its
//! booking's prefill at once and is learnt, at its true time, when the copy wins or loses a
//! failover late ([`Replicas::on_first_token_held`], the gateway's
//! `InflightGuard::first_token_held`). The winner's held events reach the client together
//! with its first answer token, so a raced stream's TTFT is its TTFA, as the gateway's client
//! sees it; a loser's held events are dropped. A copy that ends without an answer wins at its
//! end. The gateway's 1 MiB cap on held reasoning is not modelled (the sim's reasoning tokens
//! have no size).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{start_step, Backend, Chooser, SimBackend, Track};
use crate::engine::{Engine, EngineEvent, SimRequest};
use crate::eval_replicas::{Replicas, Tracked};
use crate::fleet_config::FaultConfig;
use pronto_core::ids::BackendId;
use pronto_core::race::{
    Action, FirstTokenDeadline, Hedge, HedgeBucket, Race, RaceOn, Side, Trigger,
};
use pronto_core::request::RequestFeatures;
use pronto_core::routing::BackendView;
use pronto_core::tokens::BLOCK_TOKENS;

/// The engine request id bit of a request's second copy.
pub const SECOND: u64 = 1 << 63;

/// A backend's first-token stall (its fleet file `faults:`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StallFault {
    /// How long a stalled first token is held, seconds.
    pub stall_s: f64,
    /// Share of requests stalled (0–1).
    pub probability: f64,
    /// Seed of the draws (the fault seed mixed with the backend's index).
    pub seed: u64,
}

impl StallFault {
    /// The stall of backend `index` with `faults`; `None` when it does not stall.
    pub fn of(faults: &FaultConfig, index: usize) -> Option<StallFault> {
        let d = faults.stall_first_token.filter(|d| !d.is_zero())?;
        (faults.stall_probability > 0.0).then_some(StallFault {
            stall_s: d.as_secs_f64(),
            probability: faults.stall_probability,
            seed: splitmix(faults.seed ^ (index as u64).wrapping_mul(0x9e37_79b9)),
        })
    }

    /// Whether the request with engine id `id` is stalled.
    pub fn hits(&self, id: u64) -> bool {
        let u = (splitmix(self.seed ^ splitmix(id)) >> 11) as f64 / (1u64 << 53) as f64;
        self.probability >= 1.0 || u < self.probability
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A run's race settings, as a route's `first_token_deadline` and `hedge`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RaceConfig {
    /// `--first-token-deadline`.
    pub deadline: Option<FirstTokenDeadline>,
    /// `--hedge`.
    pub hedge: Option<Hedge>,
    /// `--race-on`: what a copy must deliver to win.
    pub on: RaceOn,
    /// `--failover-oracle`: fail a stalled copy over the instant the engine produced the
    /// first token its stall holds (module docs, *The failover oracle*).
    pub oracle_failover: bool,
    /// `--stall-floor` / `--stall-factor` / `--no-stall`: progress-based exclusion of a
    /// wedged engine, as the gateway's `health.stall` ([`pronto_core::stall`]); `None`: off.
    pub stall: Option<pronto_core::stall::StallRule>,
}

/// What the races of a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RaceCounts {
    /// Second copies sent at a missed deadline, and those that won.
    pub failovers: u64,
    /// Failovers won by the second copy.
    pub failovers_won: u64,
    /// Hedges sent, and those that won.
    pub hedges: u64,
    /// Hedges won by the second copy.
    pub hedges_won: u64,
    /// Prompt tokens engines prefilled for copies that lost and were aborted.
    pub extra_prefill_tokens: u64,
    /// Uncached prompt tokens of the relayed first tokens (prompt − cache hit).
    pub relayed_prefill_tokens: u64,
    /// Requests (copies) whose first token a stall fault held.
    pub stalled: u64,
    /// Times a backend was taken out of routing for making no progress
    /// ([`pronto_core::stall`]; a wedge fault).
    pub stall_exclusions: u64,
}

// === flags ===

/// `--first-token-deadline '{factor: 1.5, floor: 60ms}'` or `'{after: 150ms}'`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadlineFlag(pub FirstTokenDeadline);

/// `--hedge '{quantile: 0.95, budget: 0.1, max_predicted_ttft: 2s}'` or `'{after: 300ms}'`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgeFlag(pub Hedge);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadlineText {
    after: Option<String>,
    factor: Option<f64>,
    floor: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HedgeText {
    after: Option<String>,
    quantile: Option<f64>,
    budget: Option<f64>,
    max_predicted_ttft: Option<String>,
}

fn duration(field: &str, s: Option<String>) -> Result<Option<Duration>, String> {
    s.map(|s| humantime::parse_duration(s.trim()).map_err(|e| format!("{field}: `{s}`: {e}")))
        .transpose()
}

impl std::str::FromStr for DeadlineFlag {
    type Err = String;
    fn from_str(s: &str) -> Result<DeadlineFlag, String> {
        let t: DeadlineText = serde_yaml_ng::from_str(s).map_err(|e| e.to_string())?;
        let (after, floor) = (duration("after", t.after)?, duration("floor", t.floor)?);
        FirstTokenDeadline::from_parts(after, t.factor, floor)
            .map(DeadlineFlag)
            .map_err(|e| e.to_string())
    }
}

impl std::str::FromStr for HedgeFlag {
    type Err = String;
    fn from_str(s: &str) -> Result<HedgeFlag, String> {
        let t: HedgeText = serde_yaml_ng::from_str(s).map_err(|e| e.to_string())?;
        let after = duration("after", t.after)?;
        let max = duration("max_predicted_ttft", t.max_predicted_ttft)?;
        Hedge::from_parts(after, t.quantile, t.budget, max)
            .map(HedgeFlag)
            .map_err(|es| {
                es.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            })
    }
}

// === the races of one run ===

/// Everything of the run a race touches.
pub(super) struct World<'a> {
    pub router: &'a mut Replicas,
    pub backends: &'a mut [Backend],
    pub tracks: &'a mut [Track],
    pub dispatched: &'a mut [Option<Tracked>],
    pub per_backend: &'a mut [u64],
    pub fleet: &'a [SimBackend],
    pub chooser: &'a Chooser,
    pub base: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Copy {
    backend: usize,
    dispatched_s: f64,
    reasoning_tokens: u32,
    alive: bool,
}

/// A request with a race plan.
struct Entry {
    replica: usize,
    features: RequestFeatures,
    ids: Vec<u32>,
    copies: [Option<Copy>; 2],
    /// The booking of the copy whose booking is not in `World::dispatched`.
    other: Option<Tracked>,
    /// The race's sequencing, shared with the gateway ([`pronto_core::race::Race`]).
    race: Race,
    /// A first token was delivered (the race is decided).
    won: bool,
    /// With [`RaceOn::Ttfa`], per copy: the tokens it has produced and its events held back
    /// until its first answer token.
    tokens: [u32; 2],
    held: [Vec<EngineEvent>; 2],
}

struct Stall {
    stall_s: f64,
    release_s: Option<f64>,
    /// Uncached prompt tokens, known at the engine's first token.
    prefilled: u32,
}

enum Item {
    Deliver { backend: usize, ev: EngineEvent },
    Trigger { request: usize, kind: Trigger },
}

/// The races and stalls of one run (see the module docs).
pub(super) struct Races {
    cfg: RaceConfig,
    faults: Vec<Option<StallFault>>,
    bucket: HedgeBucket,
    entries: HashMap<usize, Entry>,
    stalls: HashMap<u64, Stall>,
    /// Items by (time bits, order): times are ≥ 0, so their bits sort as they do.
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    items: HashMap<u64, Item>,
    seq: u64,
    /// [`Races::admit`]'s output buffer, kept between calls (empty outside them).
    delivered: Vec<EngineEvent>,
    pub counts: RaceCounts,
}

/// The request (and copy) an engine event belongs to.
pub(super) fn id_of(ev: &EngineEvent) -> u64 {
    match *ev {
        EngineEvent::FirstToken { id, .. }
        | EngineEvent::Token { id }
        | EngineEvent::Finished { id, .. } => id,
    }
}

fn set_id(ev: &mut EngineEvent, to: u64) {
    match ev {
        EngineEvent::FirstToken { id, .. }
        | EngineEvent::Token { id }
        | EngineEvent::Finished { id, .. } => *id = to,
    }
}

impl Races {
    /// The races of a run on `fleet` with `cfg`; `racing: false` (the oracle) never races.
    pub fn new(cfg: RaceConfig, fleet: &[SimBackend], racing: bool) -> Races {
        Races {
            cfg: if racing { cfg } else { RaceConfig::default() },
            faults: fleet.iter().map(|b| b.stall).collect(),
            bucket: HedgeBucket::default(),
            entries: HashMap::new(),
            stalls: HashMap::new(),
            heap: BinaryHeap::new(),
            items: HashMap::new(),
            seq: 0,
            delivered: Vec::new(),
            counts: RaceCounts::default(),
        }
    }

    fn push(&mut self, at: f64, item: Item) {
        self.heap.push(Reverse((at.max(0.0).to_bits(), self.seq)));
        self.items.insert(self.seq, item);
        self.seq += 1;
    }

    /// A request is routed: it earns hedge credit.
    pub fn earn(&mut self) {
        if let Some(h) = &self.cfg.hedge {
            self.bucket.earn(h.budget);
        }
    }

    fn stall_draw(&mut self, b: usize, id: u64) {
        if let Some(f) = self.faults[b].filter(|f| f.hits(id)) {
            self.counts.stalled += 1;
            let s = Stall {
                stall_s: f.stall_s,
                release_s: None,
                prefilled: 0,
            };
            self.stalls.insert(id, s);
        }
    }

    /// Request `i` was dispatched to backend `b` by `replica` at `t`, decided on `view` with
    /// prediction `predicted`: its stall is drawn and its race planned.
    #[allow(clippy::too_many_arguments)]
    pub fn on_dispatch(
        &mut self,
        i: usize,
        b: usize,
        replica: usize,
        predicted: Option<f64>,
        view: &BackendView,
        features: &RequestFeatures,
        ids: &[u32],
        reasoning_tokens: u32,
        expected_reasoning: f64,
        t: f64,
    ) {
        self.stall_draw(b, i as u64);
        let rel_error = view.ttft_model.map(|m| m.quality.rel_error);
        let (d, h) = (self.cfg.deadline.as_ref(), self.cfg.hedge.as_ref());
        let tpot = view.predicted_tpot_s();
        let predicted = self.cfg.on.prediction(predicted, tpot, expected_reasoning);
        let plan = pronto_core::race::plan(d, h, predicted, rel_error);
        if plan.is_none() && !self.cfg.oracle_failover {
            return;
        }
        let first = Copy {
            backend: b,
            dispatched_s: t,
            reasoning_tokens,
            alive: true,
        };
        let entry = Entry {
            replica,
            features: features.clone(),
            ids: ids.to_vec(),
            copies: [Some(first), None],
            other: None,
            race: plan.as_ref().map_or(Race::new(None, None), Race::of),
            won: false,
            tokens: [0; 2],
            held: [Vec::new(), Vec::new()],
        };
        self.entries.insert(i, entry);
        let Some(plan) = plan else {
            return;
        };
        for (d, kind) in Race::of(&plan).triggers() {
            self.push(t + d.as_secs_f64(), Item::Trigger { request: i, kind });
        }
    }

    /// The next item's time and backend (`usize::MAX` for a trigger).
    pub fn next_at(&self) -> Option<(f64, usize)> {
        let &Reverse((bits, seq)) = self.heap.peek()?;
        let b = match self.items.get(&seq) {
            Some(Item::Deliver { backend, .. }) => *backend,
            _ => usize::MAX,
        };
        Some((f64::from_bits(bits), b))
    }

    /// Take the next item, due at `t`: a held event to deliver (pass it through
    /// [`Races::admit`]) or a trigger, acted on here.
    pub fn fire(&mut self, t: f64, w: &mut World<'_>) -> Vec<EngineEvent> {
        let Some(Reverse((_, seq))) = self.heap.pop() else {
            return Vec::new();
        };
        match self.items.remove(&seq) {
            Some(Item::Deliver { ev, .. }) => vec![ev],
            Some(Item::Trigger { request, kind }) => {
                self.trigger(request, kind, t, w);
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// Events from backend `b` visible at `t`: those of aborted copies are dropped, those a
    /// stall holds are kept for later, races are decided; what is left carries the request's
    /// index as its id, to be delivered now.
    pub fn admit(&mut self, b: usize, t: f64, events: &mut Vec<EngineEvent>, w: &mut World<'_>) {
        if self.entries.is_empty() && self.stalls.is_empty() {
            for ev in events.iter() {
                self.count_relayed(ev);
            }
            return;
        }
        // The delivered events go to the run's reused buffer, which becomes `events`.
        let mut out = std::mem::take(&mut self.delivered);
        for ev in events.drain(..) {
            self.pass(b, t, ev, w, &mut out);
        }
        std::mem::swap(events, &mut out);
        self.delivered = out;
    }

    /// One event of backend `b` at `t`: what of it (and of the events it releases) is
    /// delivered goes to `out`.
    fn pass(
        &mut self,
        b: usize,
        t: f64,
        mut ev: EngineEvent,
        w: &mut World<'_>,
        out: &mut Vec<EngineEvent>,
    ) {
        let e = id_of(&ev);
        let (i, c) = ((e & !SECOND) as usize, usize::from(e & SECOND != 0));
        if let Some(en) = self.entries.get(&i) {
            if !en.copies[c].is_some_and(|k| k.alive) {
                return;
            }
        }
        if let Some(s) = self.stalls.get_mut(&e) {
            let hold = match (ev, s.release_s) {
                (
                    EngineEvent::FirstToken {
                        prompt_tokens,
                        cached_tokens,
                        ..
                    },
                    None,
                ) => {
                    s.prefilled = prompt_tokens.saturating_sub(cached_tokens);
                    let at = t + s.stall_s;
                    s.release_s = Some(at);
                    if self.cfg.oracle_failover && c == 0 && self.entries.contains_key(&i) {
                        let kind = Trigger::Failover;
                        self.push(t, Item::Trigger { request: i, kind });
                    }
                    Some(at)
                }
                (_, Some(at)) if t < at => Some(at),
                _ => None,
            };
            if let Some(at) = hold {
                self.push(at, Item::Deliver { backend: b, ev });
                return;
            }
            if matches!(ev, EngineEvent::Finished { .. }) {
                self.stalls.remove(&e);
            }
        }
        set_id(&mut ev, i as u64);
        let Some(en) = self.entries.get_mut(&i) else {
            self.count_relayed(&ev);
            out.push(ev);
            return;
        };
        let other_alive = en.copies[1 - c].is_some_and(|k| k.alive);
        let rejected = matches!(
            ev,
            EngineEvent::Finished {
                output_tokens: 0,
                ..
            }
        );
        if self.cfg.on == RaceOn::Ttfa && !en.won && !(rejected && other_alive) {
            // Held until the copy's first answer token (or its end without one).
            if let EngineEvent::FirstToken { .. } = ev {
                let tr = if c == 0 {
                    w.dispatched[i].as_mut()
                } else {
                    en.other.as_mut()
                };
                let k = en.copies[c].expect("an alive copy");
                if let Some(tr) = tr {
                    w.router
                        .on_first_token_held(tr, k.backend, t - k.dispatched_s, t);
                }
            }
            let finished = matches!(ev, EngineEvent::Finished { .. });
            if !finished {
                en.tokens[c] += 1;
            }
            en.held[c].push(ev);
            let reasoning = en.copies[c].map_or(0, |k| k.reasoning_tokens);
            if !finished && en.tokens[c] <= reasoning {
                return;
            }
            let held = std::mem::take(&mut en.held[c]);
            self.decide(i, c, t, w);
            for ev in held {
                self.count_relayed(&ev);
                if matches!(ev, EngineEvent::Finished { .. }) {
                    self.finish(i, c);
                }
                out.push(ev);
            }
            return;
        }
        let en = self.entries.get_mut(&i).expect("looked up above");
        match ev {
            EngineEvent::FirstToken { .. } if !en.won => self.decide(i, c, t, w),
            EngineEvent::Finished {
                output_tokens: 0, ..
            } if !en.won && other_alive => {
                // Rejected during the race: dropped, the other copy awaited alone.
                let now = since(en, t);
                let actions = en.race.on_failed(side(c), now);
                self.apply(i, &actions, t, w);
                return;
            }
            // Done (or rejected before a race): no trigger may race it any more.
            EngineEvent::Finished { .. } => self.finish(i, c),
            _ => {}
        }
        self.count_relayed(&ev);
        out.push(ev);
    }

    /// Copy `c` of request `i` delivered its first token at `t`: the race is decided
    /// ([`Race::on_first_token`]).
    fn decide(&mut self, i: usize, c: usize, t: f64, w: &mut World<'_>) {
        let Some(en) = self.entries.get_mut(&i) else {
            return;
        };
        en.won = true;
        en.held[1 - c].clear();
        let now = since(en, t);
        let actions = en.race.on_first_token(side(c), now);
        if c == 1 && en.race.decided() == Some(Side::Second) {
            match en.race.kind() {
                Some(Trigger::Failover) => self.counts.failovers_won += 1,
                Some(Trigger::Hedge) => self.counts.hedges_won += 1,
                None => {}
            }
        }
        self.apply(i, &actions, t, w);
    }

    /// Carry out the race's `actions` for request `i` at `t`: the adopted copy becomes the
    /// request; the other is aborted in its engine (its prefill counted) and its booking
    /// cancelled as the gateway cancels an attempt — a censored observation for a late
    /// first copy, its prefix record undone, its booking released ([`Replicas::on_cancel`]).
    fn apply(&mut self, i: usize, actions: &[Action], t: f64, w: &mut World<'_>) {
        let (mut late, mut released) = (None, None);
        for a in actions {
            match *a {
                Action::Adopt(Side::Second) => {
                    if let Some(en) = self.entries.get_mut(&i) {
                        adopt_second(i, en, w);
                    }
                }
                Action::Cancel(s) => self.abort(i, s.index(), w),
                Action::ObserveCensored { waited, .. } => late = Some(waited.as_secs_f64()),
                Action::Release(s) => released = Some(s.index()),
                Action::Adopt(Side::First)
                | Action::UndoRecord(_)
                | Action::Tried(_)
                | Action::Launch(_) => {}
            }
        }
        if let Some(c) = released {
            self.abort(i, c, w);
            let Some(en) = self.entries.get_mut(&i) else {
                return;
            };
            let backend = en.copies[c].map_or(0, |k| k.backend);
            if let Some(tr) = en.other.take() {
                w.router.on_cancel(tr, backend, late, &en.features, t);
            }
        }
    }

    /// Copy `c` of request `i` finished: no trigger may race it any more.
    fn finish(&mut self, i: usize, c: usize) {
        let Some(en) = self.entries.get_mut(&i) else {
            return;
        };
        en.race.on_finished(side(c));
        if let Some(k) = en.copies[c].as_mut() {
            k.alive = false;
        }
    }

    /// A relayed event: a first token's uncached prompt is the relayed prefill.
    fn count_relayed(&mut self, ev: &EngineEvent) {
        if let EngineEvent::FirstToken {
            prompt_tokens,
            cached_tokens,
            ..
        } = *ev
        {
            self.counts.relayed_prefill_tokens +=
                u64::from(prompt_tokens.saturating_sub(cached_tokens));
        }
    }

    /// Copy `c` of request `i` is dropped: aborted in its engine, its prefill (or what a
    /// stall held of it) counted as extra; nothing more of it is delivered.
    fn abort(&mut self, i: usize, c: usize, w: &mut World<'_>) {
        let Some(k) = self
            .entries
            .get_mut(&i)
            .and_then(|en| en.copies[c].as_mut())
        else {
            return;
        };
        if !k.alive {
            return;
        }
        k.alive = false;
        let e = i as u64 | if c == 1 { SECOND } else { 0 };
        let engine: &mut Engine = &mut w.backends[k.backend].engine;
        let stalled = self.stalls.remove(&e).map(|s| s.prefilled);
        let prefilled = engine.prefilled_tokens(e).or(stalled).unwrap_or(0);
        engine.abort(e);
        self.counts.extra_prefill_tokens += u64::from(prefilled);
    }

    /// Request `i`'s `kind` trigger is due at `t` (see the module docs).
    fn trigger(&mut self, i: usize, kind: Trigger, t: f64, w: &mut World<'_>) {
        let Some(en) = self.entries.get_mut(&i) else {
            return;
        };
        let bucket = &mut self.bucket;
        let Some(Action::Launch(kind)) = en.race.on_trigger(kind, || bucket.take()) else {
            return;
        };
        let Chooser::Policy(policy, _) = w.chooser else {
            en.race.launch_failed();
            return;
        };
        let first = en.copies[0].expect("a first copy").backend;
        let now = w.base + Duration::from_secs_f64(t);
        let residency = policy.limits_prefix_credit_to_residency();
        let tried = [BackendId(first as u64)];
        let views = w
            .router
            .views_excluding(en.replica, &en.features, t, residency, &tried)
            .to_vec();
        let Ok(d) = pronto_core::routing::decide(&**policy, &en.features, &views, now) else {
            en.race.launch_failed();
            return;
        };
        let now_race = since(en, t);
        en.race.launched(now_race);
        let b = d.index;
        w.per_backend[b] += 1;
        let tr = w.router.on_dispatch(
            en.replica,
            b,
            d.predicted_ttft_s,
            &views[b],
            &en.features,
            t,
        );
        let thinking = w.fleet[b].reasoning.map_or(0, |c| c.tokens_for(&en.ids));
        en.other = Some(tr);
        en.copies[1] = Some(Copy {
            backend: b,
            dispatched_s: t,
            reasoning_tokens: thinking,
            alive: true,
        });
        match kind {
            Trigger::Failover => self.counts.failovers += 1,
            Trigger::Hedge => self.counts.hedges += 1,
        }
        let id = i as u64 | SECOND;
        let generated = w.tracks[i].output_tokens.saturating_add(thinking);
        let engine = &mut w.backends[b].engine;
        if engine.config().block_size == BLOCK_TOKENS && !engine.logs_kv_events() {
            let hashes = en.features.block_hashes.clone().into();
            engine.add_hashed(id, en.features.prompt_tokens, hashes, generated);
        } else {
            let prompt = en.ids.clone();
            engine.add_request(SimRequest {
                id,
                prompt,
                max_tokens: generated,
            });
        }
        if w.backends[b].busy_until.is_none() {
            start_step(&mut w.backends[b], t);
        }
        self.stall_draw(b, id);
    }
}

/// Copy `c`'s side of the race.
fn side(c: usize) -> Side {
    if c == 0 {
        Side::First
    } else {
        Side::Second
    }
}

/// `t` as the race's time: since the first copy's dispatch.
fn since(en: &Entry, t: f64) -> Duration {
    let first = en.copies[0].map_or(t, |k| k.dispatched_s);
    Duration::from_secs_f64((t - first).max(0.0))
}

/// Request `i`'s second copy becomes the request: its booking (swapped with the first's, which
/// `en.other` then holds), backend, dispatch time and reasoning.
fn adopt_second(i: usize, en: &mut Entry, w: &mut World<'_>) {
    std::mem::swap(&mut w.dispatched[i], &mut en.other);
    let k = en.copies[1].expect("a second copy");
    let tr = &mut w.tracks[i];
    (tr.backend, tr.dispatched_s) = (k.backend, k.dispatched_s);
    tr.reasoning_tokens = k.reasoning_tokens;
}

/// At the end of a run every copy is gone: no request left in any engine (the losers were
/// aborted), no booking left in any replica's ledger (theirs were released). Checked in debug
/// builds (every test run), with one router (synced replicas may not have heard the last
/// releases yet).
pub(super) fn assert_drained(backends: &[Backend], router: &mut Replicas, t: f64) {
    for (i, b) in backends.iter().enumerate() {
        assert_eq!(
            b.engine.num_requests(),
            0,
            "backend {i}'s engine is not empty"
        );
    }
    let f = RequestFeatures::synthetic("m", String::new(), None);
    for v in router.views_excluding(0, &f, t, false, &[]) {
        assert_eq!(
            (v.inflight, v.outstanding_prefill_tokens),
            (0, 0),
            "the router still books on {:?}",
            v.id
        );
    }
}
