//! The effective config, for `GET /admin/config`: the typed [`Config`] written back as the
//! file structs ([`super::file::ConfigFile`]) and serialized by their `Serialize` derive.
//!
//! The shape is the file's (same keys, same nesting; as JSON, whose objects are unordered,
//! the pools come by name rather than in file order), with every default filled in,
//! durations written back by `humantime` (`2s`, `1m 30s`) and sizes in their largest exact
//! binary unit (`32MiB`). Every section is written: [`Config::to_file`] builds the
//! `ConfigFile` with a struct literal that names each field, so a key added to the file is a
//! compile error here until it is written back.
//!
//! Secrets are never written. A secret read from the environment or a file is shown as
//! where it is read from (`{env: NAME}`, `{file: PATH}`); one written inline (an API key, the
//! admin token, a backend key, a route's `match.api_keys`) is replaced by
//! [`super::secrets::REDACTED`], which the loader refuses, so a copy of the effective config
//! cannot silently run with a placeholder as its secret. Everything else loads back to the
//! same [`Config`] (`effective_tests.rs` checks `config/pronto.yaml` and every example).

use std::collections::BTreeMap;

use serde_json::Value;

use super::cluster::{ClusterFile, RepairFile};
use super::edge::{AdminFile, AuthFile, KeyFile, RateLimit, RateLimitsFile, SecretFile};
use super::file::*;
use super::model::{Backend, Config, Pool, ProfileHint};
use super::nats::{NatsAuth, NatsAuthFile, NatsSecret, NatsTlsFile};
use super::race::{DeadlineFile, HedgeFile};
use super::route::{OnSloMiss, Route, SloAction};
use super::secrets::REDACTED;
use super::tls::TlsFile;
use super::value::{BackendUrl, HostName, Name};
use pronto_core::race::{FirstTokenDeadline, HedgeDelay};
use pronto_core::routing::PolicySpec;

// === impl Config ===

impl Config {
    /// Every setting, defaults included, as JSON in the config file's shape (no `null`s).
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self.to_file()).unwrap_or(Value::Null);
        strip_nulls(&mut v);
        v
    }

    /// Every setting, defaults included, as the file structs; secrets redacted.
    pub fn to_file(&self) -> ConfigFile {
        ConfigFile {
            listen: Some(self.listen),
            admin_listen: Some(self.admin_listen),
            threads: Some(self.threads as u64),
            grace_period: Some(self.grace_period),
            limits: Some(self.limits),
            retry: Some(self.retry),
            migration: Some(self.migration),
            health: Some(self.health.clone()),
            explain_headers: Some(self.explain_headers),
            access_log: Some(self.access_log),
            reload: Some(self.reload),
            priority_classes: Some(
                self.priority_classes
                    .iter()
                    .map(|c| c.to_string())
                    .collect(),
            ),
            admission: Some(self.admission),
            routes: (!self.routes.is_empty()).then(|| self.routes.iter().map(route).collect()),
            pools: Some(Pools(
                self.pools
                    .iter()
                    .map(|p| (p.model.to_string(), pool(p)))
                    .collect(),
            )),
            auth: self.auth.as_ref().map(|a| AuthFile {
                keys: Some(
                    a.keys
                        .iter()
                        .map(|k| KeyFile {
                            name: Some(k.name.to_string()),
                            key: Some(REDACTED.to_string()),
                            sha256: None,
                            models: (!k.models.is_empty()).then(|| k.models.clone()),
                            routes: (!k.routes.is_empty())
                                .then(|| k.routes.iter().map(|r| r.to_string()).collect()),
                            priority: k.priority.as_ref().map(|(name, _)| name.to_string()),
                        })
                        .collect(),
                ),
                keys_file: None,
            }),
            admin: Some(AdminFile {
                token: self.admin.token_from.as_ref().map(redacted),
                allowed_hosts: Some(
                    (self.admin.allowed_hosts.iter())
                        .map(|h| HostName::written(h))
                        .collect(),
                ),
            }),
            // Limits need keys or routes to apply to: written only when some are set.
            rate_limits: (self.rate_limits != Default::default()).then(|| RateLimitsFile {
                per_key: self.rate_limits.per_key,
                keys: limits_by_name(&self.rate_limits.keys),
                routes: limits_by_name(&self.rate_limits.routes),
            }),
            tls: self.tls.as_ref().map(|t| TlsFile {
                cert: Some(t.cert.display().to_string()),
                key: Some(t.key.display().to_string()),
            }),
            cluster: self.cluster.as_ref().map(cluster),
        }
    }
}

/// `v` without its `null` members (a key left out is the file's way to say "unset").
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, x| !x.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Where a secret is read from; an inline one, [`REDACTED`].
fn redacted(s: &SecretFile) -> SecretFile {
    match s {
        SecretFile::Inline(_) => SecretFile::Inline(REDACTED.to_string()),
        other => other.clone(),
    }
}

fn policy(p: &PolicySpec) -> PolicyFile {
    super::policy_file(p)
}

/// Limits by key or route name; `None` when there are none (per-key limits need keys).
fn limits_by_name(
    by: &BTreeMap<std::sync::Arc<str>, super::edge::RateLimit>,
) -> Option<BTreeMap<String, RateLimit>> {
    (!by.is_empty()).then(|| by.iter().map(|(name, r)| (name.to_string(), *r)).collect())
}

fn route(r: &Route) -> RouteFile {
    let m = &r.matcher;
    let matches = MatchFile {
        model: m.model.clone(),
        path: m.path.clone(),
        headers: (!m.headers.is_empty()).then(|| m.headers.iter().cloned().collect()),
        api_keys: (!m.api_keys.is_empty())
            .then(|| m.api_keys.iter().map(|_| REDACTED.to_string()).collect()),
    };
    let (ttft_slo, on_slo_miss, fallback_pool) = match &r.slo {
        None => (None, None, None),
        Some(slo) => {
            let (action, fallback) = match &slo.on_miss {
                SloAction::Queue => (OnSloMiss::Queue, None),
                SloAction::Fallback(pool) => (OnSloMiss::Fallback, Some(pool.to_string())),
                SloAction::Shed => (OnSloMiss::Shed, None),
            };
            (Some(slo.ttft), Some(action), fallback)
        }
    };
    RouteFile {
        name: Some(Name::written(&r.name)),
        matches: Some(matches),
        pool: Some(r.pool.to_string()),
        ttft_slo,
        tpot_slo: r.tpot_slo,
        objective: Some(r.objective),
        race_on: Some(r.race_on),
        // A class the file did not name is left out: an API key's class may replace it.
        priority: r.priority_explicit.then(|| r.priority.to_string()),
        on_slo_miss,
        fallback_pool,
        policy: r.policy.as_ref().map(policy),
        max_retries: r.max_retries,
        first_token_timeout: r.first_token_timeout,
        idle_timeout: r.idle_timeout,
        first_token_deadline: r.first_token_deadline.map(|d| match d {
            FirstTokenDeadline::After(after) => DeadlineFile {
                after: Some(after),
                ..DeadlineFile::default()
            },
            FirstTokenDeadline::Predicted { factor, floor } => DeadlineFile {
                after: None,
                factor: Some(factor),
                floor: Some(floor),
            },
        }),
        hedge: r.hedge.map(|h| {
            let (after, quantile) = match h.delay {
                HedgeDelay::After(d) => (Some(d), None),
                HedgeDelay::Quantile(q) => (None, Some(q)),
            };
            HedgeFile {
                after,
                quantile,
                budget: Some(h.budget),
                max_predicted_ttft: h.max_predicted_ttft,
            }
        }),
        migration: r.migration,
        keepalive: r.keepalive,
    }
}

fn pool(pool: &Pool) -> PoolFile {
    let key = |k: &Option<super::model::UpstreamKey>| k.as_ref().map(|k| redacted(k.source()));
    PoolFile {
        policy: Some(policy(&pool.policy)),
        backends: (!pool.backends.is_empty()).then(|| {
            pool.backends
                .iter()
                .map(|b| backend(b, key(&b.api_key)))
                .collect()
        }),
        discover: pool.discover.as_ref().map(|d| DiscoverFile {
            dns: Some(super::value::HostPort {
                host: d.host.clone(),
                port: d.port,
            }),
            interval: d.interval,
            scheme: "http".to_string(),
            family: d.family,
            weight: d.weight,
            max_inflight: d.max_inflight,
        }),
        profile: pool.profile.as_ref().map(profile),
        tokenizer: pool
            .tokenizer
            .as_ref()
            .map(|t| t.path.display().to_string()),
        chat_template: pool
            .tokenizer
            .as_ref()
            .and_then(|t| t.chat_template.as_ref())
            .map(|p| p.display().to_string()),
        api_key: key(&pool.api_key),
        scrape: Some(pool.scrape),
        served_model_name: pool.served_model_name.clone(),
        continue_streams: Some(pool.continue_streams),
        serve_listed_models: Some(pool.serve_listed_models),
    }
}

fn profile(p: &ProfileHint) -> ProfileFile {
    ProfileFile {
        file: None,
        base_ms: p.base_ms,
        prefill_tokens_per_s: p.prefill_tokens_per_s,
        decode_ms_per_running: p.decode_ms_per_running,
    }
}

fn backend(b: &Backend, api_key: Option<SecretFile>) -> BackendFile {
    BackendFile {
        name: Some(Name::written(&b.name)),
        url: Some(BackendUrl {
            host: b.host.clone(),
            port: b.port,
            tls: b.tls,
        }),
        weight: Some(b.weight),
        max_inflight: b.max_inflight,
        labels: (!b.labels.is_empty()).then(|| {
            b.labels
                .iter()
                .map(|(k, v)| (k.clone(), LabelValue(v.clone())))
                .collect()
        }),
        profile: b.profile.as_ref().map(profile),
        kv_events: b.kv_events.as_ref().map(|k| KvEventsFile {
            endpoint: Some(k.endpoint.clone()),
            block_size: Some(k.block_size as u64),
        }),
        ca_file: b.ca.as_ref().map(|c| c.path.display().to_string()),
        api_key,
        served_model_name: b.served_model_name.clone(),
    }
}

/// `cluster:`, its secrets written as where they are read from (never their values).
fn cluster(c: &super::cluster::Cluster) -> ClusterFile {
    // Only a user name may be inline; any other inline value is redacted.
    let source = |s: &NatsSecret| redacted(&s.from);
    let user = |s: &NatsSecret| match &s.from {
        SecretFile::Inline(_) => SecretFile::Inline(s.value().to_string()),
        other => other.clone(),
    };
    let auth = c.auth.as_ref().map(|a| match a {
        NatsAuth::Token(t) => NatsAuthFile {
            token: Some(source(t)),
            ..NatsAuthFile::default()
        },
        NatsAuth::UserPassword { user: u, password } => NatsAuthFile {
            user: Some(user(u)),
            password: Some(source(password)),
            ..NatsAuthFile::default()
        },
        NatsAuth::NKey(k) => NatsAuthFile {
            nkey: Some(source(k)),
            ..NatsAuthFile::default()
        },
        NatsAuth::Creds(k) => NatsAuthFile {
            creds: Some(source(k)),
            ..NatsAuthFile::default()
        },
    });
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    ClusterFile {
        nats: Some(c.nats.clone()),
        subject: Some(c.subject.clone()),
        replica: Some(SecretFile::Inline(c.replica.clone())),
        heartbeat: Some(c.heartbeat),
        peer_timeout: Some(c.peer_timeout),
        collision_repair: Some(match c.collision_repair {
            Some(margin) => RepairFile::Margin(margin),
            None => RepairFile::Word("off".to_string()),
        }),
        auth,
        tls: c.tls.as_ref().map(|t| NatsTlsFile {
            ca: path(&t.ca),
            cert: path(&t.cert),
            key: path(&t.key),
            server_name: t.server_name.clone(),
        }),
    }
}

#[cfg(test)]
#[path = "effective_tests.rs"]
mod tests;
