//! Loader tests: located messages, syntax and type errors, quick start, hash, check-config.

use super::*;
use pronto_core::routing::PolicyKind;

const BROKEN: &str = "\
listen: 127.0.0.1:8080
pools:
  llama-3-8b:
    policy: fastest
    backends:
      - name: gpu-0
        url: http://127.0.0.1:8001
      - name: gpu-1
        url: ftp://127.0.0.1:8002
        weight: 0
";

#[test]
fn validation_errors_display_with_file_line_column_and_path() {
    let err = Config::from_yaml_str(BROKEN, "pronto.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("pronto.yaml:4:13: pools.llama-3-8b.policy: unknown policy `fastest`; valid policies: {}\n", pronto_core::routing::PolicyKind::ALL.join(", ")) + "pronto.yaml:9:14: pools.llama-3-8b.backends[1].url: unsupported scheme `ftp`; use http or https\n\
         pronto.yaml:10:17: pools.llama-3-8b.backends[1].weight: must be at least 1, got 0"
    );
}

#[test]
fn errors_without_a_location_omit_it() {
    let err = Config::from_yaml_str("threads: 4\n", "f.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "f.yaml: pools: at least one pool is required (a map from model name to backends)"
    );
    // A missing field points at its parent entry.
    let err = Config::from_yaml_str("pools:\n  m:\n    backends:\n      - name: a\n", "f.yaml")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "f.yaml:4:9: pools.m.backends[0].url: missing; e.g. `http://10.0.0.1:8000`"
    );
}

#[test]
fn syntax_and_type_errors_are_located_once() {
    let err = Config::from_yaml_str("pools:\n  m: [\n", "f.yaml").unwrap_err();
    assert_eq!(err.errors.len(), 1);
    let d = &err.errors[0];
    assert!(d.location.is_some(), "{err}");
    assert!(!d.message.contains(" at line "), "{}", d.message);

    // Every error in file order: the entry's missing url (line 4), then the unknown key.
    let yaml = "pools:\n  m:\n    backends:\n      - name: a\n        wieght: 2\n";
    let err = Config::from_yaml_str(yaml, "f.yaml").unwrap_err();
    let text = err.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("f.yaml:4:9: pools.m.backends[0].url: missing"));
    assert!(
        lines[1].starts_with(
            "f.yaml:5:17: pools.m.backends[0].wieght: unknown field `wieght`, expected one of"
        ),
        "{text}"
    );
    assert!(!text.contains(" at line "), "{text}");

    // The wrong type, then what the rest of the file lacks: every error in one pass.
    let err = Config::from_yaml_str("threads: many\n", "f.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "f.yaml:1:10: threads: invalid type: string \"many\", expected u64\n\
         f.yaml: pools: at least one pool is required (a map from model name to backends)"
    );
}

/// `check-config` shows every problem at once: unknown keys and wrong types (serde alone
/// stops at the first) together with the semantic errors of the rest of the file.
#[test]
fn unknown_keys_type_errors_and_semantic_errors_are_reported_in_one_pass() {
    let yaml = "\
lisen: 127.0.0.1:8080
threads: many
limits: {max_body_byts: 1MiB, connect_timeout: 0s}
pools:
  m:
    backends:
      - {name: a, url: 'ftp://h:1', wieght: 2}
";
    let err = Config::from_yaml_str(yaml, "f.yaml").unwrap_err();
    let lines: Vec<String> = err
        .errors
        .iter()
        .map(|d| d.display("f.yaml").to_string())
        .collect();
    let has = |prefix: &str, needle: &str| {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(prefix) && l.contains(needle)),
            "no {prefix}…{needle} in\n{}",
            lines.join("\n")
        )
    };
    has("f.yaml:1:", "lisen: unknown field `lisen`");
    has("f.yaml:2:10: threads:", "invalid type");
    has("f.yaml:3:", "limits.max_body_byts: unknown field");
    has(
        "f.yaml:3:",
        "limits.connect_timeout: must be greater than zero",
    );
    has("f.yaml:7:", "pools.m.backends[0].wieght: unknown field");
    has(
        "f.yaml:7:",
        "pools.m.backends[0].url: unsupported scheme `ftp`",
    );
    assert_eq!(lines.len(), 6, "{}", lines.join("\n"));
}

/// Found by the config-loader fuzz body: the parser places an error at the end of a text
/// with no final line break on the line after the last; it is reported at the text's end.
#[test]
fn an_error_at_the_end_of_the_text_is_located_inside_it() {
    let yaml = "pools:\n  m:\n    backends:\n      - {name: a, url: 'http://h:1'";
    let err = Config::from_yaml_str(yaml, "f.yaml").unwrap_err();
    assert_eq!(
        err.errors[0].location,
        Some(Location {
            line: 4,
            column: 36
        }),
        "{err}"
    );
    for yaml in ["pools:\r\n  m: [\r\n", "pools:\r  m: [", "pools:\n  m: ["] {
        let err = Config::from_yaml_str(yaml, "f.yaml").unwrap_err();
        let loc = err.errors[0].location.unwrap();
        assert!(loc.line <= 2, "{yaml:?}: {err}");
    }
}

#[test]
fn warnings_are_located_on_success() {
    let yaml =
        "health: {interval: 1s, timeout: 1s}\npools:\n  m:\n    backends: [{name: a, url: 'http://h:1'}]\n";
    let c = Config::from_yaml_str(yaml, "w.yaml").unwrap();
    let lines: Vec<String> = c
        .warnings
        .iter()
        .map(|w| w.display(&c.origin).to_string())
        .collect();
    assert_eq!(
        lines,
        [
            "w.yaml:1:33: health.timeout: 1s is not shorter than health.interval (1s): probes can overlap",
            "w.yaml:4:15: pools.m.backends: only one backend, so retry.max_retries = 2 has no other backend to try",
        ]
    );
}

#[test]
fn hash_is_stable_and_tracks_the_text() {
    let yaml =
        "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}, {name: b, url: 'http://h:2'}]}\n";
    let a = Config::from_yaml_str(yaml, "a").unwrap();
    let b = Config::from_yaml_str(yaml, "b").unwrap();
    assert_eq!(a.hash(), b.hash());
    assert_eq!(a.hash().len(), 16);
    assert_eq!(a.hash(), format!("{:016x}", model::fnv1a(yaml.as_bytes())));
    let c = Config::from_yaml_str(&format!("# edited\n{yaml}"), "a").unwrap();
    assert_ne!(a.hash(), c.hash());
}

#[test]
fn from_backend_urls_names_backends_in_order() {
    let urls = vec![
        "http://127.0.0.1:8001".to_string(),
        "http://127.0.0.1:8002/".to_string(),
    ];
    let c = Config::from_backend_urls(&urls, "llama", PolicyKind::RoundRobin).unwrap();
    assert_eq!(c.origin, "--backend");
    assert_eq!(c.pools.len(), 1);
    let p = c.pool("llama").unwrap();
    assert_eq!(p.policy, PolicySpec::RoundRobin);
    let names: Vec<&str> = p.backends.iter().map(|b| &*b.name).collect();
    assert_eq!(names, ["backend-0", "backend-1"]);
    assert_eq!(p.backends[1].port, 8002);
    assert_eq!(
        c.limits,
        Limits {
            max_buffered_bytes: Some(crate::config::model::DEFAULT_MAX_BUFFERED_BYTES),
            ..Limits::default()
        }
    );
    assert!(c.warnings.is_empty());
    let again = Config::from_backend_urls(&urls, "llama", PolicyKind::RoundRobin).unwrap();
    assert_eq!(c.hash(), again.hash());
    let other = Config::from_backend_urls(&urls, "llama", PolicyKind::LeastInflight).unwrap();
    assert_ne!(c.hash(), other.hash());
}

#[test]
fn from_backend_urls_carries_policy_parameters() {
    let urls = vec!["http://127.0.0.1:8001".to_string()];
    let spec = PolicySpec::CacheAware(pronto_core::routing::CacheAwareParams {
        cache_threshold: 0.5,
        ..Default::default()
    });
    let c = Config::from_backend_urls(&urls, "m", spec).unwrap();
    assert_eq!(c.pool("m").unwrap().policy, spec);
    let defaults = Config::from_backend_urls(&urls, "m", PolicyKind::CacheAware).unwrap();
    assert_eq!(
        defaults.pool("m").unwrap().policy,
        PolicyKind::CacheAware.spec()
    );
    assert_ne!(c.hash(), defaults.hash());
}

#[test]
fn from_backend_urls_reports_every_bad_url() {
    let urls = vec!["localhost:1".to_string(), "http://h:1/v1".to_string()];
    let err = Config::from_backend_urls(&urls, "m", PolicyKind::LeastInflight).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--backend: pools.m.backends[0].url: `localhost:1` is not a URL; write it with a scheme, e.g. `http://localhost:1`\n\
         --backend: pools.m.backends[1].url: must not have a path (`/v1`): Pronto forwards the client's request path as is"
    );
    let err = Config::from_backend_urls(&[], "m", PolicyKind::LeastInflight).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--backend: pools.m.backends: pool has no backends; at least one is required (or a `discover:` section)"
    );
}

#[test]
fn load_reports_unreadable_files() {
    let err = Config::load("/nonexistent/pronto.yaml").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("/nonexistent/pronto.yaml: cannot read: "),
        "{text}"
    );
}

fn check(yaml: &str, name: &str) -> (u8, String, String) {
    let dir = std::env::temp_dir().join(format!("pronto-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = check_config(&path, &mut out, &mut err);
    std::fs::remove_file(&path).unwrap();
    let strip = |b: Vec<u8>| {
        String::from_utf8(b)
            .unwrap()
            .replace(&format!("{}/", dir.display()), "")
    };
    (code, strip(out), strip(err))
}

#[test]
fn check_config_ok_with_counts_and_warnings() {
    let yaml = "pools:\n  a: {backends: [{name: x, url: 'http://h:1'}]}\n  b: {backends: [{name: y, url: 'http://h:2'}, {name: z, url: 'http://h:3'}]}\n";
    let (code, out, err) = check(yaml, "ok.yaml");
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "OK: 2 pools, 3 backends\n\
         warning: ok.yaml:2:17: pools.a.backends: only one backend, so retry.max_retries = 2 has no other backend to try\n"
    );
    assert_eq!(err, "");
}

#[test]
fn check_config_prints_every_error_and_fails() {
    let (code, out, err) = check(BROKEN, "broken.yaml");
    assert_eq!(code, 1);
    assert_eq!(out, "");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 4, "{err}");
    assert!(lines[0].starts_with("error: broken.yaml:4:13: pools.llama-3-8b.policy: "));
    assert_eq!(lines[3], "3 errors in broken.yaml");
}

#[test]
fn policy_parameter_errors_are_located_at_the_parameter() {
    let yaml = "\
pools:
  m:
    policy:
      name: cache_aware
      cache_threshold: 1.5
    backends:
      - {name: a, url: 'http://127.0.0.1:1'}
  n:
    policy: {name: power_of_two, alpha: 2}
    backends:
      - {name: b, url: 'http://127.0.0.1:2'}
";
    let err = Config::from_yaml_str(yaml, "p.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "p.yaml:5:24: pools.m.policy.cache_threshold: must be in 0..=1\n\
         p.yaml:9:41: pools.n.policy.alpha: unknown parameter for `power_of_two`; valid parameters: seed"
    );
}

#[test]
fn keepalive_timeout_is_whole_seconds() {
    let pool = "pools:\n  m:\n    backends:\n      - {name: a, url: 'http://127.0.0.1:8001'}\n";
    let err = Config::from_yaml_str(
        &format!("limits: {{keepalive_timeout: 1500ms}}\n{pool}"),
        "p.yaml",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("limits.keepalive_timeout: must be whole seconds, got 1.5s"),
        "{err}"
    );
    let c = Config::from_yaml_str(
        &format!("limits: {{keepalive_timeout: 2m}}\n{pool}"),
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        c.limits.keepalive_timeout,
        std::time::Duration::from_secs(120)
    );
}

/// Sections whose struct is the model (`retry`, `access_log`, `admission`, `migration`, a
/// rate limit, `limits`, `reload`, `health`):
/// a wrongly typed value, or one out of its range, is serde's error, located, with the
/// field's path; what is left to the checker (a rate limit naming a route, a buffer smaller
/// than the body limit) follows.
#[test]
fn model_sections_report_bad_values_located() {
    let pools =
        "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}, {name: b, url: 'http://h:2'}]}\n";
    for (section, expected) in [
        (
            "retry: {max_retries: -1}",
            "f.yaml:1:22: retry.max_retries: ",
        ),
        (
            "retry: {max_retries: 2, tries: 3}",
            "f.yaml:1:32: retry.tries: unknown field `tries`",
        ),
        (
            "access_log: {enabled: maybe}",
            "f.yaml:1:23: access_log.enabled: ",
        ),
        (
            "access_log: {sample_rate: 1.5}",
            "f.yaml:1:27: access_log.sample_rate: must be between 0 and 1",
        ),
        (
            "admission: {queue_size: many}",
            "f.yaml:1:25: admission.queue_size: ",
        ),
        (
            "admission: {queue_size: 0}",
            "f.yaml:1:25: admission.queue_size: must be between 1 and",
        ),
        (
            "migration: {max_attempts: -2}",
            "f.yaml:1:27: migration.max_attempts: ",
        ),
        (
            "rate_limits: {routes: {nope: {max_concurrent: many}}}",
            "f.yaml:1:47: rate_limits.routes.nope.max_concurrent: ",
        ),
        (
            "limits: {connect_timeout: 250}",
            "f.yaml:1:27: limits.connect_timeout: `250` has no unit; write `250ms` or `250s`",
        ),
        (
            "limits: {max_body_bytes: 1.5}",
            "f.yaml:1:26: limits.max_body_bytes: `1.5` is not a size (e.g. `32MiB`)",
        ),
        (
            "limits: {max_connections: 0}",
            "f.yaml:1:27: limits.max_connections: must be between 1 and 1000000, got 0",
        ),
        (
            "reload: {watch: true, watch_interval: often}",
            "f.yaml:1:39: reload.watch_interval: `often` is not a duration",
        ),
        (
            "reload: {watch_interval: 0s}",
            "f.yaml:1:26: reload.watch_interval: must be greater than zero",
        ),
        (
            "health: {eject_after_failures: -1}",
            "f.yaml:1:32: health.eject_after_failures: ",
        ),
        (
            "health: {stall: {floor: soon}}",
            "f.yaml:1:25: health.stall.floor: `soon` is not a duration",
        ),
        (
            "health: {stall: {factor: 0.5}}",
            "f.yaml:1:26: health.stall.factor: must be between 1 and 1000, got 0.5",
        ),
        (
            "grace_period: 30",
            "f.yaml:1:15: grace_period: `30` has no unit; write `30s` or `30ms`",
        ),
        (
            "migration: {max_attempts: 9}",
            "f.yaml:1:27: migration.max_attempts: must be at most 8, got 9",
        ),
    ] {
        let err = Config::from_yaml_str(&format!("{section}\n{pools}"), "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.lines().any(|l| l.starts_with(expected)),
            "{section}: {err}"
        );
    }
}

/// Every duration is read by serde: a bad one is a located shape error, and the checker adds
/// nothing that only follows from its removal (`hedge: needs after`, `on_slo_miss: has no
/// effect without ttft_slo`, a `peer_timeout` compared with a `heartbeat` it never read).
#[test]
fn bad_durations_are_located_shape_errors_without_follow_ons() {
    let pools = "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}]}\n";
    for (text, expected) in [
        (
            "routes:\n  - {name: r, pool: m, ttft_slo: 800, on_slo_miss: shed}\n",
            "f.yaml:2:34: routes[0].ttft_slo: `800` has no unit; write `800ms` or `800s`",
        ),
        (
            "routes:\n  - {name: r, pool: m, hedge: {after: 5}}\n",
            "f.yaml:2:39: routes[0].hedge.after: `5` has no unit; write `5s` or `5ms`",
        ),
        (
            "routes:\n  - {name: r, pool: m, keepalive: soon}\n",
            "f.yaml:2:35: routes[0].keepalive: `soon` is not a duration (e.g. `250ms`, `2s`, \
             `1h30m`)",
        ),
        (
            "cluster: {nats: 'nats://x:1', replica: r, heartbeat: 1, peer_timeout: 500ms}\n",
            "f.yaml:1:54: cluster.heartbeat: `1` has no unit; write `1s` or `1ms`",
        ),
    ] {
        let err = Config::from_yaml_str(&format!("{text}{pools}"), "f.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(err, expected, "{text}");
    }
    // A semantic error beside a removed node that does not name it stays.
    let err = Config::from_yaml_str(
        &format!("routes:\n  - {{name: r, pool: m, ttft_slo: 800, fallback_pool: gone}}\n{pools}"),
        "f.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.ends_with("routes[0].fallback_pool: unknown pool `gone`; pools has: m"),
        "{err}"
    );
}
