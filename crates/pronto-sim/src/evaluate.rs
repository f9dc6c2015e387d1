//! Offline evaluator: replay a trace through a simulated fleet on a virtual clock and compare
//! routing policies.
//!
//! ## Discrete-event simulation
//! Each backend is an [`Engine`] stepped independently: idle until a request arrives, then
//! busy for one step's duration, then the step's events are delivered and the next step
//! starts at once if there is work. Requests arrive at their trace times. At the same instant,
//! step ends are processed before arrivals (the router sees the freshest state). Each arrival
//! is routed by **the gateway's own decision path**: the policy (built by
//! [`PolicyKind::parse`]`(name).build()`) run by `pronto_core::routing::decide` on views from
//! the core's view builder, over the same per-backend routing state the gateway keeps
//! ([`RouterSideState`]: ledger, TTFT model, scraped engine state, prefix index), booked and
//! recorded at dispatch and observed at the first token as the gateway does. The engines'
//! `/metrics` are "scraped" from their true queues on the virtual clock, each backend on its
//! own timer as the gateway's scraper runs them: every 250 ms (the gateway's default), backend
//! `i` at phase `frac(i × 0.618…)` of the interval (`Scrapes`), so a burst after a quiet gap
//! sees samples as old as the gateway's would be, not taken at its arrival.
//! `now` is a fixed [`Instant`] plus the virtual offset. TTFT = first-token step end −
//! arrival; E2E = finish − arrival. Nothing is random: a run is a pure function of trace,
//! fleet and policy.
//!
//! ## The TTFT model's prior
//! Each backend's TTFT model starts from its engine's profile, as a gateway backend's does from
//! its `profile:` hint: the profile file's `prior:` block when it has one, else the prior its
//! timing terms imply ([`crate::profile::Profile::router_prior`]) — not the generic GPU prior
//! ([`pronto_core::predict::Coefficients::default`]) a gateway backend without a hint starts
//! from. (A gateway hint carries three of the block's five terms, `base_s`, `s_per_token` and
//! `s_per_decode`; the other two keep the generic values there.)
//!
//! ## The `oracle` policy (evaluator only)
//! Reads true engine state: for each backend it clones the engine, adds the request and steps
//! the clone until the request's first token (from the end of the step in flight, if any).
//! It picks the smallest true TTFT — with `--objective ttfa`, the smallest true TTFA: the clone
//! runs on through the request's reasoning to its first answer token. Backends are tried in
//! order of a cheap lower bound and skipped once the bound reaches the best time found (ties
//! go to the backend tried first); a clone stops stepping as soon as its time reaches the best.
//! It is the best any router could do *for this request* given the current queues — greedy,
//! not a global optimum, and it ignores how its choice delays requests already queued there.
//!
//! ## Policy parameters
//! A gateway policy name may carry its parameters as a YAML flow map, the keys of a pool's
//! `policy:` map (`predicted_ttft{decode_stall_weight: 0.3}`); they are checked as the config
//! checks them, and the report names the policy as given.
//!
//! ## `POLICY+exact`: the exact prefix index
//! Any gateway policy name with the suffix [`EXACT_SUFFIX`] (`predicted_ttft+exact`) runs that
//! policy as a gateway whose backends have `kv_events:`: each engine logs the KV events vLLM's
//! publisher would send, each router keeps a [`pronto_core::kv_index::ExactIndex`] per backend
//! fed with them — one batch per engine step, applied when the step ends, as a live engine
//! publishes it — and the views come from the shared view builder (`views::build`), which
//! takes a backend's prefix hit from its exact index while that index is live and trusted,
//! and from the approximate index otherwise, exactly as in the gateway.
//!
//! ## `--load X`
//! Capacity is the fleet's sustainable request rate for this trace's request mix:
//! for each distinct engine configuration, a closed-loop calibration run feeds up to
//! [`CALIBRATION_SAMPLE`] requests taken evenly across the trace to one fresh engine all at
//! once (the queue never empties, so the engine batches as fully as its KV cache allows) and
//! measures requests / virtual seconds to drain. The fleet's capacity is the sum over
//! backends. Arrival times are then scaled so that the offered rate (requests / trace span)
//! is `X ×` capacity. Without `--load` the trace's own timing is kept.
//!
//! ## Reasoning models
//! When the fleet file's model reasons ([`crate::reasoning`]), each request generates its
//! reasoning tokens — drawn from its prompt ids exactly as the live fleet draws them — before
//! its `output_tokens` answer tokens, on whichever backend serves it. TTFT is still the first
//! token; TTFA is the step that produced the first answer token (the first token after the
//! reasoning) − arrival. `--load` calibration counts the reasoning tokens as generated work.
//! With `--objective ttfa` every request carries the `ttfa` objective, its expected reasoning
//! length learned — as the gateway learns it per pool — from the reasoning tokens of the
//! requests finished so far ([`pronto_core::predict::ReasoningLengths`]).
//!
//! ## `--collision-repair auto|off|MARGIN`
//! Synced replicas route again what a late booking shows to be on the wrong backend
//! ([`repair`]), as the gateway does; on by default wherever the run can repair.
//!
//! ## Stall faults, failover and hedging
//! A fleet file's `stall_first_token` (with `stall_probability`, a seeded draw per backend and
//! request) holds a first token back as the live fleet does: the engine prefills and decodes on,
//! the router sees the first token `stall` after its step ended and the tokens made meanwhile
//! at once. `--first-token-deadline` / `--hedge` race a second backend as the gateway's routes
//! do; the loser is aborted and released. Details in [`race`]; without them a run is unchanged.
//!
//! ## Crash faults and stream migration
//! A fleet file's `crash_after` / `crash_every` / `restart_after` crash a backend on the
//! virtual clock; the requests it held are retried (before their first token), continued on
//! another backend with the tokens generated so far as the gateway's stream migration does
//! (`--migration N`, after their first token; a new prefill of prompt + generated), or lost
//! (an error event). Details in [`crash`]; without crash faults a run is unchanged.
//!
//! ## Wedged engines
//! A fleet file's `wedge_after` (with `wedge_for`) stops a backend's engine from stepping, as
//! the live fleet's `wedged` fault does: requests still reach it and queue, nothing is
//! produced ([`Wedge`]). The router runs the gateway's progress rule (`--stall-floor`,
//! `--stall-factor`, `--no-stall`; the gateway's `health.stall`, [`pronto_core::stall`]) in
//! the shared view builder: a backend silent past its bound is left out while it holds
//! requests, and probed one request at a time; `stall_exclusions` counts the marks. Tokens
//! reach every replica's rule. With `--first-token-deadline` the requests stuck on it fail
//! over as any late first token.
//!
//! Mooncake's conversation trace is quantised to 3 s; ties are spread over each bucket
//! ([`crate::workload::spread_ties`]) before anything else; `--arrival-seed` then re-draws the
//! gaps ([`crate::eval_args::redraw_gaps`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::engine::{Engine, EngineEvent};
pub use super::eval_args::{
    prepare_trace, EvalObjective, EvalOnMiss, EvaluateArgs, Generated, SloLimit,
};
use super::eval_replicas::{Replicas, Replication, Tracked};
use super::eval_report::RunReport;
use super::eval_router::ScrapedLoad;
use super::profile::StepWork;
use crate::workload::TraceRequest;
pub use cli::run_evaluate;
pub use crash::{CrashCounts, CrashFault, CrashPlan};
pub use fleet::{
    apply_load, engine_capacity_rps, fleet_capacity_rps, load_fleet, reasoning_capacity_rps,
    SimBackend,
};
use pronto_core::admission::Verdict;
use pronto_core::predict::{Coefficients, ReasoningLengths};
use pronto_core::request::RequestFeatures;
use pronto_core::routing::BackendView;
use pronto_core::slo::{Objective, SloTargets};
use pronto_core::tokens::{block_hashes, BLOCK_TOKENS};
pub use race::{DeadlineFlag, HedgeFlag, RaceConfig, RaceCounts, StallFault, SECOND};
pub use wedge::Wedge;

mod chooser;
mod cli;
mod crash;
mod feed;
mod fleet;
mod oracle;
pub mod race;
mod repair;
mod report;
mod wedge;

use chooser::Chooser;
use feed::{start_step, submit};
use oracle::oracle_pick;

/// Requests in a `--load` calibration run.
pub const CALIBRATION_SAMPLE: usize = 400;

/// Seconds between the router's (simulated) scrapes of engine metrics, as the gateway's default.
const SCRAPE_INTERVAL_S: f64 = 0.25;

/// Name of the evaluator-only policy that reads true engine state.
pub const ORACLE: &str = "oracle";

/// Suffix of a policy name that swaps the approximate prefix index for the exact one.
pub const EXACT_SUFFIX: &str = "+exact";

/// Policies evaluated when none is given: the baselines, the gateway's default
/// (`predicted_ttft`) and the oracle that bounds what any router could do.
pub const DEFAULT_POLICIES: &[&str] = &["round_robin", "least_inflight", "predicted_ttft", ORACLE];

#[derive(Debug, Clone, Copy)]
struct Track {
    arrival_s: f64,
    /// When the gateway sent it (its arrival, unless it was held).
    dispatched_s: f64,
    backend: usize,
    prompt_tokens: u32,
    first_token_s: Option<f64>,
    /// Reasoning tokens before the answer, and output tokens produced so far.
    reasoning_tokens: u32,
    produced: u32,
    first_answer_s: Option<f64>,
    predicted_ttft_s: Option<f64>,
    reason: Option<pronto_core::routing::Reason>,
    cached_tokens: u32,
    output_tokens: u32,
    tpot_s: Option<f64>,
    completed: bool,
}

struct Backend {
    engine: Engine,
    busy_until: Option<f64>,
    pending: Vec<EngineEvent>,
    /// Its wedge fault, if any ([`feed::start_step`] runs no step while it holds).
    wedge: Option<Wedge>,
}

/// Replay `reqs` through a fresh fleet under `policy`, one router; deterministic.
pub fn evaluate(
    fleet: &[SimBackend],
    model: &str,
    reqs: &[TraceRequest],
    policy: &str,
) -> anyhow::Result<RunReport> {
    evaluate_replicated(
        fleet,
        model,
        reqs,
        policy,
        Replication::default(),
        &SloTargets::default(),
        EvalObjective::Ttft,
    )
}

/// [`evaluate`] with the router replicated as `rep` says ([`crate::eval_replicas`]), every
/// request carrying the objectives `slo` (as a route's `ttft_slo` / `tpot_slo` would set them:
/// policies see them, and goodput is counted against them) and minimising `objective`.
pub fn evaluate_replicated(
    fleet: &[SimBackend],
    model: &str,
    reqs: &[TraceRequest],
    policy: &str,
    rep: Replication,
    slo: &SloTargets,
    objective: EvalObjective,
) -> anyhow::Result<RunReport> {
    let route = RouteSettings {
        slo: *slo,
        objective,
        races: RaceConfig::default(),
        admission: None,
    };
    evaluate_route(fleet, model, reqs, policy, rep, &route)
}

/// What every request's route asks of the router, as a gateway route would: its objectives
/// (`ttft_slo`, `tpot_slo`), what `predicted_ttft` minimises (`objective`), and its races
/// (`first_token_deadline`, `hedge`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RouteSettings {
    /// The objectives: policies see them, goodput counts against them.
    pub slo: SloTargets,
    /// `--objective`.
    pub objective: EvalObjective,
    /// `--first-token-deadline`, `--hedge`.
    pub races: RaceConfig,
    /// `--on-slo-miss`: SLO admission against `slo.ttft_s` ([`pronto_core::admission`]).
    pub admission: Option<pronto_core::admission::OnMiss>,
}

/// One run: `reqs` through a fresh fleet under `policy`, the router replicated as `rep` says,
/// every request on a route as `route` says; deterministic.
pub fn evaluate_route(
    fleet: &[SimBackend],
    model: &str,
    reqs: &[TraceRequest],
    policy: &str,
    rep: Replication,
    route: &RouteSettings,
) -> anyhow::Result<RunReport> {
    evaluate_crashing(
        fleet,
        model,
        reqs,
        policy,
        rep,
        route,
        &CrashPlan::default(),
    )
}

/// [`evaluate_route`] with the backends crashing as `plan` says ([`crash`]).
pub fn evaluate_crashing(
    fleet: &[SimBackend],
    model: &str,
    reqs: &[TraceRequest],
    policy: &str,
    rep: Replication,
    route: &RouteSettings,
    plan: &CrashPlan,
) -> anyhow::Result<RunReport> {
    let mut run = Run::new(fleet, model, reqs, policy, rep, route, plan)?;
    run.drive();
    // An engine wedged for good keeps what it held past its first token (lost streams).
    if cfg!(debug_assertions) && rep.replicas <= 1 && !Wedge::for_good(fleet) {
        race::assert_drained(&run.backends, &mut run.router, run.tally.last_finish);
    }
    Ok(run.report())
}

/// A routing decision: the backend, the policy's predicted TTFT and reason (none from the
/// oracle), and the view of the backend it was made on.
type Choice = (
    usize,
    Option<f64>,
    Option<pronto_core::routing::Reason>,
    BackendView,
);

/// How the gateway parses a request of the run: its features, with the run's objectives.
struct Parse<'a> {
    model: &'a str,
    slo: SloTargets,
    objective: EvalObjective,
    /// How long the model reasons before answering, learned as the gateway learns it.
    reasoning: ReasoningLengths,
}

impl Parse<'_> {
    /// Request `r` (prompt `ids`) as the gateway parses it, with the run's objectives.
    fn features(&self, ids: &[u32], r: &TraceRequest) -> RequestFeatures {
        let mut f = features_of(self.model, ids, r);
        f.slo = self.slo;
        if self.objective == EvalObjective::Ttfa {
            f.objective = Objective::Ttfa {
                reasoning_tokens: self.reasoning.expected(None),
            };
        }
        f
    }
}

/// One run of [`evaluate_crashing`]: the engines, the routers and what the run tallies,
/// driven event by event on the virtual clock.
struct Run<'a> {
    fleet: &'a [SimBackend],
    reqs: &'a [TraceRequest],
    policy: &'a str,
    rep: Replication,
    parse: Parse<'a>,
    /// SLO admission: what a miss does, and the TTFT objective it is checked against.
    admission: Option<(pronto_core::admission::OnMiss, f64)>,
    chooser: Chooser,
    /// `+exact`: each engine publishes its KV events, each router's exact index applies them.
    exact: bool,
    base: Instant,
    router: Replicas,
    backends: Vec<Backend>,
    /// Each request's booking and prediction inputs, while it is in flight.
    dispatched: Vec<Option<Tracked>>,
    /// Arrived, not yet routed (ids), and the head's prompt ids and features.
    queue: VecDeque<u64>,
    head: Option<(u64, Vec<u32>, RequestFeatures)>,
    /// The time of the event in hand, virtual seconds.
    clock: f64,
    /// Per backend, the KV-event publisher's sequence number.
    kv_seq: Vec<u64>,
    tracks: Vec<Track>,
    per_backend: Vec<u64>,
    /// The next request of the trace to arrive.
    next: usize,
    scrapes: Scrapes,
    race: race::Races,
    repair: Option<repair::Repair>,
    crashes: crash::Crashes,
    /// The oracle's buffer: each backend's reasoning length for the head.
    oracle_thinking: Vec<u32>,
    tally: report::Tally,
}

/// Everything of `$run` a race, a crash or a repair touches ([`race::World`]), borrowed field
/// by field so that the rest of the run stays free.
macro_rules! world {
    ($run:ident) => {
        race::World {
            router: &mut $run.router,
            backends: &mut $run.backends,
            tracks: &mut $run.tracks,
            dispatched: &mut $run.dispatched,
            per_backend: &mut $run.per_backend,
            fleet: $run.fleet,
            chooser: &$run.chooser,
            base: $run.base,
        }
    };
}

impl<'a> Run<'a> {
    /// A fresh fleet and router for `reqs` under `policy` (see [`evaluate_crashing`]).
    fn new(
        fleet: &'a [SimBackend],
        model: &'a str,
        reqs: &'a [TraceRequest],
        policy: &'a str,
        rep: Replication,
        route: &RouteSettings,
        plan: &CrashPlan,
    ) -> anyhow::Result<Run<'a>> {
        let RouteSettings {
            ref slo,
            objective,
            ref races,
            admission,
        } = *route;
        // SLO admission applies with a TTFT objective, as on a route with `ttft_slo`.
        let admission = admission.zip(slo.ttft_s);
        anyhow::ensure!(!fleet.is_empty(), "the fleet has no backends");
        let chooser = Chooser::of(policy)?;
        let names: Vec<&str> = fleet.iter().map(|b| b.name.as_str()).collect();
        let capacities: Vec<Option<u64>> = fleet
            .iter()
            .map(|b| Some((b.config.num_kv_blocks * b.config.block_size) as u64))
            .collect();
        // Each TTFT model starts from its engine's profile prior (see the module docs).
        let priors: Vec<Coefficients> = fleet
            .iter()
            .map(|b| b.config.profile.router_prior().coefficients())
            .collect();
        let base = Instant::now();
        let exact = matches!(chooser, Chooser::Policy(_, true));
        let block_sizes: Vec<usize> = fleet.iter().map(|b| b.config.block_size).collect();
        let mut router = Replicas::new(
            &names,
            &capacities,
            &priors,
            base,
            rep,
            exact.then_some(&block_sizes[..]),
        );
        router.set_stall_rule(races.stall);
        let backends: Vec<Backend> = fleet
            .iter()
            .map(|b| {
                let mut engine = Engine::new(b.config.clone());
                if exact {
                    engine.enable_kv_events();
                }
                Backend {
                    engine,
                    busy_until: None,
                    pending: Vec::new(),
                    wedge: b.wedge,
                }
            })
            .collect();
        let race = race::Races::new(*races, fleet, matches!(chooser, Chooser::Policy(..)));
        let repair = repair::Repair::new(&rep, &chooser, races, fleet)?;
        let mut faults = plan.faults.clone();
        faults.resize(fleet.len(), None);
        let crashes = crash::Crashes::new(faults, plan.migration);
        anyhow::ensure!(
            !crashes.any()
                || (matches!(chooser, Chooser::Policy(..))
                    && *races == RaceConfig::default()
                    && rep.replicas <= 1),
            "{policy}: crash faults are modelled for one router running a gateway policy, without \
             first-token races (not the oracle)"
        );
        if repair.is_some() {
            router.collect_collisions();
        }
        Ok(Run {
            fleet,
            reqs,
            policy,
            rep,
            parse: Parse {
                model,
                slo: *slo,
                objective,
                reasoning: ReasoningLengths::default(),
            },
            admission,
            chooser,
            exact,
            base,
            router,
            backends,
            dispatched: (0..reqs.len()).map(|_| None).collect(),
            queue: VecDeque::new(),
            head: None,
            clock: 0.0,
            kv_seq: vec![0; fleet.len()],
            tracks: Vec::with_capacity(reqs.len()),
            per_backend: vec![0; fleet.len()],
            next: 0,
            scrapes: Scrapes::new(fleet.len()),
            race,
            repair,
            crashes,
            oracle_thinking: Vec::new(),
            tally: report::Tally::new(reqs.len()),
        })
    }

    /// Every event of the run in time order, each followed by the routing of the gateway's
    /// queue, until nothing is left to happen.
    fn drive(&mut self) {
        loop {
            let step_end = self.next_step_end();
            let arrival = self.reqs.get(self.next).map(|r| r.arrival_s);
            // A crash due before the next event (and while work remains) happens first.
            let due = self.crashes.next_at().filter(|&(c, _)| {
                let work = step_end.is_some() || arrival.is_some();
                work && step_end.is_none_or(|s| c <= s.0) && arrival.is_none_or(|a| c <= a)
            });
            if let Some((c, b)) = due {
                self.crash(b, c);
                continue;
            }
            match (step_end, arrival) {
                (None, None) => break,
                (Some((t, b, raced)), a) if a.is_none_or(|a| t <= a) => self.step_end(b, t, raced),
                (_, Some(t)) => self.arrive(t),
                (Some(_), None) => unreachable!("handled by the step-end arm"),
            }
            self.route_queue();
        }
    }

    /// The next step end, `(time, backend, raced)`: the earliest engine step to end, or a held
    /// event or a race trigger (`raced`) due before it — after the step ends of its instant.
    fn next_step_end(&self) -> Option<(f64, usize, bool)> {
        let step_end = self
            .backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.busy_until.map(|t| (t, i, false)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        match self.race.next_at() {
            Some((t, b)) if step_end.is_none_or(|s| t < s.0) => Some((t, b, true)),
            _ => step_end,
        }
    }

    /// Backend `b` crashes at `c` ([`crash::Crashes::crash`]).
    fn crash(&mut self, b: usize, c: f64) {
        self.clock = c;
        self.scrapes
            .due(&mut self.router, &self.backends, self.base, c);
        let (reqs, model) = (self.reqs, self.parse.model);
        self.crashes.crash(b, c, reqs, model, &mut world!(self));
    }

    /// Backend `b`'s step ended at `t` (`raced`: a held event or a race trigger is due then):
    /// its events are delivered, and its next step starts.
    fn step_end(&mut self, b: usize, t: f64, raced: bool) {
        self.clock = t;
        self.router.deliver_until(t);
        self.scrapes
            .due(&mut self.router, &self.backends, self.base, t);
        let mut w = world!(self);
        let mut events = match raced {
            true => self.race.fire(t, &mut w),
            false => std::mem::take(&mut w.backends[b].pending),
        };
        self.race.admit(b, t, &mut events, &mut w);
        for ev in events {
            self.on_event(b, t, ev);
        }
        if !raced {
            self.publish_kv_events(b, t);
            start_step(&mut self.backends[b], t);
        }
        // After the step's events: a first token that arrived at `t` is not undone.
        self.repair(t);
    }

    /// One event of backend `b`'s engine, delivered at `t`.
    fn on_event(&mut self, b: usize, t: f64, ev: EngineEvent) {
        match ev {
            EngineEvent::FirstToken { id, .. } if self.crashes.is_continuation(id) => {
                // A migrated stream's continuation: one more token for the client, the end of
                // its booking's prefill for the router.
                let tr = &mut self.tracks[id as usize];
                tr.produced += 1;
                if let Some(d) = self.dispatched[id as usize].as_mut() {
                    self.router.on_first_token(d, b, t - tr.dispatched_s, t);
                }
            }
            EngineEvent::FirstToken {
                id, cached_tokens, ..
            } => {
                let tr = &mut self.tracks[id as usize];
                debug_assert!(tr.first_token_s.is_none(), "request {id}: two first tokens");
                tr.first_token_s = Some(t);
                tr.cached_tokens = cached_tokens;
                self.tally.ttft.push(t - tr.arrival_s);
                tr.produced = 1;
                if tr.reasoning_tokens == 0 {
                    tr.first_answer_s = Some(t);
                    self.tally.ttfa.push(t - tr.arrival_s);
                }
                self.tally.hit_tokens += u64::from(cached_tokens);
                self.tally.prompt_tokens += u64::from(tr.prompt_tokens);
                self.router.on_progress(b, t);
                if let Some(d) = self.dispatched[id as usize].as_mut() {
                    self.router.on_first_token(d, b, t - tr.dispatched_s, t);
                }
            }
            EngineEvent::Token { id } => {
                self.router.on_progress(b, t);
                let tr = &mut self.tracks[id as usize];
                tr.produced += 1;
                // Token number reasoning + 1 is the first of the answer.
                if tr.produced == tr.reasoning_tokens + 1 {
                    tr.first_answer_s = Some(t);
                    self.tally.ttfa.push(t - tr.arrival_s);
                }
            }
            EngineEvent::Finished { id, output_tokens } => self.finished(b, t, id, output_tokens),
        }
    }

    /// Request `id` finished on backend `b` at `t` with `output_tokens` (0: rejected).
    fn finished(&mut self, b: usize, t: f64, id: u64, output_tokens: u32) {
        let tr = &mut self.tracks[id as usize];
        // A continuation's output comes after what was relayed before it.
        let output_tokens = match self.crashes.is_continuation(id) {
            true if output_tokens > 0 => tr.produced,
            _ => output_tokens,
        };
        tr.tpot_s = match tr.first_token_s {
            Some(f) if output_tokens >= 2 => Some((t - f) / f64::from(output_tokens - 1)),
            _ => None,
        };
        tr.completed = output_tokens > 0;
        if tr.completed {
            self.parse.reasoning.observe(None, tr.reasoning_tokens);
        }
        let (tr, tpot) = (*tr, tr.tpot_s);
        if let Some(d) = self.dispatched[id as usize].take() {
            self.router.on_finish(d, b, tpot, t);
        }
        if output_tokens == 0 {
            self.tally.rejected += 1;
        } else {
            self.tally.e2e.push(t - tr.arrival_s);
            self.tally.last_finish = self.tally.last_finish.max(t);
        }
    }

    /// The step of backend `b` that ended at `t` published its KV events (a live engine sends
    /// them when the step ends); with `+exact` the routers' exact indexes apply them now.
    fn publish_kv_events(&mut self, b: usize, t: f64) {
        if !self.exact {
            return;
        }
        let events = self.backends[b].engine.take_kv_events();
        if !events.is_empty() {
            self.kv_seq[b] += 1;
            let batch = pronto_core::kv_index::EventBatch {
                seq: self.kv_seq[b],
                ts: t,
                events,
                dp_rank: None,
            };
            self.router.apply_kv_events(b, &batch);
        }
    }

    /// Collision repair, when on, of what the messages delivered by `t` reveal.
    fn repair(&mut self, t: f64) {
        if let Some(rp) = self.repair.as_mut() {
            let parse = &self.parse;
            let features_for = |ids: &[u32], r: &TraceRequest| parse.features(ids, r);
            rp.run(&mut world!(self), self.reqs, &features_for, t);
        }
    }

    /// The next request of the trace arrives at `t` and joins the gateway's queue.
    fn arrive(&mut self, t: f64) {
        self.clock = t;
        self.router.deliver_until(t);
        self.repair(t);
        self.scrapes
            .due(&mut self.router, &self.backends, self.base, t);
        let r = &self.reqs[self.next];
        self.tracks.push(Track {
            arrival_s: t,
            dispatched_s: t,
            backend: usize::MAX,
            prompt_tokens: r.input_tokens,
            first_token_s: None,
            reasoning_tokens: 0,
            produced: 0,
            first_answer_s: None,
            predicted_ttft_s: None,
            reason: None,
            cached_tokens: 0,
            output_tokens: r.output_tokens,
            tpot_s: None,
            completed: false,
        });
        self.queue.push_back(self.next as u64);
        self.next += 1;
    }

    /// The gateway's queue, head first: every request is routed at once, unless SLO admission
    /// holds the head back (and the rest behind it).
    fn route_queue(&mut self) {
        while let Some(&id) = self.queue.front() {
            let i = id as usize;
            self.parse_head(id);
            let t = self.tracks[i].arrival_s.max(self.clock);
            let replica = self.router.pick(i);
            let chosen = self.choose(id, replica, t);
            let Some(chosen) = self.admit(chosen, i, t) else {
                break;
            };
            self.queue.pop_front();
            self.race.earn();
            let (_, ids, features) = self.head.take().expect("parsed above");
            match chosen {
                Some(c) => self.dispatch(id, replica, c, ids, features, t),
                None => self.tally.shed += 1,
            }
        }
    }

    /// The queue's head `id`, parsed once (a head that waits keeps its parse).
    fn parse_head(&mut self, id: u64) {
        if self.head.as_ref().is_none_or(|h| h.0 != id) {
            let r = &self.reqs[id as usize];
            let mut v = Vec::new();
            r.prompt_ids(id, &mut v);
            let f = self.parse.features(&v, r);
            self.head = Some((id, v, f));
        }
    }

    /// Where the head `id` goes from replica `replica` at `t`, by the policy (the gateway's
    /// decision path) or the oracle; `None`: no backend is eligible.
    fn choose(&mut self, id: u64, replica: usize, t: f64) -> Option<Choice> {
        let r = &self.reqs[id as usize];
        let (_, ids, features) = self.head.as_ref().expect("parsed by parse_head");
        let now = self.base + Duration::from_secs_f64(t);
        let residency = match &self.chooser {
            Chooser::Policy(p, _) => p.limits_prefix_credit_to_residency(),
            Chooser::Oracle => true,
        };
        let down = self.crashes.down_at(t);
        let views = match down.is_empty() {
            true => self.router.router(replica).views(features, now, residency),
            false => self
                .router
                .views_excluding(replica, features, t, residency, &down),
        };
        match &self.chooser {
            Chooser::Oracle => {
                // With the TTFA objective the oracle times the first answer token.
                let thinking = (self.parse.objective == EvalObjective::Ttfa).then(|| {
                    self.oracle_thinking.clear();
                    let per = self
                        .fleet
                        .iter()
                        .map(|f| f.reasoning.map_or(0, |c| c.tokens_for(ids)));
                    self.oracle_thinking.extend(per);
                    &self.oracle_thinking[..]
                });
                let b = oracle_pick(&self.backends, ids, id, r, t, thinking);
                Some((b, None, None, views[b]))
            }
            Chooser::Policy(p, _) => pronto_core::routing::decide(&**p, features, views, now)
                .ok()
                .map(|d| (d.index, d.predicted_ttft_s, Some(d.reason), views[d.index])),
        }
    }

    /// SLO admission of request `i`'s `chosen` at `t`, by the gateway's rules: the queue is
    /// first-come first-served (one class), so nothing waits ahead of its head. `None`: the
    /// head waits; `Some(None)`: it is shed.
    fn admit(&self, chosen: Option<Choice>, i: usize, t: f64) -> Option<Option<Choice>> {
        let Some((on, slo_s)) = self.admission else {
            return Some(chosen);
        };
        let decided = chosen.as_ref().map(|c| c.1);
        let missed = pronto_core::admission::miss(false, decided, slo_s);
        let expired = t >= self.tracks[i].arrival_s + slo_s;
        let eligible = chosen.is_some();
        match pronto_core::admission::on_miss(missed.map(|m| m.0), on, expired, eligible) {
            Verdict::Send => Some(chosen),
            Verdict::Wait => None,
            Verdict::Shed(_) | Verdict::Fallback => Some(None),
        }
    }

    /// Send request `id` (prompt `ids`, `features`) where `choice` says, from replica
    /// `replica` at `t`: booked by the router, planned by the races, fed to the engine.
    fn dispatch(
        &mut self,
        id: u64,
        replica: usize,
        choice: Choice,
        mut ids: Vec<u32>,
        mut features: RequestFeatures,
        t: f64,
    ) {
        let (i, r) = (id as usize, &self.reqs[id as usize]);
        let (b, predicted, reason, view) = choice;
        // The served model's reasoning, drawn from the prompt as the live fleet does.
        let thinking = self.fleet[b].reasoning.map_or(0, |c| c.tokens_for(&ids));
        let generated = r.output_tokens.saturating_add(thinking);
        let tr = &mut self.tracks[i];
        (tr.backend, tr.predicted_ttft_s, tr.reason) = (b, predicted, reason);
        tr.reasoning_tokens = thinking;
        tr.dispatched_s = t;
        self.crashes.dispatched(tr.prompt_tokens);
        self.per_backend[b] += 1;
        let booked = self
            .router
            .on_dispatch(replica, b, predicted, &view, &features, t);
        self.dispatched[i] = Some(booked);
        let expected = self.parse.reasoning.expected(None);
        self.race.on_dispatch(
            i, b, replica, predicted, &view, &features, &ids, thinking, expected, t,
        );
        if let Some(rp) = self.repair.as_mut() {
            rp.dispatched(replica, i, t);
        }
        submit(
            &mut self.backends[b],
            id,
            r,
            &mut features,
            &mut ids,
            generated,
            t,
        );
    }
}

/// The gateway's scrapes of the backends' `/metrics` on the virtual clock: backend `i` every
/// [`SCRAPE_INTERVAL_S`] at its own phase, `frac(i × φ⁻¹)` of the interval (a low-discrepancy
/// spread: the gateway's per-backend timers are not aligned with each other or with arrivals).
struct Scrapes {
    /// When each backend is next due.
    next: Vec<f64>,
}

impl Scrapes {
    fn new(backends: usize) -> Scrapes {
        let phase = |i: usize| (i as f64 * 0.618_033_988_749_895).fract() * SCRAPE_INTERVAL_S;
        Scrapes {
            next: (0..backends).map(phase).collect(),
        }
    }

    /// Before the events of `t`: each backend due by `t` is scraped once, at its latest due
    /// time — its engine's state has not changed since the last event, so that sample is what
    /// the scrape would have read then, and the earlier ones are superseded.
    fn due(&mut self, router: &mut Replicas, backends: &[Backend], base: Instant, t: f64) {
        for (i, b) in backends.iter().enumerate() {
            let next = self.next[i];
            if next > t {
                continue;
            }
            let at = next + ((t - next) / SCRAPE_INTERVAL_S).floor() * SCRAPE_INTERVAL_S;
            self.next[i] = at + SCRAPE_INTERVAL_S;
            let st = b.engine.stats();
            let load = ScrapedLoad {
                waiting: st.waiting as f64,
                running: st.running as f64,
                kv_usage: st.kv_usage,
            };
            router.on_scrape(i, load, base + Duration::from_secs_f64(at));
        }
    }
}

/// What the gateway would parse from this request (prompt text omitted: it is never read by
/// routing; the token count and block hashes are exactly what the parser would produce for the
/// synthetic text of these ids).
fn features_of(model: &str, ids: &[u32], r: &TraceRequest) -> RequestFeatures {
    let mut f = RequestFeatures::synthetic(model, String::new(), Some(r.output_tokens));
    f.prompt_tokens = r.input_tokens;
    f.block_hashes = block_hashes(ids, BLOCK_TOKENS);
    f.session_key = r.session.map(|s| s.to_string());
    f
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::engine::EngineConfig;
    use crate::profile::Profile;

    /// Coefficients as a prior's fields, in its file order.
    fn fields(c: Coefficients) -> [f64; 5] {
        [
            c.base_s,
            c.s_per_token,
            c.s_per_token_sq,
            c.s_per_decode,
            c.s_per_waiting,
        ]
    }

    /// Every replica's TTFT model of each backend starts from the backend's profile prior, as
    /// a gateway backend's does from its `profile:` hint: the file's `prior:` block where it has
    /// one (cpu-tiny), else what the timing terms imply (the built-in GPU profiles have none) —
    /// not the generic prior.
    #[test]
    fn each_ttft_model_starts_from_its_profiles_prior() {
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/sim/cpu-tiny.yaml");
        let tiny = Profile::load(&tiny).unwrap();
        let written = tiny.prior.expect("cpu-tiny carries its prior");
        let h100 = Profile::builtin("h100-llama3-8b").unwrap();
        let a100 = Profile::builtin("a100-llama3-8b").unwrap();
        assert!(h100.prior.is_none() && a100.prior.is_none());
        let want = [h100.ttft_prior(), a100.ttft_prior(), written];
        let fleet: Vec<SimBackend> = [h100, a100, tiny]
            .into_iter()
            .enumerate()
            .map(|(i, p)| SimBackend::new(format!("b{i}"), EngineConfig::from_profile(p)))
            .collect();
        let rep = Replication {
            replicas: 2,
            ..Replication::default()
        };
        let route = RouteSettings::default();
        let mut run = Run::new(
            &fleet,
            "m",
            &[],
            "predicted_ttft",
            rep,
            &route,
            &CrashPlan::default(),
        )
        .unwrap();
        let f = RequestFeatures::synthetic("m", String::new(), None);
        for replica in 0..2 {
            let views = run.router.router(replica).views(&f, run.base, false);
            assert_eq!(views.len(), want.len());
            for (v, prior) in views.iter().zip(want) {
                let c = v.ttft_model.expect("a TTFT model").coefficients;
                // The model keeps its coefficients scaled: they come back to within rounding.
                let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
                let (got, want) = (fields(c), prior.fields().map(|(_, v)| v));
                assert!(
                    got.iter().zip(want).all(|(&a, b)| close(a, b)),
                    "replica {replica}, {:?}: {c:?}, not the prior {prior:?}",
                    v.id
                );
            }
        }
    }
}
