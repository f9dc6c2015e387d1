//! GPU/model profiles: how long one engine step takes, and how much KV cache there is.
//!
//! A profile is a YAML file under `config/sim/` (also compiled in, see [`Profile::builtin`]).
//! The step-time model, in milliseconds, for a step that computes `P` prefill tokens and
//! `D` decode tokens is
//!
//! ```text
//! t = floor_ms
//!   + prefill_ms_per_token · P                  linear ops (GEMMs), per prefill token
//!   + attn_ms_per_mpair    · A / 1e6            prefill attention, A = Σ_chunks n·(p + n/2)
//!   + decode_ms_per_seq    · D                  per decoding sequence (linear ops, sampling)
//!   + decode_ms_per_kctx   · C / 1e3            decode attention, C = Σ context of decoders
//! ```
//!
//! `A` counts query×key token pairs of causal attention: a chunk of `n` new tokens after `p`
//! already-computed ones (cached prefix or earlier chunks) attends to `p + n/2` keys on
//! average, so one uncached prompt of `n` tokens costs `n²/2` pairs — the superlinear term that
//! makes TTFT of long prompts grow faster than their length. `floor_ms` is the weight-streaming
//! cost paid by every step (memory bound). Each file states the fit and its source rows.

use serde::Deserialize;

/// Coefficients of the step-time model (see the module docs). All in milliseconds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepModel {
    /// Fixed cost of any non-empty step.
    pub floor_ms: f64,
    /// Per prefill token (linear layers).
    pub prefill_ms_per_token: f64,
    /// Per million causal attention pairs of prefill.
    pub attn_ms_per_mpair: f64,
    /// Per decoding sequence in the step.
    pub decode_ms_per_seq: f64,
    /// Per thousand context tokens read by decoding sequences.
    pub decode_ms_per_kctx: f64,
}

/// What one engine step computes, as the step-time model sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepWork {
    /// Prefill tokens computed.
    pub prefill_tokens: u64,
    /// Causal attention pairs of the prefill chunks, Σ n·(p + n/2).
    pub prefill_pairs: f64,
    /// Decoding sequences (one token each).
    pub decode_seqs: u64,
    /// Total context tokens of the decoding sequences.
    pub decode_ctx_tokens: u64,
}

/// A GPU + model profile.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Profile name (the file stem).
    pub name: String,
    /// Human description: GPU, model, parallelism.
    pub description: String,
    /// Step-time coefficients.
    pub step: StepModel,
    /// KV bytes per token: 2 · layers · kv_heads · head_dim · dtype bytes (per GPU group).
    pub kv_bytes_per_token: u64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks that fit in GPU memory after weights and activations.
    pub num_kv_blocks: usize,
    /// Default cap on the running batch.
    pub max_num_seqs: usize,
    /// Default per-step token budget.
    pub max_num_batched_tokens: usize,
}

/// Names of the compiled-in profiles.
pub const BUILTIN: &[&str] = &[
    "h100-llama3-8b",
    "a100-llama3-8b",
    "h100-llama2-70b-tp8",
    "cpu-tiny",
];

fn builtin_text(name: &str) -> Option<&'static str> {
    Some(match name {
        "h100-llama3-8b" => include_str!("../../../config/sim/h100-llama3-8b.yaml"),
        "a100-llama3-8b" => include_str!("../../../config/sim/a100-llama3-8b.yaml"),
        "h100-llama2-70b-tp8" => include_str!("../../../config/sim/h100-llama2-70b-tp8.yaml"),
        "cpu-tiny" => include_str!("../../../config/sim/cpu-tiny.yaml"),
        _ => return None,
    })
}

/// A profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No built-in profile has that name.
    #[error("unknown profile {0:?} (built in: {list})", list = BUILTIN.join(", "))]
    Unknown(String),
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The YAML is malformed or has unknown fields.
    #[error("{origin}: {source}")]
    Parse {
        /// File path or built-in name.
        origin: String,
        /// Cause.
        source: serde_yaml_ng::Error,
    },
    /// A value is out of range.
    #[error("{origin}: {field}: {reason}")]
    Invalid {
        /// File path or built-in name.
        origin: String,
        /// Offending field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl Profile {
    /// A compiled-in profile by name (see [`BUILTIN`]).
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        let text = builtin_text(name).ok_or_else(|| ProfileError::Unknown(name.to_string()))?;
        Profile::parse(text, name)
    }

    /// Load a profile from a YAML file.
    pub fn load(path: &std::path::Path) -> Result<Profile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Profile::parse(&text, &path.display().to_string())
    }

    /// A built-in name, else a path to a YAML file.
    pub fn resolve(name_or_path: &str) -> Result<Profile, ProfileError> {
        if builtin_text(name_or_path).is_some() {
            Profile::builtin(name_or_path)
        } else if name_or_path.ends_with(".yaml") || name_or_path.ends_with(".yml") {
            Profile::load(std::path::Path::new(name_or_path))
        } else {
            Err(ProfileError::Unknown(name_or_path.to_string()))
        }
    }

    /// Parse and validate profile YAML; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Profile, ProfileError> {
        let p: Profile = serde_yaml_ng::from_str(text).map_err(|source| ProfileError::Parse {
            origin: origin.to_string(),
            source,
        })?;
        p.validate(origin)?;
        Ok(p)
    }

    fn validate(&self, origin: &str) -> Result<(), ProfileError> {
        let bad = |field, reason: &str| ProfileError::Invalid {
            origin: origin.to_string(),
            field,
            reason: reason.to_string(),
        };
        let s = &self.step;
        for (field, v) in [
            ("step.floor_ms", s.floor_ms),
            ("step.prefill_ms_per_token", s.prefill_ms_per_token),
            ("step.attn_ms_per_mpair", s.attn_ms_per_mpair),
            ("step.decode_ms_per_seq", s.decode_ms_per_seq),
            ("step.decode_ms_per_kctx", s.decode_ms_per_kctx),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(field, "must be a finite number >= 0"));
            }
        }
        if s.floor_ms <= 0.0 {
            return Err(bad("step.floor_ms", "must be > 0"));
        }
        if self.block_size == 0 {
            return Err(bad("block_size", "must be > 0"));
        }
        if self.num_kv_blocks == 0 {
            return Err(bad("num_kv_blocks", "must be > 0"));
        }
        if self.max_num_seqs == 0 {
            return Err(bad("max_num_seqs", "must be > 0"));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(bad("max_num_batched_tokens", "must be > 0"));
        }
        Ok(())
    }

    /// Simulated duration of one step, in seconds.
    pub fn step_seconds(&self, w: &StepWork) -> f64 {
        let s = &self.step;
        let ms = s.floor_ms
            + s.prefill_ms_per_token * w.prefill_tokens as f64
            + s.attn_ms_per_mpair * w.prefill_pairs / 1e6
            + s.decode_ms_per_seq * w.decode_seqs as f64
            + s.decode_ms_per_kctx * w.decode_ctx_tokens as f64 / 1e3;
        ms / 1e3
    }

    /// KV capacity in tokens.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.num_kv_blocks * self.block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses_and_yaml_files_match() {
        for name in BUILTIN {
            let p = Profile::builtin(name).unwrap();
            assert_eq!(&p.name, name);
            let path = format!(
                "{}/../../config/sim/{name}.yaml",
                env!("CARGO_MANIFEST_DIR")
            );
            assert_eq!(Profile::load(std::path::Path::new(&path)).unwrap(), p);
        }
        assert!(matches!(
            Profile::builtin("nope"),
            Err(ProfileError::Unknown(_))
        ));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_rejected() {
        let good = include_str!("../../../config/sim/cpu-tiny.yaml");
        let extra = format!("{good}\nbogus: 1\n");
        assert!(matches!(
            Profile::parse(&extra, "x"),
            Err(ProfileError::Parse { .. })
        ));
        let neg = good.replace("floor_ms:", "floor_ms: -1 #");
        let err = Profile::parse(&neg, "x").unwrap_err().to_string();
        assert!(err.contains("step.floor_ms"), "{err}");
    }

    #[test]
    fn step_time_is_monotonic_and_superlinear_in_prefill() {
        let p = Profile::builtin("h100-llama3-8b").unwrap();
        let t = |n: u64| {
            p.step_seconds(&StepWork {
                prefill_tokens: n,
                prefill_pairs: (n * n) as f64 / 2.0,
                ..StepWork::default()
            })
        };
        assert!(t(1024) < t(2048));
        // The marginal cost per token grows with length (attention).
        assert!((t(8192) - t(4096)) / 4096.0 > (t(2048) - t(1024)) / 1024.0);
    }

    fn decode_ms(p: &Profile, batch: u64, ctx_each: u64) -> f64 {
        1e3 * p.step_seconds(&StepWork {
            decode_seqs: batch,
            decode_ctx_tokens: batch * ctx_each,
            ..StepWork::default()
        })
    }

    fn prefill_ms(p: &Profile, n: u64) -> f64 {
        1e3 * p.step_seconds(&StepWork {
            prefill_tokens: n,
            prefill_pairs: (n * n) as f64 / 2.0,
            ..StepWork::default()
        })
    }

    /// The fits reproduce the numbers their files cite.
    #[test]
    fn profiles_match_their_sources() {
        let h = Profile::builtin("h100-llama3-8b").unwrap();
        let a = Profile::builtin("a100-llama3-8b").unwrap();
        // llm-d-inference-sim ITL at batch 1: 10-15 ms (H100), 15-25 ms (A100).
        assert!((10.0..15.0).contains(&decode_ms(&h, 1, 512)));
        assert!((15.0..25.0).contains(&decode_ms(&a, 1, 512)));
        // Dynamo mocker cross-check: 4096-token prefill ~85 ms; ours within 30 %.
        let p4k = prefill_ms(&h, 4096);
        assert!((85.0 * 0.7..85.0 * 1.3).contains(&p4k), "{p4k}");
        // Vidur: A100 prefill ~3x slower than H100 for the same model.
        let ratio = prefill_ms(&a, 8192) / prefill_ms(&h, 8192);
        assert!((2.5..3.5).contains(&ratio), "{ratio}");
        // SplitwiseSim 70B TP8: decode 30.6 ms at batch 1, 50.2 ms at batch 64 (prompt 512).
        let b = Profile::builtin("h100-llama2-70b-tp8").unwrap();
        assert!((decode_ms(&b, 1, 640) - 30.6).abs() < 1.5);
        assert!((decode_ms(&b, 64, 640) - 50.2).abs() < 2.5);
        // cpu-tiny, fitted to a real vLLM on CPU (docs/fidelity): a 1000-token prompt measured
        // 31.1 ms cold and 25.5 ms with 896 tokens cached (client TTFT, concurrency 1; the
        // engine step is a few ms less).
        let c = Profile::builtin("cpu-tiny").unwrap();
        let cold = prefill_ms(&c, 1000);
        assert!((22.0..32.0).contains(&cold), "{cold}");
        let hit = 1e3
            * c.step_seconds(&StepWork {
                prefill_tokens: 104,
                prefill_pairs: 104.0 * (896.0 + 52.0),
                ..StepWork::default()
            });
        assert!((20.0..27.0).contains(&hit) && hit < cold, "{hit}");
    }
}
