//! The fleet file: a model name and the simulated backends serving it.
//!
//! ```yaml
//! model: llama-3-8b
//! backends:
//!   - { name: h100-0, profile: h100-llama3-8b, port: 8201, num_kv_blocks: 25000 }
//! ```
//! `profile` is a built-in profile name or a path to a profile YAML file; `num_kv_blocks`
//! overrides the profile's capacity; `faults` holds the live fleet's fault knobs.

use serde::Deserialize;

use super::engine::EngineConfig;
use super::profile::{Profile, ProfileError};

/// Fault-injection knobs of one live backend (owned by the live fleet).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {}

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
    /// Port of the live fleet's HTTP server for this backend.
    #[serde(default)]
    pub port: Option<u16>,
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
            if let Some(p) = b.port {
                if cfg.backends[..i].iter().any(|o| o.port == Some(p)) {
                    return Err(invalid(format!("backends[{i}].port"), "duplicate port"));
                }
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
        Ok(cfg)
    }
}
