//! Evaluator tests of the stall fault, failover and hedging (`crate::evaluate`'s race model).
//! Deterministic: virtual time only. Every run also checks, in debug builds, that the engines
//! end empty and the router's bookings end at zero (the losers were aborted and released).

use std::time::Duration;

use super::eval_replicas::Replication;
use super::eval_report::RunReport;
use super::evaluate::*;
use crate::engine::EngineConfig;
use crate::profile::Profile;
use crate::reasoning::ReasoningConfig;
use crate::workload::{spread_ties, SyntheticWorkload, TraceRequest};
use pronto_core::race::{FirstTokenDeadline, Hedge, HedgeDelay, RaceOn, HEDGE_BURST};
use pronto_core::stall::StallRule;

const STALL_S: f64 = 2.0;

/// Two H100 backends; the first stalls every first token 2 s when `stall`.
fn fleet(stall: bool) -> Vec<SimBackend> {
    let cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
    (0..2)
        .map(|i| SimBackend {
            name: format!("b{i}"),
            config: cfg.clone(),
            reasoning: None,
            stall: (stall && i == 0).then_some(StallFault {
                stall_s: STALL_S,
                probability: 1.0,
                seed: 1,
            }),
            wedge: None,
        })
        .collect()
}

fn workload() -> Vec<TraceRequest> {
    let mut reqs = SyntheticWorkload {
        seed: 3,
        conversations: 30,
        ..SyntheticWorkload::default()
    }
    .generate();
    spread_ties(&mut reqs);
    apply_load(&fleet(false), &mut reqs, 0.3);
    reqs
}

fn run(fleet: &[SimBackend], reqs: &[TraceRequest], policy: &str, races: RaceConfig) -> RunReport {
    let route = RouteSettings {
        races,
        ..RouteSettings::default()
    };
    evaluate_route(fleet, "m", reqs, policy, Replication::default(), &route).unwrap()
}

fn ttfts(r: &RunReport) -> Vec<Option<f64>> {
    r.outcomes.iter().map(|o| o.ttft_s).collect()
}

const AFTER_100MS: RaceConfig = RaceConfig {
    on: RaceOn::Ttft,
    deadline: Some(FirstTokenDeadline::After(Duration::from_millis(100))),
    hedge: None,
    oracle_failover: false,
    stall: None,
};

#[test]
fn without_a_deadline_the_stall_is_in_the_ttft() {
    let reqs = workload();
    let healthy = run(&fleet(false), &reqs, "round_robin", RaceConfig::default());
    let r = run(&fleet(true), &reqs, "round_robin", RaceConfig::default());
    assert_eq!(r.completed, reqs.len() as u64);
    // Round robin: every other request is on the stalling backend and waits the stall.
    let on_b0 = r.outcomes.iter().filter(|o| o.backend == Some(0)).count();
    assert_eq!(r.races.stalled, on_b0 as u64);
    for (o, h) in r.outcomes.iter().zip(&healthy.outcomes) {
        let (t, th) = (o.ttft_s.unwrap(), h.ttft_s.unwrap());
        if o.backend == Some(0) {
            assert!(t >= STALL_S && t < STALL_S + th + 0.5, "{t} vs {th}");
        } else {
            assert!(t < STALL_S, "{t}");
        }
    }
    assert_eq!((r.races.failovers, r.races.hedges), (0, 0));
}

#[test]
fn a_deadline_fails_the_stalled_copies_over_and_aborts_them() {
    let reqs = workload();
    let r = run(&fleet(true), &reqs, "round_robin", AFTER_100MS);
    assert_eq!(r.completed, reqs.len() as u64);
    let healthy_b1 = run(&fleet(false), &reqs, "round_robin", RaceConfig::default());
    let p99_healthy = healthy_b1.ttft_p99_ms / 1e3;
    // Every request sent first to the stalling backend failed over to the other and won
    // there: its TTFT is the deadline plus the other backend's TTFT, far below the stall. A
    // request first on the healthy backend that was later than the deadline failed over to
    // the stalling one and kept its first copy. So every copy on b0 is a failover or the
    // first copy of a won failover, and stalls; every request is served by b1.
    let on_b0 = r.per_backend[0].1;
    assert_eq!((r.races.failovers, r.races.stalled), (on_b0, on_b0));
    assert!(r.races.failovers_won > 10, "{:?}", r.races);
    assert_eq!(r.per_backend[1].1, reqs.len() as u64, "{:?}", r.per_backend);
    assert!(r.outcomes.iter().all(|o| o.backend == Some(1)));
    let late = r.outcomes.iter().filter(|o| o.ttft_s.unwrap() >= 0.1);
    assert!(late.count() as u64 >= r.races.failovers_won);
    for t in ttfts(&r).into_iter().flatten() {
        assert!(t < 0.1 + p99_healthy + 0.5, "{t}");
    }
    assert!(r.ttft_p99_ms < 1e3 * STALL_S / 2.0, "{}", r.ttft_p99_ms);
    // The aborted copies had been prefilled (the stall holds the first token, not the
    // prefill): their prompts are the extra prefill.
    assert!(r.races.extra_prefill_tokens > 0);
    assert!(r.races.extra_prefill > 0.0 && r.races.extra_prefill < 1.0);
    // Deterministic.
    assert_eq!(run(&fleet(true), &reqs, "round_robin", AFTER_100MS), r);
}

/// `--failover-oracle`: every stalled first copy fails over at the instant its engine made the
/// first token the stall holds, and no healthy copy does; without a fault the run is untouched.
#[test]
fn the_failover_oracle_fails_over_exactly_the_stalled_copies() {
    let reqs = workload();
    let oracle = RaceConfig {
        oracle_failover: true,
        ..RaceConfig::default()
    };
    // b0 stalls a third of its first tokens; b1 never stalls.
    let mut f = fleet(true);
    f[0].stall = f[0].stall.map(|s| StallFault {
        probability: 0.3,
        ..s
    });
    let healthy = run(&fleet(false), &reqs, "round_robin", RaceConfig::default());
    let r = run(&f, &reqs, "round_robin", oracle);
    assert_eq!(r.completed, reqs.len() as u64);
    // Only first copies on b0 stall, and each of them — no other — fails over to b1 and wins.
    assert!(r.races.stalled > 5, "{:?}", r.races);
    assert_eq!(r.races.failovers, r.races.stalled, "{:?}", r.races);
    assert_eq!(r.races.failovers_won, r.races.failovers, "{:?}", r.races);
    // No request waited out a stall, and the stalled copies' prefill is the extra prefill.
    assert!(r.ttft_p99_ms < 1e3 * STALL_S / 2.0, "{}", r.ttft_p99_ms);
    assert!(r.races.extra_prefill > 0.0 && r.races.extra_prefill < 1.0);
    // Without a fault it never fires: the run is the plain run.
    assert_eq!(run(&fleet(false), &reqs, "round_robin", oracle), healthy);
}

#[test]
fn an_inert_deadline_leaves_a_run_bit_identical() {
    let reqs = workload();
    for policy in ["round_robin", "predicted_ttft"] {
        let plain = run(&fleet(false), &reqs, policy, RaceConfig::default());
        let inert = RaceConfig {
            deadline: Some(FirstTokenDeadline::After(Duration::from_secs(3600))),
            ..RaceConfig::default()
        };
        let r = run(&fleet(false), &reqs, policy, inert);
        assert_eq!(ttfts(&r), ttfts(&plain), "{policy}");
        assert_eq!(r, plain, "{policy}");
    }
}

#[test]
fn the_hedge_budget_bounds_the_hedges() {
    let reqs = workload();
    let hedge = |max: Option<Duration>| RaceConfig {
        on: RaceOn::Ttft,
        oracle_failover: false,
        stall: None,
        deadline: None,
        hedge: Some(Hedge {
            delay: HedgeDelay::After(Duration::from_millis(1)),
            budget: 0.1,
            max_predicted_ttft: max,
        }),
    };
    let r = run(&fleet(false), &reqs, "predicted_ttft", hedge(None));
    assert_eq!(r.completed, reqs.len() as u64);
    let n = reqs.len() as f64;
    let hedges = r.races.hedges as f64;
    // Every first token takes more than 1 ms: the budget is what limits.
    assert!(hedges <= 0.1 * n + HEDGE_BURST, "{hedges} of {n}");
    assert!(hedges >= 0.1 * n - 1.0, "{hedges} of {n}");
    assert!(r.races.hedges_won <= r.races.hedges);
    assert_eq!(r.races.failovers, 0);
    // No hedge while every prediction is above `max_predicted_ttft`.
    let r = run(
        &fleet(false),
        &reqs,
        "predicted_ttft",
        hedge(Some(Duration::from_nanos(1))),
    );
    assert!(r
        .outcomes
        .iter()
        .all(|o| o.predicted_ttft_s.unwrap() > 1e-9));
    assert_eq!(r.races.hedges, 0);
}

#[test]
fn stall_draws_are_seeded_and_keep_their_share() {
    let f = StallFault {
        stall_s: 2.0,
        probability: 0.05,
        seed: 7,
    };
    let hits = (0..20_000u64).filter(|&id| f.hits(id)).count();
    assert!((800..=1200).contains(&hits), "{hits}");
    assert_eq!(
        (0..100u64).map(|id| f.hits(id)).collect::<Vec<_>>(),
        (0..100u64).map(|id| f.hits(id)).collect::<Vec<_>>()
    );
    let faults = crate::fleet_config::FaultConfig {
        stall_first_token: Some(Duration::from_secs(2)),
        stall_probability: 0.05,
        ..Default::default()
    };
    let (a, b) = (StallFault::of(&faults, 0), StallFault::of(&faults, 1));
    assert_eq!(a.map(|s| (s.stall_s, s.probability)), Some((2.0, 0.05)));
    assert_ne!(a.unwrap().seed, b.unwrap().seed, "seeded per backend");
    assert_eq!(StallFault::of(&Default::default(), 0), None);
}

#[test]
fn race_flags_parse_as_the_route_settings() {
    let d: DeadlineFlag = "{factor: 1.5, floor: 60ms}".parse().unwrap();
    assert_eq!(
        d.0,
        FirstTokenDeadline::Predicted {
            factor: 1.5,
            floor: Duration::from_millis(60)
        }
    );
    let d: DeadlineFlag = "{after: 150ms}".parse().unwrap();
    assert_eq!(d.0, FirstTokenDeadline::After(Duration::from_millis(150)));
    let h: HedgeFlag = "{quantile: 0.95, budget: 0.1, max_predicted_ttft: 2s}"
        .parse()
        .unwrap();
    assert_eq!(
        h.0,
        Hedge {
            delay: HedgeDelay::Quantile(0.95),
            budget: 0.1,
            max_predicted_ttft: Some(Duration::from_secs(2)),
        }
    );
    for (bad, expected) in [
        ("{factor: 0.5}", "factor: must be a number >= 1"),
        ("{after: 1s, factor: 2}", "set either"),
        ("{after: 1s, floor: 1s}", "floor: only applies"),
        ("{after: soon}", "after: `soon`"),
        ("{flor: 1s}", "unknown field `flor`"),
    ] {
        let e = bad.parse::<DeadlineFlag>().unwrap_err();
        assert!(e.contains(expected), "{bad}: {e}");
    }
    let e = "{quantile: 1.5, budget: 0}"
        .parse::<HedgeFlag>()
        .unwrap_err();
    assert!(e.contains("quantile: must be between 0 and 1"), "{e}");
    assert!(e.contains("budget: must be a fraction"), "{e}");
}

#[test]
fn a_hedge_races_a_stall_and_the_winner_is_relayed() {
    let reqs = workload();
    let hedge = RaceConfig {
        on: RaceOn::Ttft,
        oracle_failover: false,
        stall: None,
        deadline: None,
        hedge: Some(Hedge {
            delay: HedgeDelay::After(Duration::from_millis(50)),
            budget: 1.0,
            max_predicted_ttft: None,
        }),
    };
    for policy in ["round_robin", "predicted_ttft+exact", "cache_aware"] {
        let r = run(&fleet(true), &reqs, policy, hedge);
        assert_eq!(r.completed, reqs.len() as u64, "{policy}");
        assert!(r.races.hedges_won > 0, "{policy}: {:?}", r.races);
        assert_eq!(r.races.failovers, 0);
        // What the stalling backend relays waited out its stall: a race never shortens it.
        let short_on_b0 = r
            .outcomes
            .iter()
            .filter(|o| o.backend == Some(0) && o.ttft_s.unwrap() < STALL_S)
            .count();
        assert_eq!(short_on_b0, 0, "{policy}");
    }
    // Replicated routers race too.
    let rep = Replication {
        replicas: 2,
        sync: crate::eval_replicas::SyncMode::Delay(Duration::from_millis(5)),
        ..Replication::default()
    };
    let route = RouteSettings {
        races: AFTER_100MS,
        ..RouteSettings::default()
    };
    let r = evaluate_route(&fleet(true), "m", &reqs, "predicted_ttft", rep, &route).unwrap();
    assert_eq!(r.completed, reqs.len() as u64);
    assert!(r.races.failovers_won > 0);
}

/// [`fleet`] serving a model that reasons `tokens` tokens before it answers.
fn reasoning_fleet(stall: bool, tokens: f64) -> Vec<SimBackend> {
    let reasoning = ReasoningConfig {
        mean_tokens: tokens,
        sigma: 0.0,
        max_tokens: 1000,
        seed: 1,
    };
    let mut f = fleet(stall);
    for b in &mut f {
        b.reasoning = Some(reasoning);
    }
    f
}

/// A deadline past every first token and before every first answer: `race_on: ttft` never
/// fires it, `race_on: ttfa` fires it on every request; a raced stream's reasoning is held,
/// so its client sees the first token with the first answer.
#[test]
fn racing_on_the_first_answer_holds_the_reasoning_and_times_the_answer() {
    let reqs = workload();
    let f = reasoning_fleet(false, 200.0);
    let plain = run(&f, &reqs, "round_robin", RaceConfig::default());
    let max_ttft = ttfts(&plain).into_iter().flatten().fold(0.0, f64::max);
    let min_ttfa = plain
        .outcomes
        .iter()
        .map(|o| o.ttfa_s.unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(max_ttft < min_ttfa, "{max_ttft} vs {min_ttfa}");
    let deadline = |on| RaceConfig {
        on,
        oracle_failover: false,
        stall: None,
        deadline: Some(FirstTokenDeadline::After(Duration::from_secs_f64(
            (max_ttft + min_ttfa) / 2.0,
        ))),
        hedge: None,
    };
    let ttft = run(&f, &reqs, "round_robin", deadline(RaceOn::Ttft));
    assert_eq!(ttft.races.failovers, 0);
    assert_eq!(ttfts(&ttft), ttfts(&plain), "an inert race changes nothing");
    let r = run(&f, &reqs, "round_robin", deadline(RaceOn::Ttfa));
    assert_eq!(r.completed, reqs.len() as u64);
    assert_eq!(r.races.failovers, reqs.len() as u64, "{:?}", r.races);
    for o in &r.outcomes {
        // The held reasoning reaches the client with the first answer token.
        assert_eq!(o.ttft_s, o.ttfa_s);
        assert!(o.ttft_s.unwrap() >= min_ttfa, "{o:?}");
    }
    // The losers were aborted mid-reasoning: their prefill is extra work.
    assert!(r.races.extra_prefill_tokens > 0);
    // Deterministic.
    assert_eq!(run(&f, &reqs, "round_robin", deadline(RaceOn::Ttfa)), r);
}

/// A stall longer than the reasoning (20 tokens): a TTFA deadline moves the request to the
/// healthy backend, whose answer wins long before the stall ends.
#[test]
fn a_ttfa_deadline_fails_a_stalled_reasoning_stream_over() {
    let reqs = workload();
    let healthy = run(
        &reasoning_fleet(false, 20.0),
        &reqs,
        "round_robin",
        RaceConfig::default(),
    );
    assert!(
        healthy.ttfa_p99_ms < 1e3 * STALL_S / 2.0,
        "{}",
        healthy.ttfa_p99_ms
    );
    let p99_ttfa = healthy.ttfa_p99_ms / 1e3;
    let race = RaceConfig {
        on: RaceOn::Ttfa,
        oracle_failover: false,
        stall: None,
        deadline: Some(FirstTokenDeadline::After(Duration::from_secs_f64(p99_ttfa))),
        hedge: None,
    };
    for policy in ["round_robin", "predicted_ttft"] {
        let r = run(&reasoning_fleet(true, 20.0), &reqs, policy, race);
        assert_eq!(r.completed, reqs.len() as u64, "{policy}");
        assert!(r.races.failovers_won > 0, "{policy}: {:?}", r.races);
        assert!(
            r.outcomes.iter().all(|o| o.backend == Some(1)),
            "{policy}: a stalled answer never wins"
        );
        assert!(r.ttfa_p99_ms < 1e3 * STALL_S, "{policy}: {}", r.ttfa_p99_ms);
    }
}

/// A wedged engine offline, under the gateway's rule: one backend stops stepping a quarter
/// into the run, for half of it. With a first-token deadline every request completes either
/// way (those past their first token when it wedged finish once it goes on); with the stall
/// rule the wedged backend is marked and gets only probes (one per bound), so far fewer
/// requests wait out the deadline on it.
#[test]
fn a_wedged_engine_is_excluded_and_its_stuck_requests_fail_over() {
    let mut reqs = SyntheticWorkload {
        seed: 3,
        conversations: 120,
        ..SyntheticWorkload::default()
    }
    .generate();
    spread_ties(&mut reqs);
    apply_load(&fleet(false), &mut reqs, 0.3);
    let span = reqs.last().unwrap().arrival_s;
    let mut f = fleet(false);
    f[0].wedge = Some(Wedge {
        from_s: span / 4.0,
        until_s: Some(span * 0.75),
    });
    let deadline = RaceConfig {
        deadline: Some(FirstTokenDeadline::After(Duration::from_millis(500))),
        ..RaceConfig::default()
    };
    let rule = StallRule {
        floor: Duration::from_secs(2),
        factor: 4.0,
    };
    let off = run(&f, &reqs, "round_robin", deadline);
    let on = run(
        &f,
        &reqs,
        "round_robin",
        RaceConfig {
            stall: Some(rule),
            ..deadline
        },
    );
    for r in [&off, &on] {
        assert_eq!(r.completed, r.requests, "none lost");
    }
    eprintln!(
        "wedged {:.0} s of {:.0} s: failovers {} with the rule ({} marks), {} without",
        span / 2.0,
        span,
        on.races.failovers,
        on.races.stall_exclusions,
        off.races.failovers
    );
    assert_eq!(off.races.stall_exclusions, 0);
    assert!(on.races.stall_exclusions >= 1);
    assert!(
        on.races.failovers * 2 < off.races.failovers,
        "{} vs {} failovers",
        on.races.failovers,
        off.races.failovers
    );
    // A healthy fleet under the rule is the same run as without it.
    let healthy = run(&fleet(false), &reqs, "round_robin", deadline);
    let ruled = run(
        &fleet(false),
        &reqs,
        "round_robin",
        RaceConfig {
            stall: Some(rule),
            ..deadline
        },
    );
    assert_eq!(ttfts(&healthy), ttfts(&ruled));
}
