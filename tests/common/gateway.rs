//! Runs the real `pronto` binary as a child process for end-to-end tests.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running gateway process.
pub struct Gateway {
    pub child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub config_path: PathBuf,
    _dir: TempDir,
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "pronto-test-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    // The port is released before the gateway binds it; `start` retries on the rare clash.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Quick defaults suited to tests: short health interval (unless `extra` has its own `health:`
/// section), short grace period.
pub fn config_yaml(pools: &str, extra: &str) -> String {
    let health = if extra.contains("health:") {
        ""
    } else {
        "health:\n  interval: 200ms\n  timeout: 500ms\n  eject_after_failures: 2\n  readmit_after: 1s\n"
    };
    format!("threads: 2\ngrace_period: 5s\n{health}{extra}\npools:\n{pools}")
}

/// A pool section with the given backends.
pub fn pool(model: &str, policy: &str, urls: &[String]) -> String {
    let mut s = format!("  {model}:\n    policy: {policy}\n    backends:\n");
    for (i, u) in urls.iter().enumerate() {
        s.push_str(&format!("      - name: {model}-b{i}\n        url: {u}\n"));
    }
    s
}

impl Gateway {
    /// Start `pronto serve --config` on a config whose listeners the harness chooses.
    pub fn start(yaml_without_listeners: &str) -> Gateway {
        for _ in 0..5 {
            let dir = TempDir::new("gw");
            let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let config_path = dir.0.join("pronto.yaml");
            let mut f = std::fs::File::create(&config_path).unwrap();
            write!(
                f,
                "listen: {listen}\nadmin_listen: {admin}\n{yaml_without_listeners}"
            )
            .unwrap();
            drop(f);
            let child = Command::new(env!("CARGO_BIN_EXE_pronto"))
                .arg("serve")
                .arg("--config")
                .arg(&config_path)
                .env(
                    "RUST_LOG",
                    std::env::var("PRONTO_TEST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn pronto");
            let mut gw = Gateway {
                child,
                listen,
                admin,
                config_path,
                _dir: dir,
            };
            if gw.wait_ready(Duration::from_secs(20)) {
                return gw;
            }
            let _ = gw.child.kill();
        }
        panic!("gateway did not start");
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let admin = std::net::TcpStream::connect(self.admin).is_ok();
            let proxy = std::net::TcpStream::connect(self.listen).is_ok();
            if admin && proxy {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Replace the config file with `listen`/`admin_listen` (kept) + `yaml_without_listeners`,
    /// atomically (write a sibling, then rename), so a watcher never reads half a file.
    pub fn write_config(&self, yaml_without_listeners: &str) {
        let tmp = self.config_path.with_extension("yaml.tmp");
        std::fs::write(
            &tmp,
            format!(
                "listen: {}\nadmin_listen: {}\n{yaml_without_listeners}",
                self.listen, self.admin
            ),
        )
        .unwrap();
        std::fs::rename(&tmp, &self.config_path).unwrap();
    }

    /// Replace the config file with exactly `text` (atomically).
    pub fn write_raw_config(&self, text: &str) {
        let tmp = self.config_path.with_extension("yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.config_path).unwrap();
    }

    /// Send a signal (`HUP`, `TERM`, ...) to the gateway process.
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Send SIGTERM.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Wait for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of a metric line `name{labels} value` in Prometheus text (labels as written,
/// sorted by name as the prometheus crate renders them).
pub fn metric_value(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `POST /admin/reload`: the status and the JSON report.
pub async fn post_reload(gw: &Gateway) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(gw.admin_url("/admin/reload"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Every backend's JSON object from the admin `GET /admin/backends`.
pub async fn admin_backends(gw: &Gateway) -> Vec<serde_json::Value> {
    let v: serde_json::Value = reqwest::get(gw.admin_url("/admin/backends"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["backends"].as_array().cloned().unwrap_or_default()
}

/// The admin `/metrics` text once `ready(text)` holds, or the last scrape after 5 s. The
/// gateway records a request after the client has its last byte, so tests that read counters
/// right after a response poll instead of racing it.
pub async fn metrics_when(gw: &Gateway, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = reqwest::get(gw.admin_url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if ready(&m) || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
