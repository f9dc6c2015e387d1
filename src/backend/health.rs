//! Active health checks: `GET <url><health.path>` on every backend each `health.interval`.
//!
//! A check passes on any 2xx within `health.timeout`. The checker reads the current
//! [`GatewayState`] on every round, so a reload's backends are picked up without restarting it.
//! Passive ejection lives on [`super::Backend`]; an ejected backend is re-admitted once its
//! ejection period is over and its active check passes.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use futures::future::join_all;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::gateway::GatewayState;

/// The active health checker (a pingora background service).
#[derive(Debug)]
pub struct HealthChecker {
    state: Arc<ArcSwap<GatewayState>>,
}

impl HealthChecker {
    /// A checker over whatever state is current.
    pub fn new(state: Arc<ArcSwap<GatewayState>>) -> HealthChecker {
        HealthChecker { state }
    }

    /// Run one round of checks over every backend. A backend that goes down has its prefix
    /// index entries forgotten (its cache will be cold or gone when it returns); expired index
    /// entries are swept.
    pub async fn check_all(&self) {
        let state = self.state.load_full();
        let health = &state.config.health;
        let checks = state.pools.values().flat_map(|pool| {
            pool.backends.iter().enumerate().map(move |(i, b)| {
                let url = format!("{}{}", b.config.base_url(), health.path);
                let req = b.http.get(url).timeout(health.timeout).send();
                async move {
                    let ok = matches!(req.await, Ok(r) if r.status().is_success());
                    let now = Instant::now();
                    let was_healthy = b.is_healthy(now);
                    if !ok {
                        tracing::debug!(backend = %b.name(), "active health check failed");
                    }
                    b.record_active_check(ok, now);
                    if was_healthy && !ok {
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
