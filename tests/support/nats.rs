//! A `nats-server` (Debian's package, installed by `scripts/bootstrap.sh`) on loopback for the
//! replica-sync tests. Missing: the test fails under CI (`CI` set) and is skipped elsewhere,
//! like the other external tools (`support/tool.rs`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Where `nats-server` is: on `PATH`, or where Debian puts it (`/usr/sbin`, often not on a
/// user's `PATH`).
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// The binary, or `None` (after saying why the test is skipped) outside CI; a panic under CI.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = binary() {
        return Some(p);
    }
    let msg = "nats-server not found (Debian package nats-server)";
    if std::env::var_os("CI").is_some() {
        panic!("{msg}: needed under CI; scripts/bootstrap.sh installs it");
    }
    eprintln!("skipping: {msg}; run scripts/bootstrap.sh");
    None
}

/// A running `nats-server`; killed on drop.
pub struct Nats {
    bin: PathBuf,
    /// Its configuration file (`-c`) and environment, when started with one.
    config: Option<(PathBuf, Vec<(String, String)>)>,
    child: Option<Child>,
    /// Its client port.
    pub port: u16,
}

impl Nats {
    /// Start one on a port of its own choosing (`-p -1`); `None` when the binary is missing
    /// outside CI.
    pub fn start() -> Option<Nats> {
        let bin = find()?;
        let (child, port) = spawn(&bin, None, -1);
        Some(Nats {
            bin,
            config: None,
            child: Some(child),
            port,
        })
    }

    /// Start one with the configuration file `config` (authorization, TLS, ...) and `env` in
    /// its environment (variables the file names); it listens on loopback, on a port of its
    /// own choosing.
    pub fn start_with(config: PathBuf, env: &[(&str, &str)]) -> Option<Nats> {
        let bin = find()?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (child, port) = spawn(&bin, Some((&config, &env)), -1);
        Some(Nats {
            bin,
            config: Some((config, env)),
            child: Some(child),
            port,
        })
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kill it (the clients see the connection drop).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let config = self.config.as_ref().map(|(c, env)| (c, env));
        let (child, port) = spawn(&self.bin, config, i32::from(self.port));
        assert_eq!(port, self.port);
        self.child = Some(child);
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Start `bin` on `port` (-1: any), with `config` if given, and read the port it listens on
/// from its log.
fn spawn(
    bin: &PathBuf,
    config: Option<(&PathBuf, &Vec<(String, String)>)>,
    port: i32,
) -> (Child, u16) {
    for attempt in 0..20 {
        let mut cmd = Command::new(bin);
        if let Some((c, env)) = config {
            cmd.arg("-c").arg(c).envs(env.iter().map(|(k, v)| (k, v)));
        }
        let mut child = cmd
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", bin.display()));
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("Listening for client connections on ") {
                    let addr = &line[at + "Listening for client connections on ".len()..];
                    let port = addr.rsplit(':').next().and_then(|p| p.trim().parse().ok());
                    let _ = tx.send(port);
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Some(p)) => return (child, p),
            _ => {
                // The port may still be held by the server just killed: try again.
                let _ = child.kill();
                let _ = child.wait();
                assert!(attempt < 19, "nats-server did not listen on {port}");
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    unreachable!()
}
