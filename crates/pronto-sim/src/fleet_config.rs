//! The fleet file: a model name and the simulated backends serving it.
//!
//! ```yaml
//! model: llama-3-8b
//! backends:
//!   - { name: h100-0, profile: h100-llama3-8b, port: 8201, num_kv_blocks: 25000 }
//! ```
//! `profile` is a built-in profile name or a path to a profile YAML file; `num_kv_blocks`
//! overrides the profile's capacity; `faults` holds the live fleet's fault knobs. An optional
//! top-level `reasoning: { mean_tokens, sigma, max_tokens, seed }` makes the model a reasoning
//! model ([`super::reasoning`]).

use std::time::Duration;

use serde::Deserialize;

use super::engine::EngineConfig;
use super::profile::{Profile, ProfileError};
use super::reasoning::ReasoningConfig;

/// Fault-injection knobs of one live backend (owned by the live fleet; see
/// [`super::fleet_faults`] for what each does). Durations are human strings (`250ms`, `2s`)
/// or numbers of seconds.
///
/// ```yaml
/// faults: { error_rate: 0.1, stall_first_token: 2s, stall_probability: 0.05, slowdown: 1.5,
///           crash_after: 30s, crash_every: 60s, restart_after: 5s, wedge_after: 20s,
///           wedge_for: 30s, seed: 7 }
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultConfig {
    /// Probability (0–1) that a generation request is answered 500 before any byte.
    pub error_rate: f64,
    /// Hold each request's first token back this long (wall time).
    #[serde(deserialize_with = "de_opt_duration")]
    pub stall_first_token: Option<Duration>,
    /// Probability (0–1) that a request is stalled (`stall_first_token`); 1: every request.
    pub stall_probability: f64,
    /// Factor multiplying every engine step's duration (> 0; 1 = nominal speed).
    pub slowdown: f64,
    /// How long a crashed backend answers 503 before serving again (wall time).
    #[serde(deserialize_with = "de_duration")]
    pub restart_after: Duration,
    /// Crash this long after the fleet starts.
    #[serde(deserialize_with = "de_opt_duration")]
    pub crash_after: Option<Duration>,
    /// Crash again this often after the first crash (needs `crash_after`).
    #[serde(deserialize_with = "de_opt_duration")]
    pub crash_every: Option<Duration>,
    /// Wedge the engine this long after the fleet starts (alive, health 200, accepting
    /// requests, producing no token); in the evaluator, this long after its start (virtual).
    #[serde(deserialize_with = "de_opt_duration")]
    pub wedge_after: Option<Duration>,
    /// With `wedge_after`: let it go after this long (absent: wedged for good).
    #[serde(deserialize_with = "de_opt_duration")]
    pub wedge_for: Option<Duration>,
    /// Seed of the `error_rate` draws (mixed with the backend's index).
    pub seed: u64,
}

impl Default for FaultConfig {
    fn default() -> FaultConfig {
        FaultConfig {
            error_rate: 0.0,
            stall_first_token: None,
            stall_probability: 1.0,
            slowdown: 1.0,
            restart_after: Duration::from_secs(5),
            crash_after: None,
            crash_every: None,
            wedge_after: None,
            wedge_for: None,
            seed: 0,
        }
    }
}

impl FaultConfig {
    /// Check ranges; the error is `(field, reason)` relative to `faults`.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(("error_rate", "must be between 0 and 1"));
        }
        if !(0.0..=1.0).contains(&self.stall_probability) {
            return Err(("stall_probability", "must be between 0 and 1"));
        }
        if !(self.slowdown.is_finite() && self.slowdown > 0.0) {
            return Err(("slowdown", "must be a positive number"));
        }
        if self.crash_every.is_some() && self.crash_after.is_none() {
            return Err(("crash_every", "needs crash_after"));
        }
        if self.crash_every.is_some_and(|d| d.is_zero()) {
            return Err(("crash_every", "must be positive"));
        }
        if self.wedge_for.is_some() && self.wedge_after.is_none() {
            return Err(("wedge_for", "needs wedge_after"));
        }
        Ok(())
    }
}

/// A duration as a human string (`250ms`, `2s`, `1m`) or a number of seconds.
#[derive(Deserialize)]
#[serde(untagged)]
enum HumanDuration {
    Text(String),
    Seconds(f64),
}

impl HumanDuration {
    fn into_duration<E: serde::de::Error>(self) -> Result<Duration, E> {
        match self {
            HumanDuration::Text(s) => humantime::parse_duration(s.trim())
                .map_err(|e| E::custom(format!("invalid duration {s:?}: {e}"))),
            HumanDuration::Seconds(x) => Duration::try_from_secs_f64(x)
                .map_err(|_| E::custom(format!("invalid duration {x}: must be >= 0 seconds"))),
        }
    }
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    HumanDuration::deserialize(d)?.into_duration()
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<HumanDuration>::deserialize(d)?
        .map(HumanDuration::into_duration)
        .transpose()
}

/// One simulated backend.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimBackendConfig {
    /// Backend name (a metric label).
    pub name: String,
    /// Built-in profile name or path to a profile YAML.
    pub profile: String,
    /// Override of the profile's KV block count.
    #[serde(default)]
    pub num_kv_blocks: Option<usize>,
    /// Override of the profile's cap on running requests (vLLM `--max-num-seqs`).
    #[serde(default)]
    pub max_num_seqs: Option<usize>,
    /// Port of the live fleet's HTTP server for this backend.
    #[serde(default)]
    pub port: Option<u16>,
    /// Port of this backend's ZMQ publisher of KV-cache events (live fleet only; 0: an
    /// ephemeral port; absent: no events).
    #[serde(default)]
    pub kv_events_port: Option<u16>,
    /// Fault injection (live fleet only).
    #[serde(default)]
    pub faults: FaultConfig,
}

/// A fleet file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Model name every backend serves.
    pub model: String,
    /// The model reasons before it answers ([`super::reasoning`]); absent: it does not.
    #[serde(default)]
    pub reasoning: Option<ReasoningConfig>,
    /// The backends, in pool order.
    pub backends: Vec<SimBackendConfig>,
}

/// A fleet file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FleetConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Malformed YAML or unknown field.
    #[error("{origin}: {source}")]
    Parse {
        /// File path.
        origin: String,
        /// Cause.
        source: serde_yaml_ng::Error,
    },
    /// A backend's profile could not be loaded.
    #[error("{origin}: backends[{index}].profile: {source}")]
    Profile {
        /// File path.
        origin: String,
        /// Backend index.
        index: usize,
        /// Cause.
        source: ProfileError,
    },
    /// A value is out of range.
    #[error("{origin}: {field}: {reason}")]
    Invalid {
        /// File path.
        origin: String,
        /// Field path.
        field: String,
        /// Why.
        reason: String,
    },
}

impl FleetConfig {
    /// Load and validate a fleet file.
    pub fn load(path: &std::path::Path) -> Result<FleetConfig, FleetConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| FleetConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        FleetConfig::parse(&text, &path.display().to_string())
    }

    /// Parse and validate fleet YAML; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<FleetConfig, FleetConfigError> {
        let cfg: FleetConfig =
            serde_yaml_ng::from_str(text).map_err(|source| FleetConfigError::Parse {
                origin: origin.to_string(),
                source,
            })?;
        let invalid = |field: String, reason: &str| FleetConfigError::Invalid {
            origin: origin.to_string(),
            field,
            reason: reason.to_string(),
        };
        if let Some(Err((field, reason))) = cfg.reasoning.as_ref().map(ReasoningConfig::validate) {
            return Err(invalid(format!("reasoning.{field}"), reason));
        }
        if cfg.backends.is_empty() {
            return Err(invalid(
                "backends".into(),
                "at least one backend is required",
            ));
        }
        for (i, b) in cfg.backends.iter().enumerate() {
            if b.name.is_empty() {
                return Err(invalid(format!("backends[{i}].name"), "must not be empty"));
            }
            if cfg.backends[..i].iter().any(|o| o.name == b.name) {
                return Err(invalid(format!("backends[{i}].name"), "duplicate name"));
            }
            if let Some(p) = b.port.filter(|&p| p != 0) {
                if cfg.backends[..i].iter().any(|o| o.port == Some(p)) {
                    return Err(invalid(format!("backends[{i}].port"), "duplicate port"));
                }
            }
            if let Err((field, reason)) = b.faults.validate() {
                return Err(invalid(format!("backends[{i}].faults.{field}"), reason));
            }
            if b.max_num_seqs == Some(0) {
                return Err(invalid(
                    format!("backends[{i}].max_num_seqs"),
                    "must be > 0",
                ));
            }
            if b.num_kv_blocks == Some(0) {
                return Err(invalid(
                    format!("backends[{i}].num_kv_blocks"),
                    "must be > 0",
                ));
            }
        }
        Ok(cfg)
    }

    /// The engine configuration of each backend, in pool order. Relative profile paths are
    /// resolved against `base_dir` (the fleet file's directory).
    pub fn engine_configs(
        &self,
        base_dir: &std::path::Path,
    ) -> Result<Vec<EngineConfig>, FleetConfigError> {
        self.backends
            .iter()
            .enumerate()
            .map(|(index, b)| {
                b.engine_config(base_dir)
                    .map_err(|source| FleetConfigError::Profile {
                        origin: base_dir.display().to_string(),
                        index,
                        source,
                    })
            })
            .collect()
    }
}

impl SimBackendConfig {
    /// This backend's engine configuration (profile defaults plus overrides).
    pub fn engine_config(&self, base_dir: &std::path::Path) -> Result<EngineConfig, ProfileError> {
        let profile = match Profile::builtin(&self.profile) {
            Ok(p) => p,
            Err(ProfileError::Unknown(_))
                if self.profile.ends_with(".yaml") || self.profile.ends_with(".yml") =>
            {
                Profile::load(&base_dir.join(&self.profile))?
            }
            Err(e) => return Err(e),
        };
        let mut cfg = EngineConfig::from_profile(profile);
        if let Some(n) = self.num_kv_blocks {
            cfg.num_kv_blocks = n;
        }
        if let Some(n) = self.max_num_seqs {
            cfg.max_num_seqs = n;
        }
        Ok(cfg)
    }
}
