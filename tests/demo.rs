//! `pronto demo` as a user runs it: the binary, on its built-in defaults, non-interactively.
//!
//! - The comparison (`--compare-only`): it exits cleanly with no warning or error in its log,
//!   prints the side-by-side table (one row per policy, in order) and a legend for every
//!   column, and the ordering holds — `predicted_ttft` beats both `round_robin` and
//!   `cache_aware` on TTFT mean and p99 — with every policy sent the same requests,
//!   `round_robin` spreading them evenly and `predicted_ttft` sending most to the H100s. Its
//!   `ttft_cdf.svg` is a well-formed standalone SVG with one curve per policy.
//! - Afterwards (`--no-workload`, the comparison skipped): the gateway it leaves up answers
//!   the printed curl example's request, writes it to its access log, serves the admin links
//!   it prints, and stops on SIGTERM.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const POLICIES: [&str; 3] = ["round_robin", "cache_aware", "predicted_ttft"];

fn pronto() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pronto"));
    cmd.env("RUST_LOG", "info,pingora_core=warn")
        .env("NO_COLOR", "1");
    cmd
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A summary field of `comparison.json`'s row for `policy`.
fn field(rows: &[serde_json::Value], policy: &str, key: &str) -> f64 {
    let row = rows
        .iter()
        .find(|r| r["name"] == policy)
        .unwrap_or_else(|| panic!("no row for {policy}"));
    row["summary"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{policy}.{key} is not a number: {row}"))
}

#[test]
fn the_demo_shows_predicted_ttft_beating_round_robin() {
    let out = scratch("demo-compare");
    let started = Instant::now();
    let run = pronto()
        .args(["demo", "--compare-only", "--out"])
        .arg(&out)
        .output()
        .expect("pronto demo runs");
    let wall = started.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout).into_owned(),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    );
    assert!(
        run.status.success(),
        "pronto demo failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    eprintln!("{stdout}\n(pronto demo --compare-only took {wall:.1?})");
    for line in stderr.lines() {
        assert!(
            !line.contains(" WARN ") && !line.contains(" ERROR "),
            "the demo logs a warning or an error: {line}\n{stderr}"
        );
        // The comparison's gateways keep no access log: the table sums their requests up.
        assert!(!line.contains("request_id="), "an access log line: {line}");
    }
    assert!(
        stdout.contains("Live: each run starts the real gateway"),
        "{stdout}"
    );

    // The table: a header, a rule, one row per policy in order.
    let lines: Vec<&str> = stdout.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with("policy "))
        .unwrap_or_else(|| panic!("no table header:\n{stdout}"));
    let columns = [
        "requests",
        "errors",
        "TTFT mean",
        "p50",
        "p99",
        "mean vs round_robin",
        "p99 vs round_robin",
        "h100-a",
        "h100-b",
        "a100-a",
        "a100-b",
    ];
    for c in columns {
        assert!(lines[head].contains(c), "no column {c}: {}", lines[head]);
    }
    assert!(lines[head + 1].chars().all(|c| c == '-'));
    for (i, p) in POLICIES.iter().enumerate() {
        assert!(
            lines[head + 2 + i].starts_with(&format!("{p} ")),
            "row {i}: {}",
            lines[head + 2 + i]
        );
    }
    // The legend explains every column.
    let legend = stdout
        .split_once("Legend:\n")
        .unwrap_or_else(|| panic!("no legend:\n{stdout}"))
        .1;
    for item in [
        "policy",
        "requests",
        "errors",
        "TTFT mean",
        "p50, p99",
        "… vs round_robin",
        "h100-a … a100-b",
    ] {
        assert!(
            legend.lines().any(|l| l.trim_start().starts_with(item)),
            "the legend misses {item}:\n{legend}"
        );
    }

    // The numbers, from comparison.json (the same summaries the table prints).
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
            .unwrap();
    let rows = json["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, POLICIES);
    let requests = field(rows, "round_robin", "requests");
    assert!(requests >= 100.0, "{requests} requests");
    for p in POLICIES {
        assert_eq!(field(rows, p, "requests"), requests, "{p}: same workload");
        assert_eq!(field(rows, p, "errors"), 0.0, "{p}: errors");
    }
    for key in ["ttft_mean_ms", "ttft_p99_ms"] {
        let [rr, ca, pt] = POLICIES.map(|p| field(rows, p, key));
        assert!(
            pt < ca && pt < rr,
            "{key}: predicted_ttft {pt:.0} should beat cache_aware {ca:.0} and round_robin \
             {rr:.0} (a run slowed by a busy machine says so above)"
        );
    }
    let share = |policy: &str, backend: &str| {
        let row = rows.iter().find(|r| r["name"] == policy).unwrap();
        row["summary"]["backends"][backend].as_f64().unwrap_or(0.0) / requests
    };
    for b in ["h100-a", "h100-b", "a100-a", "a100-b"] {
        let s = share("round_robin", b);
        assert!((s - 0.25).abs() < 0.02, "round_robin sends {s:.3} to {b}");
    }
    let h100 = share("predicted_ttft", "h100-a") + share("predicted_ttft", "h100-b");
    assert!(h100 > 0.6, "predicted_ttft sends {h100:.2} to the H100s");

    // The plot: a standalone SVG document with one curve per policy, labelled.
    let svg = std::fs::read_to_string(out.join("ttft_cdf.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("ttft_cdf.svg is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let curves = root
        .descendants()
        .filter(|n| n.has_tag_name("polyline") || n.has_tag_name("path"))
        .count();
    assert_eq!(curves, POLICIES.len());
    let texts: Vec<&str> = root.descendants().filter_map(|n| n.text()).collect();
    for p in POLICIES {
        assert!(
            texts.iter().any(|t| t.starts_with(p)),
            "no legend entry for {p}"
        );
    }
    // Standalone: nothing it links to or loads.
    for n in root.descendants().filter(|n| n.is_element()) {
        for a in n.attributes() {
            assert!(
                !a.name().contains("href") && !a.value().contains("url("),
                "external reference {}={}",
                a.name(),
                a.value()
            );
        }
    }
}

#[tokio::test]
async fn the_demo_gateway_stays_up_for_the_users_requests() {
    let mut child = pronto()
        .args([
            "demo",
            "--no-workload",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pronto demo starts");
    // Its log, forwarded to ours and kept.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr = child.stderr.take().unwrap();
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            let mut k = kept.lock().unwrap();
            k.push_str(&line);
            k.push('\n');
        }
    });
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let done = line.starts_with("Ctrl-C");
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    });
    let lines = tokio::time::timeout(Duration::from_secs(60), lines)
        .await
        .expect("the demo prints its curl example")
        .unwrap();
    let text = lines.join("\n");
    assert!(
        !text.contains("Legend:"),
        "--no-workload compares nothing:\n{text}"
    );
    let up = lines
        .iter()
        .find(|l| l.starts_with("The gateway stays up"))
        .unwrap_or_else(|| panic!("{text}"));
    let addr = up
        .split("on http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {up}"));
    let curl = lines
        .iter()
        .find(|l| l.trim_start().starts_with("curl "))
        .unwrap_or_else(|| panic!("no curl example:\n{text}"));
    assert!(
        curl.contains(&format!("http://{addr}/v1/chat/completions")),
        "{curl}"
    );
    // The curl example's request, as curl sends it.
    let body = curl
        .split("-d '")
        .nth(1)
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no body in {curl}"));
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("data: [DONE]"), "{text}");
    // One access log line for it, naming the backend.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = log.lock().unwrap().lines().any(|l| {
            l.contains("request_id=") && l.contains("backend=") && l.contains("status=200")
        });
        if found {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no access log line for the request:\n{}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The admin links it prints answer too.
    let admin = up
        .split("(admin: http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("no admin address in {up}"));
    for path in ["/metrics", "/"] {
        let r = reqwest::get(format!("http://{admin}{path}")).await.unwrap();
        assert_eq!(r.status(), 200, "GET {path} on the admin listener");
    }

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}
