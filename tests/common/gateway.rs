//! Runs the gateway for end-to-end tests: in-process on `127.0.0.1:0` ([`Gateway::start`],
//! the listeners bound once and kept), or as the real `pronto` binary for what only a process
//! shows — signals and exit codes ([`Gateway::start_process`]).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running gateway.
pub struct Gateway {
    handle: Option<pronto::server::Handle>,
    child: Option<Child>,
    /// Every log line of a process gateway, in order (ANSI colour removed).
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
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

/// Logs of in-process gateways, when `PRONTO_TEST_LOG` is set (e.g. `info`).
fn init_log() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(filter) = std::env::var("PRONTO_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
    });
}

fn write_file(dir: &TempDir, yaml_without_listeners: &str) -> PathBuf {
    let config_path = dir.0.join("pronto.yaml");
    let mut f = std::fs::File::create(&config_path).unwrap();
    write!(
        f,
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n{yaml_without_listeners}"
    )
    .unwrap();
    config_path
}

/// `text` without ANSI colour sequences.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of `key=VALUE` in a log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..].split_whitespace().next()
}

impl Gateway {
    /// Start the gateway in this process on a config file whose listeners are
    /// `127.0.0.1:0` (the handle reports the ports; reload reads the file as usual).
    pub fn start(yaml_without_listeners: &str) -> Gateway {
        init_log();
        let dir = TempDir::new("gw");
        let config_path = write_file(&dir, yaml_without_listeners);
        let config = pronto::config::Loaded::load(&config_path)
            .unwrap_or_else(|e| panic!("test config is invalid: {e}"));
        let handle = pronto::server::start(config, false).expect("gateway starts");
        let gw = Gateway {
            listen: handle.listen,
            admin: handle.admin,
            handle: Some(handle),
            child: None,
            log: Default::default(),
            config_path,
            _dir: dir,
        };
        gw.rewrite_listeners();
        gw
    }

    /// Start the `pronto` binary (`serve --config`), reading the ports it bound from its log.
    pub fn start_process(yaml_without_listeners: &str) -> Gateway {
        Gateway::start_process_with(yaml_without_listeners, &[])
    }

    /// [`Gateway::start_process`] with `global_args` before `serve` (e.g. `--log-format
    /// json`); its log lines are kept ([`Gateway::log_lines`]).
    pub fn start_process_with(yaml_without_listeners: &str, global_args: &[&str]) -> Gateway {
        let dir = TempDir::new("gw");
        let config_path = write_file(&dir, yaml_without_listeners);
        let config = config_path.to_str().unwrap().to_string();
        let mut args: Vec<&str> = global_args.to_vec();
        args.extend(["serve", "--config", &config]);
        let gw = Gateway::spawn(&args, dir, config_path);
        gw.rewrite_listeners();
        gw
    }

    /// The `pronto` binary with exactly `args` (e.g. `serve --backend URL ...`; it must listen
    /// on `127.0.0.1:0` and log where); no config file.
    pub fn start_cli(args: &[&str]) -> Gateway {
        let dir = TempDir::new("cli");
        let config_path = dir.0.join("no-config-file");
        Gateway::spawn(args, dir, config_path)
    }

    fn spawn(args: &[&str], dir: TempDir, config_path: PathBuf) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pronto"))
            .args(args)
            .env("RUST_LOG", "info,pingora_core=warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pronto");
        // Its log (whichever stream it writes to) is forwarded to ours, line by line, and
        // scanned for where it listens.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let log: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for pipe in [out, err] {
            let tx = tx.clone();
            let log = std::sync::Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let line = strip_ansi(&line);
                    eprintln!("{line}");
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut addrs = None;
        while addrs.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                break;
            };
            if line.contains("pronto gateway listening") {
                let json: Option<serde_json::Value> = serde_json::from_str(&line).ok();
                let parse = |k: &str| {
                    let v = match &json {
                        Some(j) => j[k].as_str(),
                        None => field(&line, k),
                    };
                    v.and_then(|v| v.parse::<SocketAddr>().ok())
                };
                addrs = parse("listen").zip(parse("admin_listen"));
            }
        }
        let (listen, admin) = addrs.expect("the gateway logs where it listens");
        Gateway {
            handle: None,
            child: Some(child),
            log,
            listen,
            admin,
            config_path,
            _dir: dir,
        }
    }

    /// The file with the ports the gateway got, so later rewrites keep them.
    fn rewrite_listeners(&self) {
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        let rest = text
            .strip_prefix("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n")
            .unwrap()
            .to_string();
        self.write_config(&rest);
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

    /// Send a signal (`HUP`, `TERM`, ...) to the gateway process ([`Gateway::start_process`]
    /// only: a signal to this test process would reach every in-process gateway).
    pub fn signal(&self, name: &str) {
        let child = self
            .child
            .as_ref()
            .expect("signals need Gateway::start_process");
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status();
    }

    /// The log lines of a process gateway so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The first log line (of a process gateway) that `want` accepts, waiting up to 10 s.
    pub async fn wait_for_log(&self, want: impl Fn(&str) -> bool) -> Option<String> {
        let mut found = None;
        self.wait_for_lines(|lines| {
            found = lines.iter().find(|l| want(l)).cloned();
            found.is_some()
        })
        .await;
        found
    }

    /// Wait up to 10 s until `ready` accepts the log lines so far; whether it did.
    pub async fn wait_for_lines(&self, mut ready: impl FnMut(&[String]) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ready(&self.log_lines()) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The gateway's process id ([`Gateway::start_process`] only).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a process").id()
    }

    /// Send a streamed chat request for `model` whose prompt is `words` words ` {tag}{i}`
    /// (distinct per tag), within `bound`; returns the response, checked to be a 200.
    pub async fn post_chat_stream(
        &self,
        model: &str,
        tag: &str,
        words: usize,
        max_tokens: u32,
        bound: Duration,
    ) -> reqwest::Response {
        let text: String = (0..words).map(|i| format!(" {tag}{i}")).collect();
        let body = serde_json::json!({"model": model, "stream": true, "max_tokens": max_tokens,
                                      "messages": [{"role": "user", "content": text}]});
        let r = tokio::time::timeout(
            bound,
            reqwest::Client::new()
                .post(self.url("/v1/chat/completions"))
                .json(&body)
                .send(),
        )
        .await
        .expect("no hang")
        .unwrap();
        assert_eq!(r.status(), 200);
        r
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Graceful shutdown: SIGTERM to a process, [`pronto::server::Handle::shutdown`] in-process.
    pub fn terminate(&self) {
        match &self.handle {
            Some(h) => h.shutdown(),
            None => self.signal("TERM"),
        }
    }

    /// Wait for the gateway to stop, up to `timeout`: whether it did and, for a process, how
    /// it exited (`Some(None)`: an in-process gateway stopped).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Option<std::process::ExitStatus>> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            match (&mut self.child, &self.handle) {
                (Some(c), _) => {
                    if let Ok(Some(s)) = c.try_wait() {
                        return Some(Some(s));
                    }
                }
                (None, Some(h)) => {
                    if h.is_finished() {
                        return Some(None);
                    }
                }
                (None, None) => return Some(None),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(h) = self.handle.take() {
            h.abort();
            h.wait();
        }
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

/// The admin `/metrics` text, scraped once.
pub async fn metrics(gw: &Gateway) -> String {
    reqwest::get(gw.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The admin `/metrics` text once `ready(text)` holds, or the last scrape after 5 s. The
/// gateway records a request after the client has its last byte, so tests that read counters
/// right after a response poll instead of racing it.
pub async fn metrics_when(gw: &Gateway, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = metrics(gw).await;
        if ready(&m) || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
