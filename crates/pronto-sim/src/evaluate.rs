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
use super::eval_report::{percentile, tpot_and_goodput, RequestOutcome, RunReport};
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
use pronto_core::predict::ReasoningLengths;
use pronto_core::request::RequestFeatures;
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
    let mut oracle_thinking: Vec<u32> = Vec::new();
    let names: Vec<&str> = fleet.iter().map(|b| b.name.as_str()).collect();
    let capacities: Vec<Option<u64>> = fleet
        .iter()
        .map(|b| Some((b.config.num_kv_blocks * b.config.block_size) as u64))
        .collect();
    let base = Instant::now();
    // `+exact`: each engine publishes its KV events, each router's exact index applies them.
    let exact = matches!(chooser, Chooser::Policy(_, true));
    let block_sizes: Vec<usize> = fleet.iter().map(|b| b.config.block_size).collect();
    let mut router = Replicas::new(
        &names,
        &capacities,
        base,
        rep,
        exact.then_some(&block_sizes[..]),
    );
    router.set_stall_rule(races.stall);
    // Each request's booking and prediction inputs, while it is in flight.
    let mut dispatched: Vec<Option<Tracked>> = (0..reqs.len()).map(|_| None).collect();
    // Arrived, not yet routed (ids), and the head's prompt ids and features.
    let mut queue: VecDeque<u64> = VecDeque::new();
    let mut head: Option<(u64, Vec<u32>, RequestFeatures)> = None;
    let mut clock: f64;
    let mut backends: Vec<Backend> = fleet
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
    // Per backend, the KV-event publisher's sequence number.
    let mut kv_seq = vec![0u64; fleet.len()];
    let mut tracks: Vec<Track> = Vec::with_capacity(reqs.len());
    let mut ttft = Vec::with_capacity(reqs.len());
    let mut ttfa = Vec::with_capacity(reqs.len());
    let mut e2e = Vec::with_capacity(reqs.len());
    let mut per_backend = vec![0u64; fleet.len()];
    let (mut shed, mut rejected) = (0u64, 0u64);
    let (mut hit_tokens, mut prompt_tokens) = (0u64, 0u64);
    let mut last_finish = 0.0f64;
    let mut next = 0usize;
    let mut scrapes = Scrapes::new(fleet.len());
    // How long the model reasons before answering, learned as the gateway learns it.
    let reasoning = ReasoningLengths::default();
    let mut race = race::Races::new(*races, fleet, matches!(chooser, Chooser::Policy(..)));
    let mut repair = repair::Repair::new(&rep, &chooser, races, fleet)?;
    let mut faults = plan.faults.clone();
    faults.resize(fleet.len(), None);
    let mut crashes = crash::Crashes::new(faults, plan.migration);
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
    macro_rules! world {
        () => {
            race::World {
                router: &mut router,
                backends: &mut backends,
                tracks: &mut tracks,
                dispatched: &mut dispatched,
                per_backend: &mut per_backend,
                fleet,
                chooser: &chooser,
                base,
            }
        };
    }
    // A request's features as the gateway parses them, with the run's objectives.
    let features_for = |ids: &[u32], r: &TraceRequest| {
        let mut f = features_of(model, ids, r);
        f.slo = *slo;
        if objective == EvalObjective::Ttfa {
            f.objective = Objective::Ttfa {
                reasoning_tokens: reasoning.expected(None),
            };
        }
        f
    };
    loop {
        let step_end = backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.busy_until.map(|t| (t, i, false)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        // A held event or a race trigger, after the step ends of its instant.
        let step_end = match race.next_at() {
            Some((t, b)) if step_end.is_none_or(|s| t < s.0) => Some((t, b, true)),
            _ => step_end,
        };
        let arrival = reqs.get(next).map(|r| r.arrival_s);
        // A crash due before the next event (and while work remains) happens first.
        let due = crashes.next_at().filter(|&(c, _)| {
            let work = step_end.is_some() || arrival.is_some();
            work && step_end.is_none_or(|s| c <= s.0) && arrival.is_none_or(|a| c <= a)
        });
        if let Some((c, b)) = due {
            clock = c;
            scrapes.due(&mut router, &backends, base, c);
            crashes.crash(b, c, reqs, model, &mut world!());
            let _ = clock;
            continue;
        }
        match (step_end, arrival) {
            (None, None) => break,
            (Some((t, b, raced)), a) if a.is_none_or(|a| t <= a) => {
                clock = t;
                router.deliver_until(t);
                scrapes.due(&mut router, &backends, base, t);
                let mut w = world!();
                let mut events = match raced {
                    true => race.fire(t, &mut w),
                    false => std::mem::take(&mut w.backends[b].pending),
                };
                race.admit(b, t, &mut events, &mut w);
                for ev in events {
                    match ev {
                        EngineEvent::FirstToken { id, .. } if crashes.is_continuation(id) => {
                            // A migrated stream's continuation: one more token for the client,
                            // the end of its booking's prefill for the router.
                            let tr = &mut tracks[id as usize];
                            tr.produced += 1;
                            if let Some(d) = dispatched[id as usize].as_mut() {
                                router.on_first_token(d, b, t - tr.dispatched_s, t);
                            }
                        }
                        EngineEvent::FirstToken {
                            id, cached_tokens, ..
                        } => {
                            let tr = &mut tracks[id as usize];
                            debug_assert!(
                                tr.first_token_s.is_none(),
                                "request {id}: two first tokens"
                            );
                            tr.first_token_s = Some(t);
                            tr.cached_tokens = cached_tokens;
                            ttft.push(t - tr.arrival_s);
                            tr.produced = 1;
                            if tr.reasoning_tokens == 0 {
                                tr.first_answer_s = Some(t);
                                ttfa.push(t - tr.arrival_s);
                            }
                            hit_tokens += u64::from(cached_tokens);
                            prompt_tokens += u64::from(tr.prompt_tokens);
                            router.on_progress(b, t);
                            if let Some(d) = dispatched[id as usize].as_mut() {
                                router.on_first_token(d, b, t - tr.dispatched_s, t);
                            }
                        }
                        EngineEvent::Token { id } => {
                            router.on_progress(b, t);
                            let tr = &mut tracks[id as usize];
                            tr.produced += 1;
                            // Token number reasoning + 1 is the first of the answer.
                            if tr.produced == tr.reasoning_tokens + 1 {
                                tr.first_answer_s = Some(t);
                                ttfa.push(t - tr.arrival_s);
                            }
                        }
                        EngineEvent::Finished { id, output_tokens } => {
                            let tr = &mut tracks[id as usize];
                            // A continuation's output comes after what was relayed before it.
                            let output_tokens = match crashes.is_continuation(id) {
                                true if output_tokens > 0 => tr.produced,
                                _ => output_tokens,
                            };
                            tr.tpot_s = match tr.first_token_s {
                                Some(f) if output_tokens >= 2 => {
                                    Some((t - f) / f64::from(output_tokens - 1))
                                }
                                _ => None,
                            };
                            tr.completed = output_tokens > 0;
                            if tr.completed {
                                reasoning.observe(None, tr.reasoning_tokens);
                            }
                            let (tr, tpot) = (*tr, tr.tpot_s);
                            if let Some(d) = dispatched[id as usize].take() {
                                router.on_finish(d, b, tpot, t);
                            }
                            if output_tokens == 0 {
                                rejected += 1;
                            } else {
                                e2e.push(t - tr.arrival_s);
                                last_finish = last_finish.max(t);
                            }
                        }
                    }
                }
                if !raced {
                    // The step that ended published its KV events (a live engine sends them
                    // when the step ends); the routers' exact indexes apply them now.
                    if exact {
                        let events = backends[b].engine.take_kv_events();
                        if !events.is_empty() {
                            kv_seq[b] += 1;
                            let batch = pronto_core::kv_index::EventBatch {
                                seq: kv_seq[b],
                                ts: t,
                                events,
                                dp_rank: None,
                            };
                            router.apply_kv_events(b, &batch);
                        }
                    }
                    start_step(&mut backends[b], t);
                }
                // After the step's events: a first token that arrived at `t` is not undone.
                if let Some(rp) = repair.as_mut() {
                    rp.run(&mut world!(), reqs, &features_for, t);
                }
            }
            (_, Some(t)) => {
                clock = t;
                router.deliver_until(t);
                if let Some(rp) = repair.as_mut() {
                    rp.run(&mut world!(), reqs, &features_for, t);
                }
                scrapes.due(&mut router, &backends, base, t);
                let r = &reqs[next];
                tracks.push(Track {
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
                queue.push_back(next as u64);
                next += 1;
            }
            (Some(_), None) => unreachable!("handled by the step-end arm"),
        }
        // The gateway's queue, head first: every request is routed at once.
        while let Some(&id) = queue.front() {
            let i = id as usize;
            let r = &reqs[i];
            if head.as_ref().is_none_or(|h| h.0 != id) {
                let mut v = Vec::new();
                r.prompt_ids(id, &mut v);
                let f = features_for(&v, r);
                head = Some((id, v, f));
            }
            let t = tracks[i].arrival_s.max(clock);
            let (_, ids, features) = head.as_mut().expect("set above");
            let now = base + Duration::from_secs_f64(t);
            let residency = match &chooser {
                Chooser::Policy(p, _) => p.limits_prefix_credit_to_residency(),
                Chooser::Oracle => true,
            };
            let replica = router.pick(i);
            let down = crashes.down_at(t);
            let views = match down.is_empty() {
                true => router.router(replica).views(features, now, residency),
                false => router.views_excluding(replica, features, t, residency, &down),
            };
            let chosen = match &chooser {
                Chooser::Oracle => {
                    // With the TTFA objective the oracle times the first answer token.
                    let thinking = (objective == EvalObjective::Ttfa).then(|| {
                        oracle_thinking.clear();
                        let per = fleet
                            .iter()
                            .map(|f| f.reasoning.map_or(0, |c| c.tokens_for(ids)));
                        oracle_thinking.extend(per);
                        &oracle_thinking[..]
                    });
                    let b = oracle_pick(&backends, ids, id, r, t, thinking);
                    Some((b, None, None, views[b]))
                }
                Chooser::Policy(p, _) => pronto_core::routing::decide(&**p, features, views, now)
                    .ok()
                    .map(|d| (d.index, d.predicted_ttft_s, Some(d.reason), views[d.index])),
            };
            // SLO admission, by the gateway's rules: the queue is first-come first-served (one
            // class), so nothing waits ahead of its head; a waiting head holds the rest back.
            let chosen = match admission {
                Some((on, slo_s)) => {
                    let decided = chosen.as_ref().map(|c| c.1);
                    let missed = pronto_core::admission::miss(false, decided, slo_s);
                    let expired = t >= tracks[i].arrival_s + slo_s;
                    let eligible = chosen.is_some();
                    match pronto_core::admission::on_miss(
                        missed.map(|m| m.0),
                        on,
                        expired,
                        eligible,
                    ) {
                        Verdict::Send => chosen,
                        Verdict::Wait => break,
                        Verdict::Shed(_) | Verdict::Fallback => None,
                    }
                }
                None => chosen,
            };
            queue.pop_front();
            race.earn();
            let (_, mut ids, mut features) = head.take().expect("set above");
            let Some((b, predicted, reason, view)) = chosen else {
                shed += 1;
                continue;
            };
            // The served model's reasoning, drawn from the prompt as the live fleet does.
            let thinking = fleet[b].reasoning.map_or(0, |c| c.tokens_for(&ids));
            let generated = r.output_tokens.saturating_add(thinking);
            let tr = &mut tracks[i];
            (tr.backend, tr.predicted_ttft_s, tr.reason) = (b, predicted, reason);
            tr.reasoning_tokens = thinking;
            tr.dispatched_s = t;
            crashes.dispatched(tr.prompt_tokens);
            per_backend[b] += 1;
            dispatched[i] = Some(router.on_dispatch(replica, b, predicted, &view, &features, t));
            let expected = reasoning.expected(None);
            race.on_dispatch(
                i, b, replica, predicted, &view, &features, &ids, thinking, expected, t,
            );
            if let Some(rp) = repair.as_mut() {
                rp.dispatched(replica, i, t);
            }
            submit(
                &mut backends[b],
                id,
                r,
                &mut features,
                &mut ids,
                generated,
                t,
            );
        }
    }
    // An engine wedged for good keeps what it held past its first token (lost streams).
    if cfg!(debug_assertions) && rep.replicas <= 1 && !Wedge::for_good(fleet) {
        race::assert_drained(&backends, &mut router, last_finish);
    }
    let preemptions = backends
        .iter()
        .map(|b| b.engine.stats().preemptions_total)
        .sum();
    let first_arrival = reqs.first().map_or(0.0, |r| r.arrival_s);
    let span = last_finish - first_arrival;
    let ms = |v: f64| v * 1e3;
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let ttft_mean = mean(&ttft);
    let ttfa_mean = mean(&ttfa);
    let e2e_mean = mean(&e2e);
    ttft.sort_by(f64::total_cmp);
    ttfa.sort_by(f64::total_cmp);
    let started: Vec<f64> = tracks
        .iter()
        .filter(|t| t.first_token_s.is_some())
        .map(|t| f64::from(t.reasoning_tokens))
        .collect();
    e2e.sort_by(f64::total_cmp);
    let outcomes: Vec<RequestOutcome> = tracks
        .iter()
        .map(|t| RequestOutcome {
            arrival_s: t.arrival_s,
            prompt_tokens: t.prompt_tokens,
            backend: (t.backend != usize::MAX).then_some(t.backend),
            predicted_ttft_s: t.predicted_ttft_s,
            reason: t.reason,
            cached_tokens: t.cached_tokens,
            ttft_s: t.first_token_s.map(|f| f - t.arrival_s),
            ttfa_s: t.first_answer_s.map(|f| f - t.arrival_s),
            tpot_s: t.tpot_s,
            output_tokens: t.output_tokens,
            completed: t.completed,
        })
        .collect();
    let ([tpot_p50, tpot_p90, tpot_p99], goodput) = tpot_and_goodput(&outcomes, slo);
    Ok(RunReport {
        policy: policy.to_string(),
        requests: reqs.len() as u64,
        completed: e2e.len() as u64,
        ttft_mean_ms: ms(ttft_mean),
        ttft_p50_ms: ms(percentile(&ttft, 0.50)),
        ttft_p90_ms: ms(percentile(&ttft, 0.90)),
        ttft_p99_ms: ms(percentile(&ttft, 0.99)),
        ttfa_mean_ms: ms(ttfa_mean),
        ttfa_p99_ms: ms(percentile(&ttfa, 0.99)),
        reasoning_tokens_mean: mean(&started),
        tpot_p50_ms: tpot_p50,
        tpot_p90_ms: tpot_p90,
        tpot_p99_ms: tpot_p99,
        ttft_slo_ms: slo.ttft_s.map(ms),
        tpot_slo_ms: slo.tpot_s.map(ms),
        goodput_requests: goodput.request_share(),
        goodput_tokens: goodput.token_share(),
        e2e_mean_ms: ms(e2e_mean),
        e2e_p99_ms: ms(percentile(&e2e, 0.99)),
        throughput_rps: if span > 0.0 {
            e2e.len() as f64 / span
        } else {
            0.0
        },
        prefix_hit_rate: if prompt_tokens > 0 {
            hit_tokens as f64 / prompt_tokens as f64
        } else {
            0.0
        },
        per_backend: router
            .names()
            .zip(per_backend)
            .map(|(n, c)| (n.to_string(), c))
            .collect(),
        shed,
        rejected,
        preemptions,
        replicas: rep.replicas.max(1) as u32,
        sync: rep.sync.to_string(),
        sync_bytes_per_request: router.sync_bytes() as f64 / reqs.len().max(1) as f64,
        races: RaceCounts {
            stall_exclusions: router.stall_exclusions(),
            ..race.counts
        }
        .into(),
        collision_repair_margin: repair.as_ref().map(|rp| rp.margin()),
        collision_repairs: repair.map_or(0, |rp| rp.moves),
        crashes: crashes.counts,
        outcomes,
    })
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
