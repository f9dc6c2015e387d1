//! Unit tests for `validate`: one per error class, with exact paths and messages.

use std::time::Duration;

use super::*;
use crate::config::file;
use pronto_core::routing::PolicyKind;

/// Two valid backends in pool `m`; tests append top-level sections.
pub(super) const POOL: &str = "
pools:
  m:
    backends:
      - {name: a, url: 'http://127.0.0.1:8001'}
      - {name: b, url: 'http://127.0.0.1:8002'}
";

pub(super) fn run(yaml: &str) -> Result<(Config, Vec<ConfigWarning>), Invalid> {
    run_loaded(yaml).map(|(c, _, w)| (c, w))
}

pub(super) fn run_loaded(
    yaml: &str,
) -> Result<(Config, crate::config::Resources, Vec<ConfigWarning>), Invalid> {
    let diagnostic = |d: crate::config::Diagnostic| (d.path, d.message);
    match crate::config::Loaded::from_yaml_str(yaml, "t.yaml") {
        Ok(loaded) => {
            let warnings = loaded.config.warnings.iter().cloned().map(diagnostic);
            let warnings = warnings
                .map(|(path, message)| ConfigWarning { path, message })
                .collect();
            Ok((loaded.config, loaded.resources, warnings))
        }
        Err(e) => Err(Invalid {
            errors: (e.errors.into_iter().map(diagnostic))
                .map(|(path, message)| ConfigError { path, message })
                .collect(),
            warnings: (e.warnings.into_iter().map(diagnostic))
                .map(|(path, message)| ConfigWarning { path, message })
                .collect(),
        }),
    }
}

pub(super) fn errors(yaml: &str) -> Vec<(String, String)> {
    match run(yaml) {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(i) => i.errors.into_iter().map(|e| (e.path, e.message)).collect(),
    }
}

/// The errors of loading `yaml` as a file: serde's shape errors (a section whose struct is
/// the model reads its own values) first, then the checker's.
pub(super) fn load_errors(yaml: &str) -> Vec<(String, String)> {
    match crate::config::Config::from_yaml_str(yaml, "t.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(e) => e.errors.into_iter().map(|d| (d.path, d.message)).collect(),
    }
}

pub(super) fn warnings(yaml: &str) -> Vec<(String, String)> {
    match run(yaml) {
        Ok((_, w)) => w.into_iter().map(|w| (w.path, w.message)).collect(),
        Err(i) => panic!("unexpected errors: {:?}", i.errors),
    }
}

pub(super) fn one_error(yaml: &str) -> (String, String) {
    let mut e = errors(yaml);
    assert_eq!(e.len(), 1, "{e:?}");
    e.remove(0)
}

pub(super) fn pair(path: &str, message: &str) -> (String, String) {
    (path.to_string(), message.to_string())
}

pub(super) fn with_backend(backend: &str) -> String {
    format!("pools:\n  m:\n    backends:\n      - {backend}\n      - {{name: z, url: 'http://10.0.0.9:80'}}\n")
}

#[test]
fn defaults_fill_every_optional_field() {
    let (c, w) = run(POOL).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.listen, DEFAULT_LISTEN);
    assert_eq!(c.admin_listen, DEFAULT_ADMIN_LISTEN);
    assert_eq!(c.threads, 2);
    assert_eq!(c.grace_period, Duration::from_secs(30));
    assert_eq!(
        c.limits,
        Limits {
            max_buffered_bytes: Some(DEFAULT_MAX_BUFFERED_BYTES),
            ..Limits::default()
        }
    );
    assert_eq!(c.limits.max_body_bytes, 32 << 20);
    assert_eq!(c.retry.max_retries, 2);
    assert_eq!(c.health, Health::default());
    assert_eq!(c.health.path, "/health");
    assert!(!c.explain_headers);
    assert_eq!(c.access_log, AccessLog::default());
    assert!(c.access_log.enabled && c.access_log.sample_rate == 1.0);
    assert_eq!(c.pools.len(), 1);
    let p = &c.pools[0];
    assert_eq!(&*p.model, "m");
    assert_eq!(p.policy, PolicySpec::PredictedTtft(Default::default()));
    let b = &p.backends[0];
    assert_eq!(
        (&*b.name, b.host.as_str(), b.port, b.tls),
        ("a", "127.0.0.1", 8001, false)
    );
    assert_eq!((b.weight, b.max_inflight), (1, None));
    assert!(b.labels.is_empty());
}

#[test]
fn every_field_set_explicitly() {
    let yaml = "
listen: 0.0.0.0:9000
admin_listen: '[::1]:9401'
threads: 8
grace_period: 1m30s
explain_headers: true
access_log: {enabled: false, sample_rate: 0.25}
limits: {max_body_bytes: 1GiB, connect_timeout: 250ms, first_token_timeout: 10s, idle_timeout: 1h}
retry: {max_retries: 0}
health: {path: /v1/models, interval: 2s, timeout: 500ms, eject_after_failures: 5, readmit_after: 1m}
reload: {watch: false, watch_interval: 250ms}
pools:
  m:
    policy: {name: round_robin}
    backends:
      - name: gpu-0.a_b
        url: https://gpu0.internal/
        weight: 3
        max_inflight: 64
        labels: {zone: a, gpu_kind: h100}
      - {name: gpu-1, url: 'http://gpu1.internal'}
";
    let (c, w) = run(yaml).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.listen, "0.0.0.0:9000".parse().unwrap());
    assert_eq!(c.admin_listen, "[::1]:9401".parse().unwrap());
    assert_eq!(c.threads, 8);
    assert_eq!(c.grace_period, Duration::from_secs(90));
    assert!(c.explain_headers);
    assert_eq!(
        c.access_log,
        AccessLog {
            enabled: false,
            sample_rate: 0.25
        }
    );
    assert_eq!(
        c.limits,
        Limits {
            max_body_bytes: 1 << 30,
            connect_timeout: Duration::from_millis(250),
            first_token_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(3600),
            // The budget grows to fit the largest body.
            max_buffered_bytes: Some(1 << 30),
            ..Limits::default()
        }
    );
    assert_eq!(c.retry.max_retries, 0);
    assert_eq!(c.health.path, "/v1/models");
    assert_eq!(c.health.eject_after_failures, 5);
    assert_eq!(c.health.readmit_after, Duration::from_secs(60));
    assert_eq!(
        c.reload,
        ReloadSettings {
            watch: false,
            watch_interval: Duration::from_millis(250)
        }
    );
    let p = &c.pools[0];
    assert_eq!(p.policy, PolicySpec::RoundRobin);
    let b = &p.backends[0];
    assert_eq!(
        (&*b.name, b.host.as_str(), b.port, b.tls),
        ("gpu-0.a_b", "gpu0.internal", 443, true)
    );
    assert_eq!((b.weight, b.max_inflight), (3, Some(64)));
    assert_eq!(b.labels.get("gpu_kind").map(String::as_str), Some("h100"));
}

#[test]
fn both_policy_forms_and_unknown_policy_lists_valid_ones() {
    for form in ["round_robin", "{name: round_robin}"] {
        let yaml = POOL.replace(
            "    backends:",
            &format!("    policy: {form}\n    backends:"),
        );
        assert_eq!(
            run(&yaml).unwrap().0.pools[0].policy,
            PolicySpec::RoundRobin
        );
    }
    let yaml = POOL.replace("    backends:", "    policy: fastest\n    backends:");
    assert_eq!(
        one_error(&yaml),
        pair(
            "pools.m.policy",
            &format!(
                "unknown policy `fastest`; valid policies: {}",
                PolicyKind::ALL.join(", ")
            )
        )
    );
}

/// `POOL` with `policy: {policy}`.
fn with_policy(policy: &str) -> String {
    POOL.replace(
        "    backends:",
        &format!("    policy: {policy}\n    backends:"),
    )
}

#[test]
fn policy_parameters_are_typed_with_defaults() {
    let spec = |p: &str| run(&with_policy(p)).unwrap().0.pools[0].policy;
    assert_eq!(spec("cache_aware"), PolicyKind::CacheAware.spec());
    assert_eq!(
        spec("{name: cache_aware, cache_threshold: 0.5, balance_abs_threshold: 8}"),
        PolicySpec::CacheAware(pronto_core::routing::CacheAwareParams {
            cache_threshold: 0.5,
            balance_abs_threshold: 8,
            balance_rel_threshold: 1.5,
        })
    );
    assert_eq!(
        spec("{name: power_of_two, seed: 42}"),
        PolicySpec::PowerOfTwo(pronto_core::routing::SeedParams { seed: 42 })
    );
    assert_eq!(
        spec("{name: consistent_hash, virtual_nodes: 40}"),
        PolicySpec::ConsistentHash(pronto_core::routing::ConsistentHashParams {
            virtual_nodes: 40
        })
    );
}

#[test]
fn policy_parameter_errors_name_the_parameter() {
    assert_eq!(
        errors(&with_policy(
            "{name: cache_aware, cache_threshold: 1.2, balance_rel_threshold: 0.9, alpha: 1}"
        )),
        [
            pair("pools.m.policy.cache_threshold", "must be in 0..=1"),
            pair(
                "pools.m.policy.balance_rel_threshold",
                "must be a finite number >= 1"
            ),
            pair(
                "pools.m.policy.alpha",
                "unknown parameter for `cache_aware`; valid parameters: cache_threshold, \
                 balance_abs_threshold, balance_rel_threshold"
            ),
        ]
    );
    assert_eq!(
        one_error(&with_policy("{name: round_robin, seed: 3}")),
        pair(
            "pools.m.policy.seed",
            "unknown parameter; `round_robin` takes none"
        )
    );
    let (path, message) = one_error(&with_policy("{name: random, seed: lots}"));
    assert_eq!(path, "pools.m.policy.seed");
    assert!(message.contains("invalid type"), "{message}");
    assert_eq!(
        one_error(&with_policy("{name: consistent_hash, virtual_nodes: 0}")).0,
        "pools.m.policy.virtual_nodes"
    );
}

#[test]
fn pools_required_and_non_empty() {
    let msg = "at least one pool is required (a map from model name to backends)";
    assert_eq!(one_error("threads: 2"), pair("pools", msg));
    assert_eq!(one_error("pools: {}"), pair("pools", msg));
    assert_eq!(
        one_error("pools:\n  m: {}\n"),
        pair(
            "pools.m.backends",
            "pool has no backends; at least one is required (or a `discover:` section)"
        )
    );
    assert_eq!(
        one_error("pools:\n  m: {backends: []}\n"),
        pair(
            "pools.m.backends",
            "pool has no backends; at least one is required (or a `discover:` section)"
        )
    );
}

#[test]
fn duplicate_pools_and_odd_model_names() {
    let yaml = "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}]}\n  m: {backends: [{name: b, url: 'http://h:2'}]}\nretry: {max_retries: 0}\n";
    assert_eq!(
        one_error(yaml),
        pair("pools.m", "pool `m` is defined more than once")
    );
    let yaml =
        "pools:\n  'meta/Llama-3.1': {policy: x, backends: [{name: a, url: 'http://h:1'}]}\n";
    assert_eq!(one_error(yaml).0, r#"pools."meta/Llama-3.1".policy"#);
}

#[test]
fn backend_names_present_well_formed_unique_across_pools() {
    let yaml = "
pools:
  m1:
    backends:
      - {url: 'http://h:1'}
      - {name: 'gpu 0', url: 'http://h:2'}
      - {name: dup, url: 'http://h:3'}
  m2:
    backends:
      - {name: dup, url: 'http://h:4'}
";
    assert_eq!(
        errors(yaml),
        vec![
            pair(
                "pools.m1.backends[0].name",
                "missing; every backend needs a unique name (it is a metric label)"
            ),
            pair(
                "pools.m1.backends[1].name",
                "`gpu 0` is not a valid name: use letters, digits, `_`, `.` and `-`"
            ),
            pair(
                "pools.m2.backends[0].name",
                "duplicate backend name `dup` (first used at pools.m1.backends[2])"
            ),
        ]
    );
}

#[test]
fn url_errors_each_say_what_is_wrong() {
    let cases = [
        ("ftp://h:1", "unsupported scheme `ftp`; use http or https"),
        (
            "localhost:8001",
            "`localhost:8001` is not a URL; write it with a scheme, e.g. `http://localhost:8001`",
        ),
        (
            "http://h:99999",
            "`http://h:99999` is not a valid URL: invalid port number",
        ),
        ("http://", "`http://` is not a valid URL: empty host"),
        (
            "http://h:1/v1",
            "must not have a path (`/v1`): Pronto forwards the client's request path as is",
        ),
        ("http://h:1/?x=1", "must not have a query or fragment"),
        ("http://h:1#frag", "must not have a query or fragment"),
        (
            "http://u:p@h:1",
            "credentials in backend URLs are not supported",
        ),
    ];
    // Read by serde (`value::BackendUrl`): shape errors, located at the field.
    for (url, message) in cases {
        let yaml = with_backend(&format!("{{name: a, url: '{url}'}}"));
        assert_eq!(
            load_errors(&yaml),
            [pair("pools.m.backends[0].url", message)],
            "{url}"
        );
    }
    let yaml = with_backend("{name: a}");
    assert_eq!(
        one_error(&yaml),
        pair(
            "pools.m.backends[0].url",
            "missing; e.g. `http://10.0.0.1:8000`"
        )
    );
}

#[test]
fn urls_parse_host_port_and_tls() {
    let cases = [
        ("http://10.0.0.1:8000", "10.0.0.1", 8000, false),
        ("http://example.com", "example.com", 80, false),
        ("https://example.com/", "example.com", 443, true),
        ("http://[::1]:8001", "[::1]", 8001, false),
        ("HTTP://Example.COM:81", "example.com", 81, false),
    ];
    for (url, host, port, tls) in cases {
        let parsed = crate::config::value::BackendUrl::parse(url);
        assert_eq!(
            parsed.map(|u| (u.host, u.port, u.tls)),
            Ok((host.to_string(), port, tls)),
            "{url}"
        );
    }
}

#[test]
fn weight_and_max_inflight_at_least_one() {
    let yaml = with_backend("{name: a, url: 'http://h:1', weight: 0, max_inflight: 0}");
    assert_eq!(
        errors(&yaml),
        vec![
            pair("pools.m.backends[0].weight", "must be at least 1, got 0"),
            pair(
                "pools.m.backends[0].max_inflight",
                "must be at least 1, got 0"
            ),
        ]
    );
    let yaml = with_backend("{name: a, url: 'http://h:1', weight: 4294967296}");
    assert_eq!(
        one_error(&yaml),
        pair(
            "pools.m.backends[0].weight",
            "4294967296 is too large (at most 4294967295)"
        )
    );
}

#[test]
fn label_names_are_prometheus_identifiers() {
    let yaml = with_backend("{name: a, url: 'http://h:1', labels: {ok_1: x, 1bad: y, 'a.b': z}}");
    assert_eq!(
        errors(&yaml),
        vec![
            pair(
                "pools.m.backends[0].labels.1bad",
                "`1bad` is not a valid label name: start with a letter or `_`, then letters, digits or `_`"
            ),
            pair(
                r#"pools.m.backends[0].labels."a.b""#,
                "`a.b` is not a valid label name: start with a letter or `_`, then letters, digits or `_`"
            ),
        ]
    );
}

#[test]
fn durations_must_parse_and_be_positive() {
    let yaml = format!(
        "grace_period: 0s\nlimits: {{connect_timeout: 5, idle_timeout: soon, first_token_timeout: 1.5}}\nhealth: {{readmit_after: 10 parsecs}}\n{POOL}"
    );
    // In file order: the checker's error on line 1 before serde's on lines 2 and 3.
    assert_eq!(
        load_errors(&yaml),
        vec![
            pair("grace_period", "must be greater than zero"),
            pair(
                "limits.connect_timeout",
                "`5` has no unit; write `5s` or `5ms`"
            ),
            pair(
                "limits.idle_timeout",
                "`soon` is not a duration (e.g. `250ms`, `2s`, `1h30m`)"
            ),
            pair(
                "limits.first_token_timeout",
                "`1.5` has no unit; write `1.5s` or `1.5ms`"
            ),
            pair(
                "health.readmit_after",
                "unknown duration unit `parsecs` in `10 parsecs`; use ns, us, ms, s, m, h or d"
            ),
        ]
    );
}

#[test]
fn body_limit_between_1kib_and_1gib() {
    for (value, expected) in [("1024", 1024), ("512KiB", 512 << 10), ("1GiB", 1 << 30)] {
        let yaml = format!("limits: {{max_body_bytes: {value}}}\n{POOL}");
        assert_eq!(run(&yaml).unwrap().0.limits.max_body_bytes, expected);
    }
    for (value, message) in [
        ("1023", "must be between 1KiB and 1GiB, got 1023B"),
        ("2GiB", "must be between 1KiB and 1GiB, got 2GiB"),
        ("-5", "`-5` is not a size (e.g. `32MiB`)"),
        (
            "32zb",
            "unknown size unit `zb` in `32zb`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB",
        ),
    ] {
        let yaml = format!("limits: {{max_body_bytes: {value}}}\n{POOL}");
        assert_eq!(
            load_errors(&yaml),
            [pair("limits.max_body_bytes", message)],
            "{value}"
        );
    }
}

#[test]
fn threads_between_1_and_256() {
    for n in [0, 257] {
        assert_eq!(
            one_error(&format!("threads: {n}\n{POOL}")),
            pair("threads", &format!("must be between 1 and 256, got {n}"))
        );
    }
    assert_eq!(
        run(&format!("threads: 256\n{POOL}")).unwrap().0.threads,
        256
    );
}

#[test]
fn access_log_sample_rate_is_a_share() {
    for bad in ["-0.1", "1.5", ".nan"] {
        let (path, message) = one_error(&format!("access_log: {{sample_rate: {bad}}}\n{POOL}"));
        assert_eq!(path, "access_log.sample_rate");
        assert!(message.starts_with("must be between 0 and 1"), "{message}");
    }
    for (ok, rate) in [("0", 0.0), ("1", 1.0), ("0.5", 0.5)] {
        let c = run(&format!("access_log: {{sample_rate: {ok}}}\n{POOL}"))
            .unwrap()
            .0;
        assert_eq!(c.access_log.sample_rate, rate);
    }
    assert!(file::parse(&format!("access_log: {{rate: 1}}\n{POOL}")).is_err());
}

#[test]
fn listeners_parse_and_must_not_collide() {
    assert_eq!(
        load_errors(&format!("listen: localhost:8080\n{POOL}")),
        [pair(
            "listen",
            "`localhost:8080` is not an IP:port address (e.g. 127.0.0.1:8080)"
        )]
    );
    let msg = "must differ from listen (127.0.0.1:8080): both would bind the same port";
    assert_eq!(
        one_error(&format!("admin_listen: 127.0.0.1:8080\n{POOL}")),
        pair("admin_listen", msg)
    );
    // A wildcard listener takes the port on every address, loopback included.
    let e = one_error(&format!(
        "listen: 0.0.0.0:9400\nadmin_listen: 127.0.0.1:9400\n{POOL}"
    ));
    assert_eq!(e.0, "admin_listen");
    // Port 0 asks the OS for a fresh port each time: no collision.
    assert!(run(&format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n{POOL}"
    ))
    .is_ok());
}

#[test]
fn health_path_and_eject_threshold() {
    assert_eq!(
        errors(&format!(
            "health: {{path: health, eject_after_failures: 0}}\n{POOL}"
        )),
        vec![
            pair(
                "health.path",
                "`health` is not an absolute HTTP path (e.g. `/health`)"
            ),
            pair("health.eject_after_failures", "must be at least 1, got 0"),
        ]
    );
}

#[test]
fn all_errors_collected_in_one_pass() {
    let yaml = "
listen: nowhere
threads: 0
limits: {max_body_bytes: 10, connect_timeout: 0ms}
health: {path: x}
pools:
  m:
    policy: best
    backends:
      - {name: a, url: 'ftp://h', weight: 0}
      - {url: 'http://h:2/x'}
  empty: {}
";
    let paths: Vec<String> = errors(yaml).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        [
            "listen",
            "threads",
            "limits.max_body_bytes",
            "limits.connect_timeout",
            "health.path",
            "pools.m.policy",
            "pools.m.backends[0].url",
            "pools.m.backends[0].weight",
            "pools.m.backends[1].name",
            "pools.m.backends[1].url",
            "pools.empty.backends",
        ]
    );
}

#[test]
fn warnings_for_suspicious_but_valid_settings() {
    let yaml = "
limits: {connect_timeout: 5s, first_token_timeout: 2s}
health: {interval: 1s, timeout: 1s}
pools:
  solo:
    backends: [{name: a, url: 'http://h:1'}]
  twice:
    backends:
      - {name: b, url: 'http://h:2'}
      - {name: c, url: 'http://h:2/'}
";
    assert_eq!(
        warnings(yaml),
        vec![
            pair(
                "limits.first_token_timeout",
                "2s is shorter than limits.connect_timeout (5s): a slow connect alone can exhaust it"
            ),
            pair(
                "health.timeout",
                "1s is not shorter than health.interval (1s): probes can overlap"
            ),
            pair(
                "pools.solo.backends",
                "only one backend, so retry.max_retries = 2 has no other backend to try"
            ),
            pair(
                "pools.twice.backends[1].url",
                "same server as pools.twice.backends[0]: it will get a double share"
            ),
        ]
    );
    // No retries, no warning about them.
    let yaml =
        "retry: {max_retries: 0}\npools:\n  solo: {backends: [{name: a, url: 'http://h:1'}]}\n";
    assert!(warnings(yaml).is_empty());
    // A retry budget beyond the pool, a policy for a single backend, a slow readmission probe.
    let yaml = "
retry: {max_retries: 4}
health: {interval: 20s, timeout: 1s, readmit_after: 10s}
pools:
  three:
    backends: [{name: a, url: 'http://h:1'}, {name: b, url: 'http://h:2'}, {name: c, url: 'http://h:3'}]
  one:
    policy: cache_aware
    backends: [{name: d, url: 'http://h:4'}]
";
    assert_eq!(
        warnings(yaml),
        vec![
            pair(
                "health.interval",
                "20s is longer than health.readmit_after (10s): an ejected backend is readmitted \
                 on the strength of a probe up to 20s old"
            ),
            pair(
                "pools.three.backends",
                "retry.max_retries = 4 exceeds the pool's 3 backends: each retry goes to a \
                 backend not yet tried, so at most 2 can happen"
            ),
            pair(
                "pools.one.backends",
                "only one backend, so retry.max_retries = 4 has no other backend to try"
            ),
            pair(
                "pools.one.policy",
                "policy `cache_aware` balances between backends, but the pool has only one"
            ),
        ]
    );
    // The default retry budget (2) in a two-backend pool is fine.
    let yaml =
        "pools:\n  two: {backends: [{name: a, url: 'http://h:1'}, {name: b, url: 'http://h:2'}]}\n";
    assert!(warnings(yaml).is_empty());
}

#[test]
fn key_path_quotes_only_when_needed() {
    assert_eq!(key_path("", "pools"), "pools");
    assert_eq!(key_path("pools", "llama-3-8b"), "pools.llama-3-8b");
    assert_eq!(key_path("pools", "a.b"), r#"pools."a.b""#);
    assert_eq!(key_path("pools", ""), r#"pools."""#);
    assert_eq!(key_path("pools", "q\"x"), r#"pools."q\"x""#);
}
