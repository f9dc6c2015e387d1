//! The Grafana dashboard and the alert rules against a real Prometheus: a simulated fleet
//! (`pronto sim-fleet`), the gateway in front of it (the `pronto` binary), 20 s of the
//! synthetic workload (`pronto replay`), and Prometheus scraping the admin listener's
//! `/metrics` every second (with the admin token, as a deployment does). Then every query of
//! every panel of `deploy/grafana/pronto.json`, and each of its template variables, is
//! evaluated through Prometheus's HTTP API and must return data; the alert rules must
//! evaluate without error.
//!
//! Panels of events that a healthy run never has (retries, ejections, rate-limit and
//! admission rejections, upstream errors, client disconnects, failovers and hedges — the chat
//! route has an inert deadline and hedge) return data because the gateway
//! registers those series at zero at start-up.

mod common;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/tool.rs"]
mod tool;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway::TempDir;
use common::Gateway;
use fleet::Proc;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TOKEN: &str = "prometheus-test-admin-token";
const MODEL: &str = "sim-llama";
/// The window that stands for Grafana's `$__rate_interval` (the load lasts 20 s, and the
/// queries run right after it).
const WINDOW: &str = "1m";

/// Prometheus on a free loopback port (tried again if the port is taken between the check
/// and its bind), ready: the process and its base URL.
fn start_prometheus(bin: &Path, dir: &Path, config: &Path) -> (Proc, String) {
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.join(format!("data-{port}"));
        let mut child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                assert!(
                    err.contains("address already in use"),
                    "prometheus exited ({status}):\n{err}"
                );
                break;
            }
            let ready = std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .and_then(|mut s| {
                    use std::io::Write;
                    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                    write!(s, "GET /-/ready HTTP/1.0\r\n\r\n").ok()?;
                    let mut head = [0u8; 12];
                    s.read_exact(&mut head).ok()?;
                    Some(head.ends_with(b"200"))
                })
                .unwrap_or(false);
            if ready {
                return (Proc(child), url);
            }
            assert!(Instant::now() < deadline, "prometheus did not get ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("no free port for prometheus after 5 tries");
}

/// A panel query with Grafana's variables replaced: every pool and backend, `WINDOW` for the
/// rate interval.
fn expand(expr: &str) -> String {
    expr.replace("$__rate_interval", WINDOW)
        .replace("$__interval", WINDOW)
        .replace("$pool", ".*")
        .replace("$backend", ".*")
}

/// Every `(panel title, expr)` of the dashboard, rows' nested panels included.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("every target has an expr");
                out.push((p["title"].as_str().unwrap().to_string(), expr.to_string()));
            }
            if let Some(nested) = p["panels"].as_array() {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dash["panels"].as_array().unwrap(), &mut out);
    out
}

async fn api(client: &reqwest::Client, base: &str, path: &str, query: &[(&str, &str)]) -> Value {
    let resp = client
        .get(format!("{base}{path}"))
        .query(query)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert!(status.is_success(), "{path} {query:?}: {status} {body}");
    assert_eq!(body["status"], "success", "{body}");
    body["data"].clone()
}

async fn instant(client: &reqwest::Client, base: &str, expr: &str) -> Vec<Value> {
    let data = api(client, base, "/api/v1/query", &[("query", expr)]).await;
    data["result"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_has_data_in_a_real_prometheus() {
    let Some(prometheus) = tool::find(&["prometheus"], "Debian package prometheus") else {
        return;
    };
    let dir = TempDir::new("prometheus");
    let (_fleet, backends) = fleet::start(3, MODEL, &[]);
    let urls: Vec<&str> = backends.iter().map(|(_, u)| u.as_str()).collect();
    let port = |u: &str| u.rsplit(':').next().unwrap().to_string();
    // Two static backends; the third found by DNS (`localhost`), as a Kubernetes pool is.
    let yaml = common::config_yaml(
        &format!(
            "  {MODEL}:\n    backends:\n      - {{name: sim-0, url: '{}'}}\n      - {{name: sim-1, url: '{}'}}\n  discovered:\n    discover: {{dns: 'localhost:{}', interval: 1s, family: ipv4}}\n",
            urls[0],
            urls[1],
            port(urls[2])
        ),
        &format!(
            "admin: {{token: {TOKEN}}}\nroutes:\n  - {{name: chat, pool: {MODEL}, ttft_slo: 10s, first_token_deadline: {{after: 30s}}, hedge: {{after: 20s, budget: 0.01}}, match: {{model: {MODEL}}}}}\n  - {{name: other, pool: discovered}}\nrate_limits:\n  routes:\n    chat: {{requests_per_minute: 100000}}\n"
        ),
    );
    let gw = Gateway::start_process(&yaml);

    let rules = Path::new(ROOT).join("deploy/prometheus/pronto-rules.yaml");
    let config = dir.0.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: pronto\n    authorization: {{credentials: {TOKEN}}}\n    static_configs: [{{targets: ['{}']}}]\n",
            rules.display(),
            gw.admin
        ),
    )
    .unwrap();
    let (_prom, base) = start_prometheus(&prometheus, &dir.0, &config);
    let client = reqwest::Client::new();

    // 20 s of the seeded synthetic workload through the gateway.
    let out: PathBuf = dir.0.join("replay");
    let replay = tokio::task::spawn_blocking({
        let target = gw.url("");
        let out = out.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_pronto"))
                .args(["replay", "--target", target.trim_end_matches('/')])
                .args(["--model", MODEL, "--duration", "20s"])
                .arg("--out")
                .arg(&out)
                .env("RUST_LOG", "warn")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        replay.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let sent = summary["requests"].as_f64().unwrap();
    assert!(sent > 0.0, "{summary}");

    // Until Prometheus has scraped the end of the load.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = instant(&client, &base, "sum(pronto_requests_total)").await;
        let seen = r
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if seen >= sent {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus saw {seen} of {sent} requests"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("deploy/grafana/pronto.json")).unwrap(),
    )
    .unwrap();
    let queries = dashboard_queries(&dash);
    assert!(queries.len() >= 30, "{} queries", queries.len());
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let result = instant(&client, &base, &expand(expr)).await;
        if result.is_empty() {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "panel queries without data:\n{}",
        empty.join("\n")
    );

    // The numbers that matter are live, not only present.
    let positive = |r: &[Value]| {
        r.iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v.is_finite() && v > 0.0)
        })
    };
    for expr in [
        "sum(rate(pronto_requests_total[1m]))",
        "histogram_quantile(0.99, sum by (pool, le) (rate(pronto_client_ttft_seconds_bucket[1m])))",
        "sum by (backend) (rate(pronto_ttft_prediction_abs_error_seconds_count[1m]))",
        "pronto_discovery_backends{pool=\"discovered\"}",
    ] {
        let r = instant(&client, &base, expr).await;
        assert!(positive(&r), "{expr}: {r:?}");
    }

    // The template variables list the pools and backends.
    for (var, want) in [("pool", MODEL), ("backend", "sim-0")] {
        let def = dash["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == var)
            .unwrap();
        let q = def["query"]["query"].as_str().unwrap();
        let (metric, label) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.split_once(", "))
            .unwrap_or_else(|| panic!("{q}: not label_values(metric, label)"));
        let values = api(
            &client,
            &base,
            &format!("/api/v1/label/{label}/values"),
            &[("match[]", metric)],
        )
        .await;
        assert!(
            values.as_array().unwrap().iter().any(|v| v == want),
            "${var}: {values}"
        );
    }

    // The alert rules evaluate on these series without error, and those whose condition is
    // false on a healthy run are inactive (pending or firing would be a false alarm). The
    // prediction-error alert is left out: a TTFT model that is still learning may be
    // pending on a cold 20 s run, and its `for: 15m` keeps it from firing.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let groups = api(&client, &base, "/api/v1/rules", &[]).await;
        let rules: Vec<Value> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        assert_eq!(rules.len(), 5, "{groups}");
        let evaluated = rules.iter().all(|r| r["health"] == "ok");
        if evaluated {
            for r in &rules {
                if r["name"] != "ProntoTTFTPredictionErrorHigh" {
                    assert_eq!(r["state"], "inactive", "{r}");
                }
            }
            break;
        }
        let bad: Vec<&Value> = rules.iter().filter(|r| r["health"] == "err").collect();
        assert!(bad.is_empty(), "rules failing: {bad:?}");
        assert!(Instant::now() < deadline, "rules not evaluated: {groups}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
