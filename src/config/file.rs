//! The config file as written: serde structs mirroring the YAML.
//!
//! Every struct denies unknown fields, so a typo (`wieght:`) is an error with a line and
//! column rather than a silently ignored setting. Every field is optional here, even ones the
//! gateway requires: [`super::validate()`] reports a missing field together with every other
//! problem. Sections whose struct is the model (`limits`, `retry`, `health`, `reload`,
//! `access_log`, `admission`, `migration`, a pool's `scrape`, a rate limit) fill their
//! defaults. Every value with a form of its own is read whole by serde: durations and sizes
//! (`duration::text_duration`, `duration::text_size`), addresses, URLs and globs
//! ([`super::value`]), served model names, enums. A bad one is a shape error
//! ([`super::shape`] reports every one, located, like an unknown key); the checker sees only
//! values that parsed and keeps the ranges, the rules between fields, the references between
//! sections, the files and the secrets.
//!
//! The structs also derive the JSON Schema ([`super::schema`]): a field's doc comment is its
//! description there (and in `docs/config-reference.md`), so it is written for the person
//! editing the file; `#[schemars(..)]` adds the bounds and the defaults.
//!
//! Two shapes need hand-written deserializers:
//! - [`PolicyFile`] accepts a bare name (`policy: round_robin`) or a map
//!   (`policy: {name: cache_aware, cache_threshold: 0.5}`) whose other keys are the policy's
//!   parameters, kept raw until validation checks them against the named policy;
//! - [`Pools`] keeps pools in file order and keeps duplicate keys, so validation can report
//!   them by name instead of YAML's generic "duplicate entry".

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::duration::text_duration;
use super::model::*;
use super::route::Glob;
use super::route::DEFAULT_PRIORITY_CLASSES;
use super::schema::{dur, DurationText};
use super::validate::MAX_THREADS;
use super::value::{self, BackendUrl};
use pronto_core::race::RaceOn;

/// Check a file with `pronto check-config FILE`. Unknown keys are errors.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Address clients connect to, IP:port
    #[serde(default, deserialize_with = "value::socket_addr")]
    #[schemars(with = "Option<String>", extend("default" = DEFAULT_LISTEN.to_string()))]
    pub listen: Option<SocketAddr>,
    /// Admin listener (status page, /metrics, /admin/*), IP:port; not loopback needs admin.token
    #[serde(default, deserialize_with = "value::socket_addr")]
    #[schemars(with = "Option<String>", extend("default" = DEFAULT_ADMIN_LISTEN.to_string()))]
    pub admin_listen: Option<SocketAddr>,
    /// Worker threads for the proxy service (restart to change)
    #[serde(
        default,
        deserialize_with = "value::int_in_option::<_, _, 1, MAX_THREADS>"
    )]
    #[schemars(range(min = 1, max = MAX_THREADS), extend("default" = DEFAULT_THREADS))]
    pub threads: Option<u64>,
    /// On SIGTERM, how long in-flight streams may continue
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>", extend("default" = dur(DEFAULT_GRACE_PERIOD)))]
    pub grace_period: Option<Duration>,
    /// Request limits and timeouts
    pub limits: Option<Limits>,
    /// Retry policy
    pub retry: Option<Retry>,
    /// Stream migration: a stream whose backend fails after its first token is continued on
    /// the next-best backend with the text so far, spliced into the same client stream
    pub migration: Option<super::migration::Migration>,
    /// Active and passive health checking
    pub health: Option<Health>,
    /// Add x-pronto-* headers to responses: the backend, the decision's reason and
    /// prediction, the runner-up and its prediction, the attempts
    #[schemars(extend("default" = false))]
    pub explain_headers: Option<bool>,
    /// The access log: one line per request (log target pronto::access)
    pub access_log: Option<AccessLog>,
    /// Live reload of this file (also on SIGHUP and POST /admin/reload)
    pub reload: Option<ReloadSettings>,
    /// Priority classes, most urgent first; queued requests of a class go before any of a
    /// later one
    #[schemars(length(min = 1), inner(regex(pattern = r"^[A-Za-z0-9_.-]+$")))]
    #[schemars(extend("default" = DEFAULT_PRIORITY_CLASSES))]
    pub priority_classes: Option<Vec<String>>,
    /// The SLO admission queue (routes with on_slo_miss: queue)
    pub admission: Option<super::route::AdmissionSettings>,
    /// Ordered routes, first match wins; without it a request goes to the pool named by its
    /// model
    #[schemars(length(min = 1))]
    pub routes: Option<Vec<RouteFile>>,
    /// Backend pools keyed by the model name clients send
    pub pools: Option<Pools>,
    /// API keys; with it every request needs `Authorization: Bearer <key>`
    pub auth: Option<super::edge::AuthFile>,
    /// Admin listener settings
    pub admin: Option<super::edge::AdminFile>,
    /// Rate limits per API key and per route (429 with Retry-After)
    pub rate_limits: Option<super::edge::RateLimitsFile>,
    /// TLS on the client listener (h2 by ALPN, HTTP/1.1 fallback)
    pub tls: Option<super::tls::TlsFile>,
    /// Replica sync over NATS: several Pronto replicas that route as one
    pub cluster: Option<super::cluster::ClusterFile>,
}

/// One entry of `routes:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "route", extend("required" = ["name", "pool"]))]
pub struct RouteFile {
    /// Unique route name; the `route` metric label
    #[schemars(with = "Option<String>", regex(pattern = r"^[A-Za-z0-9_.-]+$"))]
    pub name: Option<value::Name>,
    /// Conditions, all of which must hold; absent: every request
    #[serde(rename = "match")]
    pub matches: Option<MatchFile>,
    /// Target pool (a key of pools)
    pub pool: Option<String>,
    /// Time-to-first-token objective; enables admission control
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub ttft_slo: Option<Duration>,
    /// Time-per-output-token objective (after the first token): predicted_ttft avoids a
    /// backend whose predicted TPOT would break it while another meets both objectives
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub tpot_slo: Option<Duration>,
    /// What predicted_ttft minimises: ttft (time to first token, the default) or ttfa (time
    /// to first answer: TTFT + expected reasoning tokens × the backend's predicted TPOT)
    #[schemars(with = "Option<String>", extend("enum" = ["ttft", "ttfa"]))]
    pub objective: Option<super::route::RouteObjective>,
    /// What first_token_deadline and hedge race on: ttft (the first token, the default) or
    /// ttfa (the first answer token: each copy's reasoning is held until its answer, the
    /// first to answer wins)
    #[schemars(with = "Option<String>", extend("enum" = ["ttft", "ttfa"]))]
    pub race_on: Option<RaceOn>,
    /// Priority class (one of priority_classes); default: the first
    pub priority: Option<String>,
    /// When the best predicted TTFT exceeds ttft_slo
    #[schemars(with = "Option<String>")]
    #[schemars(extend("enum" = ["queue", "fallback", "shed"], "default" = "queue"))]
    pub on_slo_miss: Option<super::route::OnSloMiss>,
    /// Pool for on_slo_miss: fallback
    pub fallback_pool: Option<String>,
    /// Routing policy for this route's requests, overriding the pool's
    pub policy: Option<PolicyFile>,
    /// Overrides retry.max_retries for this route
    #[schemars(with = "Option<u64>")]
    pub max_retries: Option<u32>,
    /// Overrides limits.first_token_timeout for this route
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub first_token_timeout: Option<Duration>,
    /// Overrides limits.idle_timeout for this route
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub idle_timeout: Option<Duration>,
    /// Streams: a backend without a first token by then also gets the request sent to the
    /// next-best backend; the first to answer is relayed, the other cancelled. Either after,
    /// or factor (with floor)
    pub first_token_deadline: Option<super::race::DeadlineFile>,
    /// Streams: send a second copy to the next-best backend after a delay (after, or
    /// quantile of the predicted TTFT); the first to answer is relayed, the other cancelled
    pub hedge: Option<super::race::HedgeFile>,
    /// Overrides the top-level migration for this route. Stream migration: a stream whose
    /// backend fails after its first token is continued on the next-best backend with the
    /// text so far, spliced into the same client stream
    pub migration: Option<super::migration::Migration>,
    /// Streams: send an SSE comment (: keep-alive) this often while waiting for the first
    /// token, so idle timeouts in front of Pronto do not cut a long prefill (100ms..=10m; off
    /// when absent)
    #[serde(
        default,
        serialize_with = "text_duration::option::serialize",
        deserialize_with = "text_duration::within_option::<_, { super::progress::MIN_KEEPALIVE.as_millis() as u64 }, { super::progress::MAX_KEEPALIVE.as_millis() as u64 }>",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub keepalive: Option<Duration>,
}

/// Conditions, all of which must hold; absent: every request
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    /// Model name or glob (*, ?, [a-z], [!x])
    #[schemars(with = "Option<String>")]
    pub model: Option<Glob>,
    /// Request path or glob, e.g. /v1/chat/*
    #[serde(default, deserialize_with = "value::path_glob")]
    #[schemars(with = "Option<String>")]
    pub path: Option<Glob>,
    /// Header name -> exact value
    pub headers: Option<BTreeMap<String, String>>,
    /// Bearer tokens (Authorization: Bearer ...), any of which matches
    #[schemars(length(min = 1))]
    pub api_keys: Option<Vec<String>>,
}

/// One pool: the backends serving one model name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "pool", extend("anyOf" = [{ "required": ["backends"] }, { "required": ["discover"] }]))]
pub struct PoolFile {
    /// Routing policy; `least_inflight` when absent
    pub policy: Option<PolicyFile>,
    /// The pool's static backends
    #[schemars(length(min = 1))]
    pub backends: Option<Vec<BackendFile>>,
    /// Backends from a DNS name: every address it resolves to, re-resolved periodically
    pub discover: Option<DiscoverFile>,
    /// Default profile hint of the pool's backends
    pub profile: Option<ProfileFile>,
    /// The model's tokenizer: a Hugging Face tokenizer.json or a directory holding it (with
    /// tokenizer_config.json and chat_template.jinja), relative to the config file; or
    /// `tiktoken:<name>`, an OpenAI encoding (o200k_base, o200k_harmony, cl100k_base,
    /// p50k_base, p50k_edit, r50k_base) or a model name mapped to one (gpt-4o, gpt-4, ...),
    /// built in. Exact prompt tokens and engine-matching block hashes
    pub tokenizer: Option<String>,
    /// A Jinja chat template file overriding the one beside the tokenizer (needs `tokenizer`;
    /// with `tiktoken:` it replaces OpenAI's chat format)
    pub chat_template: Option<String>,
    /// Key presented to the pool's backends as Authorization: Bearer (requests, health
    /// checks, scrapes): the key, {env: NAME} or {file: PATH}
    pub api_key: Option<super::edge::SecretFile>,
    /// Engine metrics scraping of the pool's backends (GET /metrics)
    pub scrape: Option<Scrape>,
    /// What the backends call this model when not the pool's name: the request's `model` is
    /// rewritten to it upstream and back in answers. A name, or `discover`: the one model
    /// each backend lists at GET /v1/models
    #[schemars(with = "Option<ServedModelName>")]
    pub served_model_name: Option<ServedName>,
    /// The pool's engines can continue a partial answer (vLLM, SGLang:
    /// continue_final_message): its streams may be migrated, and it may take migrated streams
    #[schemars(extend("default" = true))]
    pub continue_streams: Option<bool>,
    /// The pool also serves every model its backends list at GET /v1/models, each on the
    /// backends that list it (what `pronto serve --backend URL` without `--model` sets)
    #[schemars(extend("default" = false))]
    pub serve_listed_models: Option<bool>,
}

/// Backends from a DNS name: every address it resolves to, re-resolved periodically
///
/// Read whole by serde (defaults filled, `dns` parsed, ranges checked); the checker requires
/// `dns` and `scheme: http` ([`super::discover`]).
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
#[schemars(extend("required" = ["dns"]))]
pub struct DiscoverFile {
    /// host:port to resolve (port 80 when absent)
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub dns: Option<value::HostPort>,
    /// Time between two resolutions
    #[serde(with = "super::duration::text_duration")]
    #[schemars(with = "DurationText", extend("default" = dur(DEFAULT_DISCOVER_INTERVAL)))]
    pub interval: Duration,
    /// Scheme of the discovered backends
    #[schemars(extend("enum" = ["http"]))]
    #[serde(deserialize_with = "value::discover_scheme")]
    pub scheme: String,
    /// Keep only IPv4 or IPv6 addresses
    #[schemars(with = "String", extend("enum" = ["any", "ipv4", "ipv6"]))]
    pub family: AddressFamily,
    /// Relative share of traffic of each discovered backend
    #[serde(deserialize_with = "value::at_least::<_, _, 1>")]
    #[schemars(range(min = 1))]
    pub weight: u32,
    /// Cap on concurrent requests to each discovered backend
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "value::at_least_option::<_, _, 1>"
    )]
    #[schemars(range(min = 1))]
    pub max_inflight: Option<u32>,
}

impl Default for DiscoverFile {
    fn default() -> DiscoverFile {
        DiscoverFile {
            dns: None,
            interval: DEFAULT_DISCOVER_INTERVAL,
            scheme: "http".to_string(),
            family: AddressFamily::Any,
            weight: DEFAULT_WEIGHT,
            max_inflight: None,
        }
    }
}

/// Cold-start prior of the backend's TTFT model; absent fields keep the generic prior
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "profile")]
pub struct ProfileFile {
    /// A simulator profile written by `pronto calibrate` (relative to this file); its
    /// `prior:` block gives the fields not set beside it
    pub file: Option<String>,
    /// Fixed overhead of a request, ms
    #[serde(default, deserialize_with = "value::positive_option")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub base_ms: Option<f64>,
    /// Prefill throughput, prompt tokens per second
    #[serde(default, deserialize_with = "value::positive_option")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub prefill_tokens_per_s: Option<f64>,
    /// TTFT added by each running decode, ms
    #[serde(default, deserialize_with = "value::positive_option")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub decode_ms_per_running: Option<f64>,
}

/// One backend entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "backend", extend("required" = ["name", "url"]))]
pub struct BackendFile {
    /// Unique across the file; the `backend` metric label
    #[schemars(with = "Option<String>", regex(pattern = r"^[A-Za-z0-9_.-]+$"))]
    pub name: Option<value::Name>,
    /// Base URL of an OpenAI-compatible server, no path
    #[schemars(with = "Option<String>", regex(pattern = r"^https?://"))]
    pub url: Option<BackendUrl>,
    /// Relative share of traffic
    #[serde(default, deserialize_with = "value::at_least_option::<_, _, 1>")]
    #[schemars(with = "Option<u64>", range(min = 1), extend("default" = DEFAULT_WEIGHT))]
    pub weight: Option<u32>,
    /// Cap on concurrent requests to this backend
    #[serde(default, deserialize_with = "value::at_least_option::<_, _, 1>")]
    #[schemars(with = "Option<u64>", range(min = 1))]
    pub max_inflight: Option<u32>,
    /// Free-form labels (scalar values, kept as text)
    #[schemars(extend("propertyNames" = { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" }))]
    pub labels: Option<BTreeMap<String, LabelValue>>,
    /// Profile hint; overrides the pool's field by field
    pub profile: Option<ProfileFile>,
    /// The engine's ZMQ KV-cache event publisher: an exact prefix index for this backend
    pub kv_events: Option<KvEventsFile>,
    /// PEM CA certificates trusted for this https backend instead of the system roots;
    /// relative to this file
    pub ca_file: Option<String>,
    /// This backend's key, replacing the pool's api_key
    pub api_key: Option<super::edge::SecretFile>,
    /// This backend's name for the model, replacing the pool's served_model_name
    #[schemars(with = "Option<ServedModelName>")]
    pub served_model_name: Option<ServedName>,
}

/// The engine's ZMQ KV-cache event publisher: an exact prefix index for this backend
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("required" = ["endpoint", "block_size"]))]
pub struct KvEventsFile {
    /// Publisher address, `tcp://HOST:PORT`
    #[serde(default, deserialize_with = "value::kv_endpoint")]
    #[schemars(regex(pattern = r"^tcp://.+:[0-9]+$"))]
    pub endpoint: Option<String>,
    /// Tokens per engine KV block (16 on GPU, 128 for vLLM on CPU)
    #[serde(default, deserialize_with = "value::int_in_option::<_, _, 1, 65536>")]
    #[schemars(range(min = 1, max = 65536))]
    pub block_size: Option<u64>,
}

/// A model name as a backend knows it (`served_model_name`).
struct ServedModelName;

impl JsonSchema for ServedModelName {
    fn schema_name() -> Cow<'static, str> {
        "served_model_name".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "minLength": 1, "maxLength": 512,
            "pattern": "^[^\\u0000-\\u001f\\u007f]+$",
        })
    }
}

/// A label value: any YAML scalar, as text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LabelValue(pub String);

impl JsonSchema for LabelValue {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "label_value".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": ["string", "number", "boolean"] })
    }
}

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

impl serde::Serialize for PolicyFile {
    /// The map form, `{name: .., <parameters>}`, always (a reader finds `name` there).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.params.len() + 1))?;
        map.serialize_entry("name", &self.name)?;
        for (k, v) in &self.params {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl JsonSchema for PolicyFile {
    fn schema_name() -> Cow<'static, str> {
        "policy".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        Schema::try_from(super::schema::policy_schema()).unwrap_or_else(|_| json_schema!({}))
    }
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

impl serde::Serialize for Pools {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, pool) in &self.0 {
            map.serialize_entry(name, pool)?;
        }
        map.end()
    }
}

impl JsonSchema for Pools {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "pools".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "minProperties": 1,
            "additionalProperties": generator.subschema_for::<PoolFile>(),
        })
    }
}

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
