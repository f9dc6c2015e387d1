//! Evaluator tests: determinism, the oracle bound, load scaling, real traces when present.

use std::path::{Path, PathBuf};

use super::evaluate::*;
use crate::engine::EngineConfig;
use crate::profile::Profile;
use crate::workload::{spread_ties, SyntheticWorkload, TraceFormat, TraceRequest};

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

/// Four H100 backends with a small cache (2,000 blocks = 32k tokens) so prefixes evict. Their
/// TTFT models start from the prior the H100 terms imply, pinned as a calibrated profile file
/// pins it (its `prior:` block): what predicted_ttft does before it has learnt — collision
/// repair's moves in particular — depends on it.
fn small_fleet() -> Vec<SimBackend> {
    let mut cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
    cfg.num_kv_blocks = 2000;
    cfg.profile.prior = Some(cfg.profile.ttft_prior());
    (0..4)
        .map(|i| SimBackend::new(format!("b{i}"), cfg.clone()))
        .collect()
}

fn workload(load: f64) -> Vec<TraceRequest> {
    let mut reqs = SyntheticWorkload {
        seed: 7,
        conversations: 60,
        ..SyntheticWorkload::default()
    }
    .generate();
    spread_ties(&mut reqs);
    apply_load(&small_fleet(), &mut reqs, load);
    reqs
}

/// One run of `policy` with one router, every request carrying the objectives `slo` and
/// minimising `objective`.
fn run_route(
    fleet: &[SimBackend],
    reqs: &[TraceRequest],
    policy: &str,
    slo: &pronto_core::slo::SloTargets,
    objective: EvalObjective,
) -> anyhow::Result<crate::eval_report::RunReport> {
    let rep = crate::eval_replicas::Replication::default();
    evaluate_replicated(fleet, "m", reqs, policy, rep, slo, objective)
}

#[test]
fn fleet_files_load() {
    for f in [
        "config/sim/fleet.yaml",
        "config/sim/fleet-hetero.yaml",
        "config/sim/fleet-hetero-reasoning.yaml",
    ] {
        let fleet = load_fleet(&repo(f)).unwrap();
        assert_eq!(fleet.len(), 8, "{f}");
        assert!(fleet.iter().all(|b| b.config.num_kv_blocks == 24_000));
        let reasons = f.contains("reasoning");
        assert!(
            fleet.iter().all(|b| b.reasoning.is_some() == reasons),
            "{f}"
        );
    }
    // Issue 18's worlds: small bounded caches; two speed classes with 2–4 running slots.
    let small = load_fleet(&repo("config/sim/fleet-small-cache.yaml")).unwrap();
    assert!(small.iter().all(|b| b.config.num_kv_blocks == 6_000));
    let slots = load_fleet(&repo("config/sim/fleet-slots.yaml")).unwrap();
    let seqs: Vec<usize> = slots.iter().map(|b| b.config.max_num_seqs).collect();
    assert_eq!(seqs, [4, 4, 4, 4, 2, 2, 2, 2]);
    assert_ne!(slots[0].config.profile, slots[7].config.profile);
}

#[test]
fn without_a_policy_the_gateway_default_is_evaluated_with_the_baselines() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: EvaluateArgs,
    }
    use clap::Parser;
    let none = Cli::try_parse_from(["evaluate"]).unwrap().args;
    assert_eq!(
        none.policies(),
        ["round_robin", "least_inflight", "predicted_ttft", "oracle"]
    );
    let one = Cli::try_parse_from(["evaluate", "--policy", "cache_aware"]).unwrap();
    assert_eq!(one.args.policies(), ["cache_aware"]);
    // Objectives: 1 s TTFT and 50 ms TPOT unless told; `off` drops one; zero is refused.
    let slo = none.slo();
    assert_eq!((slo.ttft_s, slo.tpot_s), (Some(1.0), Some(0.05)));
    let off = Cli::try_parse_from(["evaluate", "--tpot-slo", "off", "--ttft-slo", "800ms"])
        .unwrap()
        .args
        .slo();
    assert_eq!((off.ttft_s, off.tpot_s), (Some(0.8), None));
    assert!(Cli::try_parse_from(["evaluate", "--tpot-slo", "0s"]).is_err());
    // `--workload agentic` generates agent sessions (seeded) instead of chats.
    let agentic = Cli::try_parse_from(["evaluate", "--workload", "agentic", "--limit", "50"])
        .unwrap()
        .args;
    assert_eq!(none.workload, Generated::Chat);
    let (reqs, _) = prepare_trace(&agentic, &small_fleet()).unwrap();
    let (chat, _) = prepare_trace(&none, &small_fleet()).unwrap();
    assert_eq!(reqs.len(), 50);
    assert!(
        reqs.iter().all(|r| r.hash_ids.len() > 12),
        "long tool prompts"
    );
    assert_ne!(reqs[0].hash_ids, chat[0].hash_ids);
    // `--arrival-seed` re-draws the gaps: same order, same mean rate, other timing; seeded.
    let redrawn = |seed| {
        let a = Cli::try_parse_from(["evaluate", "--arrival-seed", seed])
            .unwrap()
            .args;
        prepare_trace(&a, &small_fleet()).unwrap().0
    };
    let (r2, r2b, r3) = (redrawn("2"), redrawn("2"), redrawn("3"));
    assert_eq!(r2, r2b);
    assert_ne!(r2, r3);
    assert_ne!(r2, chat);
    assert!(r2.windows(2).all(|p| p[0].arrival_s <= p[1].arrival_s));
    let span = |r: &[TraceRequest]| r.last().unwrap().arrival_s;
    let ratio = span(&r2) / span(&chat);
    assert!((0.8..1.25).contains(&ratio), "mean rate kept: {ratio}");
    assert!(r2.iter().zip(&chat).all(|(a, b)| a.hash_ids == b.hash_ids));
}

#[test]
fn runs_are_deterministic_and_complete() {
    let reqs = workload(0.8);
    let fleet = small_fleet();
    for p in DEFAULT_POLICIES {
        let a = evaluate(&fleet, "m", &reqs, p).unwrap();
        let b = evaluate(&fleet, "m", &reqs, p).unwrap();
        assert_eq!(a, b, "{p}");
        assert_eq!(a.completed, reqs.len() as u64, "{p}");
        assert_eq!(
            a.per_backend.iter().map(|x| x.1).sum::<u64>(),
            reqs.len() as u64
        );
        assert!(a.ttft_p50_ms <= a.ttft_p99_ms && a.ttft_p99_ms <= a.e2e_p99_ms);
        assert!(a.prefix_hit_rate > 0.0 && a.prefix_hit_rate < 1.0, "{p}");
    }
    assert!(evaluate(&fleet, "m", &reqs, "nope").is_err());
}

#[test]
fn oracle_beats_round_robin_at_the_tail() {
    let reqs = workload(0.8);
    let fleet = small_fleet();
    let rr = evaluate(&fleet, "m", &reqs, "round_robin").unwrap();
    let oracle = evaluate(&fleet, "m", &reqs, ORACLE).unwrap();
    assert!(
        oracle.ttft_p99_ms <= rr.ttft_p99_ms,
        "oracle {} > rr {}",
        oracle.ttft_p99_ms,
        rr.ttft_p99_ms
    );
    assert!(oracle.ttft_mean_ms <= rr.ttft_mean_ms);
}

#[test]
fn higher_load_means_higher_ttft() {
    let fleet = small_fleet();
    let lo = evaluate(&fleet, "m", &workload(0.3), "least_inflight").unwrap();
    let hi = evaluate(&fleet, "m", &workload(1.2), "least_inflight").unwrap();
    assert!(lo.ttft_mean_ms < hi.ttft_mean_ms, "{lo:?} vs {hi:?}");
    assert!(lo.throughput_rps < hi.throughput_rps);
}

#[test]
fn load_scaling_hits_the_target_rate() {
    let fleet = small_fleet();
    let mut reqs = workload(1.0);
    let cap = fleet_capacity_rps(&fleet, &reqs);
    reqs = {
        let mut r = reqs.clone();
        let c = apply_load(&fleet, &mut r, 0.5);
        assert!((c - cap).abs() / cap < 1e-9);
        r
    };
    let offered = reqs.len() as f64 / reqs.last().unwrap().arrival_s;
    assert!((offered / cap - 0.5).abs() < 0.01, "{offered} vs {cap}");
}

/// `pronto evaluate` arguments for the first `limit` requests of the Mooncake conversation
/// trace on the 8×H100 fleet at `load` (`None`: the trace is absent, outside CI).
fn conversation_slice(load: f64, limit: usize) -> Option<EvaluateArgs> {
    let path = crate::testing::shared("traces/mooncake/conversation_trace.jsonl")?;
    Some(EvaluateArgs {
        trace: Some(path),
        format: TraceFormat::Mooncake,
        trace_block_tokens: crate::workload::TRACE_BLOCK_TOKENS as u32,
        workload: crate::evaluate::Generated::Chat,
        fleet: repo("config/sim/fleet.yaml"),
        policies: vec![],
        load: Some(load),
        limit: Some(limit),
        seed: 1,
        arrival_seed: None,
        json: false,
        requests_csv: None,
        replicas: 1,
        spread: crate::eval_replicas::Spread::RoundRobin,
        sync: crate::eval_replicas::SyncMode::Off,
        collision_repair: crate::eval_replicas::RepairSetting::Auto,
        migration: 1,
        ttft_slo: SloLimit(None),
        tpot_slo: SloLimit(None),
        on_slo_miss: None,
        objective: crate::evaluate::EvalObjective::Ttft,
        first_token_deadline: None,
        hedge: None,
        race_on: crate::eval_args::EvalRaceOn::Ttft,
        failover_oracle: false,
        stall_floor: pronto_core::stall::DEFAULT_FLOOR,
        stall_factor: pronto_core::stall::DEFAULT_FACTOR,
        no_stall: false,
    })
}

#[test]
fn mooncake_conversation_prefix_when_present() {
    let Some(args) = conversation_slice(0.8, 500) else {
        return;
    };
    let fleet = load_fleet(&args.fleet).unwrap();
    let (reqs, cap) = prepare_trace(&args, &fleet).unwrap();
    assert_eq!(reqs.len(), 500);
    assert!(cap.unwrap() > 0.0);
    let rr = evaluate(&fleet, "m", &reqs, "round_robin").unwrap();
    let oracle = evaluate(&fleet, "m", &reqs, ORACLE).unwrap();
    assert_eq!(rr.completed, 500);
    assert!(rr.prefix_hit_rate > 0.0);
    assert!(oracle.ttft_mean_ms <= rr.ttft_mean_ms);
}

#[test]
fn predicted_ttft_beats_round_robin_on_p99_for_shared_prefix_traffic() {
    // Multi-turn chats over shared system prompts on bounded caches, at 80 % load: each turn
    // extends the previous one's prefix, so routing to the backend that holds it saves prefill.
    let reqs = workload(0.8);
    let fleet = small_fleet();
    let rr = evaluate(&fleet, "m", &reqs, "round_robin").unwrap();
    let pt = evaluate(&fleet, "m", &reqs, "predicted_ttft").unwrap();
    eprintln!(
        "p99 TTFT ms: round_robin {:.1}, predicted_ttft {:.1}; hit rate {:.2} vs {:.2}",
        rr.ttft_p99_ms, pt.ttft_p99_ms, rr.prefix_hit_rate, pt.prefix_hit_rate
    );
    assert!(pt.ttft_p99_ms < rr.ttft_p99_ms);
    assert!(pt.ttft_mean_ms < rr.ttft_mean_ms);
}

#[test]
fn per_request_outcomes_match_the_summary_and_write_as_csv() {
    let reqs = workload(0.8);
    let fleet = small_fleet();
    let r = evaluate(&fleet, "m", &reqs, "predicted_ttft").unwrap();
    assert_eq!(r.outcomes.len(), reqs.len());
    let mut ttft: Vec<f64> = r.outcomes.iter().filter_map(|o| o.ttft_s).collect();
    ttft.sort_by(f64::total_cmp);
    let p99 = super::eval_report::percentile(&ttft, 0.99) * 1e3;
    assert!((p99 - r.ttft_p99_ms).abs() < 1e-9);
    for (o, q) in r.outcomes.iter().zip(&reqs) {
        assert_eq!(
            (o.arrival_s, o.prompt_tokens),
            (q.arrival_s, q.input_tokens)
        );
        assert!(o.backend.is_some() && o.predicted_ttft_s.is_some() && o.reason.is_some());
        assert!(o.cached_tokens <= o.prompt_tokens);
    }
    let cached: u64 = r.outcomes.iter().map(|o| u64::from(o.cached_tokens)).sum();
    assert!(cached > 0, "the workload shares prefixes");
    let csv = super::eval_report::outcomes_csv(&r);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), reqs.len() + 1);
    assert!(lines[0].starts_with("id,arrival_s,prompt_tokens,backend,"));
    let first: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(first.len(), 9);
    assert!(first[3].starts_with('b'), "backend by name: {}", lines[1]);
    // Every completed multi-token request has a TPOT, and goodput is a share.
    assert!(r
        .outcomes
        .iter()
        .all(|o| !o.completed || o.output_tokens < 2 || o.tpot_s.is_some_and(|t| t > 0.0)));
    assert!(r.tpot_p50_ms > 0.0 && r.tpot_p99_ms >= r.tpot_p50_ms);
    // The oracle makes no prediction: the field is empty.
    let o = evaluate(&fleet, "m", &reqs, ORACLE).unwrap();
    assert!(super::eval_report::outcomes_csv(&o)
        .lines()
        .nth(1)
        .unwrap()
        .contains(",,"));
}

mod replicas {
    use std::time::Duration;

    use super::*;
    use crate::eval_replicas::{RepairSetting, Replication, Spread, SyncMode};

    fn replicated(n: usize, spread: Spread, sync: SyncMode) -> crate::eval_report::RunReport {
        repaired(n, spread, sync, RepairSetting::Off, "predicted_ttft").unwrap()
    }

    fn repaired(
        n: usize,
        spread: Spread,
        sync: SyncMode,
        repair: RepairSetting,
        policy: &str,
    ) -> anyhow::Result<crate::eval_report::RunReport> {
        let rep = Replication {
            replicas: n,
            spread,
            sync,
            seed: 3,
            repair,
        };
        let slo = pronto_core::slo::SloTargets::default();
        evaluate_replicated(
            &small_fleet(),
            "m",
            &workload(0.8),
            policy,
            rep,
            &slo,
            crate::evaluate::EvalObjective::Ttft,
        )
    }

    #[test]
    fn collision_repair_moves_requests_a_late_booking_put_behind_another() {
        let late = SyncMode::Delay(Duration::from_millis(50));
        let rr = Spread::RoundRobin;
        let plain = replicated(4, rr, late);
        let fixed = repaired(4, rr, late, RepairSetting::Margin(0.2), "predicted_ttft").unwrap();
        eprintln!(
            "mean / p99 TTFT ms: plain {:.0} {:.0}; repaired {:.0} {:.0}, {} moves",
            plain.ttft_mean_ms,
            plain.ttft_p99_ms,
            fixed.ttft_mean_ms,
            fixed.ttft_p99_ms,
            fixed.collision_repairs
        );
        assert_eq!(plain.collision_repairs, 0);
        assert!(fixed.collision_repairs > 0);
        // Every request is served once, where it was moved to.
        assert_eq!(fixed.completed, plain.completed);
        let served: u64 = fixed.per_backend.iter().map(|(_, n)| n).sum();
        assert_eq!(served, fixed.requests);
        // Repair moves by comparing predictions, so whether its moves help depends on the prior
        // the models start from: here the engines' own (`small_fleet`; plain 208 ms mean, p99
        // 1236, repaired 101 / 738). From the generic GPU prior (up to 11x off per term on
        // these engines) they barely helped the mean and hurt the tail (106 / 641 → 100 / 831);
        // from the profile's base, prefill and decode terms alone (what a gateway hint carries)
        // they hurt (100 → 154 ms mean).
        assert!(fixed.ttft_mean_ms < plain.ttft_mean_ms);
        assert!(fixed.ttft_p99_ms < plain.ttft_p99_ms);
        // `auto` is the gateway's default margin.
        let auto = repaired(4, rr, late, RepairSetting::Auto, "predicted_ttft").unwrap();
        assert_eq!(auto.collision_repair_margin, Some(0.2));
        assert_eq!(auto.collision_repairs, fixed.collision_repairs);
        // A margin no prediction beats moves nothing.
        let never = repaired(4, rr, late, RepairSetting::Margin(1e9), "predicted_ttft").unwrap();
        assert_eq!(never.collision_repairs, 0);
    }

    #[test]
    fn collision_repair_needs_synced_replicas_and_a_gateway_policy() {
        let late = SyncMode::Delay(Duration::from_millis(50));
        let rr = Spread::RoundRobin;
        for (n, sync, policy) in [
            (4, SyncMode::Off, "predicted_ttft"),
            (1, late, "predicted_ttft"),
            (4, late, "oracle"),
            (4, late, "predicted_ttft+exact"),
        ] {
            let e = repaired(n, rr, sync, RepairSetting::Margin(0.2), policy).unwrap_err();
            assert!(e.to_string().contains("--collision-repair"), "{e}");
            // `auto` (the default) is off there, as the gateway would be.
            let auto = repaired(n, rr, sync, RepairSetting::Auto, policy).unwrap();
            assert_eq!(
                (auto.collision_repair_margin, auto.collision_repairs),
                (None, 0)
            );
        }
    }

    #[test]
    fn one_replica_is_the_single_router() {
        let one = evaluate(&small_fleet(), "m", &workload(0.8), "predicted_ttft").unwrap();
        let synced = replicated(1, Spread::Random, SyncMode::Delay(Duration::from_millis(5)));
        assert_eq!(one.outcomes, synced.outcomes);
        assert_eq!(synced.sync_bytes_per_request, 0.0, "nobody to tell");
    }

    #[test]
    fn synced_replicas_route_like_one_and_unsynced_ones_lose_prefix_hits() {
        let one = replicated(1, Spread::RoundRobin, SyncMode::Off);
        let off = replicated(4, Spread::RoundRobin, SyncMode::Off);
        let synced = replicated(
            4,
            Spread::RoundRobin,
            SyncMode::Delay(Duration::from_millis(5)),
        );
        let late = replicated(
            4,
            Spread::RoundRobin,
            SyncMode::Delay(Duration::from_millis(500)),
        );
        eprintln!(
            "hit rate / mean / p99 TTFT ms: one {:.3} {:.0} {:.0}; 4 synced {:.3} {:.0} {:.0}; \
             4 late {:.3} {:.0} {:.0}; 4 unsynced {:.3} {:.0} {:.0}; {:.0} sync bytes/request",
            one.prefix_hit_rate,
            one.ttft_mean_ms,
            one.ttft_p99_ms,
            synced.prefix_hit_rate,
            synced.ttft_mean_ms,
            synced.ttft_p99_ms,
            late.prefix_hit_rate,
            late.ttft_mean_ms,
            late.ttft_p99_ms,
            off.prefix_hit_rate,
            off.ttft_mean_ms,
            off.ttft_p99_ms,
            synced.sync_bytes_per_request,
        );
        // Delivered at once, the four replicas know what one router knows (their TTFT models
        // learn the same observations, in another order between backends).
        let instant = replicated(4, Spread::Random, SyncMode::Delay(Duration::ZERO));
        eprintln!(
            "instant: {:.3} {:.1} {:.1}; one: {:.3} {:.1} {:.1}",
            instant.prefix_hit_rate,
            instant.ttft_mean_ms,
            instant.ttft_p99_ms,
            one.prefix_hit_rate,
            one.ttft_mean_ms,
            one.ttft_p99_ms
        );
        assert!((instant.prefix_hit_rate - one.prefix_hit_rate).abs() < 0.01);
        assert!((instant.ttft_mean_ms / one.ttft_mean_ms - 1.0).abs() < 0.05);
        assert!((instant.ttft_p99_ms / one.ttft_p99_ms - 1.0).abs() < 0.1);
        assert!(synced.prefix_hit_rate > off.prefix_hit_rate);
        assert!(late.ttft_mean_ms > synced.ttft_mean_ms);
        assert!(synced.ttft_mean_ms < off.ttft_mean_ms);
        assert!(synced.sync_bytes_per_request > 0.0);
        assert_eq!(off.sync_bytes_per_request, 0.0);
        assert_eq!(synced.completed, synced.requests);
    }
}

#[test]
fn a_reasoning_model_answers_after_its_reasoning_offline() {
    use crate::reasoning::ReasoningConfig;
    let reasoning = ReasoningConfig {
        mean_tokens: 300.0,
        sigma: 0.5,
        max_tokens: 5000,
        seed: 1,
    };
    let thinking: Vec<SimBackend> = small_fleet()
        .into_iter()
        .map(|b| SimBackend {
            reasoning: Some(reasoning),
            ..b
        })
        .collect();
    let reqs = workload(0.3);
    let plain = evaluate(&small_fleet(), "m", &reqs, "predicted_ttft").unwrap();
    let r = evaluate(&thinking, "m", &reqs, "predicted_ttft").unwrap();
    // Without reasoning the first answer is the first token.
    assert_eq!(plain.ttfa_mean_ms, plain.ttft_mean_ms);
    assert_eq!(plain.reasoning_tokens_mean, 0.0);
    // With it, every answer waits for the reasoning: hundreds of decode steps.
    assert!(
        (r.reasoning_tokens_mean - 300.0).abs() < 60.0,
        "{}",
        r.reasoning_tokens_mean
    );
    assert!(r.ttfa_mean_ms > 10.0 * r.ttft_mean_ms, "{r:?}");
    for o in &r.outcomes {
        if let (Some(a), Some(t)) = (o.ttfa_s, o.ttft_s) {
            assert!(a > t);
        }
    }
    assert_eq!(
        r.outcomes.iter().filter(|o| o.ttfa_s.is_some()).count() as u64,
        r.completed
    );
    // Deterministic, like every run.
    assert_eq!(
        evaluate(&thinking, "m", &reqs, "predicted_ttft").unwrap(),
        r
    );
    // Reasoning is generated work: the fleet sustains fewer requests per second.
    let sample: Vec<(u64, &TraceRequest)> = reqs
        .iter()
        .take(100)
        .enumerate()
        .map(|(i, r)| (i as u64, r))
        .collect();
    let cfg = &small_fleet()[0].config;
    assert!(
        reasoning_capacity_rps(cfg, Some(&reasoning), &sample) < engine_capacity_rps(cfg, &sample)
    );
}

/// The regression gate of issue 18: at 95 % load on a generated world (the seeded chat
/// workload on the fleet of small bounded caches, `config/sim/fleet-small-cache.yaml`),
/// `predicted_ttft`'s mean TTFT stays at or below `cache_aware`'s, on two seeds. Generated,
/// so it needs no trace file. Measured when written (release build): seed 1 58.6 vs 72.5 ms,
/// seed 2 59.7 vs 71.3 ms.
#[test]
fn predicted_ttft_is_not_behind_cache_aware_at_95_percent_load() {
    let fleet = load_fleet(&repo("config/sim/fleet-small-cache.yaml")).unwrap();
    for seed in [1, 2] {
        let mut reqs = SyntheticWorkload {
            seed,
            ..SyntheticWorkload::default()
        }
        .generate();
        spread_ties(&mut reqs);
        apply_load(&fleet, &mut reqs, 0.95);
        let pt = evaluate(&fleet, "m", &reqs, "predicted_ttft").unwrap();
        let ca = evaluate(&fleet, "m", &reqs, "cache_aware").unwrap();
        assert_eq!(
            (pt.completed, ca.completed),
            (reqs.len() as u64, reqs.len() as u64)
        );
        assert!(
            pt.ttft_mean_ms <= ca.ttft_mean_ms,
            "seed {seed}: predicted_ttft mean TTFT {:.1} ms > cache_aware's {:.1} ms at 95 % load",
            pt.ttft_mean_ms,
            ca.ttft_mean_ms
        );
    }
}

/// `--objective ttfa` (a route's `objective: ttfa`): on the 4×H100 + 4×A100 fleet serving a
/// reasoning model at half its capacity, routing by predicted TTFA — the learned reasoning
/// length at each backend's predicted TPOT — answers sooner than routing by TTFT, on the mean
/// and at p99; on a model that does not reason it learns an expectation of 0 and decides
/// exactly as `ttft`. Measured when written (debug build, seeded synthetic workload): TTFA mean
/// 8465 vs 10245 ms, p99 24416 vs 31272 ms.
#[test]
fn the_ttfa_objective_answers_a_reasoning_model_sooner() {
    let run = |fleet: &[SimBackend], reqs: &[TraceRequest], objective| {
        run_route(
            fleet,
            reqs,
            "predicted_ttft",
            &Default::default(),
            objective,
        )
        .unwrap()
    };
    use crate::evaluate::EvalObjective::{Ttfa, Ttft};
    let fleet = load_fleet(&repo("config/sim/fleet-hetero-reasoning.yaml")).unwrap();
    let mut reqs = SyntheticWorkload::default().generate();
    spread_ties(&mut reqs);
    apply_load(&fleet, &mut reqs, 0.5);
    let (ttft, ttfa) = (run(&fleet, &reqs, Ttft), run(&fleet, &reqs, Ttfa));
    assert_eq!(ttfa.completed, reqs.len() as u64);
    assert!(
        ttfa.ttfa_mean_ms < ttft.ttfa_mean_ms && ttfa.ttfa_p99_ms < ttft.ttfa_p99_ms,
        "TTFA mean/p99: ttfa objective {:.0}/{:.0} ms, ttft objective {:.0}/{:.0} ms",
        ttfa.ttfa_mean_ms,
        ttfa.ttfa_p99_ms,
        ttft.ttfa_mean_ms,
        ttft.ttfa_p99_ms
    );
    let plain = small_fleet();
    let reqs = workload(0.8);
    assert_eq!(run(&plain, &reqs, Ttfa), run(&plain, &reqs, Ttft));
}

/// The goodput gate of issue 18: at 95 % load on a slice of the Mooncake conversation trace
/// (8×H100, the first 1500 requests), with the matrix's objectives (TTFT 1 s, TPOT 50 ms),
/// `predicted_ttft` serves at least as large a share within both as `cache_aware`. It is the
/// charge for the decode stall a prefill imposes (`decode_stall_weight`) that wins it: measured
/// when written (release build) 74.1 % against 66.6 %, and 60.6 % without the charge.
#[test]
fn predicted_ttft_goodput_is_not_behind_cache_aware_at_95_percent_load() {
    let Some(args) = conversation_slice(0.95, 1500) else {
        return;
    };
    let fleet = load_fleet(&args.fleet).unwrap();
    let (reqs, _) = prepare_trace(&args, &fleet).unwrap();
    let slo = pronto_core::slo::SloTargets {
        ttft_s: Some(1.0),
        tpot_s: Some(0.05),
    };
    let run = |policy| run_route(&fleet, &reqs, policy, &slo, EvalObjective::Ttft).unwrap();
    let (pt, ca) = (run("predicted_ttft"), run("cache_aware"));
    assert_eq!((pt.completed, ca.completed), (1500, 1500));
    assert!(
        pt.goodput_requests >= ca.goodput_requests,
        "goodput at 95 % load: predicted_ttft {:.1} % < cache_aware {:.1} %",
        100.0 * pt.goodput_requests,
        100.0 * ca.goodput_requests
    );
}

/// The oracle with `--objective ttfa` times each backend to the request's first *answer* token
/// (its reasoning included): on a 2×H100 + 2×A100 fleet serving a reasoning model it answers
/// sooner on the mean than the oracle timing the first token; on a model that does not reason
/// the two are the same run.
#[test]
fn the_oracle_minimises_the_runs_objective() {
    use crate::evaluate::EvalObjective::{Ttfa, Ttft};
    use crate::reasoning::ReasoningConfig;
    let run = |fleet: &[SimBackend], reqs: &[TraceRequest], objective| {
        run_route(fleet, reqs, ORACLE, &Default::default(), objective).unwrap()
    };
    let plain = small_fleet();
    let reqs = workload(0.5);
    assert_eq!(run(&plain, &reqs, Ttfa), run(&plain, &reqs, Ttft));
    let reasoning = ReasoningConfig {
        mean_tokens: 200.0,
        sigma: 0.5,
        max_tokens: 2000,
        seed: 1,
    };
    let hetero: Vec<SimBackend> = small_fleet()
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let profile = if i < 2 {
                "h100-llama3-8b"
            } else {
                "a100-llama3-8b"
            };
            let mut config = EngineConfig::from_profile(Profile::builtin(profile).unwrap());
            config.num_kv_blocks = b.config.num_kv_blocks;
            SimBackend {
                reasoning: Some(reasoning),
                config,
                ..b
            }
        })
        .collect();
    let mut reqs = SyntheticWorkload {
        seed: 7,
        conversations: 30,
        ..SyntheticWorkload::default()
    }
    .generate();
    spread_ties(&mut reqs);
    apply_load(&hetero, &mut reqs, 0.7);
    let (ttft, ttfa) = (run(&hetero, &reqs, Ttft), run(&hetero, &reqs, Ttfa));
    assert_eq!(ttfa.completed, reqs.len() as u64);
    assert!(
        ttfa.ttfa_mean_ms < ttft.ttfa_mean_ms,
        "TTFA mean: the ttfa oracle {:.0} ms, the ttft oracle {:.0} ms",
        ttfa.ttfa_mean_ms,
        ttft.ttfa_mean_ms
    );
}

/// `--policy NAME{key: value}`: a gateway policy's parameters reach the policy, are checked as
/// the config checks them, and the report names the policy as given.
#[test]
fn a_policy_takes_its_parameters_after_its_name() {
    let fleet = small_fleet();
    let reqs = workload(0.9);
    let slo = pronto_core::slo::SloTargets {
        ttft_s: Some(1.0),
        tpot_s: Some(0.02),
    };
    let run = |policy: &str| run_route(&fleet, &reqs, policy, &slo, EvalObjective::Ttft);
    let plain = run("predicted_ttft").unwrap();
    let default = run("predicted_ttft{decode_stall_weight: 0.2}").unwrap();
    assert_eq!(default.policy, "predicted_ttft{decode_stall_weight: 0.2}");
    assert_eq!(
        default.outcomes, plain.outcomes,
        "the default weight, written out"
    );
    let heavy = run("predicted_ttft{decode_stall_weight: 50}").unwrap();
    assert_ne!(
        heavy.outcomes, plain.outcomes,
        "the parameter reaches the policy"
    );
    for (bad, says) in [
        (
            "predicted_ttft{decode_stall_weight: -1}",
            "decode_stall_weight",
        ),
        ("predicted_ttft{nope: 1}", "unknown parameter"),
        ("predicted_ttft{", "not a YAML map"),
        ("predicted_ttft{[1]}", "not a YAML map"),
        ("oracle{x: 1}", "unknown policy"),
    ] {
        let e = run(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

/// SLO admission offline, by the gateway's rules (`pronto_core::admission`): at 1.5 × capacity
/// with a tight TTFT SLO, `shed` refuses what would miss it, so what it serves starts sooner;
/// `queue` holds requests back instead, shedding none while a backend can still take them.
#[test]
fn slo_admission_sheds_or_queues_what_would_miss() {
    use crate::eval_replicas::Replication;
    use pronto_core::admission::OnMiss;
    use pronto_core::slo::SloTargets;
    let reqs = workload(1.5);
    let run = |admission| {
        let route = RouteSettings {
            slo: SloTargets {
                ttft_s: Some(0.3),
                tpot_s: None,
            },
            admission,
            ..RouteSettings::default()
        };
        let fleet = small_fleet();
        evaluate_route(
            &fleet,
            "m",
            &reqs,
            "predicted_ttft",
            Replication::default(),
            &route,
        )
        .unwrap()
    };
    let open = run(None);
    let shed = run(Some(OnMiss::Shed));
    let queued = run(Some(OnMiss::Queue));
    assert_eq!(open.shed, 0);
    assert!(shed.shed > 0, "an overload sheds");
    assert_eq!(
        shed.completed + shed.shed + shed.rejected,
        reqs.len() as u64
    );
    assert!(
        shed.ttft_mean_ms < open.ttft_mean_ms,
        "what is admitted starts sooner: {} vs {}",
        shed.ttft_mean_ms,
        open.ttft_mean_ms
    );
    assert!(queued.shed < shed.shed, "{} vs {}", queued.shed, shed.shed);
    assert_eq!(
        queued.completed + queued.shed + queued.rejected,
        reqs.len() as u64
    );
}
