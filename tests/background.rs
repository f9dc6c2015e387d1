//! The background loops end to end, through the real binary: active health checks, engine
//! scrapes and KV-event connects that fail are counted in `/metrics`; a backend that leaves
//! the config by reload leaves no series behind.

mod common;

use std::net::TcpListener;

use common::{
    config_yaml, metric_value, metrics_when, post_reload, Behavior, Gateway, TestBackend,
};

/// A port with nothing listening (bound, then released; nothing here binds it again).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn pool(backends: &[(&str, String, String)]) -> String {
    let mut s = String::from(
        "  m:\n    policy: least_inflight\n    scrape: {interval: 50ms}\n    backends:\n",
    );
    for (name, url, extra) in backends {
        s.push_str(&format!("      - {{name: {name}, url: '{url}'{extra}}}\n"));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_and_a_removed_backend_leaves_no_series() {
    let sick = TestBackend::start(
        "sick",
        Behavior {
            healthy: false,
            ..Behavior::default()
        },
    )
    .await;
    let well = TestBackend::start("well", Behavior::default()).await;
    let kv = format!(
        ", kv_events: {{endpoint: 'tcp://127.0.0.1:{}', block_size: 16}}",
        closed_port()
    );
    let both = pool(&[
        ("sick", sick.url(), kv.clone()),
        ("well", well.url(), String::new()),
    ]);
    // A refusing backend for the scraper: its /metrics fails (the test backends have none,
    // which is a 404 and no error).
    let refused = format!("http://127.0.0.1:{}", closed_port());
    let with_refused = format!(
        "{both}  n:\n    scrape: {{interval: 50ms}}\n    backends:\n      - {{name: gone, url: '{refused}'}}\n"
    );
    let gw = Gateway::start(&config_yaml(&with_refused, "reload: {watch: false}\n"));

    let health = "pronto_health_check_failures_total{backend=\"sick\",reason=\"status\"}";
    let refused_health = "pronto_health_check_failures_total{backend=\"gone\",reason=\"refused\"}";
    let connects = "pronto_kv_events_connect_failures_total{backend=\"sick\"}";
    let scrapes = "pronto_engine_scrape_errors_total{backend=\"gone\"}";
    let text = metrics_when(&gw, |m| {
        [health, refused_health, connects, scrapes]
            .iter()
            .all(|s| metric_value(m, s).is_some_and(|v| v >= 2.0))
    })
    .await;
    for s in [health, refused_health, connects, scrapes] {
        assert!(
            metric_value(&text, s).is_some_and(|v| v >= 2.0),
            "{s}\n{text}"
        );
    }
    assert_eq!(
        metric_value(&text, "pronto_backend_healthy{backend=\"sick\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&text, "pronto_engine_scrape_errors_total{backend=\"well\"}"),
        Some(0.0),
        "a 404 is not a scrape error (the series exists at zero)"
    );
    // Every reason's series exists from start-up; a healthy backend's all read zero.
    for reason in ["status", "timeout", "refused", "connect", "io"] {
        let series =
            format!("pronto_health_check_failures_total{{backend=\"well\",reason=\"{reason}\"}}");
        assert_eq!(metric_value(&text, &series), Some(0.0), "{series}");
    }
    assert_eq!(
        metric_value(
            &text,
            "pronto_kv_events_connect_failures_total{backend=\"well\"}"
        ),
        None,
        "no KV-event series without kv_events"
    );

    // The sick backend and pool `n` leave the config: every series of theirs goes.
    gw.write_config(&config_yaml(
        &pool(&[("well", well.url(), String::new())]),
        "reload: {watch: false}\n",
    ));
    let (status, report) = post_reload(&gw).await;
    assert_eq!(status, 200, "{report}");
    let text = metrics_when(&gw, |m| {
        !m.contains("backend=\"sick\"") && !m.contains("backend=\"gone\"")
    })
    .await;
    assert!(!text.contains("backend=\"sick\""), "{text}");
    assert!(!text.contains("backend=\"gone\""), "{text}");
    assert_eq!(
        metric_value(&text, "pronto_backend_healthy{backend=\"well\"}"),
        Some(1.0)
    );
    // And they stay gone: no loop still holding them records again.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let later = metrics_when(&gw, |_| true).await;
    assert!(!later.contains("backend=\"sick\""), "{later}");
    assert!(!later.contains("backend=\"gone\""), "{later}");
}
