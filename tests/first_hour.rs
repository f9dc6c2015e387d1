//! The first hour, as a new user plays it, on loopback: a fleet of engines that serve the
//! model under their own name (`pronto sim-fleet --model /models/tiny-llama`, as a stock vLLM
//! started without `--served-model-name` serves its model path, and 404s any other name);
//! then the shipped configs run unchanged by the `pronto` binary in front of it — the
//! container's (`config/docker.yaml`) and the starting point (`config/minimal.yaml`) — and a
//! chat through the real OpenAI Python SDK asks for the pool's name and gets an answer that
//! says that name.
//!
//! What is substituted, and only that: the backend addresses (the fleet listens on ephemeral
//! ports, not on `vllm:8000` or `127.0.0.1:8000`/`:8001`), in a copy of the file; the
//! listeners come from `--listen 127.0.0.1:0 --admin-listen 127.0.0.1:0` on the command line
//! (as `tests/container.rs` does), and the container's admin token from
//! `PRONTO_ADMIN_TOKEN`, as `docker run -e` gives it. `config/minimal.yaml` is run from
//! another working directory, by a relative path.

mod common;
#[path = "support/fleet.rs"]
mod fleet;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway::TempDir;
use fleet::Proc;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// What the engines call the model.
const ENGINE_MODEL: &str = "/models/tiny-llama";

/// Whether the OpenAI SDK is there (skip outside CI, fail in CI).
fn has_sdk() -> bool {
    let has = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has && std::env::var_os("CI").is_none() {
        eprintln!(
            "SKIPPED: the OpenAI Python SDK is not installed (pip install openai); CI installs it"
        );
        return false;
    }
    assert!(
        has,
        "CI must have the OpenAI Python SDK (scripts/bootstrap.sh installs it)"
    );
    true
}

/// `pronto serve --config CONFIG` run in `cwd` on ephemeral listeners: the process and the
/// client listener's address.
fn serve(cwd: &Path, config: &Path) -> (Proc, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pronto"))
        .current_dir(cwd)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env("PRONTO_ADMIN_TOKEN", "a-token-of-the-first-hour-test")
        .env("RUST_LOG", "info,pingora_core=warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let proc = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if let Some(at) = line
            .contains("pronto gateway listening")
            .then(|| line.find(" listen="))
            .flatten()
        {
            let addr = line[at + " listen=".len()..].split_whitespace().next();
            return (proc, addr.unwrap().parse().unwrap());
        }
    }
    panic!("the gateway did not start on {}", config.display());
}

/// Wait until a chat for `model` is answered 200 (the gateway asks the engines their model's
/// name before it routes to them).
async fn routable(listen: SocketAddr, model: &str) {
    let body = serde_json::json!({"model": model, "max_tokens": 1,
                                  "messages": [{"role": "user", "content": "ping"}]});
    let client = reqwest::Client::new();
    let mut last = String::new();
    for _ in 0..100 {
        let r = client
            .post(format!("http://{listen}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            return;
        }
        last = format!("{}: {}", r.status(), r.text().await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("`{model}` was never served: {last}");
}

/// The SDK's chat through the gateway at `listen`, checked.
async fn sdk_chat(listen: SocketAddr, model: &str) {
    routable(listen, model).await;
    let script = Path::new(ROOT).join("tests/py/first_hour.py");
    let base = format!("http://{listen}/v1");
    let model = model.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args([&base, &model])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the SDK failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |key: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
            .to_string()
    };
    let m = "default";
    assert_eq!(line("MODELS"), m, "{stdout}");
    assert_eq!(line("MODEL"), m, "the answer names the model asked for");
    assert_eq!(
        line("STREAM_MODELS"),
        m,
        "every chunk names the model asked for"
    );
    assert!(!line("TEXT").trim().is_empty() && line("TEXT") != "None");
    assert!(!line("STREAM_TEXT").trim().is_empty());
    assert!(line("USAGE").parse::<u32>().unwrap() > 0);
}

/// `text` of the shipped file `rel` with each `(from, to)` address substituted, written to
/// `dir/name`; each `from` must occur.
fn substituted(rel: &str, subs: &[(&str, String)], dir: &Path, name: &str) -> PathBuf {
    let mut text = std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap();
    for (from, to) in subs {
        assert!(text.contains(from), "{rel} no longer names {from}");
        text = text.replace(from, to);
    }
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `host:port` of a fleet backend URL.
fn authority(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_configs_serve_a_differently_named_engine_model_through_the_sdk() {
    if !has_sdk() {
        return;
    }
    let (_fleet, backends) = fleet::start(2, ENGINE_MODEL, &["--time-scale", "0.1"]);
    let tmp = TempDir::new("first-hour");

    // The container's config: its `vllm:8000` is the first engine.
    let docker = substituted(
        "config/docker.yaml",
        &[("vllm:8000", authority(&backends[0].1))],
        &tmp.0.join("etc"),
        "pronto.yaml",
    );
    let (gw, listen) = serve(&tmp.0, &docker);
    sdk_chat(listen, "default").await;
    drop(gw);

    // The starting point, from another working directory, by a relative path.
    let cfg = substituted(
        "config/minimal.yaml",
        &[
            ("127.0.0.1:8000", authority(&backends[0].1)),
            ("127.0.0.1:8001", authority(&backends[1].1)),
        ],
        &tmp.0.join("cfg"),
        "minimal.yaml",
    );
    let elsewhere = tmp.0.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    assert!(cfg.starts_with(&tmp.0));
    let (_gw, listen) = serve(&elsewhere, Path::new("../cfg/minimal.yaml"));
    sdk_chat(listen, "default").await;
}
