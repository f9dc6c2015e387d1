//! The config file as written: serde structs mirroring the YAML, with no interpretation.
//!
//! Every struct denies unknown fields, so a typo (`wieght:`) is an error with a line and
//! column rather than a silently ignored setting. Every field is optional here, even ones the
//! gateway requires: [`super::validate()`] reports a missing field together with every other
//! problem, instead of serde stopping at the first. For the same reason, values that need
//! interpretation stay raw — addresses and URLs as strings, durations and sizes as
//! [`Quantity`] — and are parsed during validation.
//!
//! Two shapes need hand-written deserializers:
//! - [`PolicyFile`] accepts a bare name (`policy: round_robin`) or a map
//!   (`policy: {name: cache_aware, cache_threshold: 0.5}`) whose other keys are the policy's
//!   parameters, kept raw until validation checks them against the named policy;
//! - [`Pools`] keeps pools in file order and keeps duplicate keys, so validation can report
//!   them by name instead of YAML's generic "duplicate entry".

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// The whole gateway config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Client listener, `IP:port`.
    pub listen: Option<String>,
    /// Admin listener (metrics, config), `IP:port`.
    pub admin_listen: Option<String>,
    /// Worker threads for the proxy service.
    pub threads: Option<u64>,
    /// How long in-flight streams may run after SIGTERM.
    pub grace_period: Option<Quantity>,
    /// Request limits and timeouts.
    pub limits: Option<LimitsFile>,
    /// Retry policy.
    pub retry: Option<RetryFile>,
    /// Stream migration ([`super::migration`]).
    pub migration: Option<super::migration::MigrationFile>,
    /// Active and passive health checking.
    pub health: Option<HealthFile>,
    /// Add `x-pronto-*` explanation headers to responses.
    pub explain_headers: Option<bool>,
    /// The access log.
    pub access_log: Option<AccessLogFile>,
    /// Live reload of this file.
    pub reload: Option<ReloadFile>,
    /// Priority classes, most urgent first (`[interactive, batch]` when absent).
    pub priority_classes: Option<Vec<String>>,
    /// The SLO admission queue.
    pub admission: Option<AdmissionFile>,
    /// Ordered routes: request → pool; the first match wins.
    pub routes: Option<Vec<RouteFile>>,
    /// Backend pools keyed by model name (or by pool name when `routes:` is present).
    pub pools: Option<Pools>,
    /// API keys.
    pub auth: Option<super::edge::AuthFile>,
    /// Admin listener settings.
    pub admin: Option<super::edge::AdminFile>,
    /// Rate limits per key and per route.
    pub rate_limits: Option<super::edge::RateLimitsFile>,
    /// TLS on the client listener.
    pub tls: Option<super::tls::TlsFile>,
    /// Replica sync over NATS.
    pub cluster: Option<super::cluster::ClusterFile>,
}

/// `access_log:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogFile {
    /// Write one line per request.
    pub enabled: Option<bool>,
    /// Share of requests written, 0 to 1.
    pub sample_rate: Option<f64>,
}

/// `admission:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionFile {
    /// Requests the gateway queue holds at most, over all routes.
    pub queue_size: Option<u64>,
}

/// One entry of `routes:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// Unique route name, a metric label.
    pub name: Option<String>,
    /// What the request must look like; absent matches every request.
    #[serde(rename = "match")]
    pub matches: Option<MatchFile>,
    /// Target pool (a key of `pools:`).
    pub pool: Option<String>,
    /// Time-to-first-token objective; enables admission control.
    pub ttft_slo: Option<Quantity>,
    /// Time-per-output-token objective (after the first token); steers `predicted_ttft`.
    pub tpot_slo: Option<Quantity>,
    /// What `predicted_ttft` minimises: `ttft` (default) or `ttfa` (time to first answer).
    pub objective: Option<String>,
    /// What `first_token_deadline` and `hedge` race on: `ttft` (default) or `ttfa`.
    pub race_on: Option<String>,
    /// Priority class (one of `priority_classes`).
    pub priority: Option<String>,
    /// `queue`, `fallback` or `shed`.
    pub on_slo_miss: Option<String>,
    /// Pool used by `on_slo_miss: fallback`.
    pub fallback_pool: Option<String>,
    /// Routing policy for this route's requests, overriding the pool's.
    pub policy: Option<PolicyFile>,
    /// Overrides `retry.max_retries`.
    pub max_retries: Option<u64>,
    /// Overrides `limits.first_token_timeout`.
    pub first_token_timeout: Option<Quantity>,
    /// Overrides `limits.idle_timeout`.
    pub idle_timeout: Option<Quantity>,
    /// Fail over to the next-best backend when the first token is this late.
    pub first_token_deadline: Option<super::race::DeadlineFile>,
    /// Send a second copy of a slow request (bounded).
    pub hedge: Option<super::race::HedgeFile>,
    /// Overrides the top-level `migration:`.
    pub migration: Option<super::migration::MigrationFile>,
    /// SSE comment keep-alives this often while a stream waits for its first token.
    pub keepalive: Option<Quantity>,
}

/// A route's `match:` section; every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    /// Model name, exact or a glob (`llama-*`).
    pub model: Option<String>,
    /// Request path, exact or a glob.
    pub path: Option<String>,
    /// Header name → exact value.
    pub headers: Option<BTreeMap<String, String>>,
    /// Bearer tokens, any of which matches.
    pub api_keys: Option<Vec<String>>,
}

/// `limits:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// Largest accepted request body (integer bytes or a size such as `32MiB`).
    pub max_body_bytes: Option<Quantity>,
    /// TCP connect timeout to a backend.
    pub connect_timeout: Option<Quantity>,
    /// Deadline for the first byte of the answer.
    pub first_token_timeout: Option<Quantity>,
    /// Longest silence from the backend mid-stream.
    pub idle_timeout: Option<Quantity>,
    /// Deadline for a non-streamed request's answer, from sending it.
    pub request_timeout: Option<Quantity>,
    /// Deadline for a request head, from its first byte.
    pub header_timeout: Option<Quantity>,
    /// Deadline for the whole request body.
    pub body_timeout: Option<Quantity>,
    /// Longest a write to a client may wait for it to read.
    pub write_timeout: Option<Quantity>,
    /// How long an idle keep-alive connection waits for its next request.
    pub keepalive_timeout: Option<Quantity>,
    /// Bytes per second a client must read at least (a larger write gets a longer deadline).
    pub min_send_rate: Option<Quantity>,
    /// Request body bytes buffered at once, over all requests.
    pub max_buffered_bytes: Option<Quantity>,
    /// Client connections open at once.
    pub max_connections: Option<u64>,
}

/// `retry:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryFile {
    /// Retries on another backend before any byte reaches the client.
    pub max_retries: Option<u64>,
}

/// `health:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthFile {
    /// HTTP path probed on each backend.
    pub path: Option<String>,
    /// Time between probes.
    pub interval: Option<Quantity>,
    /// Probe timeout.
    pub timeout: Option<Quantity>,
    /// Consecutive passive failures that eject a backend.
    pub eject_after_failures: Option<u64>,
    /// Delay before an ejected backend is probed again.
    pub readmit_after: Option<Quantity>,
    /// Progress-based exclusion of a backend that produces no token.
    pub stall: Option<super::progress::StallFile>,
}

/// `reload:` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadFile {
    /// Poll the file for changes and reload it.
    pub watch: Option<bool>,
    /// Time between two polls.
    pub watch_interval: Option<Quantity>,
}

/// One pool: the backends serving one model name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// Routing policy; `least_inflight` when absent.
    pub policy: Option<PolicyFile>,
    /// The pool's static backends.
    pub backends: Option<Vec<BackendFile>>,
    /// Backends found by resolving a DNS name, besides or instead of `backends`.
    pub discover: Option<DiscoverFile>,
    /// Default profile hint of the pool's backends (a backend's own fields override it).
    pub profile: Option<ProfileFile>,
    /// The model's tokenizer: a `tokenizer.json` or a model directory holding one (exact
    /// prompt tokens and engine-matching block hashes; see `pronto_tokenizer`).
    pub tokenizer: Option<String>,
    /// A chat template file overriding the one found beside the tokenizer.
    pub chat_template: Option<String>,
    /// The key the gateway presents to the pool's backends (`Authorization: Bearer`), on
    /// requests, health checks and scrapes: inline, `{env: NAME}` or `{file: PATH}`.
    pub api_key: Option<super::edge::SecretFile>,
    /// Engine metrics scraping of the pool's backends.
    pub scrape: Option<ScrapeFile>,
    /// What the pool's backends call its model, when not the pool's name: a name, or
    /// `discover` (ask each backend's `GET /v1/models`).
    pub served_model_name: Option<String>,
    /// Whether the pool's engines can continue a partial answer (stream migration).
    pub continue_streams: Option<bool>,
}

/// A pool's `scrape:` section: how often its backends' `/metrics` are read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeFile {
    /// Time between two scrapes of each backend (while they succeed).
    pub interval: Option<Quantity>,
}

/// A pool's `discover:` section: backends from a DNS name, re-resolved periodically.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoverFile {
    /// `host:port` (or `host`, for the scheme's default port) resolved to the backends.
    pub dns: Option<String>,
    /// Time between two resolutions.
    pub interval: Option<Quantity>,
    /// `http` (the only scheme supported for discovered backends).
    pub scheme: Option<String>,
    /// Keep only `ipv4` or `ipv6` addresses; `any` (default) keeps both.
    pub family: Option<String>,
    /// Relative weight of each discovered backend.
    pub weight: Option<u64>,
    /// Cap on concurrent requests of each discovered backend.
    pub max_inflight: Option<u64>,
}

/// A profile hint: what the backend's TTFT model assumes before it has measured anything.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// A simulator profile written by `pronto calibrate` (relative to the config file): its
    /// `prior:` block gives the fields not set beside it (see `config/profile.rs`).
    pub file: Option<String>,
    /// Fixed overhead of a request, milliseconds.
    pub base_ms: Option<f64>,
    /// Prefill throughput, prompt tokens per second.
    pub prefill_tokens_per_s: Option<f64>,
    /// Time to first token added by each running decode, milliseconds.
    pub decode_ms_per_running: Option<f64>,
}

/// One backend entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendFile {
    /// Unique name, used as a metric label.
    pub name: Option<String>,
    /// Base URL, `http://host:port`.
    pub url: Option<String>,
    /// Relative weight.
    pub weight: Option<u64>,
    /// Cap on concurrent requests.
    pub max_inflight: Option<u64>,
    /// Free-form labels; scalar values (`rack: 3`, `spot: true`) are kept as their text.
    pub labels: Option<BTreeMap<String, LabelValue>>,
    /// Profile hint for the TTFT model's cold start (overrides the pool's, field by field).
    pub profile: Option<ProfileFile>,
    /// The engine's KV-cache event publisher (exact prefix index).
    pub kv_events: Option<KvEventsFile>,
    /// PEM CA certificates trusted for this `https` backend instead of the system roots.
    pub ca_file: Option<String>,
    /// This backend's key, replacing the pool's `api_key`.
    pub api_key: Option<super::edge::SecretFile>,
    /// What this backend calls the pool's model, replacing the pool's `served_model_name`.
    pub served_model_name: Option<String>,
}

/// `kv_events:` of a backend.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsFile {
    /// `tcp://HOST:PORT` of the engine's ZMQ publisher.
    pub endpoint: Option<String>,
    /// Tokens per engine KV block.
    pub block_size: Option<u64>,
}

/// A label value: any YAML scalar, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelValue(pub String);

impl<'de> Deserialize<'de> for LabelValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<LabelValue, D::Error> {
        struct LabelVisitor;

        impl Visitor<'_> for LabelVisitor {
            type Value = LabelValue;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }
        }

        deserializer.deserialize_any(LabelVisitor)
    }
}

// === impl Quantity ===

/// A duration or size as written: a bare number or a string with a unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantity {
    /// A bare integer (`30`, `-1`).
    Int(i128),
    /// A bare non-integer (`1.5`).
    Float(f64),
    /// A string (`30s`, `32MiB`).
    Text(String),
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantity::Int(n) => write!(f, "{n}"),
            Quantity::Float(x) => write!(f, "{x}"),
            Quantity::Text(s) => f.write_str(s),
        }
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Quantity {
        Quantity::Text(s.to_string())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Quantity, D::Error> {
        struct QuantityVisitor;

        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string with a unit, like `2s` or `32MiB`")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::Int(i128::from(v)))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity::Int(i128::from(v)))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity::Float(v))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity::Text(v.to_string()))
            }
        }

        deserializer.deserialize_any(QuantityVisitor)
    }
}

// === impl PolicyFile ===

/// A pool's policy: `policy: cache_aware` or `policy: {name: cache_aware, cache_threshold: 0.5}`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyFile {
    /// Policy name as written; validated against [`pronto_core::routing::PolicyKind::ALL`].
    pub name: String,
    /// The map form's other keys, in file order: the policy's parameters, checked during
    /// validation by [`pronto_core::routing::PolicySpec::from_parts`].
    pub params: Vec<(String, serde_json::Value)>,
}

impl<'de> Deserialize<'de> for PolicyFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<PolicyFile, D::Error> {
        struct PolicyVisitor;

        impl<'de> Visitor<'de> for PolicyVisitor {
            type Value = PolicyFile;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy name or a map with a `name` field and parameters")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<PolicyFile, E> {
                Ok(PolicyFile {
                    name: v.to_string(),
                    params: Vec::new(),
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PolicyFile, A::Error> {
                let mut name = None;
                let mut params = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "name" {
                        if name.is_some() {
                            return Err(de::Error::duplicate_field("name"));
                        }
                        name = Some(map.next_value::<String>()?);
                    } else {
                        params.push((key, map.next_value::<serde_json::Value>()?));
                    }
                }
                let name = name.ok_or_else(|| de::Error::missing_field("name"))?;
                Ok(PolicyFile { name, params })
            }
        }

        deserializer.deserialize_any(PolicyVisitor)
    }
}

// === impl Pools ===

/// The `pools:` map in file order, duplicates kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pools(pub Vec<(String, PoolFile)>);

impl<'de> Deserialize<'de> for Pools {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Pools, D::Error> {
        struct PoolsVisitor;

        impl<'de> Visitor<'de> for PoolsVisitor {
            type Value = Pools;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from model name to pool")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pools, A::Error> {
                let mut pools = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    pools.push((name, map.next_value::<PoolFile>()?));
                }
                Ok(Pools(pools))
            }
        }

        deserializer.deserialize_map(PoolsVisitor)
    }
}

/// Parse YAML text into [`ConfigFile`]. An empty document is an empty config.
pub fn parse(text: &str) -> Result<ConfigFile, serde_yaml_ng::Error> {
    if text.trim().is_empty() || is_only_comments(text) {
        return Ok(ConfigFile::default());
    }
    serde_yaml_ng::from_str(text)
}

fn is_only_comments(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_accepts_name_and_map() {
        let a: PoolFile = serde_yaml_ng::from_str("policy: round_robin").unwrap();
        let b: PoolFile = serde_yaml_ng::from_str("policy: {name: round_robin}").unwrap();
        let c: PoolFile = serde_yaml_ng::from_str("policy:\n  name: round_robin\n").unwrap();
        let expected = Some(PolicyFile {
            name: "round_robin".into(),
            params: Vec::new(),
        });
        assert_eq!(a.policy, expected);
        assert_eq!(b.policy, expected);
        assert_eq!(c.policy, expected);
    }

    #[test]
    fn policy_map_keeps_parameters_in_order() {
        let p: PoolFile = serde_yaml_ng::from_str(
            "policy: {cache_threshold: 0.5, name: cache_aware, alpha: x, balance_abs_threshold: 8}",
        )
        .unwrap();
        let p = p.policy.unwrap();
        assert_eq!(p.name, "cache_aware");
        let keys: Vec<&str> = p.params.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["cache_threshold", "alpha", "balance_abs_threshold"]);
        assert_eq!(p.params[0].1, serde_json::json!(0.5));
        assert_eq!(p.params[2].1, serde_json::json!(8));
    }

    #[test]
    fn policy_map_needs_exactly_one_name() {
        let err = serde_yaml_ng::from_str::<PoolFile>("policy: {seed: 1}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `name`"), "{err}");
    }

    #[test]
    fn quantities_keep_their_form() {
        let l: LimitsFile = serde_yaml_ng::from_str(
            "max_body_bytes: 1024\nconnect_timeout: 2s\nidle_timeout: 1.5\nfirst_token_timeout: -3",
        )
        .unwrap();
        assert_eq!(l.max_body_bytes, Some(Quantity::Int(1024)));
        assert_eq!(l.connect_timeout, Some(Quantity::from("2s")));
        assert_eq!(l.idle_timeout, Some(Quantity::Float(1.5)));
        assert_eq!(l.first_token_timeout, Some(Quantity::Int(-3)));
    }

    #[test]
    fn label_values_accept_any_scalar() {
        let b: BackendFile =
            serde_yaml_ng::from_str("labels: {zone: a, rack: 3, spot: true, x: 1.5}").unwrap();
        let labels = b.labels.unwrap();
        let text: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
            .collect();
        assert_eq!(
            text,
            [("rack", "3"), ("spot", "true"), ("x", "1.5"), ("zone", "a")]
        );
        let err = serde_yaml_ng::from_str::<BackendFile>("labels: {zone: [a]}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected a string, number or boolean"),
            "{err}"
        );
    }

    #[test]
    fn pools_keep_order_and_duplicates() {
        let f = parse("pools:\n  zeta: {}\n  alpha: {}\n  zeta: {}\n").unwrap();
        let pools = f.pools.unwrap();
        let names: Vec<&str> = pools.0.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["zeta", "alpha", "zeta"]);
    }

    #[test]
    fn unknown_fields_are_errors_with_location() {
        let err =
            parse("pools:\n  m:\n    backends:\n      - name: a\n        wieght: 2\n").unwrap_err();
        let loc = err.location().expect("location");
        assert_eq!((loc.line(), loc.column()), (5, 9));
        assert!(err.to_string().contains("unknown field `wieght`"), "{err}");
    }

    #[test]
    fn empty_and_comment_only_documents_are_empty_configs() {
        assert_eq!(parse("").unwrap(), ConfigFile::default());
        assert_eq!(parse("# nothing\n\n").unwrap(), ConfigFile::default());
    }
}
