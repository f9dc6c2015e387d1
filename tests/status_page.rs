//! The admin status page (`GET /`) in a real browser: headless Chromium loads it from a
//! gateway in front of a simulated fleet, runs its script (`--virtual-time-budget`), and the
//! rendered DOM (`--dump-dom`) must show a row per backend with live numbers; a screenshot is
//! taken (`$CARGO_TARGET_TMPDIR/status-page.png`). A second page load against a canned admin
//! API checks the `recent_decisions` table and that the token given as `?token=` is sent as a
//! bearer header on the page's fetches.

mod common;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/tool.rs"]
mod tool;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gateway::TempDir;
use common::Gateway;

const TOKEN: &str = "status-page-test-token";
const MODEL: &str = "sim-llama";

/// Headless Chromium on `url` with `extra` switches: its stdout. A fresh profile each time;
/// no network beyond the page's own origin (the flags turn off Chromium's background
/// services).
fn chromium(bin: &Path, url: &str, extra: &[String]) -> String {
    let profile = TempDir::new("chromium");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(status.success(), "chromium failed ({status}):\n{err}");
    reader.join().unwrap()
}

/// Text of an HTML fragment: tags removed, the few entities the page produces decoded.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
}

/// The cells' text of the table row that starts with `<tr {attr}`.
fn row(dom: &str, attr: &str) -> Option<Vec<String>> {
    let start = dom.find(&format!("<tr {attr}"))?;
    let end = start + dom[start..].find("</tr>")?;
    let body = &dom[start..end];
    Some(
        body.split("<td")
            .skip(1)
            .map(|cell| {
                let inner = &cell[cell.find('>').unwrap() + 1..];
                text(&inner[..inner.find("</td>").unwrap_or(inner.len())])
            })
            .collect(),
    )
}

fn is_ms(s: &str) -> bool {
    s.strip_suffix(" ms")
        .and_then(|n| n.parse::<f64>().ok())
        .is_some_and(|v| v.is_finite() && v >= 0.0)
}

async fn chat(client: &reqwest::Client, gw: &Gateway, i: usize) {
    let body = serde_json::json!({
        "model": MODEL,
        "stream": true,
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. ".repeat(20)},
            {"role": "user", "content": format!("question {i}: what is {i} + {i}?")}
        ]
    });
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_backends_with_live_numbers() {
    let Some(bin) = tool::find(&["chromium", "chromium-browser"], "Debian package chromium") else {
        return;
    };
    let (_fleet, backends) = fleet::start(2, MODEL, &["--time-scale", "0.1"]);
    let mut pool = format!("  {MODEL}:\n    backends:\n");
    for (name, url) in &backends {
        pool.push_str(&format!("      - {{name: {name}, url: '{url}'}}\n"));
    }
    let gw = Gateway::start_process(&common::config_yaml(
        &pool,
        &format!("admin: {{token: {TOKEN}}}\n"),
    ));
    let client = reqwest::Client::new();
    for i in 0..12 {
        chat(&client, &gw, i).await;
    }
    let url = format!("http://{}/?token={TOKEN}", gw.admin);

    // Without the token the page is a login form, and the backends stay hidden.
    let bin2 = bin.clone();
    let bare = format!("http://{}/", gw.admin);
    let login =
        tokio::task::spawn_blocking(move || chromium(&bin2, &bare, &["--dump-dom".to_string()]))
            .await
            .unwrap();
    assert!(login.contains("name=\"token\""), "{login}");
    assert!(!login.contains("data-backend"), "{login}");

    let (bin2, url2) = (bin.clone(), url.clone());
    let dom = tokio::task::spawn_blocking(move || {
        chromium(
            &bin2,
            &url2,
            &[
                "--virtual-time-budget=6000".to_string(),
                "--dump-dom".to_string(),
            ],
        )
    })
    .await
    .unwrap();
    assert!(dom.contains("<h1>Pronto</h1>"), "{dom}");
    assert!(
        !dom.contains("loading…"),
        "the page never refreshed:\n{dom}"
    );
    assert!(
        dom.contains("<p id=\"error\" hidden=\"\">"),
        "the page shows an error:\n{dom}"
    );
    for (name, _) in &backends {
        let cells = row(&dom, &format!("data-backend=\"{name}\""))
            .unwrap_or_else(|| panic!("no row for {name}:\n{dom}"));
        assert_eq!(cells.len(), 11, "{cells:?}");
        assert_eq!(cells[0], MODEL);
        assert_eq!(cells[1], *name);
        assert!(cells[2].starts_with("healthy"), "{cells:?}");
        for (i, what) in [(3, "in flight"), (4, "queue")] {
            assert!(cells[i].parse::<f64>().is_ok(), "{what}: {cells:?}");
        }
        assert!(
            cells[5]
                .strip_suffix(" %")
                .and_then(|n| n.parse::<f64>().ok())
                .is_some(),
            "KV usage: {cells:?}"
        );
        for (i, what) in [
            (6, "TTFT p50"),
            (7, "TTFT p99"),
            (8, "predicted"),
            (9, "actual"),
        ] {
            assert!(is_ms(&cells[i]), "{what}: {cells:?}");
        }
    }
    let reasons = dom.matches("<tr data-reason=").count();
    assert!(reasons >= 1, "no routing decisions by reason:\n{dom}");
    // The gateway reports its recent decisions: one row per request, each with a reason.
    assert!(
        dom.contains("<table id=\"decisions\">"),
        "the decisions table is shown:\n{dom}"
    );
    let decisions = dom.matches("<tr data-decision=\"").count();
    assert_eq!(decisions, 12, "{dom}");
    assert!(
        !dom.contains("<tr data-decision=\"\""),
        "a decision without reason:\n{dom}"
    );
    // The build line comes from pronto_build_info.
    assert!(
        dom.contains(&format!("v{} (", env!("CARGO_PKG_VERSION"))),
        "{dom}"
    );

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || {
        chromium(
            &bin,
            &url,
            &[
                "--virtual-time-budget=6000".to_string(),
                "--window-size=1400,900".to_string(),
                "--hide-scrollbars".to_string(),
                arg,
            ],
        )
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 10_000, "{} bytes: a blank page?", png.len());
    eprintln!("screenshot: {}", shot.display());
}

/// A stand-in for the admin listener: the real page, and canned `/admin/backends` (with
/// `recent_decisions`) and `/metrics`, both answering 401 without the bearer token. Counts
/// the authorized API requests.
fn canned_admin(authorized: Arc<AtomicUsize>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let backends = serde_json::json!({
        "backends": [{
            "pool": "m", "name": "gpu-a", "healthy": true, "inflight": 3,
            "engine": {"waiting": 2, "kv_usage": 0.42},
            "latency": {"window_60s": {
                "ttft": {"n": 9, "mean_s": 0.2, "p50_s": 0.12, "p99_s": 0.48},
                "predicted_vs_actual": {"predicted_mean_s": 0.25, "actual_mean_s": 0.2}
            }},
            "ttft_rel_error": 0.08
        }],
        "recent_decisions": [
            {"at_ms": 1_700_000_000_000u64, "backend": "gpu-a", "reason": "lowest_predicted_ttft",
             "predicted_ttft_ms": 130.0, "actual_ttft_ms": 118.0},
            {"at_ms": 1_700_000_001_000u64, "backend": "gpu-a", "reason": "prefix_affinity",
             "predicted_ttft_ms": 40.0, "actual_ttft_ms": null}
        ]
    })
    .to_string();
    let metrics = "pronto_build_info{revision=\"abc\",version=\"9.9.9\"} 1\n\
        pronto_route_decisions_total{pool=\"m\",policy=\"predicted_ttft\",reason=\"lowest_predicted_ttft\"} 7\n"
        .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line);
            }
            let Some(first) = head.first() else { continue };
            let path = first.split(' ').nth(1).unwrap_or("/").to_string();
            let bearer = head.iter().any(|l| {
                l.split_once(':').is_some_and(|(name, value)| {
                    name.eq_ignore_ascii_case("authorization")
                        && value.trim() == format!("Bearer {TOKEN}")
                })
            });
            let (status, ctype, body) = match path.split('?').next().unwrap() {
                "/" => (
                    "200 OK",
                    "text/html; charset=utf-8",
                    pronto::admin::status::PAGE.to_string(),
                ),
                p @ ("/admin/backends" | "/metrics") if bearer => {
                    authorized.fetch_add(1, Ordering::SeqCst);
                    if p == "/metrics" {
                        ("200 OK", "text/plain", metrics.clone())
                    } else {
                        ("200 OK", "application/json", backends.clone())
                    }
                }
                "/admin/backends" | "/metrics" => {
                    ("401 Unauthorized", "application/json", "{}".into())
                }
                _ => ("404 Not Found", "text/plain", String::new()),
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn the_status_page_lists_recent_decisions_and_sends_the_token() {
    let Some(bin) = tool::find(&["chromium", "chromium-browser"], "Debian package chromium") else {
        return;
    };
    let authorized = Arc::new(AtomicUsize::new(0));
    let addr = canned_admin(Arc::clone(&authorized));
    let dom = chromium(
        &bin,
        &format!("http://{addr}/?token={TOKEN}"),
        &[
            "--virtual-time-budget=3000".to_string(),
            "--dump-dom".to_string(),
        ],
    );
    assert!(
        authorized.load(Ordering::SeqCst) >= 2,
        "no fetch carried the token"
    );
    let cells = row(&dom, "data-backend=\"gpu-a\"").unwrap_or_else(|| panic!("{dom}"));
    // Quantiles and the predicted / actual means: one window, the gateway's 60 s.
    assert_eq!(
        &cells[2..10],
        ["healthy", "3", "2", "42.0 %", "120 ms", "480 ms", "250 ms", "200 ms"],
        "{cells:?}"
    );
    assert!(
        dom.contains("Predicted mean, 60 s") && dom.contains("TTFT p99, 60 s"),
        "{dom}"
    );
    assert_eq!(cells[10], "8.0 %");
    assert!(
        dom.contains("<table id=\"decisions\">"),
        "the decisions table is shown:\n{dom}"
    );
    // Newest first; an unknown actual TTFT shows as a dash.
    let newest = row(&dom, "data-decision=\"prefix_affinity\"").unwrap();
    assert_eq!(
        newest,
        [
            "22:13:21.000",
            "gpu-a",
            "prefix_affinity",
            "40.0 ms",
            "—",
            "—"
        ]
    );
    let older = row(&dom, "data-decision=\"lowest_predicted_ttft\"").unwrap();
    assert_eq!(older[3..], ["130.0 ms", "118.0 ms", "+12.0 ms"]);
    assert!(
        dom.find("data-decision=\"prefix_affinity\"")
            < dom.find("data-decision=\"lowest_predicted_ttft\""),
        "newest first"
    );
    assert!(dom.contains("v9.9.9 (abc)"), "{dom}");
    let reason = row(&dom, "data-reason=\"lowest_predicted_ttft\"").unwrap();
    assert_eq!(
        reason[..4],
        ["m", "predicted_ttft", "lowest_predicted_ttft", "7"]
    );
}
