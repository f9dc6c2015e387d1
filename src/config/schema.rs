//! `pronto config schema`: a JSON Schema (draft 2020-12) of the config file, for editors
//! (YAML language servers take a JSON Schema for completion and inline errors).
//!
//! Written by hand next to the file structs ([`super::file`]) rather than derived, so it can
//! carry what serde does not know: descriptions, defaults (taken from the `DEFAULT_*`
//! constants, so they cannot drift), ranges and the policy map's per-policy parameters, which
//! are generated from [`PolicyKind::spec`] (each parameter's JSON type and default come from
//! the policy's own defaults). The schema checks shape and types; the loader still checks
//! what a schema cannot express (listener collisions, unique backend names across pools,
//! URL details), so `pronto check-config` remains the authority.
//!
//! Kept in sync by `tests/config_files.rs`: every YAML file in `config/` validates against
//! the schema, a typo'd key or a wrongly typed value does not, and every property the schema
//! names appears in `config/pronto.yaml` (the file that documents every field and must load
//! with `deny_unknown_fields`).

use serde_json::{json, Map, Value};

use super::duration::{format_duration, format_size};
use super::model::*;
use super::route::{DEFAULT_PRIORITY_CLASSES, DEFAULT_QUEUE_SIZE, MAX_QUEUE_SIZE};
use super::validate::{MAX_BODY_BYTES, MAX_THREADS, MIN_BODY_BYTES};
use pronto_core::routing::PolicyKind;

/// The JSON Schema of the gateway config file, pretty-printed.
pub fn config_schema() -> String {
    serde_json::to_string_pretty(&schema_value()).expect("a JSON value always serializes")
}

/// The schema as a JSON value.
pub(super) fn schema_value() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:pronto:config",
        "title": "Pronto gateway config",
        "description": "Check a file with `pronto check-config FILE`. Unknown keys are errors.",
        "type": "object",
        "additionalProperties": false,
        "required": ["pools"],
        "properties": {
            "listen": address("Address clients connect to, IP:port", DEFAULT_LISTEN.to_string()),
            "admin_listen": address(
                "Admin listener (status page, /metrics, /admin/*), IP:port; not loopback needs admin.token",
                DEFAULT_ADMIN_LISTEN.to_string()
            ),
            "threads": {
                "description": "Worker threads for the proxy service (restart to change)",
                "type": "integer", "minimum": 1, "maximum": MAX_THREADS,
                "default": DEFAULT_THREADS,
            },
            "grace_period": duration(
                "On SIGTERM, how long in-flight streams may continue",
                DEFAULT_GRACE_PERIOD
            ),
            "limits": section("Request limits and timeouts", json!({
                "max_body_bytes": {
                    "description": format!(
                        "Largest accepted request body, {}..={}",
                        format_size(MIN_BODY_BYTES), format_size(MAX_BODY_BYTES)
                    ),
                    "$ref": "#/$defs/size",
                    "default": format_size(DEFAULT_MAX_BODY_BYTES),
                },
                "connect_timeout": duration("TCP connect timeout to a backend", DEFAULT_CONNECT_TIMEOUT),
                "first_token_timeout": duration(
                    "No first byte of the answer within this: 504, or a retry while nothing was sent",
                    DEFAULT_FIRST_TOKEN_TIMEOUT
                ),
                "idle_timeout": duration("Longest silence from a backend mid-stream", DEFAULT_IDLE_TIMEOUT),
                "request_timeout": duration(
                    "A non-streamed request's whole answer within this, else 504 (never a backend fault)",
                    DEFAULT_REQUEST_TIMEOUT
                ),
                "header_timeout": duration(
                    "A request head from its first byte to its end within this, else the connection closes",
                    DEFAULT_HEADER_TIMEOUT
                ),
                "body_timeout": duration("The whole request body within this, else 408", DEFAULT_BODY_TIMEOUT),
                "write_timeout": duration(
                    "A write to a client that does not read fails after this: the stream ends, the upstream request is cancelled",
                    DEFAULT_WRITE_TIMEOUT
                ),
                "keepalive_timeout": duration(
                    "An idle keep-alive connection (its last answer complete; HTTP/2: no stream open) is closed after this (whole seconds)",
                    DEFAULT_KEEPALIVE_TIMEOUT
                ),
                "min_send_rate": {
                    "description": "Minimum bytes per second a client must read (a larger write may wait len / rate)",
                    "$ref": "#/$defs/size",
                },
                "max_buffered_bytes": {
                    "description": "Request body bytes buffered at once over all requests; over it: 503 with Retry-After before the body is read",
                    "$ref": "#/$defs/size",
                    "default": format_size(DEFAULT_MAX_BUFFERED_BYTES),
                },
                "max_connections": {
                    "description": "Client connections open at once; one more gets 503 and is closed",
                    "type": "integer", "minimum": 1, "maximum": 1000000, "default": DEFAULT_MAX_CONNECTIONS,
                },
            })),
            "retry": section("Retry policy", json!({
                "max_retries": {
                    "description": "Retries on another backend, only while no byte reached the client",
                    "type": "integer", "minimum": 0, "default": DEFAULT_MAX_RETRIES,
                },
            })),
            "migration": section(
                "Stream migration: a stream whose backend fails after its first token is continued on the next-best backend with the text so far, spliced into the same client stream",
                json!({
                    "max_attempts": { "description": "Continuations one stream may be sent, each on another backend (0: off)", "type": "integer", "minimum": 0, "maximum": 8, "default": 1 },
                }),
            ),
            "health": section("Active and passive health checking", json!({
                "path": {
                    "description": "HTTP path probed with GET on each backend",
                    "type": "string", "pattern": "^/\\S*$", "default": DEFAULT_HEALTH_PATH,
                },
                "interval": duration("Time between active probes", DEFAULT_HEALTH_INTERVAL),
                "timeout": duration("Probe timeout", DEFAULT_HEALTH_TIMEOUT),
                "eject_after_failures": {
                    "description": "Consecutive failed requests that eject a backend",
                    "type": "integer", "minimum": 1, "default": DEFAULT_EJECT_AFTER_FAILURES,
                },
                "readmit_after": duration(
                    "Delay before an ejected backend may return",
                    DEFAULT_READMIT_AFTER
                ),
                "stall": section(
                    "Progress-based exclusion: a backend with streams in flight and no token on any of them for max(floor, factor x the predicted time of its booked prefill) gets no new requests until it produces again (not ejected)",
                    json!({
                        "enabled": { "description": "Judge backends on their progress", "type": "boolean", "default": true },
                        "floor": duration("The shortest silence that counts (100ms..=1h)", super::progress::DEFAULT_FLOOR),
                        "factor": {
                            "description": "Multiple of the predicted time of the booked prefill work",
                            "type": "number", "minimum": 1, "maximum": 1000, "default": super::progress::DEFAULT_FACTOR,
                        },
                    }),
                ),
            })),
            "explain_headers": {
                "description": "Add x-pronto-* headers to responses: the backend, the decision's reason and prediction, the runner-up and its prediction, the attempts",
                "type": "boolean", "default": false,
            },
            "access_log": section("The access log: one line per request (log target pronto::access)", json!({
                "enabled": {
                    "description": "Write one line per request when its response ends",
                    "type": "boolean", "default": DEFAULT_ACCESS_LOG_ENABLED,
                },
                "sample_rate": {
                    "description": "Share of requests written, 0..=1, chosen by a hash of the request id",
                    "type": "number", "minimum": 0, "maximum": 1,
                    "default": DEFAULT_ACCESS_LOG_SAMPLE_RATE,
                },
            })),
            "reload": section("Live reload of this file (also on SIGHUP and POST /admin/reload)", json!({
                "watch": {
                    "description": "Poll the file and reload it when it changes",
                    "type": "boolean", "default": DEFAULT_RELOAD_WATCH,
                },
                "watch_interval": duration("Time between two polls of the file", DEFAULT_WATCH_INTERVAL),
            })),
            "priority_classes": {
                "description": "Priority classes, most urgent first; queued requests of a class go before any of a later one",
                "type": "array", "minItems": 1,
                "items": { "type": "string", "pattern": "^[A-Za-z0-9_.-]+$" },
                "default": DEFAULT_PRIORITY_CLASSES,
            },
            "admission": section("The SLO admission queue (routes with on_slo_miss: queue)", json!({
                "queue_size": {
                    "description": "Requests the queue holds at most, over all routes; beyond it, 429",
                    "type": "integer", "minimum": 1, "maximum": MAX_QUEUE_SIZE,
                    "default": DEFAULT_QUEUE_SIZE,
                },
            })),
            "routes": {
                "description": "Ordered routes, first match wins; without it a request goes to the pool named by its model",
                "type": "array", "minItems": 1,
                "items": { "$ref": "#/$defs/route" },
            },
            "auth": section("API keys; with it every request needs `Authorization: Bearer <key>`", json!({
                "keys": {
                    "description": "Keys, each with a unique name",
                    "type": "array", "items": { "$ref": "#/$defs/api_key" },
                },
                "keys_file": {
                    "description": "A YAML list of further keys (same entries); relative to this file",
                    "type": "string",
                },
            })),
            "admin": section("Admin listener settings", json!({
                "token": {
                    "description": "Bearer token required for the status page, /metrics and /admin/* (not /healthz, /readyz); required when admin_listen is not loopback. The token, {env: NAME} or {file: PATH}",
                    "oneOf": [
                        { "type": "string", "minLength": 8 },
                        {
                            "type": "object", "additionalProperties": false, "required": ["env"],
                            "properties": { "env": { "description": "Environment variable holding the token", "type": "string" } },
                        },
                        {
                            "type": "object", "additionalProperties": false, "required": ["file"],
                            "properties": { "file": { "description": "File holding the token (trimmed); relative to this file", "type": "string" } },
                        },
                    ],
                },
                "allowed_hosts": {
                    "description": "Host names POST /admin/* may carry in Host and Origin, besides IP addresses and localhost",
                    "type": "array", "items": { "type": "string" },
                },
            })),
            "rate_limits": section("Rate limits per API key and per route (429 with Retry-After)", json!({
                "per_key": { "$ref": "#/$defs/rate_limit" },
                "keys": {
                    "description": "Limits by key name (replace per_key for that key)",
                    "type": "object", "additionalProperties": { "$ref": "#/$defs/rate_limit" },
                },
                "routes": {
                    "description": "Limits by route name",
                    "type": "object", "additionalProperties": { "$ref": "#/$defs/rate_limit" },
                },
            })),
            "tls": section("TLS on the client listener (h2 by ALPN, HTTP/1.1 fallback)", json!({
                "cert": {
                    "description": "PEM certificate chain, leaf first; relative to this file",
                    "type": "string",
                },
                "key": {
                    "description": "PEM private key of the leaf certificate; relative to this file",
                    "type": "string",
                },
            })),
            "cluster": cluster_schema(),
            "pools": {
                "description": "Backend pools keyed by the model name clients send",
                "type": "object",
                "minProperties": 1,
                "additionalProperties": { "$ref": "#/$defs/pool" },
            },
        },
        "$defs": {
            "duration": {
                "description": "A duration with a unit: 250ms, 2s, 1m30s, 1.5s (ns, us, ms, s, m, h, d)",
                "type": "string",
                "pattern": "^\\s*([0-9]+(\\.[0-9]*)?\\s*(ns|us|µs|ms|s|m|h|d)\\s*)+$",
            },
            "size": {
                "description": "Bytes, or a number with a unit: 32MiB, 512KiB, 1GB",
                "oneOf": [
                    { "type": "integer", "minimum": 0 },
                    {
                        "type": "string",
                        "pattern": "^\\s*[0-9]+(\\.[0-9]*)?\\s*(B|KB|kB|MB|GB|TB|KiB|MiB|GiB|TiB)?\\s*$",
                    },
                ],
            },
            "pool": {
                "type": "object",
                "additionalProperties": false,
                "anyOf": [{ "required": ["backends"] }, { "required": ["discover"] }],
                "properties": {
                    "policy": { "$ref": "#/$defs/policy" },
                    "backends": {
                        "type": "array", "minItems": 1,
                        "items": { "$ref": "#/$defs/backend" },
                    },
                    "discover": {
                        "description": "Backends from a DNS name: every address it resolves to, \
                                        re-resolved periodically",
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["dns"],
                        "properties": {
                            "dns": {
                                "description": "host:port to resolve (port 80 when absent)",
                                "type": "string",
                            },
                            "interval": duration(
                                "Time between two resolutions",
                                DEFAULT_DISCOVER_INTERVAL
                            ),
                            "scheme": {
                                "description": "Scheme of the discovered backends",
                                "enum": ["http"], "default": "http",
                            },
                            "family": {
                                "description": "Keep only IPv4 or IPv6 addresses",
                                "enum": ["any", "ipv4", "ipv6"], "default": "any",
                            },
                            "weight": {
                                "description": "Relative share of traffic of each discovered backend",
                                "type": "integer", "minimum": 1, "default": DEFAULT_WEIGHT,
                            },
                            "max_inflight": {
                                "description": "Cap on concurrent requests to each discovered backend",
                                "type": "integer", "minimum": 1,
                            },
                        },
                    },
                    "profile": {
                        "description": "Default profile hint of the pool's backends",
                        "$ref": "#/$defs/profile",
                    },
                    "scrape": {
                        "description": "Engine metrics scraping of the pool's backends \
                                        (GET /metrics)",
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "interval": duration(
                                "Time between two scrapes of each backend while they \
                                 succeed (at least 10ms); a failing backend backs off, \
                                 doubling up to 30s",
                                DEFAULT_SCRAPE_INTERVAL
                            ),
                        },
                    },
                    "continue_streams": {
                        "description": "The pool's engines can continue a partial answer \
                                        (vLLM, SGLang: continue_final_message): its streams \
                                        may be migrated, and it may take migrated streams",
                        "type": "boolean", "default": true,
                    },
                    "tokenizer": {
                        "description": "The model's tokenizer: a Hugging Face tokenizer.json or \
                                        a directory holding it (with tokenizer_config.json and \
                                        chat_template.jinja), relative to the config file; or \
                                        `tiktoken:<name>`, an OpenAI encoding (o200k_base, \
                                        o200k_harmony, cl100k_base, p50k_base, p50k_edit, \
                                        r50k_base) or a model name mapped to one (gpt-4o, \
                                        gpt-4, ...), built in. Exact prompt tokens and \
                                        engine-matching block hashes",
                        "type": "string",
                    },
                    "chat_template": {
                        "description": "A Jinja chat template file overriding the one beside \
                                        the tokenizer (needs `tokenizer`; with `tiktoken:` it \
                                        replaces OpenAI's chat format)",
                        "type": "string",
                    },
                    "api_key": {
                        "description": "Key presented to the pool's backends as Authorization: \
                                        Bearer (requests, health checks, scrapes): the key, \
                                        {env: NAME} or {file: PATH}",
                        "$ref": "#/$defs/secret",
                    },
                    "served_model_name": {
                        "description": "What the backends call this model when not the \
                                        pool's name: the request's `model` is rewritten to \
                                        it upstream and back in answers. A name, or \
                                        `discover`: the one model each backend lists at \
                                        GET /v1/models",
                        "$ref": "#/$defs/served_model_name",
                    },
                },
            },
            "profile": {
                "description": "Cold-start prior of the backend's TTFT model; absent fields \
                                keep the generic prior",
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "file": {
                        "description": "A simulator profile written by `pronto calibrate` \
                                        (relative to this file); its `prior:` block gives \
                                        the fields not set beside it",
                        "type": "string",
                    },
                    "base_ms": {
                        "description": "Fixed overhead of a request, ms",
                        "type": "number", "exclusiveMinimum": 0,
                    },
                    "prefill_tokens_per_s": {
                        "description": "Prefill throughput, prompt tokens per second",
                        "type": "number", "exclusiveMinimum": 0,
                    },
                    "decode_ms_per_running": {
                        "description": "TTFT added by each running decode, ms",
                        "type": "number", "exclusiveMinimum": 0,
                    },
                },
            },
            "backend": {
                "type": "object",
                "additionalProperties": false,
                "required": ["name", "url"],
                "properties": {
                    "name": {
                        "description": "Unique across the file; the `backend` metric label",
                        "type": "string", "pattern": "^[A-Za-z0-9_.-]+$",
                    },
                    "url": {
                        "description": "Base URL of an OpenAI-compatible server, no path",
                        "type": "string", "pattern": "^https?://",
                    },
                    "weight": {
                        "description": "Relative share of traffic",
                        "type": "integer", "minimum": 1, "default": DEFAULT_WEIGHT,
                    },
                    "max_inflight": {
                        "description": "Cap on concurrent requests to this backend",
                        "type": "integer", "minimum": 1,
                    },
                    "labels": {
                        "description": "Free-form labels (scalar values, kept as text)",
                        "type": "object",
                        "propertyNames": { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" },
                        "additionalProperties": { "type": ["string", "number", "boolean"] },
                    },
                    "kv_events": {
                        "description": "The engine's ZMQ KV-cache event publisher: an exact \
                                        prefix index for this backend",
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["endpoint", "block_size"],
                        "properties": {
                            "endpoint": {
                                "description": "Publisher address, `tcp://HOST:PORT`",
                                "type": "string", "pattern": "^tcp://.+:[0-9]+$",
                            },
                            "block_size": {
                                "description": "Tokens per engine KV block (16 on GPU, 128 \
                                                for vLLM on CPU)",
                                "type": "integer", "minimum": 1, "maximum": 65536,
                            },
                        },
                    },
                    "profile": {
                        "description": "Profile hint; overrides the pool's field by field",
                        "$ref": "#/$defs/profile",
                    },
                    "ca_file": {
                        "description": "PEM CA certificates trusted for this https backend \
                                        instead of the system roots; relative to this file",
                        "type": "string",
                    },
                    "api_key": {
                        "description": "This backend's key, replacing the pool's api_key",
                        "$ref": "#/$defs/secret",
                    },
                    "served_model_name": {
                        "description": "This backend's name for the model, replacing the \
                                        pool's served_model_name",
                        "$ref": "#/$defs/served_model_name",
                    },
                },
            },
            "served_model_name": {
                "type": "string", "minLength": 1, "maxLength": 512, "pattern": "^[^\\u0000-\\u001f\\u007f]+$",
            },
            "secret": {
                "oneOf": [
                    { "type": "string", "minLength": 1, "pattern": "^[!-~]+$" },
                    {
                        "type": "object", "additionalProperties": false, "required": ["env"],
                        "properties": { "env": { "description": "Environment variable holding it", "type": "string" } },
                    },
                    {
                        "type": "object", "additionalProperties": false, "required": ["file"],
                        "properties": { "file": { "description": "File holding it (trimmed); relative to this file", "type": "string" } },
                    },
                ],
            },
            "policy": policy_schema(),
            "route": route_schema(),
            "api_key": {
                "type": "object",
                "additionalProperties": false,
                "required": ["name"],
                "properties": {
                    "name": { "description": "Unique key name (logs, rate limits)", "type": "string" },
                    "key": { "description": "The key in plaintext", "type": "string", "minLength": 8 },
                    "sha256": {
                        "description": "The key's SHA-256 (64 hex digits) instead of `key`",
                        "type": "string", "pattern": "^[0-9a-fA-F]{64}$",
                    },
                    "models": {
                        "description": "Model globs the key may use; absent: all",
                        "type": "array", "minItems": 1, "items": { "type": "string" },
                    },
                    "routes": {
                        "description": "Route names the key may use; absent: all",
                        "type": "array", "minItems": 1, "items": { "type": "string" },
                    },
                    "priority": {
                        "description": "Admission priority class for routes that name none",
                        "type": "string",
                    },
                },
            },
            "rate_limit": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "requests_per_minute": { "description": "Requests per minute (burst: the whole minute)", "type": "integer", "minimum": 1 },
                    "tokens_per_minute": { "description": "Prompt (estimated, then usage-corrected) + completion tokens per minute", "type": "integer", "minimum": 1 },
                    "max_concurrent": { "description": "Requests in flight at once", "type": "integer", "minimum": 1 },
                },
            },
        },
    })
}

/// One entry of `routes:`.
fn route_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["name", "pool"],
        "properties": {
            "name": {
                "description": "Unique route name; the `route` metric label",
                "type": "string", "pattern": "^[A-Za-z0-9_.-]+$",
            },
            "policy": {
                "description": "Routing policy for this route's requests, overriding the pool's",
                "$ref": "#/$defs/policy",
            },
            "match": section("Conditions, all of which must hold; absent: every request", json!({
                "model": { "description": "Model name or glob (*, ?, [a-z], [!x])", "type": "string" },
                "path": { "description": "Request path or glob, e.g. /v1/chat/*", "type": "string" },
                "headers": {
                    "description": "Header name -> exact value",
                    "type": "object",
                    "additionalProperties": { "type": "string" },
                },
                "api_keys": {
                    "description": "Bearer tokens (Authorization: Bearer ...), any of which matches",
                    "type": "array", "minItems": 1, "items": { "type": "string" },
                },
            })),
            "pool": { "description": "Target pool (a key of pools)", "type": "string" },
            "ttft_slo": {
                "description": "Time-to-first-token objective; enables admission control",
                "$ref": "#/$defs/duration",
            },
            "tpot_slo": {
                "description": "Time-per-output-token objective (after the first token): predicted_ttft avoids a backend whose predicted TPOT would break it while another meets both objectives",
                "$ref": "#/$defs/duration",
            },
            "objective": {
                "description": "What predicted_ttft minimises: ttft (time to first token, the default) or ttfa (time to first answer: TTFT + expected reasoning tokens × the backend's predicted TPOT)",
                "enum": ["ttft", "ttfa"],
            },
            "race_on": {
                "description": "What first_token_deadline and hedge race on: ttft (the first token, the default) or ttfa (the first answer token: each copy's reasoning is held until its answer, the first to answer wins)",
                "enum": ["ttft", "ttfa"],
            },
            "priority": {
                "description": "Priority class (one of priority_classes); default: the first",
                "type": "string",
            },
            "on_slo_miss": {
                "description": "When the best predicted TTFT exceeds ttft_slo",
                "type": "string", "enum": ["queue", "fallback", "shed"], "default": "queue",
            },
            "fallback_pool": { "description": "Pool for on_slo_miss: fallback", "type": "string" },
            "max_retries": {
                "description": "Overrides retry.max_retries for this route",
                "type": "integer", "minimum": 0,
            },
            "first_token_timeout": {
                "description": "Overrides limits.first_token_timeout for this route",
                "$ref": "#/$defs/duration",
            },
            "idle_timeout": {
                "description": "Overrides limits.idle_timeout for this route",
                "$ref": "#/$defs/duration",
            },
            "first_token_deadline": section(
                "Streams: a backend without a first token by then also gets the request sent to the next-best backend; the first to answer is relayed, the other cancelled. Either after, or factor (with floor)",
                json!({
                    "after": { "description": "Absolute deadline from sending the request", "$ref": "#/$defs/duration" },
                    "factor": { "description": "Deadline as this many times the decision's predicted TTFT", "type": "number", "minimum": 1 },
                    "floor": { "description": "With factor: the shortest deadline, and the deadline without a prediction", "$ref": "#/$defs/duration", "default": "250ms" },
                }),
            ),
            "migration": section(
                "Overrides the top-level migration for this route. Stream migration: a stream whose backend fails after its first token is continued on the next-best backend with the text so far, spliced into the same client stream",
                json!({
                    "max_attempts": { "description": "Continuations one stream may be sent, each on another backend (0: off)", "type": "integer", "minimum": 0, "maximum": 8, "default": 1 },
                }),
            ),
            "keepalive": {
                "description": "Streams: send an SSE comment (: keep-alive) this often while waiting for the first token, so idle timeouts in front of Pronto do not cut a long prefill (100ms..=10m; off when absent)",
                "$ref": "#/$defs/duration",
            },
            "hedge": section(
                "Streams: send a second copy to the next-best backend after a delay (after, or quantile of the predicted TTFT); the first to answer is relayed, the other cancelled",
                json!({
                    "after": { "description": "Delay of the second copy", "$ref": "#/$defs/duration" },
                    "quantile": { "description": "Delay as this quantile (0-1) of the first backend's predicted TTFT", "type": "number", "minimum": 0 },
                    "budget": { "description": "Hedged requests at most, as a fraction of the route's requests (token bucket)", "type": "number", "minimum": 0, "default": 0.05 },
                    "max_predicted_ttft": { "description": "No hedge while the best predicted TTFT is above this (saturated fleet)", "$ref": "#/$defs/duration" },
                }),
            ),
        },
    })
}

fn address(description: &str, default: String) -> Value {
    json!({ "description": description, "type": "string", "default": default })
}

fn duration(description: &str, default: std::time::Duration) -> Value {
    json!({
        "description": description,
        "$ref": "#/$defs/duration",
        "default": format_duration(default),
    })
}

fn section(description: &str, properties: Value) -> Value {
    json!({
        "description": description,
        "type": "object",
        "additionalProperties": false,
        "properties": properties,
    })
}

/// `cluster:` (its own function: one `json!` this deep exceeds the macro recursion limit).
fn cluster_schema() -> Value {
    section(
        "Replica sync over NATS: several Pronto replicas that route as one",
        json!({
            "nats": {
                "description": "NATS server URL(s), nats://host:port or tls://host:port, comma-separated",
                "type": "string",
            },
            "subject": {
                "description": "Subject prefix; a replica publishes on <subject>.<replica>",
                "type": "string", "default": "pronto.cluster",
            },
            "replica": {
                "description": "This replica's name (letters, digits, _ and -): a string, {env: NAME} (e.g. the pod name) or {file: PATH}",
                "oneOf": [
                    { "type": "string", "minLength": 1 },
                    {
                        "type": "object", "additionalProperties": false, "required": ["env"],
                        "properties": { "env": { "description": "Environment variable holding the name", "type": "string" } },
                    },
                    {
                        "type": "object", "additionalProperties": false, "required": ["file"],
                        "properties": { "file": { "description": "File holding the name (trimmed)", "type": "string" } },
                    },
                ],
            },
            "heartbeat": { "$ref": "#/$defs/duration", "description": "How often this replica publishes the snapshot of its bookings", "default": "1s" },
            "peer_timeout": { "$ref": "#/$defs/duration", "description": "A replica silent this long has its bookings released (default 3 heartbeats)", "default": "3s" },
            "collision_repair": {
                "description": "Collision repair: a request waiting for its first token on a backend that another replica (heard late) sent a request to just before it is routed again, and moves when staying predicts more than this margin (a fraction) over the new decision; `off` or false: never",
                "default": 0.2,
                "oneOf": [
                    { "type": "number", "minimum": 0, "maximum": 10 },
                    { "type": "boolean" },
                    { "const": "off" },
                ],
            },
            "auth": nats_auth_schema(),
            "tls": section(
                "TLS to NATS (present: required, as with tls:// URLs)",
                json!({
                    "ca": { "description": "PEM file of the CAs to trust instead of the system roots (relative to this file)", "type": "string" },
                    "cert": { "description": "PEM client certificate chain, leaf first, when NATS verifies clients", "type": "string" },
                    "key": { "description": "PEM private key of the client certificate", "type": "string" },
                    "server_name": { "description": "The name NATS's certificate must be valid for (default: the URL's host)", "type": "string" },
                }),
            ),
        }),
    )
}

/// `cluster.auth`: one kind of credentials, each secret from `{env}` or `{file}`.
fn nats_auth_schema() -> Value {
    let source = |what: &str| {
        json!({
            "oneOf": [
                {
                    "type": "object", "additionalProperties": false, "required": ["env"],
                    "properties": { "env": { "description": format!("Environment variable holding the {what}"), "type": "string" } },
                },
                {
                    "type": "object", "additionalProperties": false, "required": ["file"],
                    "properties": { "file": { "description": format!("File holding the {what} (trimmed; relative to this file)"), "type": "string" } },
                },
            ],
        })
    };
    let mut user = source("user name");
    if let Some(branches) = user["oneOf"].as_array_mut() {
        branches.insert(0, json!({ "type": "string", "minLength": 1 }));
    }
    let with = |mut v: Value, description: &str| {
        v["description"] = Value::from(description);
        v
    };
    section(
        "Credentials NATS asks of this replica: one kind (token, user + password, nkey or creds)",
        json!({
            "token": with(source("token"), "A token: {env: NAME} or {file: PATH}"),
            "user": with(user, "A user name (with password): a string, {env: NAME} or {file: PATH}"),
            "password": with(source("password"), "The user's password: {env: NAME} or {file: PATH}"),
            "nkey": with(source("NKey seed"), "An NKey user seed (SU...): {env: NAME} or {file: PATH}"),
            "creds": with(source("credentials"), "A .creds file's text (user JWT and NKey seed): {env: NAME} or {file: PATH}"),
        }),
    )
}

/// A policy name, or a map with `name` and that policy's parameters (one branch per policy).
pub(super) fn policy_schema() -> Value {
    let names: Vec<&str> = PolicyKind::ALL.to_vec();
    let branches: Vec<Value> = PolicyKind::ALL
        .iter()
        .filter_map(|n| PolicyKind::parse(n))
        .map(|kind| {
            let mut properties = Map::new();
            properties.insert("name".into(), json!({ "const": kind.as_str() }));
            let defaults = serde_json::to_value(kind.spec()).unwrap_or(Value::Null);
            for param in kind.params() {
                let default = defaults.get(*param).cloned().unwrap_or(Value::Null);
                let ty = match &default {
                    Value::Number(n) if n.is_u64() => json!({ "type": "integer", "minimum": 0 }),
                    Value::Number(_) => json!({ "type": "number" }),
                    Value::Bool(_) => json!({ "type": "boolean" }),
                    _ => json!({ "type": "string" }),
                };
                let mut p = ty;
                p["default"] = default;
                p["description"] = json!(kind.param_doc(param));
                properties.insert((*param).to_string(), p);
            }
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["name"],
                "properties": properties,
            })
        })
        .collect();
    json!({
        "description": "Routing policy: a name, or a map with `name` and the policy's parameters",
        "oneOf": [
            { "type": "string", "enum": names },
            { "oneOf": branches },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_is_draft_2020_12_json_with_every_policy() {
        let v: Value = serde_json::from_str(&config_schema()).unwrap();
        assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
        let branches = v["$defs"]["policy"]["oneOf"][1]["oneOf"]
            .as_array()
            .unwrap();
        assert_eq!(branches.len(), PolicyKind::ALL.len());
        let cache_aware = branches
            .iter()
            .find(|b| b["properties"]["name"]["const"] == "cache_aware")
            .unwrap();
        assert_eq!(
            cache_aware["properties"]["balance_abs_threshold"]["type"],
            "integer"
        );
        assert_eq!(
            cache_aware["properties"]["cache_threshold"]["type"],
            "number"
        );
        assert_eq!(
            v["properties"]["limits"]["properties"]["connect_timeout"]["default"],
            "2s"
        );
    }
}
