//! The admin listener's safety rules, end to end on the real binary: a non-loopback listener
//! needs a token (config, `--admin-listen` override, reload), the token from the environment,
//! published example secrets refused, `Host` / `Origin` checks on `POST /admin/*`, and the
//! series the gateway exports from start-up.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway::TempDir;
use common::{config_yaml, metric_value, Gateway};

const TOKEN: &str = "admin-token-for-tests";
const POOLS: &str = "  m:\n    backends:\n      - {name: m-b0, url: 'http://127.0.0.1:9'}\n      - {name: m-b1, url: 'http://127.0.0.1:9'}\n";

/// One raw HTTP/1.1 request (`headers` as written, so tests control `Host` and `Origin`):
/// the status and body.
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {out:?}"));
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

#[test]
fn post_admin_routes_check_host_and_origin() {
    let gw = Gateway::start(&config_yaml(
        POOLS,
        &format!("admin: {{token: {TOKEN}, allowed_hosts: [pronto-admin.test]}}\n"),
    ));
    let a = gw.admin;
    let own_host = a.to_string();
    let auth = bearer();
    let reload = |headers: &[(&str, &str)]| raw(a, "POST", "/admin/reload", headers, "");

    // Scripts (no Origin) naming the listener by address, localhost or a configured name.
    for host in [
        own_host.as_str(),
        "localhost:1234",
        "pronto-admin.test",
        "[::1]:9400",
    ] {
        let (status, body) = reload(&[("host", host), ("authorization", &auth)]);
        assert_eq!(status, 200, "{host}: {body}");
        assert!(body.contains("\"error\":null"), "{body}");
    }
    // A same-origin browser request.
    let origin = format!("http://{own_host}");
    let (status, _) = reload(&[
        ("host", &own_host),
        ("origin", &origin),
        ("authorization", &auth),
    ]);
    assert_eq!(status, 200);

    // DNS rebinding: the attacker's name in Host. Cross-site: a foreign Origin.
    for (headers, why) in [
        (vec![("host", "evil.example:9400")], "DNS rebinding"),
        (
            vec![
                ("host", own_host.as_str()),
                ("origin", "http://evil.example"),
            ],
            "cross-site",
        ),
        (
            vec![("host", own_host.as_str()), ("origin", "null")],
            "cross-site",
        ),
    ] {
        let mut h = headers.clone();
        h.push(("authorization", &auth));
        let (status, body) = reload(&h);
        assert_eq!(status, 403, "{headers:?}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON error");
        assert!(v["error"].as_str().unwrap().contains(why), "{body}");
        let (status, _) = raw(
            a,
            "POST",
            "/admin/tokenize",
            &h,
            r#"{"model":"m","messages":[]}"#,
        );
        assert_eq!(status, 403, "tokenize {headers:?}");
    }
    // The token is still required with a good Host; GETs are not Host-checked.
    let (status, _) = reload(&[("host", &own_host)]);
    assert_eq!(status, 401);
    let (status, body) = raw(
        a,
        "GET",
        "/metrics",
        &[("host", "evil.example"), ("authorization", &auth)],
        "",
    );
    assert_eq!(status, 200);
    // Series that exist from start-up, before any event.
    for series in [
        "pronto_backend_ejections_total{backend=\"m-b0\"}",
        "pronto_retries_total{pool=\"m\",reason=\"connect\"}",
        "pronto_config_reloads_total{result=\"error\"}",
        "pronto_pool_backends{pool=\"m\"}",
    ] {
        assert!(metric_value(&body, series).is_some(), "{series} missing");
    }
    assert_eq!(
        metric_value(&body, "pronto_pool_backends{pool=\"m\"}"),
        Some(2.0)
    );
    assert!(metric_value(&body, "process_resident_memory_bytes").unwrap() > 0.0);
}

/// `pronto serve` with `args` and `env`, expected to exit at once: its status and stderr.
fn serve_fails(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pronto"));
    cmd.arg("serve").args(args).env_remove("PRONTO_ADMIN_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.success(), err);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("pronto serve {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_public_admin_listener_without_a_token_does_not_start() {
    let dir = TempDir::new("admin-public");
    let write = |name: &str, text: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let base = format!("listen: 127.0.0.1:0\npools:\n{POOLS}");
    let public = write("public.yaml", &format!("admin_listen: 0.0.0.0:0\n{base}"));
    let (ok, err) = serve_fails(&["--config", &public], &[]);
    assert!(!ok);
    assert!(
        err.contains("public.yaml:1:15: admin_listen: 0.0.0.0:0 is not a loopback address, and `admin.token` is not set"),
        "{err}"
    );
    // The same check after the command-line override, with a file or with --backend.
    let local = write("local.yaml", &format!("admin_listen: 127.0.0.1:0\n{base}"));
    let (ok, err) = serve_fails(&["--config", &local, "--admin-listen", "0.0.0.0:0"], &[]);
    assert!(!ok);
    assert!(
        err.contains("--admin-listen 0.0.0.0:0: admin_listen: 0.0.0.0:0 is not a loopback address"),
        "{err}"
    );
    let (ok, err) = serve_fails(
        &[
            "--backend",
            "http://127.0.0.1:9",
            "--admin-listen",
            "[::]:0",
        ],
        &[],
    );
    assert!(!ok && err.contains("is not a loopback address"), "{err}");
    // A token named by an unset variable.
    let env_file = write(
        "env.yaml",
        &format!("admin_listen: 0.0.0.0:0\nadmin: {{token: {{env: PRONTO_E2E_TOKEN}}}}\n{base}"),
    );
    let (ok, err) = serve_fails(&["--config", &env_file], &[]);
    assert!(
        !ok && err
            .contains("admin.token.env: the environment variable `PRONTO_E2E_TOKEN` is not set"),
        "{err}"
    );
    // The repository's example admin token.
    let example = write(
        "example.yaml",
        &format!("admin: {{token: example-admin-token-change-me}}\n{base}"),
    );
    let (ok, err) = serve_fails(&["--config", &example], &[]);
    assert!(!ok);
    assert!(err.contains("admin.token: this is the example admin token published in Pronto's repository (config/pronto.yaml:"), "{err}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_public_admin_listener_keeps_its_token_across_reloads() {
    let dir = TempDir::new("admin-reload");
    let path = dir.0.join("pronto.yaml");
    let listen = free_port();
    let admin_port = free_port();
    let with_token = format!(
        "listen: 127.0.0.1:{listen}\nadmin_listen: 127.0.0.1:{admin_port}\nadmin: {{token: {{env: PRONTO_E2E_TOKEN}}}}\nreload: {{watch: false}}\npools:\n{POOLS}"
    );
    std::fs::write(&path, &with_token).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pronto"))
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--admin-listen", &format!("0.0.0.0:{admin_port}")])
        .env("PRONTO_E2E_TOKEN", TOKEN)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let start = Instant::now();
    while TcpStream::connect(admin).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "the gateway exited");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the admin listener did not open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let host = admin.to_string();
    let auth = bearer();
    let (status, _) = raw(admin, "GET", "/metrics", &[("host", &host)], "");
    assert_eq!(status, 401);
    let (status, _) = raw(
        admin,
        "GET",
        "/metrics",
        &[("host", &host), ("authorization", &auth)],
        "",
    );
    assert_eq!(status, 200);
    // The file drops the token: the reload is refused, the token still guards the listener.
    std::fs::write(
        &path,
        with_token.replace("admin: {token: {env: PRONTO_E2E_TOKEN}}\n", ""),
    )
    .unwrap();
    let (status, body) = raw(
        admin,
        "POST",
        "/admin/reload",
        &[("host", &host), ("authorization", &auth)],
        "",
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains(&format!(
            "admin_listen: 0.0.0.0:{admin_port} is not a loopback address"
        )),
        "{body}"
    );
    let (status, _) = raw(admin, "GET", "/admin/backends", &[("host", &host)], "");
    assert_eq!(status, 401);
    let (status, body) = raw(
        admin,
        "GET",
        "/metrics",
        &[("host", &host), ("authorization", &auth)],
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(
        metric_value(&body, "pronto_config_last_reload_successful"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&body, "pronto_config_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn version_and_build_info_name_the_revision() {
    let out = Command::new(env!("CARGO_BIN_EXE_pronto"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let revision = std::env::var("PRONTO_GIT_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .unwrap_or(expected);
    assert_eq!(
        text.trim(),
        format!("pronto {} (revision {revision})", env!("CARGO_PKG_VERSION"))
    );
    let gw = Gateway::start(&config_yaml(POOLS, ""));
    let (_, body) = raw(gw.admin, "GET", "/metrics", &[("host", "127.0.0.1")], "");
    let line = format!(
        "pronto_build_info{{revision=\"{revision}\",version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(metric_value(&body, &line), Some(1.0), "{body}");
}

#[test]
fn route_slo_gauges_follow_the_config() {
    let routes = "routes:\n  - {name: chat, pool: m, ttft_slo: 750ms, match: {path: /v1/chat/*}}\n  - {name: rest, pool: m}\nreload: {watch: false}\n";
    let gw = Gateway::start(&config_yaml(POOLS, routes));
    let metrics = || raw(gw.admin, "GET", "/metrics", &[("host", "127.0.0.1")], "").1;
    let slo = "pronto_route_ttft_slo_seconds{pool=\"m\",route=\"chat\"}";
    let m = metrics();
    assert_eq!(metric_value(&m, slo), Some(0.75));
    assert_eq!(
        metric_value(
            &m,
            "pronto_admission_sheds_total{reason=\"deadline\",route=\"chat\"}"
        ),
        Some(0.0)
    );
    assert!(!m.contains("route=\"rest\"}"), "no SLO, no series");
    gw.write_config(&config_yaml(POOLS, &routes.replace("750ms", "2s")));
    let (status, body) = raw(
        gw.admin,
        "POST",
        "/admin/reload",
        &[("host", "localhost")],
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(metric_value(&metrics(), slo), Some(2.0));
}
