//! `cluster:` validation: defaults, the replica name from the environment, and an error with
//! its field path for each broken setting.

use std::time::Duration;

use super::*;
use crate::config::file;
use crate::config::validate::validate_with_env;

const POOL: &str = "
pools:
  m:
    backends:
      - {name: a, url: 'http://127.0.0.1:8001'}
";

fn pod_env(name: &str) -> Option<String> {
    (name == "POD_NAME").then(|| "pronto-7d9f-x2k".to_string())
}

fn load(section: &str) -> Result<Option<Cluster>, Vec<(String, String)>> {
    let yaml = format!("{section}{POOL}");
    validate_with_env(&file::parse(&yaml).expect("test YAML parses"), pod_env)
        .map(|(c, _, _)| c.cluster)
        .map_err(|i| i.errors.into_iter().map(|e| (e.path, e.message)).collect())
}

#[test]
fn absent_means_one_replica_and_defaults_fill_the_rest() {
    assert_eq!(load(""), Ok(None));
    let c = load("cluster: {nats: 'nats://nats:4222', replica: {env: POD_NAME}}\n")
        .unwrap()
        .unwrap();
    assert_eq!(c.replica, "pronto-7d9f-x2k");
    assert_eq!(
        (c.subject.as_str(), c.heartbeat),
        (DEFAULT_SUBJECT, DEFAULT_HEARTBEAT)
    );
    assert_eq!(c.peer_timeout, Duration::from_secs(3));
    assert_eq!(
        c.collision_repair,
        Some(DEFAULT_MARGIN),
        "repair is on by default"
    );
    assert_eq!(c.own_subject(), "pronto.cluster.pronto-7d9f-x2k");
    assert_eq!(c.all_subjects(), "pronto.cluster.*");
    let c = load(
        "cluster: {nats: 'nats://a:4222, nats://b:4222', replica: r1, subject: edge.sync, \
         heartbeat: 250ms}\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        c.peer_timeout,
        Duration::from_millis(750),
        "three heartbeats"
    );
}

#[test]
fn collision_repair_is_a_margin_or_off() {
    let margin = |v: &str| {
        load(&format!(
            "cluster: {{nats: 'nats://x:1', replica: r, collision_repair: {v}}}\n"
        ))
        .map(|c| c.unwrap().collision_repair)
    };
    assert_eq!(margin("0.5"), Ok(Some(0.5)));
    assert_eq!(margin("0"), Ok(Some(0.0)));
    assert_eq!(margin("true"), Ok(Some(DEFAULT_MARGIN)));
    assert_eq!(margin("off"), Ok(None));
    assert_eq!(margin("false"), Ok(None));
    for bad in ["-0.1", "11", "sometimes", ".nan"] {
        let errors = margin(bad).unwrap_err();
        assert!(
            errors
                .iter()
                .any(|(p, m)| p == "cluster.collision_repair" && m.contains("not a margin")),
            "{bad}: {errors:?}"
        );
    }
}

#[test]
fn each_broken_setting_is_an_error_at_its_path() {
    let cases = [
        ("cluster: {replica: r}", "cluster.nats", "missing"),
        (
            "cluster: {nats: 'http://x:1', replica: r}",
            "cluster.nats",
            "scheme must be `nats`",
        ),
        (
            "cluster: {nats: 'nats://x:1/p', replica: r}",
            "cluster.nats",
            "only `nats://host:port`",
        ),
        (
            "cluster: {nats: 'nats://x:1'}",
            "cluster.replica",
            "missing",
        ),
        (
            "cluster: {nats: 'nats://x:1', replica: 'a.b'}",
            "cluster.replica",
            "not a replica name",
        ),
        (
            "cluster: {nats: 'nats://x:1', replica: {env: NOPE}}",
            "cluster.replica.env",
            "not set",
        ),
        (
            "cluster: {nats: 'nats://x:1', replica: r, subject: 'a.*'}",
            "cluster.subject",
            "no wildcards",
        ),
        (
            "cluster: {nats: 'nats://x:1', replica: r, heartbeat: 0s}",
            "cluster.heartbeat",
            "greater than zero",
        ),
        (
            "cluster: {nats: 'nats://x:1', replica: r, heartbeat: 2s, peer_timeout: 1s}",
            "cluster.peer_timeout",
            "longer than `heartbeat`",
        ),
    ];
    for (section, path, message) in cases {
        let errors = load(&format!("{section}\n")).unwrap_err();
        assert!(
            errors.iter().any(|(p, m)| p == path && m.contains(message)),
            "{section}: {errors:?}"
        );
    }
    let e = file::parse(&format!(
        "cluster: {{nats: 'nats://x:1', replica: r, tick: 1s}}\n{POOL}"
    ));
    assert!(e.is_err(), "unknown fields are refused");
}
