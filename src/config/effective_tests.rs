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

#[test]
fn every_section_is_written_and_no_secret_is() {
    fn env(name: &str) -> Option<String> {
        (name == "ADMIN_TOKEN").then(|| "the-admin-token-from-env".to_string())
    }
    let yaml = "
admin: {token: {env: ADMIN_TOKEN}, allowed_hosts: [gw.internal]}
auth:
  keys:
    - {name: team-a, key: sk-inline-team-a-key, models: ['llama-*'], priority: batch}
    - {name: team-b, sha256: c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00}
rate_limits:
  per_key: {requests_per_minute: 60}
  keys: {team-b: {max_concurrent: 2}}
  routes: {chat: {tokens_per_minute: 1000}}
priority_classes: [interactive, batch]
admission: {queue_size: 16}
routes:
  - name: chat
    match: {model: 'llama-*', headers: {x-team: a}, api_keys: [sk-route-key-inline]}
    pool: llama
    ttft_slo: 2s
    on_slo_miss: shed
pools:
  llama:
    api_key: sk-upstream-inline-key
    backends: [{name: a, url: 'http://10.0.0.1:8000'}]
";
    let config = crate::config::Loaded::from_yaml_str_with_env(yaml, "t.yaml", env)
        .unwrap()
        .config;
    let json = config.to_json();
    let text = json.to_string();
    for secret in [
        "the-admin-token-from-env",
        "sk-inline-team-a-key",
        "c0ffee00",
        "sk-route-key-inline",
        "sk-upstream-inline-key",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    for section in [
        "listen",
        "admin_listen",
        "threads",
        "grace_period",
        "limits",
        "retry",
        "migration",
        "health",
        "explain_headers",
        "access_log",
        "reload",
        "priority_classes",
        "admission",
        "routes",
        "pools",
        "auth",
        "admin",
        "rate_limits",
    ] {
        assert!(json.get(section).is_some(), "{section} missing: {json}");
    }
    assert_eq!(json["admin"]["token"]["env"], "ADMIN_TOKEN");
    assert_eq!(json["auth"]["keys"][0]["key"], REDACTED);
    assert_eq!(json["routes"][0]["match"]["api_keys"][0], REDACTED);
    assert_eq!(json["pools"]["llama"]["api_key"], REDACTED);
    assert_eq!(json["pools"]["llama"]["serve_listed_models"], false);
    assert_eq!(json["rate_limits"]["keys"]["team-b"]["max_concurrent"], 2);
    // A placeholder never loads as a secret.
    let err = crate::config::Loaded::from_yaml_str_with_env(
        &serde_yaml_ng::to_string(&json).unwrap(),
        "effective",
        env,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("auth.keys[0].key"), "{err}");
    assert!(err.contains("placeholder"), "{err}");
}

/// The configs the repository ships: `config/*.yaml` and `config/examples/*.yaml`.
fn repo_configs() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("examples")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// What `GET /admin/config` serves ([`Config::to_json`]) loads back to the same config, for
/// `config/pronto.yaml` and every example: every section, every default, the same model.
#[test]
fn every_repo_config_round_trips_through_the_effective_config() {
    fn env(name: &str) -> Option<String> {
        (name == "PRONTO_ADMIN_TOKEN").then(|| "a-token-of-my-own".to_string())
    }
    let strip = |c: &Config| Config {
        origin: String::new(),
        source_path: None,
        source_hash: 0,
        warnings: Vec::new(),
        ..c.clone()
    };
    let files = repo_configs();
    assert!(files.len() >= 8, "{files:?}");
    for path in files {
        let config = crate::config::Loaded::load_with_env(&path, env)
            .unwrap_or_else(|e| panic!("{e}"))
            .config;
        let json = config.to_json();
        for section in [
            "listen",
            "limits",
            "retry",
            "migration",
            "health",
            "access_log",
            "reload",
            "priority_classes",
            "admission",
            "pools",
            "admin",
        ] {
            assert!(
                json.get(section).is_some(),
                "{}: no {section}",
                path.display()
            );
        }
        // As YAML, the file structs keep the pools in file order: the very same config.
        let text = serde_yaml_ng::to_string(&config.to_file()).unwrap();
        let again = crate::config::Loaded::from_yaml_str_with_env(&text, "effective", env)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
            .config;
        assert_eq!(strip(&again), strip(&config), "{}\n{text}", path.display());
        // As JSON (what GET /admin/config serves), objects are unordered: the same config
        // with its pools by name.
        let text = serde_yaml_ng::to_string(&json).unwrap();
        let from_json = crate::config::Loaded::from_yaml_str_with_env(&text, "effective", env)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
            .config;
        let by_name = |c: &Config| {
            let mut c = strip(c);
            c.pools.sort_by(|a, b| a.model.cmp(&b.model));
            c
        };
        assert_eq!(by_name(&from_json), by_name(&config), "{}", path.display());
        // And writing it again changes nothing.
        assert_eq!(again.to_json(), json, "{}", path.display());
    }
}
