//! Active health checks: `GET <url><health.path>` on every backend each `health.interval`.
//!
//! A check passes on any 2xx within `health.timeout`. The checker reads the current
//! [`GatewayState`](crate::state::GatewayState) on every round, so a reload's backends are picked up without restarting it.
//! Passive ejection lives on [`crate::backend::Backend`]; an ejected backend is re-admitted once its
//! ejection period is over and its active check passes.
//!
//! A failed check is counted in `pronto_health_check_failures_total{backend,reason}` (the
//! reason is a [`CheckFailure`]: `status`, `timeout`, `refused`, `connect`, `io`) and the
//! backend's transitions are logged, not its probes ([`crate::backend::lifecycle`]): `backend down`
//! with the reason at the first failure, a rate-limited `backend still down` while it lasts,
//! `backend up` / `backend re-admitted` when it ends.

use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::backend::lifecycle::CheckFailure;
use crate::backend::Backend;
use crate::state::StateHandle;

/// The active health checker (a pingora background service).
#[derive(Debug)]
pub struct HealthChecker {
    state: StateHandle,
}

impl HealthChecker {
    /// A checker over whatever state is current.
    pub fn new(state: StateHandle) -> HealthChecker {
        HealthChecker { state }
    }

    /// Run one round of checks over every backend. A backend that goes down has its prefix
    /// index entries forgotten (its cache will be cold or gone when it returns); expired index
    /// entries are swept.
    pub async fn check_all(&self) {
        let state = self.state.load();
        let health = &state.config.health;
        let checks = state.pools.values().flat_map(|pool| {
            pool.backends.iter().enumerate().map(move |(i, b)| {
                let url = format!("{}{}", b.config.base_url(), health.path);
                let req = b.http.get(url).timeout(health.timeout).send();
                async move {
                    let result = match req.await {
                        Ok(r) if r.status().is_success() => Ok(()),
                        Ok(r) => Err(CheckFailure::Status(r.status().as_u16())),
                        Err(e) => Err(CheckFailure::from_reqwest(&e)),
                    };
                    if !self.is_current(b) {
                        // A reload dropped it while the probe was out: record nothing, so
                        // its series stay forgotten.
                        return;
                    }
                    let now = Instant::now();
                    let was_healthy = b.is_healthy(now);
                    b.record_check(result, now);
                    if was_healthy && result.is_err() {
                        pool.forget(i);
                    }
                }
            })
        });
        join_all(checks).await;
        let now = Instant::now();
        for pool in state.pools.values() {
            pool.index.sweep(now);
        }
    }

    /// Whether `b` is still a backend of the current state.
    fn is_current(&self, b: &Arc<Backend>) -> bool {
        self.state.load().backends.iter().any(|o| Arc::ptr_eq(o, b))
    }
}

#[async_trait::async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.check_all().await;
            let interval = self.state.load().config.health.interval;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::get;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::backend::log_capture;
    use crate::backend::HealthChange;
    use crate::config::Config;
    use crate::state::GatewayState;
    use crate::telemetry::Metrics;

    /// `GET /health` answering with whatever status `status` holds; counts probes.
    async fn serve(status: Arc<AtomicU16>) -> (SocketAddr, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&hits);
        let app = axum::Router::new()
            .route(
                "/health",
                get(move |State(s): State<Arc<AtomicU16>>| async move {
                    h.fetch_add(1, Ordering::Relaxed);
                    StatusCode::from_u16(s.load(Ordering::Relaxed)).unwrap()
                }),
            )
            .with_state(status);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, hits)
    }

    fn state(addrs: &[SocketAddr], metrics: &Metrics) -> StateHandle {
        let mut yaml =
            String::from("health: { interval: 1s, timeout: 500ms }\npools:\n  m:\n    backends:\n");
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

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[tokio::test]
    async fn failures_are_counted_by_reason_and_the_backend_goes_down_and_up() {
        let status = Arc::new(AtomicU16::new(503));
        let (flaky, hits) = serve(Arc::clone(&status)).await;
        // Nothing listens on a port whose listener was dropped (never rebound here).
        let refused = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let metrics = Metrics::new();
        let st = state(&[flaky, refused], &metrics);
        let checker = HealthChecker::new(st.clone());
        let s = st.load();
        let (b0, b1) = (&s.backends[0], &s.backends[1]);

        for _ in 0..3 {
            checker.check_all().await;
        }
        assert_eq!(hits.load(Ordering::Relaxed), 3);
        let now = Instant::now();
        assert!(!b0.is_healthy(now) && !b1.is_healthy(now));
        let text = metrics.render();
        let failures = |b: &str, r: &str| {
            value(
                &text,
                &format!("pronto_health_check_failures_total{{backend=\"{b}\",reason=\"{r}\"}}"),
            )
        };
        assert_eq!(failures("b0", "status"), Some(3.0));
        assert_eq!(failures("b1", "refused"), Some(3.0));
        assert_eq!(failures("b0", "refused"), None);
        assert_eq!(
            value(&text, "pronto_backend_healthy{backend=\"b0\"}"),
            Some(0.0)
        );

        status.store(200, Ordering::Relaxed);
        checker.check_all().await;
        assert!(b0.is_healthy(Instant::now()));
        assert!(!b1.is_healthy(Instant::now()));
        let text = metrics.render();
        assert_eq!(
            value(&text, "pronto_backend_healthy{backend=\"b0\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "pronto_health_check_failures_total{backend=\"b0\",reason=\"status\"}"
            ),
            Some(3.0),
            "a pass counts nothing"
        );
    }

    /// The log over a backend's life through the checker: many failed probes are one
    /// `down` line with the reason, the recovery one `up` line; a passive ejection one line,
    /// its re-admission one line once the period is over and a check passes. Nothing per
    /// probe.
    #[tokio::test]
    async fn the_log_shows_transitions_not_probes() {
        let (log, _guard) = log_capture::capture();
        let status = Arc::new(AtomicU16::new(503));
        let (flaky, hits) = serve(Arc::clone(&status)).await;
        let metrics = Metrics::new();
        let st = state(&[flaky], &metrics);
        let checker = HealthChecker::new(st.clone());
        let b = Arc::clone(&st.load().backends[0]);

        for _ in 0..5 {
            checker.check_all().await;
        }
        assert_eq!(hits.load(Ordering::Relaxed), 5);
        let down = ["backend down", "b0", "HTTP status 503"];
        assert_eq!(log.count(&down), 1, "{}", log.text());
        assert_eq!(log.count(&["still down"]), 0, "no repeat within 30 s");
        status.store(200, Ordering::Relaxed);
        for _ in 0..3 {
            checker.check_all().await;
        }
        assert_eq!(
            log.count(&["backend up", "b0", "failures=5"]),
            1,
            "{}",
            log.text()
        );

        // Passive ejection (three failed requests), checks passing meanwhile.
        let (eject_after, readmit_after) = (3, Duration::from_secs(10));
        let t0 = Instant::now();
        let ejected: Vec<bool> = (0..eject_after)
            .map(|_| b.record_failure(t0, eject_after, readmit_after))
            .collect();
        assert_eq!(ejected, [false, false, true]);
        assert_eq!(log.count(&["backend ejected", "b0", "failures=3"]), 1);
        let ejections = "pronto_backend_ejections_total{backend=\"b0\"}";
        assert_eq!(
            value(&metrics.render(), ejections),
            Some(1.0),
            "counted once"
        );
        checker.check_all().await;
        assert!(b.is_ejected(Instant::now()));
        assert_eq!(log.count(&["re-admitted"]), 0, "not while the period lasts");
        let after = t0 + readmit_after + Duration::from_secs(1);
        assert_eq!(
            b.record_check(Ok(()), after),
            Some(HealthChange::Readmitted)
        );
        assert_eq!(b.record_check(Ok(()), after), None);
        assert_eq!(
            log.count(&["backend re-admitted", "b0"]),
            1,
            "{}",
            log.text()
        );

        // Every line of the lot: down, up, ejected, re-admitted.
        let lines = log
            .text()
            .lines()
            .filter(|l| l.contains("backend=\"b0\""))
            .count();
        assert_eq!(lines, 4, "{}", log.text());
    }

    #[tokio::test]
    async fn a_slow_backend_fails_by_timeout() {
        let app = axum::Router::new().route(
            "/health",
            get(|| async {
                std::future::pending::<()>().await;
                StatusCode::OK
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let metrics = Metrics::new();
        let st = state(&[addr], &metrics);
        HealthChecker::new(st.clone()).check_all().await;
        assert_eq!(
            value(
                &metrics.render(),
                "pronto_health_check_failures_total{backend=\"b0\",reason=\"timeout\"}"
            ),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn a_backend_dropped_by_a_reload_mid_probe_records_nothing() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new();
        let st = state(&[addr], &metrics);
        // The reload: the same config built afresh, so `b0` is a new backend instance.
        let reloaded = state(&[addr], &metrics).load();
        let (swap, next) = (st.clone(), Arc::clone(&reloaded));
        let app = axum::Router::new().route(
            "/health",
            get(move || {
                let (swap, next) = (swap.clone(), Arc::clone(&next));
                async move {
                    // The reload lands while this probe is out, and the old series go.
                    swap.store(next);
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let old = st.load();
        metrics.forget_backend("b0");
        HealthChecker::new(st.clone()).check_all().await;
        assert!(!Arc::ptr_eq(&st.load().backends[0], &old.backends[0]));
        assert!(old.backends[0].is_healthy(Instant::now()), "not recorded");
        assert_eq!(
            value(
                &metrics.render(),
                "pronto_health_check_failures_total{backend=\"b0\",reason=\"status\"}"
            ),
            None
        );
        // The next round probes the new instance and records it.
        HealthChecker::new(st.clone()).check_all().await;
        assert_eq!(
            value(
                &metrics.render(),
                "pronto_health_check_failures_total{backend=\"b0\",reason=\"status\"}"
            ),
            Some(1.0)
        );
    }
}
