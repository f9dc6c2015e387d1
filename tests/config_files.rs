//! Every YAML file under `config/` loads. Gateway configs are validated and must load without
//! warnings; `config/sim/` holds simulator configs (another schema) and is skipped here.
//!
//! The JSON Schema (`pronto config schema`) is kept in step with the file structs: every
//! gateway config validates against it (checked by a small validator for the keywords the
//! schema uses), broken files do not, and every property it names is set in
//! `config/pronto.yaml` — which must set every field and load with unknown keys denied.
//!
//! The annotated example leaves the settings whose example values are secrets commented out
//! with `#~ ` (the loader refuses published secrets): "every field" is checked on the file
//! with those lines uncommented, and that file must fail on exactly those secrets.
//! `config/docker.yaml` reads its admin token from `PRONTO_ADMIN_TOKEN`, which the loads
//! here provide (the process environment is left alone).

use std::path::{Path, PathBuf};

use pronto::config::{config_schema, file, Config, Loaded};
use serde_json::Value;

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
}

/// The environment a deployment provides (`config/docker.yaml`'s admin token).
fn deployment_env(name: &str) -> Option<String> {
    (name == "PRONTO_ADMIN_TOKEN").then(|| "a-token-of-my-own".to_string())
}

/// `text` with its `#~ ` lines (settings commented out for their example secrets) restored.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| match l {
            "#~" => "",
            _ => l.strip_prefix("#~ ").unwrap_or(l),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The annotated example with every setting present.
fn full_example() -> String {
    let text = std::fs::read_to_string(config_dir().join("pronto.yaml")).expect("read");
    assert!(text.contains("\n#~ "), "the example has no `#~ ` lines");
    uncommented(&text)
}

/// Every `*.yaml` / `*.yml` under `dir`, recursively, except under `config/sim/`.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path == config_dir().join("sim") {
                println!("skipping {} (simulator configs)", path.display());
                continue;
            }
            if path == config_dir().join("keys") {
                println!(
                    "skipping {} (API key lists, loaded through auth.keys_file)",
                    path.display()
                );
                continue;
            }
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

#[test]
fn every_gateway_config_in_the_repo_loads_cleanly() {
    let mut files = Vec::new();
    yaml_files(&config_dir(), &mut files);
    for required in [
        "pronto.yaml",
        "examples/single-pool.yaml",
        "examples/multi-model.yaml",
        "examples/cache-aware.yaml",
        "examples/hetero-fleet.yaml",
        "docker.yaml",
    ] {
        assert!(
            files.contains(&config_dir().join(required)),
            "config/{required} is missing"
        );
    }
    let mut failures = Vec::new();
    for path in &files {
        match Loaded::load_with_env(path, deployment_env).map(|l| l.config) {
            Ok(config) => {
                println!(
                    "{}: {} pools, {} backends, hash {}",
                    path.display(),
                    config.pools.len(),
                    config.backend_count(),
                    config.hash()
                );
                for w in &config.warnings {
                    failures.push(format!("warning: {}", w.display(&config.origin)));
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The annotated example documents every field, so it must set every field.
#[test]
fn annotated_example_sets_every_field() {
    let text = full_example();
    let f = file::parse(&text).expect("parses");
    let file::ConfigFile {
        listen,
        admin_listen,
        threads,
        grace_period,
        limits,
        retry,
        migration,
        health,
        explain_headers,
        access_log,
        reload,
        priority_classes,
        admission,
        routes,
        pools,
        auth,
        admin,
        rate_limits,
        tls,
        cluster,
    } = f;
    let pronto::config::cluster::ClusterFile {
        nats,
        subject,
        replica,
        heartbeat,
        peer_timeout,
        collision_repair,
        auth: nats_auth,
        tls: nats_tls,
    } = cluster.expect("cluster");
    assert!(nats.is_some() && subject.is_some() && replica.is_some());
    assert!(heartbeat.is_some() && peer_timeout.is_some() && collision_repair.is_some());
    // One kind of credentials at a time: the example sets `user` + `password` and shows the
    // others in comments (checked against the schema below).
    let pronto::config::nats::NatsAuthFile {
        token: _,
        user,
        password,
        nkey: _,
        creds: _,
    } = nats_auth.expect("cluster.auth");
    assert!(user.is_some() && password.is_some());
    let pronto::config::nats::NatsTlsFile {
        ca,
        cert,
        key: nats_key,
        server_name,
    } = nats_tls.expect("cluster.tls");
    assert!(ca.is_some() && cert.is_some() && nats_key.is_some() && server_name.is_some());
    let auth = auth.expect("auth");
    assert!(auth.keys_file.is_some());
    let tls = tls.expect("tls");
    assert!(tls.cert.is_some() && tls.key.is_some());
    let ca_files = pools
        .iter()
        .flat_map(|p| &p.0)
        .flat_map(|(_, p)| p.backends.iter().flatten());
    assert!(
        ca_files.filter(|b| b.ca_file.is_some()).count() > 0,
        "some backend sets ca_file"
    );
    let pronto::config::edge::KeyFile {
        name: key_name,
        key,
        sha256: _,
        models,
        routes: key_routes,
        priority: key_priority,
    } = auth.keys.expect("keys").remove(0);
    assert!(key_name.is_some() && key.is_some() && models.is_some());
    assert!(key_routes.is_some() && key_priority.is_some());
    let pronto::config::edge::AdminFile {
        token,
        allowed_hosts,
    } = admin.expect("admin");
    assert!(token.is_some() && allowed_hosts.is_some());
    let pronto::config::edge::RateLimitsFile {
        per_key,
        keys: limit_keys,
        routes: limit_routes,
    } = rate_limits.expect("rate_limits");
    let pronto::config::edge::RateLimit {
        requests_per_minute,
        tokens_per_minute,
        max_concurrent,
    } = per_key.expect("per_key");
    assert!(requests_per_minute.is_some() && tokens_per_minute.is_some());
    assert!(max_concurrent.is_some() && limit_keys.is_some() && limit_routes.is_some());
    assert!(priority_classes.is_some());
    assert!(admission.is_some());
    let file::RouteFile {
        name,
        matches,
        pool,
        ttft_slo,
        tpot_slo,
        objective,
        race_on,
        priority,
        on_slo_miss,
        fallback_pool,
        policy,
        max_retries,
        first_token_timeout,
        idle_timeout,
        first_token_deadline,
        hedge,
        migration: route_migration,
        keepalive,
    } = routes.expect("routes").remove(0);
    assert!(route_migration.is_some() && migration.is_some());
    assert!(keepalive.is_some());
    let pronto::config::race::DeadlineFile {
        after: _,
        factor,
        floor,
    } = first_token_deadline.expect("first_token_deadline");
    assert!(factor.is_some() && floor.is_some());
    let pronto::config::race::HedgeFile {
        after: _,
        quantile,
        budget,
        max_predicted_ttft,
    } = hedge.expect("hedge");
    assert!(quantile.is_some() && budget.is_some() && max_predicted_ttft.is_some());
    assert!(policy.is_some());
    assert!(name.is_some() && pool.is_some() && ttft_slo.is_some() && priority.is_some());
    assert!(on_slo_miss.is_some() && fallback_pool.is_some() && max_retries.is_some());
    assert!(first_token_timeout.is_some() && idle_timeout.is_some() && tpot_slo.is_some());
    assert!(objective.is_some() && race_on.is_some());
    let file::MatchFile {
        model,
        path: route_path,
        headers,
        api_keys,
    } = matches.expect("match");
    assert!(model.is_some() && route_path.is_some() && headers.is_some() && api_keys.is_some());
    assert!(listen.is_some() && admin_listen.is_some() && threads.is_some());
    assert!(grace_period.is_some() && explain_headers.is_some());
    // A section whose struct is the model (serde fills its defaults): the schema test below
    // checks the example names each of its fields.
    let pronto::config::AccessLog {
        enabled: _,
        sample_rate: _,
    } = access_log.expect("access_log");
    let pronto::config::Limits {
        max_body_bytes: _,
        connect_timeout: _,
        first_token_timeout: _,
        idle_timeout: _,
        request_timeout: _,
        header_timeout: _,
        body_timeout: _,
        write_timeout: _,
        keepalive_timeout: _,
        min_send_rate,
        max_buffered_bytes,
        max_connections: _,
    } = limits.expect("limits");
    assert!(min_send_rate.is_some() && max_buffered_bytes.is_some());
    assert!(retry.is_some());
    let pronto::config::ReloadSettings {
        watch: _,
        watch_interval: _,
    } = reload.expect("reload");
    let pronto::config::Health {
        path: _,
        interval: _,
        timeout: _,
        eject_after_failures: _,
        readmit_after: _,
        stall,
    } = health.expect("health");
    let pronto::config::progress::Stall {
        enabled: _,
        floor: _,
        factor: _,
    } = stall;
    let pools = pools.expect("pools").0;
    let (_, pool) = pools.first().expect("a pool");
    assert!(pool.policy.is_some());
    let file::BackendFile {
        name,
        url,
        weight,
        max_inflight,
        labels,
        kv_events,
        profile,
        ca_file: _,
        api_key,
        served_model_name,
    } = pool.backends.clone().expect("backends").remove(0);
    assert!(pool.api_key.is_some() && api_key.is_some());
    assert!(pool.served_model_name.is_some() && served_model_name.is_some());
    assert!(name.is_some() && url.is_some() && weight.is_some());
    assert!(max_inflight.is_some() && labels.is_some() && profile.is_some());
    let file::KvEventsFile {
        endpoint,
        block_size,
    } = kv_events.expect("kv_events");
    assert!(endpoint.is_some() && block_size.is_some());
    let file::ProfileFile {
        file: _,
        base_ms,
        prefill_tokens_per_s,
        decode_ms_per_running,
    } = profile.unwrap();
    assert!(base_ms.is_some() && prefill_tokens_per_s.is_some());
    assert!(decode_ms_per_running.is_some());
    let discovered = pools.iter().find_map(|(_, p)| p.discover.clone());
    // Typed by serde (defaults filled): the schema test below checks the example names each
    // of its fields.
    let file::DiscoverFile {
        dns,
        interval: _,
        scheme: _,
        family: _,
        weight: _,
        max_inflight,
    } = discovered.expect("a pool with `discover:`");
    assert!(dns.is_some() && max_inflight.is_some());
    assert!(pools.iter().any(|(_, p)| p.profile.is_some()));
    let profile_files = pools
        .iter()
        .flat_map(|(_, p)| p.backends.iter().flatten())
        .filter_map(|b| b.profile.as_ref());
    assert!(
        profile_files.filter(|p| p.file.is_some()).count() > 0,
        "some backend's profile names a file"
    );
}

/// The defaults the annotated example states are the defaults the code applies.
#[test]
fn annotated_example_values_equal_the_defaults() {
    let example = Config::load(config_dir().join("pronto.yaml")).expect("loads");
    let minimal = Config::from_yaml_str(
        "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}, {name: b, url: 'http://h:2'}]}\n",
        "minimal",
    )
    .expect("loads");
    assert_eq!(example.listen, minimal.listen);
    assert_eq!(example.admin_listen, minimal.admin_listen);
    assert_eq!(example.threads, minimal.threads);
    assert_eq!(example.grace_period, minimal.grace_period);
    assert_eq!(example.limits, minimal.limits);
    assert_eq!(example.retry, minimal.retry);
    assert_eq!(example.health, minimal.health);
    assert_eq!(example.explain_headers, minimal.explain_headers);
    assert_eq!(example.access_log, minimal.access_log);
    assert_eq!(example.reload, minimal.reload);
    assert_eq!(example.pools[0].policy, minimal.pools[0].policy);
}

// === the JSON Schema ===

fn schema() -> Value {
    serde_json::from_str(&config_schema()).expect("the schema is JSON")
}

/// Follow a local `$ref` (`#/$defs/name`).
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.strip_prefix("#/$defs/").expect("local $defs reference");
            &root["$defs"][name]
        }
        None => schema,
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        other => panic!("schema uses type {other}, unknown to this validator"),
    }
}

/// Problems with `v` at `path` against `schema`: a validator for the keywords the config
/// schema uses (type, enum, const, properties, additionalProperties, required, items,
/// minItems, minProperties, minimum, maximum, oneOf, $ref). `pattern` and `propertyNames`
/// are not checked (no regex engine in the test dependencies).
fn check(root: &Value, schema: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    let s = resolve(root, schema);
    if s.get("$ref").is_some() {
        return check(root, s, v, path, out);
    }
    // Sibling keywords of a $ref in the referring schema (description, default) constrain
    // nothing; the referenced schema was checked above.
    if let Some(ty) = s.get("type") {
        let ok = match ty {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)),
            _ => panic!("bad type keyword at {path}"),
        };
        if !ok {
            out.push(format!("{path}: expected {ty}, got {v}"));
            return;
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            out.push(format!("{path}: expected {c}, got {v}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            out.push(format!("{path}: {v} is not one of {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            out.push(format!("{path}: {n} < {min}"));
        }
    }
    if let (Some(max), Some(n)) = (s.get("maximum").and_then(Value::as_f64), v.as_f64()) {
        if n > max {
            out.push(format!("{path}: {n} > {max}"));
        }
    }
    if let Some(branches) = s.get("oneOf").and_then(Value::as_array) {
        let passing = branches
            .iter()
            .filter(|b| {
                let mut errs = Vec::new();
                check(root, b, v, path, &mut errs);
                errs.is_empty()
            })
            .count();
        if passing != 1 {
            out.push(format!(
                "{path}: {v} matches {passing} branches of oneOf, not 1"
            ));
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(min) = s.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < min {
                out.push(format!("{path}: fewer than {min} items"));
            }
        }
        if let Some(item) = s.get("items") {
            for (i, x) in items.iter().enumerate() {
                check(root, item, x, &format!("{path}[{i}]"), out);
            }
        }
    }
    if let Some(map) = v.as_object() {
        if let Some(min) = s.get("minProperties").and_then(Value::as_u64) {
            if (map.len() as u64) < min {
                out.push(format!("{path}: fewer than {min} properties"));
            }
        }
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !map.contains_key(r.as_str().unwrap()) {
                out.push(format!("{path}: missing {r}"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in map {
            let sub = format!("{path}.{k}");
            match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                (Some(p), _) => check(root, p, x, &sub, out),
                (None, Some(Value::Bool(false))) => out.push(format!("{sub}: not allowed")),
                (None, Some(extra)) if extra.is_object() => check(root, extra, x, &sub, out),
                (None, _) => {}
            }
        }
    }
}

fn schema_errors(yaml: &str) -> Vec<String> {
    let v: Value = serde_yaml_ng::from_str(yaml).expect("YAML");
    let root = schema();
    let mut out = Vec::new();
    check(&root, &root, &v, "$", &mut out);
    out
}

#[test]
fn every_gateway_config_validates_against_the_schema() {
    let mut files = Vec::new();
    yaml_files(&config_dir(), &mut files);
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let errors = schema_errors(&text);
        assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
    }
    let errors = schema_errors(&full_example());
    assert!(errors.is_empty(), "the uncommented example: {errors:#?}");
}

/// The environment the uncommented example reads (`cluster.auth.password`).
fn example_env(name: &str) -> Option<String> {
    (name == "NATS_PASSWORD").then(|| "a-password-of-my-own".to_string())
}

/// Uncommenting the example's `#~ ` lines gives a config that fails on its published
/// secrets, each at its field, and on nothing else.
#[test]
fn the_commented_out_examples_are_refused_for_their_secrets() {
    let path = config_dir().join("pronto.yaml");
    let e = pronto::config::Loaded::from_file_text_with_env(&path, &full_example(), example_env)
        .map(|l| l.config)
        .unwrap_err();
    let mut paths: Vec<&str> = e.errors.iter().map(|d| d.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "admin.token",
            "auth.keys[0].key",
            "auth.keys[1].sha256",
            "auth.keys_file[0].sha256",
            "cluster.tls.key",
            "routes[0].match.api_keys[0]",
            "tls.key",
        ],
        "{e}"
    );
    for d in &e.errors {
        assert!(
            d.message
                .contains("published in Pronto's repository (config/"),
            "{}",
            d.message
        );
    }
}

#[test]
fn the_schema_rejects_what_the_loader_rejects() {
    let ok = "pools:\n  m:\n    policy: {name: cache_aware, cache_threshold: 0.5}\n    backends: [{name: a, url: 'http://h:1'}]\n";
    assert_eq!(schema_errors(ok), Vec::<String>::new());
    for (bad, expected) in [
        (
            ok.replace("name: a,", "name: a, wieght: 2,"),
            "$.pools.m.backends[0].wieght: not allowed",
        ),
        (
            format!("threads: four\n{ok}"),
            "$.threads: expected \"integer\"",
        ),
        (format!("threads: 0\n{ok}"), "$.threads: 0 < 1"),
        (
            format!("relaod: {{watch: true}}\n{ok}"),
            "$.relaod: not allowed",
        ),
        (
            ok.replace("cache_threshold: 0.5", "virtual_nodes: 3"),
            "$.pools.m.policy:",
        ),
        (ok.replace("cache_aware", "fastest"), "$.pools.m.policy:"),
        (
            "pools: {}\n".to_string(),
            "$.pools: fewer than 1 properties",
        ),
        (
            ok.replace("[{name: a, url: 'http://h:1'}]", "[]"),
            "$.pools.m.backends: fewer than 1 items",
        ),
    ] {
        let errors = schema_errors(&bad);
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "{bad}\nexpected {expected}, got {errors:?}"
        );
        assert!(
            Config::from_yaml_str(&bad, "bad").is_err(),
            "the loader rejects it too: {bad}"
        );
    }
}

/// Every property path in the schema (`limits.connect_timeout`, `pools.*.backends[].url`).
fn schema_paths(root: &Value, s: &Value, prefix: &str, out: &mut Vec<String>) {
    let s = resolve(root, s);
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, p) in props {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(path.clone());
            if path.ends_with(".policy") {
                continue; // parameters per policy: covered by the routing spec's own list
            }
            schema_paths(root, p, &path, out);
        }
    }
    if let Some(extra) = s.get("additionalProperties").filter(|a| a.is_object()) {
        schema_paths(root, extra, &format!("{prefix}.*"), out);
    }
    if let Some(items) = s.get("items") {
        schema_paths(root, items, &format!("{prefix}[]"), out);
    }
}

/// Every key path set in a YAML value, in the same notation.
fn yaml_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        // A credential's source (`{env: NAME}`, `{file: PATH}`): one schema property.
        Value::Object(_) if prefix.starts_with("cluster.auth.") => {}
        Value::Object(map) => {
            for (k, x) in map {
                let key = if prefix == "pools"
                    || prefix.ends_with(".labels")
                    || prefix.ends_with(".headers")
                    || prefix == "rate_limits.keys"
                    || prefix == "rate_limits.routes"
                {
                    "*"
                } else {
                    k
                };
                let path = if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}.{key}")
                };
                if !path.ends_with(".*") {
                    out.push(path.clone());
                }
                if !path.ends_with(".policy") {
                    yaml_paths(x, &path, out);
                }
            }
        }
        Value::Array(items) => {
            for x in items {
                yaml_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_schema_names_exactly_the_fields_the_annotated_example_sets() {
    let root = schema();
    let mut in_schema = Vec::new();
    schema_paths(&root, &root, "", &mut in_schema);
    in_schema.sort();
    in_schema.dedup();
    let text = full_example();
    // `cluster.auth` takes one kind of credentials: the example sets `user` + `password` and
    // shows the other kinds in its comments.
    for alternative in ["token", "nkey", "creds"] {
        assert!(
            text.contains(&format!("#   {alternative}: {{")),
            "the example shows cluster.auth.{alternative} in a comment"
        );
        in_schema.retain(|p| *p != format!("cluster.auth.{alternative}"));
    }
    let v: Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut in_example = Vec::new();
    yaml_paths(&v, "", &mut in_example);
    in_example.sort();
    in_example.dedup();
    assert_eq!(in_schema, in_example);
}

/// `docs/config-reference.md` is what `pronto config reference` prints today.
#[test]
fn the_config_reference_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config-reference.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == pronto::config::config_reference(),
        "{} is stale: regenerate it with `cargo run -- config reference > docs/config-reference.md`",
        path.display()
    );
}
