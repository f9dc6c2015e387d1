//! The scraper against in-process HTTP servers on 127.0.0.1:0, one per behaviour.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::*;
use crate::backend::STALE_AFTER_FAILURES;
use crate::config::Config;
use crate::telemetry::Metrics;
use pronto_core::engine::MIN_STALE_AFTER;

const VLLM: &str = include_str!("../../crates/pronto-core/tests/fixtures/metrics/vllm.txt");

/// Serves `GET /metrics` with a fixed status and body; counts hits.
async fn serve(status: StatusCode, body: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move |State(h): State<Arc<AtomicUsize>>| async move {
                h.fetch_add(1, Ordering::Relaxed);
                (status, body)
            }),
        )
        .with_state(Arc::clone(&hits));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, hits)
}

/// A port with nothing listening (bound, then closed).
async fn closed_port() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

fn state(addrs: &[SocketAddr], metrics: &Metrics) -> Arc<ArcSwap<GatewayState>> {
    let mut yaml = String::from("pools:\n  m:\n    backends:\n");
    for (i, a) in addrs.iter().enumerate() {
        yaml.push_str(&format!("      - {{ name: b{i}, url: \"http://{a}\" }}\n"));
    }
    let config = Config::from_yaml_str(&yaml, "test").unwrap();
    Arc::new(ArcSwap::from_pointee(GatewayState::new(
        Arc::new(config),
        Default::default(),
        metrics,
    )))
}

fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

#[tokio::test]
async fn scrapes_store_samples_count_errors_and_back_off_on_404() {
    let (ok, _) = serve(StatusCode::OK, VLLM).await;
    let (absent, absent_hits) = serve(StatusCode::NOT_FOUND, "not found").await;
    let (err, _) = serve(StatusCode::INTERNAL_SERVER_ERROR, VLLM).await;
    let (garbage, _) = serve(StatusCode::OK, "<html>hello</html>").await;
    let refused = closed_port().await;
    let metrics = Metrics::new();
    let st = state(&[ok, absent, err, garbage, refused], &metrics);
    let scraper = EngineScraper::with_interval(Arc::clone(&st), Duration::from_millis(50));
    assert_eq!(scraper.stale_after(), MIN_STALE_AFTER);

    scraper.scrape_all().await;
    let s = st.load_full();
    let now = Instant::now();
    let e = s.backends[0].view(now).engine.expect("fresh vLLM sample");
    assert_eq!((e.waiting, e.running), (4.0, 12.0));
    assert!((e.kv_usage - 0.35).abs() < 1e-9);
    assert!(e.age_s >= 0.0);
    for b in &s.backends[1..] {
        assert_eq!(b.view(now).engine, None, "{}", b.name());
    }
    assert!(s.backends[1].state.engine.no_metrics());
    assert_eq!(s.backends[1].state.engine.consecutive_failures(), 0);

    // Two more rounds: the 404 backend is not asked again; the failing ones reach 3.
    scraper.scrape_all().await;
    let outcome = scraper.scrape(&s.backends[1]).await;
    assert!(matches!(outcome, ScrapeOutcome::Skipped), "{outcome:?}");
    scraper.scrape_all().await;
    assert_eq!(absent_hits.load(Ordering::Relaxed), 1);
    for b in &s.backends[2..] {
        assert_eq!(b.state.engine.consecutive_failures(), 3, "{}", b.name());
    }
    match scraper.scrape(&s.backends[2]).await {
        ScrapeOutcome::Failed(ScrapeError::Status(500)) => {}
        other => panic!("{other:?}"),
    }
    match scraper.scrape(&s.backends[3]).await {
        ScrapeOutcome::Failed(ScrapeError::Parse(EngineMetricsError::UnknownFormat)) => {}
        other => panic!("{other:?}"),
    }
    match scraper.scrape(&s.backends[4]).await {
        ScrapeOutcome::Failed(ScrapeError::Http(_)) => {}
        other => panic!("{other:?}"),
    }

    let text = metrics.render();
    assert_eq!(
        metric(&text, "pronto_backend_queue_depth{backend=\"b0\"}"),
        Some(4.0)
    );
    assert_eq!(
        metric(&text, "pronto_backend_kv_usage_ratio{backend=\"b0\"}"),
        Some(0.35)
    );
    for b in ["b2", "b3", "b4"] {
        let line = format!("pronto_engine_scrape_errors_total{{backend=\"{b}\"}}");
        assert_eq!(metric(&text, &line), Some(4.0), "{b}");
        let depth = format!("pronto_backend_queue_depth{{backend=\"{b}\"}}");
        assert_eq!(metric(&text, &depth), None, "{b}");
    }
    assert_eq!(
        metric(&text, "pronto_engine_scrape_errors_total{backend=\"b1\"}"),
        None
    );

    let json = s.backends[0].admin_json(Instant::now());
    assert_eq!(json["engine"]["status"], "fresh");
    assert_eq!(json["engine"]["flavor"], "vllm");
    assert_eq!(json["engine"]["waiting"], 4.0);
    assert_eq!(
        s.backends[1].admin_json(now)["engine"]["status"],
        "no_metrics"
    );
}

#[tokio::test]
async fn a_failing_backend_turns_stale_and_its_gauges_are_withdrawn() {
    let (ok, _) = serve(StatusCode::OK, VLLM).await;
    let metrics = Metrics::new();
    let st = state(&[ok], &metrics);
    let scraper = EngineScraper::new(Arc::clone(&st));
    scraper.scrape_all().await;
    let b = Arc::clone(&st.load().backends[0]);
    assert!(metrics
        .render()
        .contains("pronto_backend_queue_depth{backend=\"b0\"} 4"));
    // The same backend now fails: simulate with direct failure records.
    for _ in 0..STALE_AFTER_FAILURES {
        assert!(b.view(Instant::now()).engine.is_some());
        b.record_engine_failure(&"test failure");
    }
    assert_eq!(b.view(Instant::now()).engine, None);
    assert!(!metrics
        .render()
        .contains("pronto_backend_queue_depth{backend=\"b0\"}"));
    // A good scrape restores it.
    scraper.scrape_all().await;
    assert!(b.view(Instant::now()).engine.is_some());
    assert!(metrics
        .render()
        .contains("pronto_backend_queue_depth{backend=\"b0\"} 4"));
}

#[tokio::test]
async fn service_scrapes_repeatedly_until_shutdown() {
    let (ok, hits) = serve(StatusCode::OK, VLLM).await;
    let metrics = Metrics::new();
    let st = state(&[ok], &metrics);
    let scraper = Arc::new(EngineScraper::with_interval(st, Duration::from_millis(20)));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let s2 = Arc::clone(&scraper);
    let task = tokio::spawn(async move { s2.start(rx).await });
    // Wait (bounded) for several rounds; no assertion on how long they took.
    for _ in 0..500 {
        if hits.load(Ordering::Relaxed) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hits.load(Ordering::Relaxed) >= 3);
    tx.send(true).unwrap();
    task.await.unwrap();
    let after = hits.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        hits.load(Ordering::Relaxed),
        after,
        "no scrapes after shutdown"
    );
}
