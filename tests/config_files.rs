//! Every YAML file under `config/` loads. Gateway configs are validated and must load without
//! warnings; `config/sim/` holds simulator configs (another schema) and is skipped here.

use std::path::{Path, PathBuf};

use pronto::config::{file, Config};

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
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
    ] {
        assert!(
            files.contains(&config_dir().join(required)),
            "config/{required} is missing"
        );
    }
    let mut failures = Vec::new();
    for path in &files {
        match Config::load(path) {
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
    let text = std::fs::read_to_string(config_dir().join("pronto.yaml")).expect("read");
    let f = file::parse(&text).expect("parses");
    let file::ConfigFile {
        listen,
        admin_listen,
        threads,
        grace_period,
        limits,
        retry,
        health,
        explain_headers,
        pools,
    } = f;
    assert!(listen.is_some() && admin_listen.is_some() && threads.is_some());
    assert!(grace_period.is_some() && explain_headers.is_some());
    let file::LimitsFile {
        max_body_bytes,
        connect_timeout,
        first_token_timeout,
        idle_timeout,
    } = limits.expect("limits");
    assert!(max_body_bytes.is_some() && connect_timeout.is_some());
    assert!(first_token_timeout.is_some() && idle_timeout.is_some());
    assert!(retry.expect("retry").max_retries.is_some());
    let file::HealthFile {
        path,
        interval,
        timeout,
        eject_after_failures,
        readmit_after,
    } = health.expect("health");
    assert!(path.is_some() && interval.is_some() && timeout.is_some());
    assert!(eject_after_failures.is_some() && readmit_after.is_some());
    let pools = pools.expect("pools").0;
    let (_, pool) = pools.first().expect("a pool");
    assert!(pool.policy.is_some());
    let file::BackendFile {
        name,
        url,
        weight,
        max_inflight,
        labels,
    } = pool.backends.clone().expect("backends").remove(0);
    assert!(name.is_some() && url.is_some() && weight.is_some());
    assert!(max_inflight.is_some() && labels.is_some());
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
    assert_eq!(example.pools[0].policy, minimal.pools[0].policy);
}
