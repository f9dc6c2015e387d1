//! The effective config as JSON, for `GET /admin/config`.
//!
//! The shape is the file's (same keys, same nesting), with every default filled in, durations
//! written back as human strings (`2s`, `250ms`) and sizes in their largest exact binary unit
//! (`32MiB`): converted to YAML it is a valid config file that loads to the same [`Config`].

use serde_json::{json, Map, Value};

use super::cluster::Cluster;
use super::duration::{format_duration, format_size};
use super::edge::SecretFile;
use super::model::{Backend, Config, Pool, ProfileHint};
use super::nats::{NatsAuth, NatsSecret};

// === impl Config ===

impl Config {
    /// Every setting, defaults included, in the config file's shape.
    pub fn to_json(&self) -> Value {
        let mut pools = Map::new();
        for pool in &self.pools {
            pools.insert(pool.model.to_string(), pool_json(pool));
        }
        let mut v = json!({
            "listen": self.listen.to_string(),
            "admin_listen": self.admin_listen.to_string(),
            "threads": self.threads,
            "grace_period": format_duration(self.grace_period),
            "limits": {
                "max_body_bytes": format_size(self.limits.max_body_bytes),
                "connect_timeout": format_duration(self.limits.connect_timeout),
                "first_token_timeout": format_duration(self.limits.first_token_timeout),
                "idle_timeout": format_duration(self.limits.idle_timeout),
                "request_timeout": format_duration(self.limits.request_timeout),
                "header_timeout": format_duration(self.limits.header_timeout),
                "body_timeout": format_duration(self.limits.body_timeout),
                "write_timeout": format_duration(self.limits.write_timeout),
                "keepalive_timeout": format_duration(self.limits.keepalive_timeout),
                "min_send_rate": self.limits.min_send_rate.map(format_size),
                "max_buffered_bytes": format_size(self.limits.max_buffered_bytes),
                "max_connections": self.limits.max_connections,
            },
            "retry": { "max_retries": self.retry.max_retries },
            "migration": { "max_attempts": self.migration.max_attempts },
            "health": {
                "path": self.health.path,
                "interval": format_duration(self.health.interval),
                "timeout": format_duration(self.health.timeout),
                "eject_after_failures": self.health.eject_after_failures,
                "readmit_after": format_duration(self.health.readmit_after),
                "stall": match &self.health.stall {
                    Some(r) => json!({
                        "enabled": true,
                        "floor": format_duration(r.floor),
                        "factor": r.factor,
                    }),
                    None => json!({ "enabled": false }),
                },
            },
            "explain_headers": self.explain_headers,
            "access_log": {
                "enabled": self.access_log.enabled,
                "sample_rate": self.access_log.sample_rate,
            },
            "reload": {
                "watch": self.reload.watch,
                "watch_interval": format_duration(self.reload.watch_interval),
            },
            "pools": pools,
        });
        if let Some(c) = &self.cluster {
            v["cluster"] = cluster_json(c);
        }
        v
    }
}

/// `cluster:`, its secrets written as where they are read from (never their values).
fn cluster_json(c: &Cluster) -> Value {
    let mut v = json!({
        "nats": c.nats,
        "subject": c.subject,
        "replica": c.replica,
        "heartbeat": format_duration(c.heartbeat),
        "peer_timeout": format_duration(c.peer_timeout),
        "collision_repair": c.collision_repair.map_or(Value::from("off"), Value::from),
    });
    let source = |s: &NatsSecret| match &s.from {
        SecretFile::Inline(_) => Value::from(s.value()),
        SecretFile::Env(name) => json!({ "env": name }),
        SecretFile::File(path) => json!({ "file": path }),
    };
    if let Some(auth) = &c.auth {
        v["auth"] = match auth {
            NatsAuth::Token(t) => json!({ "token": source(t) }),
            NatsAuth::UserPassword { user, password } => {
                json!({ "user": source(user), "password": source(password) })
            }
            NatsAuth::NKey(k) => json!({ "nkey": source(k) }),
            NatsAuth::Creds(k) => json!({ "creds": source(k) }),
        };
    }
    if let Some(t) = &c.tls {
        let mut tls = Map::new();
        let paths = [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)];
        for (k, p) in paths {
            if let Some(p) = p {
                tls.insert(k.into(), Value::from(p.display().to_string()));
            }
        }
        if let Some(n) = &t.server_name {
            tls.insert("server_name".into(), Value::from(n.as_str()));
        }
        v["tls"] = Value::Object(tls);
    }
    v
}

fn pool_json(pool: &Pool) -> Value {
    // A tagged enum serializes to an object with its `name`: the file's map form.
    let policy = serde_json::to_value(pool.policy).unwrap_or(Value::Null);
    let backends: Vec<Value> = pool.backends.iter().map(backend_json).collect();
    let mut v = json!({
        "policy": policy,
        "backends": backends,
        "scrape": { "interval": format_duration(pool.scrape.interval) },
        "continue_streams": pool.continue_streams,
    });
    if let Some(d) = &pool.discover {
        let mut dj = json!({
            "dns": d.target(),
            "interval": format_duration(d.interval),
            "scheme": "http",
            "family": d.family.as_str(),
            "weight": d.weight,
        });
        if let Some(cap) = d.max_inflight {
            dj["max_inflight"] = Value::from(cap);
        }
        v["discover"] = dj;
    }
    if let Some(p) = &pool.profile {
        v["profile"] = profile_json(p);
    }
    if let Some(n) = &pool.served_model_name {
        v["served_model_name"] = Value::from(n.as_str());
    }
    if let Some(t) = &pool.tokenizer {
        v["tokenizer"] = Value::from(t.path.display().to_string());
        if let Some(source) = &t.chat_template {
            v["chat_template"] = Value::from(source.display().to_string());
        }
    }
    v
}

fn profile_json(p: &ProfileHint) -> Value {
    let mut v = Map::new();
    let fields = [
        ("base_ms", p.base_ms),
        ("prefill_tokens_per_s", p.prefill_tokens_per_s),
        ("decode_ms_per_running", p.decode_ms_per_running),
    ];
    for (k, x) in fields {
        if let Some(x) = x {
            v.insert(k.to_string(), Value::from(x));
        }
    }
    Value::Object(v)
}

fn backend_json(b: &Backend) -> Value {
    let mut v = json!({
        "name": &*b.name,
        "url": b.base_url(),
        "weight": b.weight,
    });
    if let Some(cap) = b.max_inflight {
        v["max_inflight"] = Value::from(cap);
    }
    if !b.labels.is_empty() {
        v["labels"] = json!(b.labels);
    }
    if let Some(k) = &b.kv_events {
        v["kv_events"] = json!({"endpoint": k.endpoint, "block_size": k.block_size});
    }
    if let Some(p) = &b.profile {
        v["profile"] = profile_json(p);
    }
    if let Some(n) = &b.served_model_name {
        v["served_model_name"] = Value::from(n.as_str());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_config_reloads_to_the_same_config() {
        let yaml = "
threads: 3
limits: {max_body_bytes: 2MiB, first_token_timeout: 1500ms}
health: {interval: 2s, readmit_after: 1m, stall: {floor: 3s}}
reload: {watch: false}
pools:
  \"meta/llama\":
    policy: {name: cache_aware, cache_threshold: 0.5}
    backends:
      - {name: a, url: 'http://10.0.0.1:8000', weight: 2, max_inflight: 8, labels: {gpu: h100}}
      - {name: b, url: 'http://10.0.0.2'}
  other:
    policy: round_robin
    profile: {base_ms: 12.5, prefill_tokens_per_s: 8000}
    served_model_name: discover
    backends:
      - {name: c, url: 'http://h:1', profile: {decode_ms_per_running: 3}}
      - {name: d, url: 'http://h:2', served_model_name: '/models/llama 3'}
  pool-dns:
    discover: {dns: 'vllm.internal:8000', interval: 30s, family: ipv4, max_inflight: 4}
";
        let config = Config::from_yaml_str(yaml, "t.yaml").unwrap();
        let json = config.to_json();
        assert_eq!(json["limits"]["max_body_bytes"], "2MiB");
        assert_eq!(json["health"]["readmit_after"], "1m");
        assert_eq!(json["health"]["stall"]["floor"], "3s");
        assert_eq!(json["health"]["stall"]["factor"], 4.0);
        assert_eq!(json["pools"]["meta/llama"]["policy"]["name"], "cache_aware");
        assert_eq!(
            json["pools"]["meta/llama"]["backends"][1]["url"],
            "http://10.0.0.2:80"
        );
        assert_eq!(
            json["pools"]["pool-dns"]["discover"]["dns"],
            "vllm.internal:8000"
        );
        assert_eq!(
            json["pools"]["other"]["backends"][0]["profile"]["base_ms"],
            12.5
        );
        assert_eq!(json["pools"]["other"]["served_model_name"], "discover");
        assert_eq!(
            json["pools"]["other"]["backends"][1]["served_model_name"],
            "/models/llama 3"
        );
        let text = serde_yaml_ng::to_string(&json).unwrap();
        let again = Config::from_yaml_str(&text, "effective").unwrap();
        let strip = |c: &Config| Config {
            origin: String::new(),
            source_hash: 0,
            warnings: Vec::new(),
            ..c.clone()
        };
        assert_eq!(strip(&again), strip(&config));
    }

    #[test]
    fn cluster_credentials_are_shown_as_where_they_are_read_from() {
        fn env(name: &str) -> Option<String> {
            (name == "NATS_PASSWORD").then(|| "the-nats-password".to_string())
        }
        let yaml = "
cluster:
  nats: 'tls://nats:4222'
  replica: r0
  collision_repair: off
  auth: {user: pronto, password: {env: NATS_PASSWORD}}
  tls: {server_name: nats.internal}
pools:
  m:
    backends: [{name: a, url: 'http://10.0.0.1:8000'}]
";
        let load = |text: &str| {
            crate::config::Loaded::from_yaml_str_with_env(text, "t.yaml", env)
                .unwrap()
                .config
        };
        let config = load(yaml);
        let json = config.to_json();
        assert_eq!(json["cluster"]["auth"]["password"]["env"], "NATS_PASSWORD");
        assert_eq!(json["cluster"]["auth"]["user"], "pronto");
        assert_eq!(json["cluster"]["collision_repair"], "off");
        assert!(!json.to_string().contains("the-nats-password"), "{json}");
        let again = load(&serde_yaml_ng::to_string(&json).unwrap());
        assert_eq!(again.cluster, config.cluster);
    }
}
