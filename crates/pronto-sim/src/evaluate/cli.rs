//! `pronto evaluate`, the command: every requested policy over the prepared trace, printed
//! as a table or JSON.

use std::time::Instant;

use anyhow::Context;

use super::{evaluate_crashing, load_fleet, prepare_trace, CrashPlan, EvaluateArgs, RouteSettings};
use crate::fleet_config::FleetConfig;

/// `pronto evaluate`: run every requested policy and print a table or JSON.
pub fn run_evaluate(args: EvaluateArgs) -> anyhow::Result<()> {
    let fleet = load_fleet(&args.fleet)?;
    let model = FleetConfig::load(&args.fleet)?.model;
    let (reqs, capacity) = prepare_trace(&args, &fleet)?;
    let mut runs = Vec::new();
    for p in &args.policies() {
        let started = Instant::now();
        let route = RouteSettings {
            slo: args.slo(),
            objective: args.objective,
            races: args.races(),
            admission: args.on_slo_miss.map(|m| m.rule()),
        };
        let plan = CrashPlan::of(&FleetConfig::load(&args.fleet)?, args.migration);
        let report =
            evaluate_crashing(&fleet, &model, &reqs, p, args.replication(), &route, &plan)?;
        let wall = started.elapsed().as_secs_f64();
        if !args.json {
            eprintln!(
                "{p}: replayed {} requests in {wall:.2} s ({:.0} requests/s)",
                reqs.len(),
                reqs.len() as f64 / wall.max(1e-9)
            );
        }
        if let Some(dir) = &args.requests_csv {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--requests-csv: cannot create {}", dir.display()))?;
            let file = dir.join(format!("{p}.csv"));
            std::fs::write(&file, crate::eval_report::outcomes_csv(&report))
                .with_context(|| format!("--requests-csv: cannot write {}", file.display()))?;
        }
        runs.push(report);
    }
    if args.json {
        println!("{}", crate::eval_report::to_json(&runs, capacity));
    } else {
        if let Some(c) = capacity {
            println!(
                "fleet capacity {c:.2} req/s; offered {:.2} req/s",
                c * args.load.unwrap_or(0.0)
            );
        }
        print!("{}", crate::eval_report::table(&runs));
        print!("{}", crate::eval_report::legend(&runs));
    }
    Ok(())
}
