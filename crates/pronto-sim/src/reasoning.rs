//! A reasoning model: how many reasoning tokens a request generates before its answer.
//!
//! A fleet file may declare that its model reasons:
//!
//! ```yaml
//! model: sim-r1
//! reasoning: { mean_tokens: 400, sigma: 0.6, max_tokens: 4000, seed: 1 }
//! backends: [ ... ]
//! ```
//!
//! Each chat request then generates `r` reasoning tokens — streamed as
//! `delta.reasoning_content`, as vLLM's reasoning parsers do — before the `max_tokens` tokens
//! of its answer (`delta.content`); `usage.completion_tokens` counts both and
//! `usage.completion_tokens_details.reasoning_tokens` the first. (Real engines count reasoning
//! inside `max_tokens`; here the answer keeps its requested length so that a reasoning fleet
//! and a plain one produce the same answers.) Completions requests do not reason.
//!
//! ## The distribution
//! `r` is log-normal with mean `mean_tokens` and shape `sigma` (the standard deviation of
//! `ln r`; 0: every request reasons exactly `mean_tokens`), rounded and capped at
//! `max_tokens`. The draw is a pure function of the prompt's token ids and `seed`
//! ([`ReasoningConfig::tokens_for`]): the same prompt reasons equally long on every backend —
//! a failover or hedge copy produces the same stream — and in the offline evaluator, which
//! therefore predicts the live fleet's reasoning request by request.

use pronto_core::tokens::{mix64, TokenId};
use serde::Deserialize;

/// Reasoning of the fleet's model (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    /// Mean reasoning tokens per request (≥ 0).
    pub mean_tokens: f64,
    /// Standard deviation of `ln r` (≥ 0; 0: a fixed length).
    #[serde(default)]
    pub sigma: f64,
    /// Most reasoning tokens of one request.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Seed of the draws (mixed with each prompt's hash).
    #[serde(default)]
    pub seed: u64,
}

fn default_max_tokens() -> u32 {
    32_768
}

impl ReasoningConfig {
    /// Check ranges; the error is `(field, reason)` relative to `reasoning`.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if !(self.mean_tokens.is_finite() && self.mean_tokens >= 0.0) {
            return Err(("mean_tokens", "must be a number >= 0"));
        }
        if !(self.sigma.is_finite() && (0.0..=4.0).contains(&self.sigma)) {
            return Err(("sigma", "must be between 0 and 4"));
        }
        Ok(())
    }

    /// Reasoning tokens of the request whose prompt has token ids `prompt`.
    pub fn tokens_for(&self, prompt: &[TokenId]) -> u32 {
        if self.mean_tokens <= 0.0 {
            return 0;
        }
        let r = if self.sigma == 0.0 {
            self.mean_tokens
        } else {
            let key = mix64(prompt_hash(prompt) ^ mix64(self.seed));
            // Two uniforms in (0, 1] from the key; Box–Muller gives one standard normal.
            let u1 = ((key >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let u2 = ((mix64(key) >> 11) as f64) / (1u64 << 53) as f64;
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            // E[exp(mu + sigma z)] = mean  ⇔  mu = ln mean − sigma²/2.
            let mu = self.mean_tokens.ln() - self.sigma * self.sigma / 2.0;
            (mu + self.sigma * z).exp()
        };
        (r.round().min(f64::from(self.max_tokens))) as u32
    }
}

/// FNV-1a over the prompt's token ids, mixed.
fn prompt_hash(prompt: &[TokenId]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in prompt {
        h ^= u64::from(t);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mean: f64, sigma: f64) -> ReasoningConfig {
        ReasoningConfig {
            mean_tokens: mean,
            sigma,
            max_tokens: 100_000,
            seed: 3,
        }
    }

    #[test]
    fn a_fixed_length_and_none() {
        assert_eq!(cfg(250.0, 0.0).tokens_for(&[1, 2, 3]), 250);
        assert_eq!(cfg(0.0, 1.0).tokens_for(&[1, 2, 3]), 0);
        let capped = ReasoningConfig {
            max_tokens: 10,
            ..cfg(250.0, 0.0)
        };
        assert_eq!(capped.tokens_for(&[1]), 10);
    }

    #[test]
    fn draws_are_per_prompt_and_have_the_configured_mean() {
        let c = cfg(400.0, 0.6);
        let a: Vec<u32> = vec![7, 8, 9];
        assert_eq!(c.tokens_for(&a), c.tokens_for(&a.clone()));
        let draws: Vec<f64> = (0..20_000u32)
            .map(|i| f64::from(c.tokens_for(&[i, i ^ 0x55])))
            .collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 400.0).abs() < 12.0, "mean {mean}");
        let distinct: std::collections::BTreeSet<u64> = draws.iter().map(|&d| d as u64).collect();
        assert!(distinct.len() > 200, "a spread, not a constant");
        let other = ReasoningConfig { seed: 4, ..c };
        assert!((0..50u32).any(|i| other.tokens_for(&[i]) != c.tokens_for(&[i])));
    }

    #[test]
    fn out_of_range_values_are_named() {
        assert_eq!(cfg(-1.0, 0.0).validate().unwrap_err().0, "mean_tokens");
        assert_eq!(cfg(1.0, f64::NAN).validate().unwrap_err().0, "sigma");
        assert!(cfg(1.0, 0.5).validate().is_ok());
    }
}
