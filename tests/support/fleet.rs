//! `pronto sim-fleet` as a process, for the deployment tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `pronto sim-fleet` with `n` backends serving `model` on ephemeral ports, `extra` flags
/// added: the process and each backend's `(name, url)` (it prints
/// `name<TAB>url<TAB>profile` per backend on stdout).
pub fn start(n: usize, model: &str, extra: &[&str]) -> (Proc, Vec<(String, String)>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pronto"))
        .args([
            "sim-fleet",
            "--backends",
            &n.to_string(),
            "--base-port",
            "0",
        ])
        .args(["--num-kv-blocks", "4000", "--model", model])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let fleet = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut backends = Vec::new();
    while backends.len() < n {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("sim-fleet prints its backends");
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() >= 2 && fields[1].starts_with("http://") {
            backends.push((fields[0].to_string(), fields[1].to_string()));
        }
    }
    (fleet, backends)
}
