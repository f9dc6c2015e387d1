//! The evaluator's fleet: backends loaded from a fleet file, and the capacity a request mix
//! gets from them (closed-loop runs of each distinct engine), which `--load` scales to.

use std::path::Path;

use super::{StallFault, Wedge, CALIBRATION_SAMPLE};
use crate::engine::{Engine, EngineConfig, SimRequest};
use crate::fleet_config::FleetConfig;
use crate::reasoning::ReasoningConfig;
use crate::workload::{self as trace, TraceRequest};

/// One simulated backend: a name and its engine configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SimBackend {
    /// Backend name.
    pub name: String,
    /// Its engine.
    pub config: EngineConfig,
    /// The model it serves reasons first ([`crate::reasoning`]); `None`: it does not.
    pub reasoning: Option<ReasoningConfig>,
    /// Its first-token stall fault (the fleet file's `faults:`); `None`: it does not stall.
    pub stall: Option<StallFault>,
    /// When its engine is wedged (the fleet file's `wedge_after` / `wedge_for`); `None`:
    /// never.
    pub wedge: Option<Wedge>,
}

impl SimBackend {
    /// A backend `name` running `config`, with no reasoning model and no fault.
    pub fn new(name: impl Into<String>, config: EngineConfig) -> SimBackend {
        SimBackend {
            name: name.into(),
            config,
            reasoning: None,
            stall: None,
            wedge: None,
        }
    }
}

/// Load a fleet file into evaluator backends.
pub fn load_fleet(path: &Path) -> anyhow::Result<Vec<SimBackend>> {
    let fleet = FleetConfig::load(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let configs = fleet.engine_configs(base)?;
    Ok(fleet
        .backends
        .iter()
        .zip(configs)
        .enumerate()
        .map(|(i, (b, config))| SimBackend {
            name: b.name.clone(),
            config,
            reasoning: fleet.reasoning,
            stall: StallFault::of(&b.faults, i),
            wedge: Wedge::of(&b.faults),
        })
        .collect())
}

/// Sustainable requests/s of one engine on `sample` (closed loop, all queued at once).
pub fn engine_capacity_rps(config: &EngineConfig, sample: &[(u64, &TraceRequest)]) -> f64 {
    reasoning_capacity_rps(config, None, sample)
}

/// [`engine_capacity_rps`] for a model that reasons as `reasoning` says (its reasoning tokens
/// are generated work too).
pub fn reasoning_capacity_rps(
    config: &EngineConfig,
    reasoning: Option<&ReasoningConfig>,
    sample: &[(u64, &TraceRequest)],
) -> f64 {
    let mut e = Engine::new(config.clone());
    let mut ids = Vec::new();
    for &(index, r) in sample {
        ids.clear();
        r.prompt_ids(index, &mut ids);
        let thinking = reasoning.map_or(0, |c| c.tokens_for(&ids));
        e.add_request(SimRequest {
            id: index,
            prompt: std::mem::take(&mut ids),
            max_tokens: r.output_tokens.saturating_add(thinking),
        });
    }
    let mut t = 0.0;
    while let Some(s) = e.step() {
        t += s.duration_s;
    }
    if t > 0.0 {
        sample.len() as f64 / t
    } else {
        f64::INFINITY
    }
}

/// Fleet capacity (requests/s) for this trace's mix; see the module docs.
pub fn fleet_capacity_rps(fleet: &[SimBackend], reqs: &[TraceRequest]) -> f64 {
    let stride = reqs.len().div_ceil(CALIBRATION_SAMPLE).max(1);
    let sample: Vec<(u64, &TraceRequest)> = reqs
        .iter()
        .enumerate()
        .step_by(stride)
        .map(|(i, r)| (i as u64, r))
        .collect();
    let mut per_config: Vec<(&SimBackend, f64)> = Vec::new();
    let mut total = 0.0;
    for b in fleet {
        let same = |c: &&SimBackend| c.config == b.config && c.reasoning == b.reasoning;
        let rate = match per_config.iter().find(|(c, _)| same(c)) {
            Some(&(_, r)) => r,
            None => {
                let r = reasoning_capacity_rps(&b.config, b.reasoning.as_ref(), &sample);
                per_config.push((b, r));
                r
            }
        };
        total += rate;
    }
    total
}

/// Rescale arrivals so the offered rate is `load ×` the fleet's capacity; returns capacity.
pub fn apply_load(fleet: &[SimBackend], reqs: &mut [TraceRequest], load: f64) -> f64 {
    let capacity = fleet_capacity_rps(fleet, reqs);
    let span = reqs.last().map_or(0.0, |r| r.arrival_s);
    if reqs.len() > 1 && span > 0.0 && load > 0.0 && capacity.is_finite() {
        let native = reqs.len() as f64 / span;
        trace::scale_arrivals(reqs, native / (load * capacity));
    }
    capacity
}
