//! Silence before the first token, end to end (issue 44, items 2 and 3): the gateway in
//! process in front of the in-process simulated fleet.
//!
//! - A wedged backend (alive, `/health` 200, accepting requests, producing no token: the
//!   sim's `wedged` fault) is taken out of routing once its silence passes the stall bound,
//!   and no request is lost: the route's first-token deadline races the stuck ones elsewhere.
//! - Keep-alives: behind the real nginx with a short `proxy_read_timeout`, a stream whose
//!   first token takes longer gets its answer with a route's `keepalive`, and is cut (504)
//!   without; with keep-alives on and every backend failing, the client gets an SSE error
//!   event and a clean end of the stream.

mod common;
#[path = "support/tool.rs"]
mod tool;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway::TempDir;
use common::{config_yaml, metric_value, metrics, Gateway};
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::json;

const MODEL: &str = "sim-model";
/// Upper bound on any one request (a hang fails instead of blocking).
const BOUND: Duration = Duration::from_secs(20);

async fn fleet(n: usize, faults: &str, scale: f64) -> SimFleet {
    let mut yaml = format!("model: {MODEL}\nbackends:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{ name: b{i}, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0, faults: {{ restart_after: 30s{faults} }} }}\n"
        ));
    }
    let config = FleetConfig::parse(&yaml, "progress").unwrap();
    SimFleet::start(&config, scale).await.unwrap()
}

fn pool(fleet: &SimFleet, policy: &str) -> String {
    let mut pool = format!("  {MODEL}:\n    policy: {policy}\n    backends:\n");
    for (i, u) in fleet.urls().iter().enumerate() {
        pool.push_str(&format!("      - name: b{i}\n        url: {u}\n"));
    }
    pool
}

fn chat(tag: &str, max_tokens: u32) -> serde_json::Value {
    let text: String = (0..40).map(|i| format!(" {tag}{i}")).collect();
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}],
           "max_tokens": max_tokens, "stream": true})
}

/// One streamed request's fate.
#[derive(Debug, Clone)]
struct Fate {
    /// When it was sent, after the wedge.
    sent: Duration,
    status: u16,
    /// The backend first sent the request (the late one of a race, else the one that served).
    first: String,
    /// The stream ended with `[DONE]` and no error event.
    complete: bool,
}

async fn stream(client: &reqwest::Client, gw: &Gateway, tag: &str) -> (u16, String, String) {
    let r = tokio::time::timeout(BOUND, async {
        let r = client
            .post(gw.url("/v1/chat/completions"))
            .json(&chat(tag, 8))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let first = header("x-pronto-race-first")
            .or_else(|| header("x-pronto-backend"))
            .unwrap_or_default();
        (status, first, r.text().await.unwrap_or_default())
    })
    .await;
    r.expect("no request hangs")
}

fn complete(body: &str) -> bool {
    body.contains("data: [DONE]") && !body.contains("\"error\"")
}

/// A backend wedged under load: within its stall bound it stops getting requests (but for
/// one probe at a time, while it holds none), it is marked stalled in the metrics, and every
/// request completes — the ones stuck on it raced to another by the first-token deadline.
/// Let go, it produces again and is routed to again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wedged_backend_is_excluded_and_no_request_is_lost() {
    let fleet = fleet(3, "", 0.05).await;
    // round_robin: without the rule, the wedged backend keeps its third of the requests.
    let extra = "explain_headers: true\nretry: {max_retries: 2}\n\
                 health:\n  interval: 200ms\n  timeout: 500ms\n  eject_after_failures: 2\n  \
                 readmit_after: 1s\n  stall: {floor: 1s, factor: 4}\n\
                 routes:\n  - {name: chat, pool: sim-model, first_token_deadline: {after: 1s}}\n";
    let gw = Gateway::start(&config_yaml(&pool(&fleet, "round_robin"), extra));
    let client = reqwest::Client::new();
    // Warm up: every backend serves.
    for i in 0..6 {
        let (status, _, body) = stream(&client, &gw, &format!("warm{i}")).await;
        assert!(status == 200 && complete(&body), "{status}: {body}");
    }
    fleet.faults(0).set_wedged(true);
    let wedged = Instant::now();
    let fates = Arc::new(Mutex::new(Vec::<Fate>::new()));
    let run_for = Duration::from_secs(6);
    let mut workers = Vec::new();
    for w in 0..4 {
        let (fates, client, gw) = (Arc::clone(&fates), client.clone(), &gw);
        workers.push(async move {
            let mut i = 0;
            while wedged.elapsed() < run_for {
                let sent = wedged.elapsed();
                let (status, first, body) = stream(&client, gw, &format!("w{w}r{i}")).await;
                fates.lock().unwrap().push(Fate {
                    sent,
                    status,
                    first,
                    complete: complete(&body),
                });
                i += 1;
            }
        });
    }
    futures::future::join_all(workers).await;
    let fates = fates.lock().unwrap().clone();
    let lost: Vec<&Fate> = fates
        .iter()
        .filter(|f| f.status != 200 || !f.complete)
        .collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
    // The bound is the floor here (the wedged backend's booked prefill is a few hundred
    // tokens); after it, with slack for the race that frees the stuck requests.
    let settled = Duration::from_secs(2);
    let later: Vec<&Fate> = fates.iter().filter(|f| f.sent >= settled).collect();
    let to_wedged = later.iter().filter(|f| f.first == "b0").count();
    eprintln!(
        "{} requests after the wedge, {} of them sent after {settled:?}; {to_wedged} of those \
         first went to the wedged backend",
        fates.len(),
        later.len()
    );
    assert!(
        later.len() >= 12,
        "too few requests to judge: {}",
        later.len()
    );
    // Probes only: one at a time, each held for the 1 s deadline — at most one per second
    // of the remaining run, against a third of every request without exclusion.
    let probes_bound = (run_for - settled).as_secs() as usize + 1;
    assert!(
        to_wedged <= probes_bound && to_wedged * 3 < later.len(),
        "{to_wedged} of {} went to the wedged backend",
        later.len()
    );
    let text = metrics(&gw).await;
    assert_eq!(
        metric_value(&text, "pronto_backend_stalled{backend=\"b0\"}"),
        Some(1.0)
    );
    assert!(metric_value(
        &text,
        "pronto_backend_stall_exclusions_total{backend=\"b0\"}"
    )
    .is_some_and(|n| n >= 1.0));
    for b in ["b1", "b2"] {
        assert_eq!(
            metric_value(&text, &format!("pronto_backend_stalled{{backend=\"{b}\"}}")),
            Some(0.0)
        );
    }
    // Not ejected: healthy all along.
    let backends = common::admin_backends(&gw).await;
    assert!(
        backends.iter().all(|b| b["healthy"] == true),
        "{backends:?}"
    );
    // Let go: its probe's first token ends the stall, and it is routed to again.
    fleet.faults(0).set_wedged(false);
    let start = Instant::now();
    let mut i = 0;
    loop {
        let (status, first, body) = stream(&client, &gw, &format!("after{i}")).await;
        assert!(status == 200 && complete(&body));
        let text = metrics(&gw).await;
        let stalled = metric_value(&text, "pronto_backend_stalled{backend=\"b0\"}");
        if first == "b0" && stalled == Some(0.0) {
            break;
        }
        assert!(start.elapsed() < BOUND, "b0 never came back");
        i += 1;
    }
    fleet.shutdown().await;
}

// === keep-alives ===

/// nginx from Debian (`/usr/sbin`), or `None` (skipping) outside CI.
fn nginx_binary() -> Option<PathBuf> {
    if Path::new("/usr/sbin/nginx").is_file() {
        return Some(PathBuf::from("/usr/sbin/nginx"));
    }
    tool::find(&["nginx"], "apt-get install nginx")
}

/// nginx in front of `upstream` on a unix socket in its own directory, with
/// `proxy_read_timeout` of `read_timeout`.
struct Nginx {
    child: Child,
    socket: PathBuf,
    _dir: TempDir,
}

impl Nginx {
    fn start(bin: &Path, upstream: std::net::SocketAddr, read_timeout: &str) -> Nginx {
        let dir = TempDir::new("nginx");
        let d = dir.0.display();
        let socket = dir.0.join("nginx.sock");
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             server {{\n    listen unix:{sock};\n    location / {{\n      \
             proxy_pass http://{upstream};\n      proxy_http_version 1.1;\n      \
             proxy_buffering off;\n      proxy_read_timeout {read_timeout};\n    }}\n  }}\n}}\n",
            sock = socket.display(),
        );
        let conf_path = dir.0.join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let child = Command::new(bin)
            .arg("-p")
            .arg(&dir.0)
            .arg("-e")
            .arg(dir.0.join("error.log"))
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nginx starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx {
            child,
            socket,
            _dir: dir,
        }
    }

    /// POST `body` to `path` with `headers` through nginx; the status and the whole body as
    /// received (`Connection: close`, read to the end or until the connection is cut).
    async fn post(&self, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let read = tokio::time::timeout(BOUND, s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "no hang behind nginx");
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, text)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Routes on the same pool, told apart by a header: `ka` sends keep-alives every 300 ms, the
/// catch-all none.
const KEEPALIVE_ROUTES: &str = "routes:\n  - {name: ka, pool: sim-model, keepalive: 300ms, \
                                match: {headers: {x-keepalive: 'on'}}}\n  - {name: plain, pool: sim-model}\n";

/// Behind nginx with a 1 s `proxy_read_timeout`, a stream whose first token takes 3 s: with
/// keep-alives the client gets its whole answer; without them nginx gives up first (504).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_carry_a_slow_first_token_through_nginx() {
    let Some(bin) = nginx_binary() else { return };
    // Every first token held 3 s (wall time) by the backend.
    let fleet = fleet(1, ", stall_first_token: 3s", 0.05).await;
    let gw = Gateway::start(&config_yaml(&pool(&fleet, "round_robin"), KEEPALIVE_ROUTES));
    let nginx = Nginx::start(&bin, gw.listen, "1s");
    let body = chat("slow", 4).to_string();
    let (status, text) = nginx
        .post("/v1/chat/completions", &[("x-keepalive", "on")], &body)
        .await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(": keep-alive"), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(text.contains("\"content\""), "{text}");
    let (status, text) = nginx.post("/v1/chat/completions", &[], &body).await;
    assert_eq!(status, 504, "nginx times the silent stream out: {text}");
    let m = metrics(&gw).await;
    assert!(
        metric_value(&m, "pronto_keepalives_sent_total{route=\"ka\"}").is_some_and(|n| n >= 5.0)
    );
    fleet.shutdown().await;
}

/// Keep-alives sent (so a 200 head is out) and then every backend fails — here the only one,
/// wedged, crashes and cuts the request off: the client gets an SSE error event and a clean
/// end of the stream, not a broken 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_then_every_backend_failing_end_in_an_sse_error_event() {
    let fleet = fleet(1, "", 0.05).await;
    let gw = Gateway::start(&config_yaml(&pool(&fleet, "round_robin"), KEEPALIVE_ROUTES));
    let client = reqwest::Client::new();
    let faults = fleet.faults(0);
    faults.set_wedged(true);
    let crash = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        faults.crash();
    });
    let r = tokio::time::timeout(
        BOUND,
        client
            .post(gw.url("/v1/chat/completions"))
            .header("x-keepalive", "on")
            .json(&chat("doomed", 4))
            .send(),
    )
    .await
    .expect("no hang")
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    // The whole body reads without a transport error: a clean end.
    let text = tokio::time::timeout(BOUND, r.text())
        .await
        .expect("no hang")
        .expect("a clean end of the stream");
    crash.await.unwrap();
    assert!(text.starts_with(": keep-alive\n\n"), "{text}");
    let last = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .last()
        .expect("an event");
    let data = last.strip_prefix("data: ").expect("a data event last");
    let v: serde_json::Value =
        serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert_eq!(v["error"]["code"], "no_backend_available", "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let m = metrics(&gw).await;
    assert_eq!(
        metric_value(&m, "pronto_keepalive_errors_total{route=\"ka\"}"),
        Some(1.0)
    );
    fleet.shutdown().await;
}
