//! `pronto evaluate`'s arguments and the workload they select: a trace file or a generated
//! workload, `--limit`, tie spreading, `--arrival-seed` and `--load` ([`prepare_trace`]), the
//! objectives every request carries ([`EvaluateArgs::slo`]) and the router replication.

use std::path::PathBuf;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::eval_replicas::{RepairSetting, Replication, Spread, SyncMode};
use super::evaluate::{
    apply_load, DeadlineFlag, HedgeFlag, RaceConfig, SimBackend, DEFAULT_POLICIES,
};
use crate::workload::{self as trace, spread_ties, SyntheticWorkload, TraceFormat, TraceRequest};
use crate::workload_agentic::AgenticWorkload;
use pronto_core::race::RaceOn;
use pronto_core::slo::SloTargets;

/// `pronto evaluate`: replay a trace through the simulated fleet under each policy.
#[derive(Debug, Clone, clap::Args)]
pub struct EvaluateArgs {
    /// Trace file; without it a seeded generated workload (`--workload`) is used.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The generated workload used without `--trace`: `chat` (multi-turn chat with shared
    /// system prompts) or `agentic` (tool-using agent sessions, [`crate::workload_agentic`]).
    #[arg(long, value_enum, default_value_t = Generated::Chat)]
    pub workload: Generated,
    /// Trace format.
    #[arg(long, value_enum, default_value_t = TraceFormat::Mooncake)]
    pub format: TraceFormat,
    /// Prompt tokens each `hash_id` of a Mooncake trace stands for: 512 (Mooncake's own grain),
    /// or the grain a trace was written at (`scripts/lib/real_fleet_workloads.py --block 128`),
    /// so that prompts share prefixes at that grain.
    #[arg(long, value_name = "TOKENS", default_value_t = trace::TRACE_BLOCK_TOKENS as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub trace_block_tokens: u32,
    /// Fleet file.
    #[arg(long, default_value = "config/sim/fleet.yaml")]
    pub fleet: PathBuf,
    /// Policy to evaluate (repeatable): round_robin, least_inflight, predicted_ttft, oracle,
    /// ... (default: round_robin, least_inflight, predicted_ttft and oracle).
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Offered load as a fraction of fleet capacity (default: the trace's own timing).
    #[arg(long)]
    pub load: Option<f64>,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Re-draw the inter-arrival gaps with this seed: each gap (after tie spreading) is
    /// multiplied by an exponential draw of mean 1, so the mean rate and the order stay and
    /// the burstiness is new — another run of the same trace (default: its own timing).
    #[arg(long)]
    pub arrival_seed: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write every request's outcome to `DIR/<policy>.csv` (arrival, prompt tokens, backend,
    /// predicted and actual TTFT, cached tokens, the decision's reason): to see which requests
    /// make a tail.
    #[arg(long, value_name = "DIR")]
    pub requests_csv: Option<PathBuf>,
    /// Router replicas in front of the fleet, each with its own ledger, index and models
    /// (`crate::eval_replicas`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub replicas: u32,
    /// How arrivals are spread across replicas.
    #[arg(long, value_enum, default_value_t = Spread::RoundRobin)]
    pub spread: Spread,
    /// How replicas sync: `off`, or the delay of every message (`5ms`).
    #[arg(long, default_value = "off")]
    pub sync: SyncMode,
    /// Collision repair, as the gateway's `cluster.collision_repair`: when a replica hears of
    /// another's dispatch late, its requests sent to that backend since then and still
    /// waiting for their first token are routed again, and move when staying predicts more
    /// than MARGIN over the new decision (`pronto_core::cluster::repair`). `auto`: the
    /// gateway's default margin (0.2) wherever the run can repair; `off`; or a margin.
    #[arg(long, value_name = "auto|off|MARGIN", default_value = "auto")]
    pub collision_repair: RepairSetting,
    /// Stream migration: continuations a stream cut by a crashing backend (the fleet file's
    /// `crash_after` / `crash_every`) may be sent, as the gateway's `migration.max_attempts`;
    /// 0: off (the stream ends with an error event).
    #[arg(long, default_value_t = 1)]
    pub migration: u32,
    /// Every request's TTFT objective (a route's `ttft_slo`), for goodput; `off`: none.
    #[arg(long, default_value = "1s")]
    pub ttft_slo: SloLimit,
    /// Every request's TPOT objective (a route's `tpot_slo`): policies see it, and goodput
    /// counts against it; `off`: none.
    #[arg(long, default_value = "50ms")]
    pub tpot_slo: SloLimit,
    /// SLO admission, as a route's `on_slo_miss` with `--ttft-slo`: a request that cannot
    /// meet it now is refused (`shed`) or waits in the gateway queue until it can or its
    /// deadline passes (`queue`) — [`pronto_core::admission`]; absent: every request is sent.
    #[arg(long, value_enum)]
    pub on_slo_miss: Option<EvalOnMiss>,
    /// What `predicted_ttft` minimises, as a route's `objective:`: `ttft`, or `ttfa` (the
    /// first answer token: TTFT + the reasoning length learned from finished requests × each
    /// backend's predicted TPOT).
    #[arg(long, value_enum, default_value_t = EvalObjective::Ttft)]
    pub objective: EvalObjective,
    /// Fail over streams whose first token is late, as a route's `first_token_deadline`:
    /// `'{factor: 1.5, floor: 60ms}'` or `'{after: 150ms}'` (`crate::evaluate` race model).
    #[arg(long, value_name = "YAML")]
    pub first_token_deadline: Option<DeadlineFlag>,
    /// Hedge streams, as a route's `hedge`: `'{quantile: 0.95, budget: 0.1,
    /// max_predicted_ttft: 2s}'` or `'{after: 300ms}'`.
    #[arg(long, value_name = "YAML")]
    pub hedge: Option<HedgeFlag>,
    /// What a raced copy must deliver to win, as a route's `race_on:`: `ttft` (its first
    /// token), or `ttfa` (its first answer token; the reasoning before it is held, and a
    /// relative deadline or quantile hedge scales the predicted TTFA).
    #[arg(long, value_enum, default_value_t = EvalRaceOn::Ttft)]
    pub race_on: EvalRaceOn,
    /// A reference for failover, not a gateway setting: fail each stalled copy over the
    /// instant its engine produced the first token the stall holds — the earliest any
    /// deadline could tell a stall from a slow start, with no false alarm
    /// (`crate::evaluate` race model, *The failover oracle*).
    #[arg(long)]
    pub failover_oracle: bool,
    /// Progress-based exclusion, as the gateway's `health.stall.floor`: a backend holding
    /// streams that produced no token for max(floor, factor × its booked prefill's predicted
    /// time) gets no new requests until it produces (a fleet file's `wedge_after` fault).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub stall_floor: std::time::Duration,
    /// `health.stall.factor` (see `--stall-floor`).
    #[arg(long, value_name = "FACTOR", default_value_t = pronto_core::stall::DEFAULT_FACTOR)]
    pub stall_factor: f64,
    /// `health.stall: {enabled: false}`: no progress-based exclusion.
    #[arg(long)]
    pub no_stall: bool,
}

/// `--on-slo-miss` (a route's `on_slo_miss:`; `fallback` needs a second pool, which the
/// evaluator does not model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalOnMiss {
    /// Refuse the request.
    Shed,
    /// Queue it until it can meet the SLO or its deadline passes.
    Queue,
}

impl EvalOnMiss {
    /// The core's rule.
    pub fn rule(self) -> pronto_core::admission::OnMiss {
        match self {
            EvalOnMiss::Shed => pronto_core::admission::OnMiss::Shed,
            EvalOnMiss::Queue => pronto_core::admission::OnMiss::Queue,
        }
    }
}

/// `--race-on` (a route's `race_on:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalRaceOn {
    /// The first token.
    #[default]
    Ttft,
    /// The first answer token.
    Ttfa,
}

/// `--objective` (a route's `objective:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalObjective {
    /// Time to first token.
    #[default]
    Ttft,
    /// Time to first answer token.
    Ttfa,
}

/// A generated workload (`--workload`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Generated {
    /// [`SyntheticWorkload`]: multi-turn chats on a few shared system prompts.
    #[default]
    Chat,
    /// [`AgenticWorkload`]: agent sessions on long shared tool prompts.
    Agentic,
}

/// A `--ttft-slo` / `--tpot-slo` value: a positive duration (`800ms`), or `off` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SloLimit(pub Option<Duration>);

impl std::str::FromStr for SloLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<SloLimit, String> {
        if s == "off" {
            return Ok(SloLimit(None));
        }
        match humantime::parse_duration(s) {
            Ok(d) if !d.is_zero() => Ok(SloLimit(Some(d))),
            Ok(_) => Err("must be greater than zero (or `off`)".into()),
            Err(e) => Err(format!("{e}; give a duration such as 800ms, or `off`")),
        }
    }
}

impl EvaluateArgs {
    /// The objectives every request carries (`--ttft-slo`, `--tpot-slo`).
    pub fn slo(&self) -> SloTargets {
        SloTargets {
            ttft_s: self.ttft_slo.0.map(|d| d.as_secs_f64()),
            tpot_s: self.tpot_slo.0.map(|d| d.as_secs_f64()),
        }
    }

    /// The races these arguments ask for (`--first-token-deadline`, `--hedge`).
    pub fn races(&self) -> RaceConfig {
        RaceConfig {
            deadline: self.first_token_deadline.map(|d| d.0),
            hedge: self.hedge.map(|h| h.0),
            on: match self.race_on {
                EvalRaceOn::Ttft => RaceOn::Ttft,
                EvalRaceOn::Ttfa => RaceOn::Ttfa,
            },
            oracle_failover: self.failover_oracle,
            stall: (!self.no_stall).then_some(pronto_core::stall::StallRule {
                floor: self.stall_floor,
                factor: self.stall_factor,
            }),
        }
    }

    /// The replica set-up these arguments ask for.
    pub fn replication(&self) -> Replication {
        Replication {
            replicas: self.replicas as usize,
            spread: self.spread,
            sync: self.sync,
            seed: self.seed,
            repair: self.collision_repair,
        }
    }
}

/// Load the trace (or generate the synthetic workload), apply `--limit`, spread ties and
/// `--load`. Returns the requests and, with `--load`, the measured fleet capacity.
pub fn prepare_trace(
    args: &EvaluateArgs,
    fleet: &[SimBackend],
) -> anyhow::Result<(Vec<TraceRequest>, Option<f64>)> {
    let mut reqs = match &args.trace {
        Some(path) => trace::read(path, args.format)?,
        None => match args.workload {
            Generated::Chat => SyntheticWorkload {
                seed: args.seed,
                ..SyntheticWorkload::default()
            }
            .generate(),
            Generated::Agentic => AgenticWorkload {
                seed: args.seed,
                ..AgenticWorkload::default()
            }
            .generate(),
        },
    };
    if let Some(n) = args.limit {
        reqs.truncate(n);
    }
    if args.trace.is_some() {
        for r in &mut reqs {
            r.block_tokens = args.trace_block_tokens;
        }
    }
    spread_ties(&mut reqs);
    if let Some(seed) = args.arrival_seed {
        redraw_gaps(&mut reqs, seed);
    }
    let capacity = args.load.map(|x| apply_load(fleet, &mut reqs, x));
    Ok((reqs, capacity))
}

impl EvaluateArgs {
    /// The policies to run: those given, else [`DEFAULT_POLICIES`].
    pub fn policies(&self) -> Vec<String> {
        if self.policies.is_empty() {
            DEFAULT_POLICIES.iter().map(|s| s.to_string()).collect()
        } else {
            self.policies.clone()
        }
    }
}

/// Multiply each inter-arrival gap by a seeded exponential draw of mean 1 (`--arrival-seed`).
pub fn redraw_gaps(reqs: &mut [TraceRequest], seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut prev_old = reqs.first().map_or(0.0, |r| r.arrival_s);
    let mut prev_new = prev_old;
    for r in reqs.iter_mut() {
        let gap = r.arrival_s - prev_old;
        prev_old = r.arrival_s;
        let draw = -(1.0 - rng.gen::<f64>()).ln();
        prev_new += gap * draw;
        r.arrival_s = prev_new;
    }
}
