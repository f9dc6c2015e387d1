//! The container image, without a container engine: the Dockerfile is read, and its
//! ENTRYPOINT + CMD are run as a process (the debug binary standing for
//! `/usr/local/bin/pronto`, the files the final stage copies standing for their image paths).
//! The image must build the gateway alone (`--no-default-features`) from the workspace, ship
//! only its minimal config, run as a non-root user, and refuse to start without an admin token
//! or with the repository's example one.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The instructions of one Dockerfile stage, in order: `(INSTRUCTION, arguments)`, with line
/// continuations joined and comments dropped.
fn stages(text: &str) -> Vec<Vec<(String, String)>> {
    let mut joined = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            joined.push(std::mem::take(&mut cur));
        }
    }
    let mut out: Vec<Vec<(String, String)>> = Vec::new();
    for ins in joined {
        let (op, args) = ins.split_once(char::is_whitespace).unwrap_or((&ins, ""));
        let op = op.to_ascii_uppercase();
        if op == "FROM" {
            out.push(Vec::new());
        }
        out.last_mut()
            .expect("a Dockerfile starts with FROM")
            .push((op, args.trim().to_string()));
    }
    out
}

/// The exec-form (JSON array) arguments of the stage's last `op`.
fn exec_form(stage: &[(String, String)], op: &str) -> Vec<String> {
    let (_, args) = stage
        .iter()
        .rev()
        .find(|(o, _)| o == op)
        .unwrap_or_else(|| panic!("the final stage has no {op}"));
    serde_json::from_str(args)
        .unwrap_or_else(|e| panic!("{op} {args} is not the exec (JSON array) form: {e}"))
}

struct Image {
    /// ENTRYPOINT then CMD.
    argv: Vec<String>,
    /// Image path → repository file, for the final stage's `COPY` from the build context.
    files: BTreeMap<String, PathBuf>,
    user: String,
    exposed: Vec<u16>,
    build_stage: String,
}

fn image() -> Image {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let stages = stages(&text);
    assert!(stages.len() >= 2, "a build stage and a runtime stage");
    let last = stages.last().unwrap();
    let mut argv = exec_form(last, "ENTRYPOINT");
    argv.extend(exec_form(last, "CMD"));
    let mut files = BTreeMap::new();
    for (op, args) in last {
        if op != "COPY" || args.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = args.split_whitespace().collect();
        let (dest, srcs) = parts.split_last().unwrap();
        for src in srcs {
            files.insert(dest.to_string(), Path::new(ROOT).join(src));
        }
    }
    let user = last
        .iter()
        .rev()
        .find(|(o, _)| o == "USER")
        .map(|(_, a)| a.clone())
        .expect("the final stage sets USER");
    let exposed = last
        .iter()
        .filter(|(o, _)| o == "EXPOSE")
        .flat_map(|(_, a)| a.split_whitespace().map(|p| p.parse().unwrap()))
        .collect();
    let build_stage = stages[..stages.len() - 1]
        .iter()
        .flatten()
        .map(|(o, a)| format!("{o} {a}\n"))
        .collect();
    Image {
        argv,
        files,
        user,
        exposed,
        build_stage,
    }
}

#[test]
fn the_image_builds_the_gateway_alone_from_the_workspace_and_runs_unprivileged() {
    let img = image();
    for needed in [
        "COPY crates ./crates",
        "build.rs",
        "--no-default-features",
        "--locked",
    ] {
        assert!(
            img.build_stage.contains(needed),
            "the build stage lacks {needed}"
        );
    }
    assert!(
        img.build_stage.contains("ARG PRONTO_GIT_REVISION"),
        "the revision is a build argument (the context has no .git)"
    );
    assert_eq!(img.argv[0], "/usr/local/bin/pronto");
    assert_eq!(img.argv[1], "serve");
    let uid: u32 = img
        .user
        .parse()
        .expect("a numeric USER (runAsNonRoot can check it)");
    assert_ne!(uid, 0);
    // The only files from the context are the minimal config: no example keys or tokens.
    assert_eq!(
        img.files.values().collect::<Vec<_>>(),
        vec![&Path::new(ROOT).join("config/docker.yaml")]
    );
    // The ports it exposes are the ones its config listens on.
    let config = std::fs::read_to_string(Path::new(ROOT).join("config/docker.yaml")).unwrap();
    for port in &img.exposed {
        assert!(config.contains(&format!("0.0.0.0:{port}\n")), "{port}");
    }
    assert_eq!(img.exposed.len(), 2);
}

/// The image's command line for this machine: image paths replaced by the repository files
/// they are copied from, then `extra`.
fn argv(img: &Image, extra: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> = img.argv[1..]
        .iter()
        .map(|a| match img.files.get(a) {
            Some(local) => local.display().to_string(),
            None => {
                assert!(!a.starts_with('/'), "{a}: not a file the image copies");
                a.clone()
            }
        })
        .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv
}

fn run_image(extra: &[&str], token: Option<&str>) -> Child {
    let img = image();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pronto"));
    cmd.args(argv(&img, extra))
        .env_remove("PRONTO_ADMIN_TOKEN")
        .env_remove("PRONTO_LOG_FORMAT")
        .env("RUST_LOG", "info,pingora_core=warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("PRONTO_ADMIN_TOKEN", t);
    }
    cmd.spawn().unwrap()
}

fn exit_with_stderr(mut child: Child) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
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
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the image's command kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_image_refuses_to_start_without_a_token_or_with_the_example_one() {
    let (ok, err) = exit_with_stderr(run_image(&[], None));
    assert!(!ok);
    assert!(
        err.contains("admin.token.env: the environment variable `PRONTO_ADMIN_TOKEN` is not set"),
        "{err}"
    );
    let (ok, err) = exit_with_stderr(run_image(&[], Some("example-admin-token-change-me")));
    assert!(!ok);
    assert!(
        err.contains("admin.token.env: this is the example admin token published"),
        "{err}"
    );
}

fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n{auth}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    (
        status,
        out.split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string(),
    )
}

#[test]
fn the_image_serves_on_every_interface_with_its_admin_token() {
    // The image's own ports (8080, 9400) are replaced by ephemeral ones on the same
    // interfaces, so the test never collides with anything on this machine.
    let token = "a-token-of-this-test-0123456789";
    let mut child = run_image(
        &["--listen", "0.0.0.0:0", "--admin-listen", "0.0.0.0:0"],
        Some(token),
    );
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut line = String::new();
    while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if l.contains("pronto gateway listening") {
            line = l;
            break;
        }
    }
    let field = |key: &str| -> SocketAddr {
        let at = line
            .find(&format!(" {key}="))
            .unwrap_or_else(|| panic!("{key} in {line:?}"));
        line[at + key.len() + 2..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (listen, admin) = (field("listen"), field("admin_listen"));
    assert!(
        listen.ip().is_unspecified() && admin.ip().is_unspecified(),
        "{line}"
    );
    let local = |a: SocketAddr| SocketAddr::from(([127, 0, 0, 1], a.port()));
    let admin = local(admin);
    // Probes stay open; everything else on the admin listener wants the token.
    assert_eq!(get(admin, "/healthz", None).0, 200);
    assert_eq!(get(admin, "/metrics", None).0, 401);
    assert_eq!(get(admin, "/", None).0, 401);
    let (status, metrics) = get(admin, "/metrics", Some(token));
    assert_eq!(status, 200);
    assert_eq!(
        common::metric_value(&metrics, "pronto_pool_backends{pool=\"default\"}"),
        Some(0.0),
        "`vllm` does not resolve here: the pool is empty"
    );
    // The client listener answers (no API keys in the minimal config).
    let (status, body) = get(local(listen), "/v1/models", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"default\""), "{body}");
    let _ = child.kill();
    let _ = child.wait();
}
