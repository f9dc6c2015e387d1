//! `admin:`: the token's sources, the loopback rule, `allowed_hosts`.

use std::path::Path;

use super::edge::{admin_exposure_error, sha256};
use super::Config;

const POOL: &str =
    "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}, {name: b, url: 'http://h:2'}]}\n";

fn env(name: &str) -> Option<String> {
    match name {
        "PRONTO_TEST_TOKEN" => Some(" token-from-env\n".into()),
        "PRONTO_TEST_SHORT" => Some("short".into()),
        "PRONTO_TEST_EMPTY" => Some("  ".into()),
        _ => None,
    }
}

fn load(yaml: &str) -> Result<Config, String> {
    super::Loaded::from_yaml_str_with_env(&format!("{yaml}{POOL}"), "t", env)
        .map(|l| l.config)
        .map_err(|e| e.to_string())
}

#[test]
fn a_non_loopback_admin_listener_needs_a_token() {
    let e = load("admin_listen: 0.0.0.0:9400\n").unwrap_err();
    assert!(
        e.starts_with("t:1:15: admin_listen: 0.0.0.0:9400 is not a loopback address, and `admin.token` is not set"),
        "{e}"
    );
    let c = load("admin_listen: 0.0.0.0:9400\nadmin: {token: a-token-of-my-own}\n").unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.admin.token_digest, Some(sha256(b"a-token-of-my-own")));
    assert!(load("admin_listen: '[::1]:9400'\n").is_ok());
    // The same rule for an address given on the command line.
    let c = load("").unwrap();
    assert!(admin_exposure_error(c.admin_listen, &c.admin).is_none());
    let public = "10.0.0.5:9400".parse().unwrap();
    assert!(admin_exposure_error(public, &c.admin)
        .unwrap()
        .contains("10.0.0.5:9400 is not a loopback address"));
    // A token that fails to load is the one error.
    let e =
        load("admin_listen: 0.0.0.0:9400\nadmin: {token: {env: PRONTO_TEST_UNSET}}\n").unwrap_err();
    assert_eq!(
        e,
        "t:2:22: admin.token.env: the environment variable `PRONTO_TEST_UNSET` is not set (or empty)"
    );
}

#[test]
fn the_token_from_the_environment() {
    let c = load("admin: {token: {env: PRONTO_TEST_TOKEN}}\n").unwrap();
    assert_eq!(c.admin.token_digest, Some(sha256(b"token-from-env")));
    for (var, message) in [
        (
            "PRONTO_TEST_UNSET",
            "admin.token.env: the environment variable `PRONTO_TEST_UNSET` is not set (or empty)",
        ),
        (
            "PRONTO_TEST_EMPTY",
            "admin.token.env: the environment variable `PRONTO_TEST_EMPTY` is not set (or empty)",
        ),
        (
            "PRONTO_TEST_SHORT",
            "admin.token.env: too short: use at least 8 characters",
        ),
        (
            "'1BAD-NAME'",
            "admin.token.env: `1BAD-NAME` is not an environment variable name",
        ),
    ] {
        let e = load(&format!("admin: {{token: {{env: {var}}}}}\n")).unwrap_err();
        assert!(e.contains(message), "{var}: {e}");
    }
}

#[test]
fn the_token_from_a_file_relative_to_the_config() {
    let dir = std::env::temp_dir().join(format!("pronto-admin-token-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("secrets")).unwrap();
    std::fs::write(dir.join("secrets/admin"), "token-from-file\n").unwrap();
    let text = format!("admin: {{token: {{file: secrets/admin}}}}\n{POOL}");
    let c = Config::from_file_text(&dir.join("pronto.yaml"), &text).unwrap();
    assert_eq!(c.admin.token_digest, Some(sha256(b"token-from-file")));
    let e = Config::from_file_text(&dir.join("elsewhere/pronto.yaml"), &text).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("admin.token.file: cannot read `"), "{e}");
    assert!(
        e.contains(&Path::new("elsewhere/secrets/admin").display().to_string()),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_token_forms_are_checked_when_parsed() {
    for (yaml, message) in [
        (
            "admin: {token: {env: A, file: b}}\n",
            "give exactly one of `env` (a variable name) or `file` (a path)",
        ),
        ("admin: {token: {}}\n", "give exactly one of `env`"),
        ("admin: {token: {envv: A}}\n", "unknown field `envv`"),
        (
            "admin: {token: [a]}\n",
            "expected a string, `{env: NAME}` or `{file: PATH}`",
        ),
        ("admin: {token: short}\n", "admin.token: too short"),
    ] {
        let e = load(yaml).unwrap_err();
        assert!(e.contains(message), "{yaml}: {e}");
    }
}

#[test]
fn allowed_hosts_are_host_names() {
    let c = load("admin: {allowed_hosts: [Pronto-Admin.Internal., admin.svc]}\n").unwrap();
    assert_eq!(
        c.admin.allowed_hosts,
        ["pronto-admin.internal", "admin.svc"]
    );
    let e =
        load("admin: {allowed_hosts: [ok.example, 'bad.example:9400', 'http://x']}\n").unwrap_err();
    assert!(
        e.contains("admin.allowed_hosts[1]: `bad.example:9400` is not a host name"),
        "{e}"
    );
    assert!(e.contains("admin.allowed_hosts[2]"), "{e}");
    assert!(!e.contains("allowed_hosts[0]"), "{e}");
}
