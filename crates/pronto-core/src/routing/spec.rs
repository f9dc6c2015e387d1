//! Which policy a pool uses, with its parameters: [`PolicyKind`] (a name) and [`PolicySpec`]
//! (a name and typed parameters, each with a default).
//!
//! In config a policy is a name (`policy: cache_aware`) or a map whose `name` selects the
//! policy and whose other keys are its parameters
//! (`policy: {name: cache_aware, cache_threshold: 0.5}`); an absent parameter takes its
//! default. [`PolicySpec::from_parts`] turns that map into a spec, reporting every problem per
//! parameter (unknown for this policy, wrong type, out of range) so the config loader can name
//! the field. `PolicySpec` also derives serde with the same shape (tag `name`).
//!
//! | name | parameters (default) |
//! | --- | --- |
//! | `predicted_ttft` (default) | `poor_error` (1.0), `min_samples` (3), `explore_after_s` (30), `explore_margin` (2.0), `decode_stall_weight` (0.2, >= 0) |
//! | `round_robin` | — |
//! | `least_inflight` | — |
//! | `random` | `seed` (0) |
//! | `power_of_two` | `seed` (0) |
//! | `cache_aware` | `cache_threshold` (0.3, 0..=1), `balance_abs_threshold` (64), `balance_rel_threshold` (1.5, >= 1) |
//! | `consistent_hash` | `virtual_nodes` (160, 1..=10000) |

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cache_aware::{
    DEFAULT_BALANCE_ABS_THRESHOLD, DEFAULT_BALANCE_REL_THRESHOLD, DEFAULT_CACHE_THRESHOLD,
};
use super::consistent_hash::DEFAULT_VIRTUAL_NODES;
use super::{
    CacheAware, ConsistentHash, LeastInflight, Policy, PowerOfTwo, PredictedTtft, Random,
    RoundRobin,
};

/// Largest accepted `consistent_hash.virtual_nodes`.
pub(crate) const MAX_VIRTUAL_NODES: u32 = 10_000;

/// Policy names accepted in config.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Rotate through eligible backends, in proportion to weight.
    RoundRobin,
    /// Fewest in-flight requests (relative to weight); ties rotate.
    LeastInflight,
    /// Lowest predicted time to first token, with bounded exploration and fallback.
    #[default]
    PredictedTtft,
    /// Weighted uniform random choice, seeded.
    Random,
    /// Two weighted random candidates, the less loaded wins.
    PowerOfTwo,
    /// SGLang's cache-aware routing with load-imbalance override.
    CacheAware,
    /// Session affinity on a consistent-hash ring.
    ConsistentHash,
}

impl PolicyKind {
    /// Every policy name, for help texts and error messages.
    pub const ALL: &'static [&'static str] = &[
        "predicted_ttft",
        "round_robin",
        "least_inflight",
        "random",
        "power_of_two",
        "cache_aware",
        "consistent_hash",
    ];

    /// Parse a policy name.
    pub fn parse(name: &str) -> Option<PolicyKind> {
        Some(match name {
            "round_robin" => PolicyKind::RoundRobin,
            "least_inflight" => PolicyKind::LeastInflight,
            "predicted_ttft" => PolicyKind::PredictedTtft,
            "random" => PolicyKind::Random,
            "power_of_two" => PolicyKind::PowerOfTwo,
            "cache_aware" => PolicyKind::CacheAware,
            "consistent_hash" => PolicyKind::ConsistentHash,
            _ => return None,
        })
    }

    /// Config name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::LeastInflight => "least_inflight",
            PolicyKind::PredictedTtft => "predicted_ttft",
            PolicyKind::Random => "random",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::ConsistentHash => "consistent_hash",
        }
    }

    /// Names of the parameters this policy accepts, in documentation order.
    pub fn params(self) -> &'static [&'static str] {
        match self {
            PolicyKind::RoundRobin | PolicyKind::LeastInflight => &[],
            PolicyKind::PredictedTtft => &[
                "poor_error",
                "min_samples",
                "explore_after_s",
                "explore_margin",
                "decode_stall_weight",
            ],
            PolicyKind::Random | PolicyKind::PowerOfTwo => &["seed"],
            PolicyKind::CacheAware => &[
                "cache_threshold",
                "balance_abs_threshold",
                "balance_rel_threshold",
            ],
            PolicyKind::ConsistentHash => &["virtual_nodes"],
        }
    }

    /// What a parameter of this policy does (the config reference and the schema show it).
    pub fn param_doc(self, param: &str) -> &'static str {
        match (self, param) {
            (PolicyKind::PredictedTtft, "poor_error") => {
                "Recent relative prediction error above which a backend's model is distrusted \
                 (and, when every model is, the decision falls back to least_inflight); > 0"
            }
            (PolicyKind::PredictedTtft, "min_samples") => {
                "Observations before a backend's model counts as calibrated (until then it is explored)"
            }
            (PolicyKind::PredictedTtft, "explore_after_s") => {
                "Seconds without an observation after which a backend is explored again; > 0"
            }
            (PolicyKind::PredictedTtft, "explore_margin") => {
                "An exploration probe is allowed when its prediction is at most this × the best; >= 1"
            }
            (PolicyKind::PredictedTtft, "decode_stall_weight") => {
                "With a route tpot_slo: each second of decode stall a prefill imposes on a stream \
                 decoding beside it costs this many seconds in the ranking (weight × running \
                 decodes × prefill time × min(1, predicted TPOT / tpot_slo)); >= 0, 0 turns it off"
            }
            (PolicyKind::Random | PolicyKind::PowerOfTwo, "seed") => {
                "Start of the pseudo-random stream (the same seed, the same draws)"
            }
            (PolicyKind::CacheAware, "cache_threshold") => {
                "Share of the prompt the best prefix match must exceed to follow the cache, 0..=1"
            }
            (PolicyKind::CacheAware, "balance_abs_threshold") => {
                "In-flight difference (per unit weight) between busiest and idlest backend that, \
                 with the relative threshold, makes the pool imbalanced (then least loaded wins)"
            }
            (PolicyKind::CacheAware, "balance_rel_threshold") => {
                "Ratio busiest / idlest that, with the absolute threshold, makes the pool \
                 imbalanced; >= 1"
            }
            (PolicyKind::ConsistentHash, "virtual_nodes") => {
                "Points per backend (per unit weight) on the hash ring"
            }
            _ => "",
        }
    }

    /// This policy with every parameter at its default.
    pub fn spec(self) -> PolicySpec {
        match self {
            PolicyKind::RoundRobin => PolicySpec::RoundRobin,
            PolicyKind::LeastInflight => PolicySpec::LeastInflight,
            PolicyKind::PredictedTtft => PolicySpec::PredictedTtft(PredictedTtftParams::default()),
            PolicyKind::Random => PolicySpec::Random(SeedParams::default()),
            PolicyKind::PowerOfTwo => PolicySpec::PowerOfTwo(SeedParams::default()),
            PolicyKind::CacheAware => PolicySpec::CacheAware(CacheAwareParams::default()),
            PolicyKind::ConsistentHash => {
                PolicySpec::ConsistentHash(ConsistentHashParams::default())
            }
        }
    }

    /// A fresh policy of this kind, parameters at their defaults.
    pub fn build(self) -> Arc<dyn Policy> {
        self.spec().build()
    }
}

/// Parameters of the seeded random policies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SeedParams {
    /// Start of the splitmix64 stream.
    pub seed: u64,
}

/// Parameters of `cache_aware` (`CacheAware`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheAwareParams {
    /// Match ratio that must be exceeded to follow the cache, 0..=1.
    pub cache_threshold: f64,
    /// In-flight difference (per unit weight) between busiest and idlest that, together with
    /// the relative threshold, makes the pool imbalanced.
    pub balance_abs_threshold: u32,
    /// Ratio busiest / idlest that, together with the absolute threshold, makes the pool
    /// imbalanced; >= 1.
    pub balance_rel_threshold: f64,
}

impl Default for CacheAwareParams {
    fn default() -> CacheAwareParams {
        CacheAwareParams {
            cache_threshold: DEFAULT_CACHE_THRESHOLD,
            balance_abs_threshold: DEFAULT_BALANCE_ABS_THRESHOLD,
            balance_rel_threshold: DEFAULT_BALANCE_REL_THRESHOLD,
        }
    }
}

/// Parameters of `predicted_ttft` (`PredictedTtft`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictedTtftParams {
    /// Recent relative prediction error above which a backend's model is distrusted and the
    /// decision falls back to `least_inflight`; > 0.
    pub poor_error: f64,
    /// Observations before a backend's model counts as calibrated (until then it is explored).
    pub min_samples: u32,
    /// Seconds without an observation after which a backend is explored again; > 0.
    pub explore_after_s: f64,
    /// An exploration probe is allowed when its prediction is at most this × the best; >= 1.
    pub explore_margin: f64,
    /// Cost per second of decode stall a prefill imposes on each stream decoding beside it,
    /// for requests with a TPOT objective; >= 0, 0 turns it off.
    pub decode_stall_weight: f64,
}

impl Default for PredictedTtftParams {
    fn default() -> PredictedTtftParams {
        let d = PredictedTtft::default();
        PredictedTtftParams {
            poor_error: d.poor_error,
            min_samples: d.min_samples,
            explore_after_s: d.explore_after_s,
            explore_margin: d.explore_margin,
            decode_stall_weight: d.decode_stall_weight,
        }
    }
}

/// Parameters of `consistent_hash` (`ConsistentHash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsistentHashParams {
    /// Ring points per unit of backend weight, 1..=`MAX_VIRTUAL_NODES`.
    pub virtual_nodes: u32,
}

impl Default for ConsistentHashParams {
    fn default() -> ConsistentHashParams {
        ConsistentHashParams {
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
        }
    }
}

/// A policy and its parameters.
///
/// Serde form: a map tagged by `name`, other keys being parameters, each optional
/// (`{"name": "cache_aware", "cache_threshold": 0.5}`). Unknown parameters of a policy with
/// parameters are rejected by serde; [`PolicySpec::from_parts`] rejects them for every policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum PolicySpec {
    /// `round_robin`.
    RoundRobin,
    /// `least_inflight`.
    LeastInflight,
    /// `predicted_ttft` (the default).
    PredictedTtft(PredictedTtftParams),
    /// `random`.
    Random(SeedParams),
    /// `power_of_two`.
    PowerOfTwo(SeedParams),
    /// `cache_aware`.
    CacheAware(CacheAwareParams),
    /// `consistent_hash`.
    ConsistentHash(ConsistentHashParams),
}

/// A problem with a policy written in config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The parameter at fault; `None` when it is the policy name itself.
    pub param: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl SpecError {
    fn param(param: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            param: Some(param.to_string()),
            message: message.into(),
        }
    }
}

impl Default for PolicySpec {
    fn default() -> PolicySpec {
        PolicySpec::PredictedTtft(PredictedTtftParams::default())
    }
}

impl From<PolicyKind> for PolicySpec {
    fn from(kind: PolicyKind) -> PolicySpec {
        kind.spec()
    }
}

impl PolicySpec {
    /// Which policy.
    pub fn kind(&self) -> PolicyKind {
        match self {
            PolicySpec::RoundRobin => PolicyKind::RoundRobin,
            PolicySpec::LeastInflight => PolicyKind::LeastInflight,
            PolicySpec::PredictedTtft(_) => PolicyKind::PredictedTtft,
            PolicySpec::Random(_) => PolicyKind::Random,
            PolicySpec::PowerOfTwo(_) => PolicyKind::PowerOfTwo,
            PolicySpec::CacheAware(_) => PolicyKind::CacheAware,
            PolicySpec::ConsistentHash(_) => PolicyKind::ConsistentHash,
        }
    }

    /// Config name.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// A fresh policy with these parameters.
    pub fn build(&self) -> Arc<dyn Policy> {
        match *self {
            PolicySpec::RoundRobin => Arc::new(RoundRobin::default()),
            PolicySpec::LeastInflight => Arc::new(LeastInflight::default()),
            PolicySpec::PredictedTtft(p) => Arc::new(PredictedTtft::new(
                p.poor_error,
                p.min_samples,
                p.explore_after_s,
                p.explore_margin,
                p.decode_stall_weight,
            )),
            PolicySpec::Random(p) => Arc::new(Random::with_seed(p.seed)),
            PolicySpec::PowerOfTwo(p) => Arc::new(PowerOfTwo::with_seed(p.seed)),
            PolicySpec::CacheAware(p) => Arc::new(CacheAware::new(
                p.cache_threshold,
                p.balance_abs_threshold,
                p.balance_rel_threshold,
            )),
            PolicySpec::ConsistentHash(p) => Arc::new(ConsistentHash::new(p.virtual_nodes)),
        }
    }

    /// Range problems with the parameters, one per parameter at fault.
    pub(crate) fn check(&self) -> Vec<SpecError> {
        let mut errors = Vec::new();
        match self {
            PolicySpec::CacheAware(p) => {
                if !(0.0..=1.0).contains(&p.cache_threshold) {
                    errors.push(SpecError::param("cache_threshold", "must be in 0..=1"));
                }
                if !(p.balance_rel_threshold.is_finite() && p.balance_rel_threshold >= 1.0) {
                    errors.push(SpecError::param(
                        "balance_rel_threshold",
                        "must be a finite number >= 1",
                    ));
                }
            }
            PolicySpec::PredictedTtft(p) => {
                if !(p.poor_error.is_finite() && p.poor_error > 0.0) {
                    errors.push(SpecError::param(
                        "poor_error",
                        "must be a finite number > 0",
                    ));
                }
                if !(p.explore_after_s.is_finite() && p.explore_after_s > 0.0) {
                    errors.push(SpecError::param(
                        "explore_after_s",
                        "must be a finite number > 0",
                    ));
                }
                if !(p.explore_margin.is_finite() && p.explore_margin >= 1.0) {
                    errors.push(SpecError::param(
                        "explore_margin",
                        "must be a finite number >= 1",
                    ));
                }
                if !(p.decode_stall_weight.is_finite() && p.decode_stall_weight >= 0.0) {
                    errors.push(SpecError::param(
                        "decode_stall_weight",
                        "must be a finite number >= 0",
                    ));
                }
            }
            PolicySpec::ConsistentHash(p) => {
                if !(1..=MAX_VIRTUAL_NODES).contains(&p.virtual_nodes) {
                    errors.push(SpecError::param(
                        "virtual_nodes",
                        format!("must be in 1..={MAX_VIRTUAL_NODES}"),
                    ));
                }
            }
            PolicySpec::RoundRobin
            | PolicySpec::LeastInflight
            | PolicySpec::Random(_)
            | PolicySpec::PowerOfTwo(_) => {}
        }
        errors
    }

    /// The spec named `name` with parameters `params` (in file order), every problem reported:
    /// an unknown name; a parameter this policy does not take; a value of the wrong type; a
    /// value out of range.
    pub fn from_parts(
        name: &str,
        params: &[(String, serde_json::Value)],
    ) -> Result<PolicySpec, Vec<SpecError>> {
        let Some(kind) = PolicyKind::parse(name) else {
            return Err(vec![SpecError {
                param: None,
                message: format!(
                    "unknown policy `{name}`; valid policies: {}",
                    PolicyKind::ALL.join(", ")
                ),
            }]);
        };
        let tagged = |entries: &mut dyn Iterator<Item = &(String, serde_json::Value)>| {
            let mut map = serde_json::Map::new();
            map.insert("name".into(), serde_json::Value::from(name));
            for (k, v) in entries {
                map.insert(k.clone(), v.clone());
            }
            serde_json::from_value::<PolicySpec>(serde_json::Value::Object(map))
        };
        let mut errors = Vec::new();
        let mut good = Vec::with_capacity(params.len());
        for entry @ (key, _) in params {
            if !kind.params().contains(&key.as_str()) {
                let message = if kind.params().is_empty() {
                    format!("unknown parameter; `{name}` takes none")
                } else {
                    format!(
                        "unknown parameter for `{name}`; valid parameters: {}",
                        kind.params().join(", ")
                    )
                };
                errors.push(SpecError::param(key, message));
            } else if let Err(e) = tagged(&mut std::iter::once(entry)) {
                errors.push(SpecError::param(key, e.to_string()));
            } else {
                good.push(entry);
            }
        }
        let spec = tagged(&mut good.into_iter()).map_err(|e| {
            vec![SpecError {
                param: None,
                message: e.to_string(),
            }]
        })?;
        errors.extend(spec.check());
        if errors.is_empty() {
            Ok(spec)
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parts(
        name: &str,
        params: &[(&str, serde_json::Value)],
    ) -> Result<PolicySpec, Vec<SpecError>> {
        let params: Vec<(String, serde_json::Value)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        PolicySpec::from_parts(name, &params)
    }

    fn errors(r: Result<PolicySpec, Vec<SpecError>>) -> Vec<(String, String)> {
        r.unwrap_err()
            .into_iter()
            .map(|e| (e.param.unwrap_or_default(), e.message))
            .collect()
    }

    #[test]
    fn every_name_parses_builds_and_round_trips() {
        for &name in PolicyKind::ALL {
            let kind = PolicyKind::parse(name).unwrap();
            assert_eq!(kind.as_str(), name);
            assert_eq!(kind.spec().kind(), kind);
            assert_eq!(kind.build().name(), name);
            assert_eq!(parts(name, &[]), Ok(kind.spec()));
            let json = serde_json::to_value(kind.spec()).unwrap();
            assert_eq!(
                serde_json::from_value::<PolicySpec>(json).unwrap(),
                kind.spec()
            );
        }
        assert_eq!(PolicyKind::parse("fastest"), None);
        assert_eq!(PolicySpec::default().kind(), PolicyKind::default());
    }

    #[test]
    fn params_lists_exactly_the_serialized_fields() {
        for &name in PolicyKind::ALL {
            let kind = PolicyKind::parse(name).unwrap();
            let json = serde_json::to_value(kind.spec()).unwrap();
            let mut keys: Vec<&str> = json
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .filter(|&k| k != "name")
                .collect();
            let mut expected = kind.params().to_vec();
            keys.sort_unstable();
            expected.sort_unstable();
            assert_eq!(keys, expected, "{name}");
        }
    }

    #[test]
    fn defaults_are_sglangs() {
        assert_eq!(
            parts("cache_aware", &[]),
            Ok(PolicySpec::CacheAware(CacheAwareParams {
                cache_threshold: 0.3,
                balance_abs_threshold: 64,
                balance_rel_threshold: 1.5,
            }))
        );
        assert_eq!(
            parts("consistent_hash", &[]),
            Ok(PolicySpec::ConsistentHash(ConsistentHashParams {
                virtual_nodes: 160
            }))
        );
    }

    #[test]
    fn parameters_override_defaults() {
        let spec = parts(
            "cache_aware",
            &[
                ("cache_threshold", json!(0.5)),
                ("balance_rel_threshold", json!(2)),
            ],
        );
        assert_eq!(
            spec,
            Ok(PolicySpec::CacheAware(CacheAwareParams {
                cache_threshold: 0.5,
                balance_abs_threshold: 64,
                balance_rel_threshold: 2.0,
            }))
        );
        assert_eq!(
            parts("random", &[("seed", json!(7))]),
            Ok(PolicySpec::Random(SeedParams { seed: 7 }))
        );
    }

    #[test]
    fn every_problem_is_reported_by_parameter() {
        let got = errors(parts(
            "cache_aware",
            &[
                ("cache_threshold", json!(1.5)),
                ("balance_abs_threshold", json!("lots")),
                ("alpha", json!(1)),
                ("balance_rel_threshold", json!(0.5)),
            ],
        ));
        let params: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            params,
            [
                "balance_abs_threshold",
                "alpha",
                "cache_threshold",
                "balance_rel_threshold"
            ]
        );
        assert!(got[0].1.contains("invalid type"), "{got:?}");
        assert!(
            got[1].1.contains("valid parameters: cache_threshold"),
            "{got:?}"
        );
        assert_eq!(got[2].1, "must be in 0..=1");
        assert_eq!(got[3].1, "must be a finite number >= 1");
    }

    #[test]
    fn parameterless_policies_reject_any_parameter() {
        let got = errors(parts("round_robin", &[("seed", json!(1))]));
        assert_eq!(
            got,
            [(
                "seed".into(),
                "unknown parameter; `round_robin` takes none".into()
            )]
        );
    }

    #[test]
    fn unknown_name_and_range_limits() {
        let got = errors(parts("fastest", &[]));
        assert_eq!(got.len(), 1);
        assert!(got[0]
            .1
            .starts_with("unknown policy `fastest`; valid policies: predicted_ttft, round_robin"));
        assert!(parts("predicted_ttft", &[("explore_margin", json!(0.5))]).is_err());
        assert!(parts("predicted_ttft", &[("poor_error", json!(0))]).is_err());
        assert!(parts("predicted_ttft", &[("min_samples", json!(10))]).is_ok());
        assert!(parts("predicted_ttft", &[("decode_stall_weight", json!(0))]).is_ok());
        // Every parameter of every policy is documented.
        for kind in PolicyKind::ALL.iter().filter_map(|n| PolicyKind::parse(n)) {
            for p in kind.params() {
                assert!(!kind.param_doc(p).is_empty(), "{} {p}", kind.as_str());
            }
        }
        assert!(parts("predicted_ttft", &[("decode_stall_weight", json!(-0.1))]).is_err());
        assert!(parts("consistent_hash", &[("virtual_nodes", json!(0))]).is_err());
        assert!(parts("consistent_hash", &[("virtual_nodes", json!(10_001))]).is_err());
        assert!(parts("consistent_hash", &[("virtual_nodes", json!(10_000))]).is_ok());
        assert!(parts("cache_aware", &[("cache_threshold", json!(0))]).is_ok());
        assert!(parts("cache_aware", &[("cache_threshold", json!(1))]).is_ok());
        assert!(parts("cache_aware", &[("cache_threshold", json!(-0.1))]).is_err());
        assert!(parts("random", &[("seed", json!(-1))]).is_err());
    }
}
