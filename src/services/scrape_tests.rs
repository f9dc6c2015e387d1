//! The scraper against in-process HTTP servers on 127.0.0.1:0, one per behaviour.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::*;
use crate::backend::log_capture;
use crate::config::Config;
use crate::telemetry::Metrics;
use pronto_core::engine::MIN_STALE_AFTER;
use pronto_core::engine::STALE_AFTER_FAILURES;

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

fn state(addrs: &[SocketAddr], metrics: &Metrics) -> StateHandle {
    state_with(addrs, metrics, "")
}

/// A state whose pool `m` has `pool_extra` (e.g. a `scrape:` line) before its backends.
fn state_with(addrs: &[SocketAddr], metrics: &Metrics, pool_extra: &str) -> StateHandle {
    let mut yaml = format!("pools:\n  m:\n{pool_extra}    backends:\n");
    for (i, a) in addrs.iter().enumerate() {
        yaml.push_str(&format!("      - {{ name: b{i}, url: \"http://{a}\" }}\n"));
    }
    let config = Config::from_yaml_str(&yaml, "test").unwrap();
    StateHandle::new(GatewayState::new(
        Arc::new(config),
        Default::default(),
        metrics,
    ))
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
    let scraper = EngineScraper::with_interval(st.clone(), Duration::from_millis(50));
    assert_eq!(scraper.stale_after(), MIN_STALE_AFTER);

    scraper.scrape_all().await;
    let s = st.load();
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
    let scraper = EngineScraper::new(st.clone());
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

/// Serves `GET /metrics`: the vLLM page while `failing` is false, else a 500; counts hits.
async fn serve_toggle(failing: Arc<AtomicBool>) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move |State(f): State<Arc<AtomicBool>>| async move {
                h.fetch_add(1, Ordering::Relaxed);
                if f.load(Ordering::Relaxed) {
                    (StatusCode::INTERNAL_SERVER_ERROR, "down")
                } else {
                    (StatusCode::OK, VLLM)
                }
            }),
        )
        .with_state(failing);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, hits)
}

/// Poll `cond` every 5 ms, at most `tries` times; whether it came true.
async fn eventually(tries: usize, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..tries {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

#[test]
fn the_delay_doubles_per_failure_up_to_the_cap_and_resets() {
    let i = Duration::from_millis(250);
    assert_eq!(next_delay(i, 0), i);
    assert_eq!(next_delay(i, 1), Duration::from_millis(500));
    assert_eq!(next_delay(i, 2), Duration::from_secs(1));
    assert_eq!(next_delay(i, 6), Duration::from_secs(16));
    assert_eq!(next_delay(i, 7), MAX_BACKOFF);
    assert_eq!(next_delay(i, u64::MAX), MAX_BACKOFF, "no overflow");
    // An interval past the cap is never shortened.
    let slow = Duration::from_secs(60);
    assert_eq!(next_delay(slow, 3), slow);
    let mut prev = Duration::ZERO;
    for n in 0..64 {
        let d = next_delay(Duration::from_millis(10), n);
        assert!(
            d >= prev && d <= MAX_BACKOFF,
            "monotonic and bounded at {n}"
        );
        prev = d;
    }
}

/// The service against real sockets at the pool's own `scrape.interval` (10 ms): a backend
/// answering 500 and one refusing connections are backed off (the number of scrapes in a
/// window is bounded by the doubling delays, whatever the machine's speed: a slow machine
/// only scrapes less); the 500 one recovers and is scraped at its interval again.
#[tokio::test]
async fn a_failing_backend_is_backed_off_and_resumes_its_interval_on_recovery() {
    let (log, _guard) = log_capture::capture();
    let failing = Arc::new(AtomicBool::new(false));
    let (flaky, hits) = serve_toggle(Arc::clone(&failing)).await;
    let refused = closed_port().await;
    let metrics = Metrics::new();
    let st = state_with(
        &[flaky, refused],
        &metrics,
        "    scrape: { interval: 10ms }\n",
    );
    let scraper = Arc::new(EngineScraper::new(st.clone()));
    let (b0, b1) = {
        let s = st.load();
        (Arc::clone(&s.backends[0]), Arc::clone(&s.backends[1]))
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let s2 = Arc::clone(&scraper);
    let task = tokio::spawn(async move { s2.start(rx).await });

    // Healthy: scraped over and over at the interval.
    assert!(eventually(2000, || hits.load(Ordering::Relaxed) >= 10).await);
    assert!(b0.view(Instant::now()).engine.is_some());

    // Failing: a window of 800 ms holds at most the scrapes the doubling delays allow
    // (20 + 40 + 80 + 160 + 320 ms: six, plus one in flight at the switch), where the
    // interval alone would allow eighty. The refusing backend has been failing since the
    // start, so it is scraped even less.
    let errors = |b: &str| {
        metric(
            &metrics.render(),
            &format!("pronto_engine_scrape_errors_total{{backend=\"{b}\"}}"),
        )
        .unwrap_or(0.0)
    };
    failing.store(true, Ordering::Relaxed);
    let at_switch = (hits.load(Ordering::Relaxed), errors("b1"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let during = hits.load(Ordering::Relaxed) - at_switch.0;
    assert!(
        during <= 8,
        "{during} scrapes of a failing backend in the window"
    );
    let refused_during = errors("b1") - at_switch.1;
    assert!(refused_during <= 8.0, "{refused_during} of a refusing one");
    assert!(
        eventually(4000, || scraper.failures(&b0) >= 3).await,
        "still probed"
    );
    assert!(errors("b1") >= 2.0);
    assert_eq!(errors("b0"), scraper.failures(&b0) as f64);
    assert_eq!(b0.view(Instant::now()).engine, None, "stale while failing");

    // Recovered: the first success resets the backoff; then scraped at the interval again
    // (thirty scrapes: under a second at 10 ms, several minutes at the cap).
    failing.store(false, Ordering::Relaxed);
    assert!(eventually(4000, || scraper.failures(&b0) == 0).await);
    let at_recovery = hits.load(Ordering::Relaxed);
    assert!(eventually(4000, || hits.load(Ordering::Relaxed) >= at_recovery + 30).await);
    assert!(b0.view(Instant::now()).engine.is_some());
    assert!(
        scraper.failures(&b1) >= 2,
        "the refusing one stays backed off"
    );

    tx.send(true).unwrap();
    task.await.unwrap();
    // One line per transition, not one per failed scrape.
    assert_eq!(
        log.count(&["engine metrics scrape failing", "b0"]),
        1,
        "{}",
        log.text()
    );
    assert_eq!(log.count(&["engine metrics scrape recovered", "b0"]), 1);
    assert_eq!(log.count(&["engine metrics scrape failing", "b1"]), 1);
    assert_eq!(
        log.count(&["scrape still failing"]),
        0,
        "no repeat within 30 s"
    );
}

#[tokio::test]
async fn a_backend_dropped_by_a_reload_mid_scrape_records_nothing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Metrics::new();
    let st = state(&[addr], &metrics);
    let reloaded = state(&[addr], &metrics).load();
    let (swap, next) = (st.clone(), Arc::clone(&reloaded));
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let (swap, next) = (swap.clone(), Arc::clone(&next));
            async move {
                swap.store(next);
                (StatusCode::INTERNAL_SERVER_ERROR, "down")
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let old = st.load();
    let scraper = EngineScraper::new(st.clone());
    let outcome = scraper.scrape(&old.backends[0]).await;
    assert!(matches!(
        outcome,
        ScrapeOutcome::Failed(ScrapeError::Status(500))
    ));
    assert_eq!(old.backends[0].state.engine.consecutive_failures(), 0);
    assert_eq!(scraper.failures(&old.backends[0]), 0);
    assert_eq!(
        metric(
            &metrics.render(),
            "pronto_engine_scrape_errors_total{backend=\"b0\"}"
        ),
        None
    );
}
