//! Calibrating the live simulator recovers the profile it runs: `pronto sim-fleet` with a
//! known profile, measured over HTTP on a reduced plan, fitted, compared with the truth.
//!
//! The profile is a slow engine whose front end is the bottleneck for short prompts and the
//! engine for long ones (so both show), and its terms are large enough that what the live
//! fleet adds on its own — HTTP in a debug build, timers that fire on the next millisecond,
//! tasks sharing two worker threads with the client: 1–5 ms, about 1 % — stays inside the 5 %
//! the test allows. The reduced plan (3 lengths up to a chunked 4000, concurrency 1 and 4, 3
//! repetitions) takes ~55 s.
//!
//! "Recovers" is checked where the plan identifies the profile: the timings (every measured
//! shape, and every length of the full plan alone), the sums of terms
//! the shapes see, and the terms that show on their own. Terms that only trade off against
//! each other inside those sums (prefill step vs output latency, prefill per token vs
//! attention) move by 5–15 % with the noise above, run to run (measured on this 2-core host
//! under other builds), and are not asserted one by one.

use std::time::Duration;

use super::fit::{fit, predict, FitOptions};
use super::measure::{measure, MeasureOptions, Server};
use super::params::{theta_of, with_theta, Lin, Param, Theta};
use super::replay::shape_row;
use super::shapes::Plan;
use super::write::profile_yaml;
use crate::engine::EngineConfig;
use crate::fleet::SimFleet;
use crate::fleet_config::{FleetConfig, SimBackendConfig};
use crate::profile::Profile;

/// floor, prefill step, per token, attention, per seq, per kctx, front end, per token, latency
const TRUTH: Theta = [16.0, 8.0, 0.08, 24.0, 2.0, 0.0, 60.0, 0.02, 80.0];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrating_the_sim_fleet_recovers_its_profile() {
    let mut profile = with_theta(&Profile::builtin("cpu-tiny").unwrap(), &TRUTH);
    profile.name = "calibrate-truth".into();
    let path = std::env::temp_dir().join(format!(
        "pronto-calibrate-truth-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, profile_yaml(&profile, &[])).unwrap();
    let fleet = SimFleet::start(
        &FleetConfig {
            model: "m".into(),
            reasoning: None,
            backends: vec![SimBackendConfig {
                name: "truth".into(),
                profile: path.display().to_string(),
                num_kv_blocks: None,
                max_num_seqs: None,
                port: Some(0),
                kv_events_port: None,
                faults: Default::default(),
            }],
        },
        1.0,
    )
    .await
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    let server = Server::new(&fleet.urls()[0], "m", Duration::from_secs(60)).unwrap();
    let plan = Plan::new(&[128, 1000, 4000], &[1, 4], 4, 128, 16, 3);
    let m = measure(
        &server,
        &MeasureOptions {
            plan,
            pause: Duration::from_millis(10),
            max_duration: Duration::from_secs(120),
            seed: 7,
            nonce_salt: 0,
            label: "self-calibration".into(),
            progress: false,
        },
    )
    .await
    .unwrap();
    fleet.shutdown().await;
    assert_eq!(m.reps, 3);
    assert_eq!(
        m.engine_version.as_deref(),
        Some(concat!("pronto-sim ", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(
        m.kv_cache,
        Some((profile.block_size, profile.num_kv_blocks))
    );
    let cfg = EngineConfig::from_profile(profile.clone());
    let f = fit(&m.results, &cfg, &FitOptions::standard()).unwrap();
    let truth = predict(&m.results, &cfg, &theta_of(&profile)).unwrap();
    let mut report: Vec<String> = Param::ALL
        .iter()
        .map(|p| {
            format!(
                "{} {:.4} (true {})",
                p.name(),
                f.theta[p.index()],
                TRUTH[p.index()]
            )
        })
        .collect();
    // What the live fleet measured against what the true profile's replay predicts.
    report.extend(
        m.results
            .iter()
            .zip(&truth)
            .map(|(r, t)| format!("{}: measured {:.2} replayed {t:.2}", r.shape, r.ms_median)),
    );
    // Every check is (what, recovered, true), printed (`--nocapture`) before any is asserted.
    let mut checks: Vec<(String, f64, f64)> = Vec::new();
    // What the reduced plan pins on its own: the front end's per-token cost, and the engine's
    // compute of a long cold prompt (prefill tokens and attention together: 4000 tokens of
    // linear ops next to 8 M attention pairs; how the two split moves with a few per cent of
    // timing noise on the 1000-token shapes).
    let p = Param::FrontendPerToken;
    checks.push((p.name().into(), f.theta[p.index()], TRUTH[p.index()]));
    let compute = |t: &Theta| {
        let w = crate::profile::StepWork {
            prefill_tokens: 4000,
            prefill_pairs: 4000.0 * 4000.0 / 2.0,
            ..Default::default()
        };
        Lin::step(&w).at(t) - t[Param::Floor.index()] - t[Param::PrefillStep.index()]
    };
    checks.push((
        "compute of 4000 cold tokens".into(),
        compute(&f.theta),
        compute(&TRUTH),
    ));
    // The constant terms, in the sums the shapes see: a decode step at batch 1, and a lone
    // request's fixed cost (front end, one prefill step, output latency). Which constant
    // carries how much is decided by the c=4 shapes alone and moves with the fleet's own
    // millisecond of HTTP and timer overhead.
    let sum = |t: &Theta, ps: &[Param]| ps.iter().map(|p| t[p.index()]).sum::<f64>();
    let decode_step = [Param::Floor, Param::DecodePerSeq];
    let fixed_cost = [
        Param::FrontendRequest,
        Param::Floor,
        Param::PrefillStep,
        Param::Latency,
    ];
    for (what, ps) in [
        ("decode step (floor + per seq)", &decode_step[..]),
        ("fixed cost of a lone request", &fixed_cost[..]),
    ] {
        checks.push((what.into(), sum(&f.theta, ps), sum(&TRUTH, ps)));
    }
    // And the recovered profile behaves as the true one: every measured shape, and every
    // length of the full plan alone (512 and 2000 tokens were never measured here). (Unmeasured
    // shapes at concurrency depend on how the constants split, and some sit where an arrival
    // ties with a step's end — 512 tokens at c=4 here — so a 1 % change flips the schedule:
    // measure the shapes you want predicted, as the full plan does.)
    let got = predict(&m.results, &cfg, &f.theta).unwrap();
    for ((r, t), g) in m.results.iter().zip(&truth).zip(got) {
        checks.push((format!("replayed {}", r.shape), g, *t));
    }
    for s in Plan::new(&[128, 512, 1000, 2000, 4000], &[1], 4, 128, 16, 1).shapes {
        let t = shape_row(&s, s.tokens, &cfg, &TRUTH).unwrap().at(&TRUTH);
        let g = shape_row(&s, s.tokens, &cfg, &f.theta)
            .unwrap()
            .at(&f.theta);
        checks.push((format!("predicted {}", s.label()), g, t));
    }
    let rel = |got: f64, want: f64| (got - want).abs() / want;
    for (what, got, want) in &checks {
        eprintln!(
            "self-calibration: {what}: {got:.4} vs {want:.4} ({:+.2} %)",
            100.0 * (got - want) / want
        );
    }
    for (what, got, want) in &checks {
        assert!(
            rel(*got, *want) <= 0.05,
            "{what}: {got} vs {want}, not within 5 %: {report:?}"
        );
    }
    assert_eq!(f.theta[Param::DecodePerKctx.index()], 0.0, "fixed");
}
