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
    crate::config::Loaded::from_yaml_str_with_env(&yaml, "t.yaml", pod_env)
        .map(|l| l.config.cluster)
        .map_err(|e| e.errors.into_iter().map(|d| (d.path, d.message)).collect())
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

// === cluster.auth and cluster.tls ===

use crate::config::nats::NatsAuth;

/// A temporary directory, removed on drop.
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("pronto-nats-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    /// Write `text` to `name`; its absolute path.
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

fn secrets_env(name: &str) -> Option<String> {
    match name {
        "NATS_TOKEN" => Some("a-token-of-our-own\n".into()),
        "NATS_PASSWORD" => Some("a-password".into()),
        _ => pod_env(name),
    }
}

fn load_with(section: &str) -> Result<Cluster, Vec<(String, String)>> {
    let yaml = format!("cluster:\n  nats: 'nats://x:1'\n  replica: r\n{section}{POOL}");
    validate_with_env(&file::parse(&yaml).expect("test YAML parses"), secrets_env)
        .map(|(c, _, _)| c.cluster.expect("cluster"))
        .map_err(|i| i.errors.into_iter().map(|e| (e.path, e.message)).collect())
}

fn creds_text(seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln\n\
         ------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{seed}\n\
         ------END USER NKEY SEED------\n"
    )
}

#[test]
fn credentials_come_from_the_environment_or_a_file_one_kind_at_a_time() {
    let d = Dir::new("auth-ok");
    let c = load_with("  auth: {token: {env: NATS_TOKEN}}\n").unwrap();
    match c.auth {
        Some(NatsAuth::Token(t)) => assert_eq!(t.value(), "a-token-of-our-own", "trimmed"),
        other => panic!("{other:?}"),
    }
    let pw = d.file("pw", "s3cret\n");
    let c = load_with(&format!(
        "  auth: {{user: pronto, password: {{file: '{pw}'}}}}\n"
    ))
    .unwrap();
    match &c.auth {
        Some(NatsAuth::UserPassword { user, password }) => {
            assert_eq!((user.value(), password.value()), ("pronto", "s3cret"));
        }
        other => panic!("{other:?}"),
    }
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("s3cret"),
        "a secret is never printed: {shown}"
    );
    let user = nkeys::KeyPair::new_user();
    let seed = d.file("seed", &user.seed().unwrap());
    let c = load_with(&format!("  auth: {{nkey: {{file: '{seed}'}}}}\n")).unwrap();
    assert!(matches!(c.auth, Some(NatsAuth::NKey(_))), "{c:?}");
    let creds = d.file("creds", &creds_text(&user.seed().unwrap()));
    let c = load_with(&format!("  auth: {{creds: {{file: '{creds}'}}}}\n")).unwrap();
    assert!(matches!(c.auth, Some(NatsAuth::Creds(_))), "{c:?}");
    assert_eq!(
        load_with("").unwrap().auth,
        None,
        "no credentials: none sent"
    );
}

#[test]
fn each_broken_credential_is_an_error_at_its_path() {
    let d = Dir::new("auth-bad");
    let account_seed = d.file("account", &nkeys::KeyPair::new_account().seed().unwrap());
    let junk = d.file("junk", "not a seed");
    let empty = d.file("empty", "\n");
    let user_seed = nkeys::KeyPair::new_user().seed().unwrap();
    let cases = [
        (
            "auth: {token: s3cret}".to_string(),
            "cluster.auth.token",
            "not the secret itself",
        ),
        (
            "auth: {token: {env: NATS_TOKEN}, nkey: {file: x}}".into(),
            "cluster.auth",
            "found `token` and `nkey`",
        ),
        ("auth: {}".into(), "cluster.auth", "found none"),
        (
            "auth: {user: pronto}".into(),
            "cluster.auth.password",
            "go together",
        ),
        (
            "auth: {user: pronto, password: {env: UNSET}}".into(),
            "cluster.auth.password.env",
            "not set",
        ),
        (
            format!("auth: {{token: {{file: '{empty}'}}}}"),
            "cluster.auth.token.file",
            "is empty",
        ),
        (
            "auth: {token: {file: /nonexistent/token}}".into(),
            "cluster.auth.token.file",
            "cannot read",
        ),
        (
            format!("auth: {{nkey: {{file: '{account_seed}'}}}}"),
            "cluster.auth.nkey.file",
            "not of a user",
        ),
        (
            format!("auth: {{nkey: {{file: '{junk}'}}}}"),
            "cluster.auth.nkey.file",
            "not an NKey user seed",
        ),
        (
            format!("auth: {{creds: {{file: '{junk}'}}}}"),
            "cluster.auth.creds.file",
            "not a NATS credentials file",
        ),
        (
            format!("auth: {{nkey: '{user_seed}'}}"),
            "cluster.auth.nkey",
            "not the secret itself",
        ),
    ];
    for (section, path, message) in cases {
        let errors = load_with(&format!("  {section}\n")).unwrap_err();
        assert!(
            errors.iter().any(|(p, m)| p == path && m.contains(message)),
            "{section}: {errors:?}"
        );
        assert!(
            errors
                .iter()
                .all(|(_, m)| !m.contains(&user_seed) && !m.contains("s3cret")),
            "no secret in an error: {errors:?}"
        );
    }
    let errors = load("cluster: {nats: 'nats://pronto:s3cret@x:1', replica: r}\n").unwrap_err();
    assert!(
        errors.iter().any(|(p, m)| p == "cluster.nats"
            && m.contains("cluster.auth")
            && !m.contains("s3cret")),
        "{errors:?}"
    );
}

#[test]
fn tls_files_are_read_and_checked_at_load() {
    let d = Dir::new("tls");
    let ca = rcgen::generate_simple_self_signed(vec!["nats.test".to_string()]).unwrap();
    let client = rcgen::generate_simple_self_signed(vec!["pronto".to_string()]).unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let ca_pem = d.file("ca.pem", &ca.cert.pem());
    let cert = d.file("client.pem", &client.cert.pem());
    let key = d.file("client.key", &client.key_pair.serialize_pem());
    let other_key = d.file("other.key", &other.serialize_pem());
    let c = load_with(&format!(
        "  tls: {{ca: '{ca_pem}', cert: '{cert}', key: '{key}', server_name: nats.test}}\n"
    ))
    .unwrap();
    let tls = c.tls.clone().expect("tls");
    assert_eq!(tls.roots.len(), 1);
    assert!(tls.identity.is_some());
    assert_eq!(tls.server_name.as_deref(), Some("nats.test"));
    assert!(c.requires_tls());
    assert!(!format!("{tls:?}").contains("PRIVATE"), "{tls:?}");
    assert!(!load_with("").unwrap().requires_tls());
    let c = load("cluster: {nats: 'tls://x:1', replica: r}\n")
        .unwrap()
        .unwrap();
    assert!(c.requires_tls(), "a tls:// URL requires TLS");
    assert!(load_with("  tls: {}\n").unwrap().requires_tls());
    let cases = [
        (
            "tls: {ca: /nonexistent/ca.pem}".to_string(),
            "cluster.tls.ca",
            "cannot read",
        ),
        (
            format!("tls: {{ca: '{key}'}}"),
            "cluster.tls.ca",
            "no PEM certificate",
        ),
        (
            format!("tls: {{cert: '{cert}'}}"),
            "cluster.tls.key",
            "needs both",
        ),
        (
            format!("tls: {{cert: '{cert}', key: '{other_key}'}}"),
            "cluster.tls.key",
            "does not fit",
        ),
        (
            "tls: {server_name: 'not a name!'}".into(),
            "cluster.tls.server_name",
            "not a DNS name",
        ),
        (
            "tls: {ca: x, verify: false}".into(),
            "cluster.tls.verify",
            "unknown field",
        ),
    ];
    for (section, path, message) in cases {
        let yaml = format!("cluster:\n  nats: 'nats://x:1'\n  replica: r\n  {section}\n{POOL}");
        let errors: Vec<(String, String)> =
            crate::config::Loaded::from_yaml_str_with_env(&yaml, "t.yaml", secrets_env)
                .map(|_| Vec::new())
                .unwrap_or_else(|e| e.errors.into_iter().map(|d| (d.path, d.message)).collect());
        assert!(
            errors.iter().any(|(p, m)| p == path && m.contains(message)),
            "{section}: {errors:?}"
        );
    }
}
