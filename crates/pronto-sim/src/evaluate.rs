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
mod run;
mod wedge;

use chooser::Chooser;
use feed::{start_step, submit};
use oracle::oracle_pick;
use run::Run;

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
