//! Engine metrics scraping: `GET <url>/metrics` on every backend each `interval`.
//!
//! The [`EngineScraper`] is a pingora background service, like the health checker. Each round
//! it reads the current [`GatewayState`] (so a reload's backends are picked up), scrapes every
//! due backend concurrently over the backend's own `reqwest` client (connections are reused), parses
//! the page ([`EngineSample::parse`]) and stores the result on the backend
//! ([`Backend::record_engine_sample`]), which also sets `pronto_backend_queue_depth` and
//! `pronto_backend_kv_usage_ratio`.
//!
//! Knobs (constants; [`EngineScraper::with_interval`] for tests):
//! - `interval` ([`DEFAULT_INTERVAL`], 250 ms): rounds start this often; a slow round delays
//!   the next instead of piling up.
//! - `timeout` ([`DEFAULT_TIMEOUT`], 500 ms): a whole scrape (connect to end of body); a hung
//!   backend delays its round by at most this.
//! - `stale_after` = max(4 × interval, [`MIN_STALE_AFTER`] 2 s): how long a sample is trusted
//!   (see `engine_state.rs`; three failures in a row distrust it at once).
//! - A 404 means "not an engine": that backend is scraped again only after
//!   [`NO_METRICS_RETRY`] (30 s). Bodies over [`MAX_BODY_BYTES`] are refused.
//!
//! Every other failure (connect error, timeout, non-2xx, unparsable page) counts in
//! `pronto_engine_scrape_errors_total{backend}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures::future::join_all;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use super::engine_metrics::{EngineMetricsError, EngineSample};
use super::Backend;
use crate::gateway::GatewayState;

/// Default time between scrape rounds.
pub const DEFAULT_INTERVAL: Duration = pronto_core::engine::DEFAULT_SCRAPE_INTERVAL;
/// Default limit on one scrape, connect to end of body.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a backend that answered 404 is left alone.
pub const NO_METRICS_RETRY: Duration = Duration::from_secs(30);
/// Largest metrics page accepted.
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// Connect, I/O or timeout.
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// A non-2xx status other than 404.
    #[error("HTTP status {0}")]
    Status(u16),
    /// The page exceeded [`MAX_BODY_BYTES`].
    #[error("metrics page larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    /// The page is not UTF-8.
    #[error("metrics page is not UTF-8")]
    NotUtf8,
    /// The page is not engine metrics.
    #[error(transparent)]
    Parse(#[from] EngineMetricsError),
}

/// What one scrape of one backend came to.
#[derive(Debug)]
pub enum ScrapeOutcome {
    /// A good page.
    Sample(EngineSample),
    /// 404: the backend exports no metrics.
    NoMetrics,
    /// Anything else.
    Failed(ScrapeError),
    /// Not due yet (it answered 404 recently).
    Skipped,
}

/// The engine metrics scraper (a pingora background service).
#[derive(Debug)]
pub struct EngineScraper {
    state: Arc<ArcSwap<GatewayState>>,
    interval: Duration,
    timeout: Duration,
    stale_after: Duration,
}

impl EngineScraper {
    /// A scraper with the default interval over whatever state is current.
    pub fn new(state: Arc<ArcSwap<GatewayState>>) -> EngineScraper {
        EngineScraper::with_interval(state, DEFAULT_INTERVAL)
    }

    /// A scraper with its own interval; staleness follows (`max(4 × interval, 2 s)`).
    pub fn with_interval(state: Arc<ArcSwap<GatewayState>>, interval: Duration) -> EngineScraper {
        EngineScraper {
            state,
            interval,
            timeout: DEFAULT_TIMEOUT,
            stale_after: pronto_core::engine::stale_after(interval),
        }
    }

    /// How long a sample taken by this scraper is trusted.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// One round: scrape every due backend of the current state concurrently and record the
    /// outcomes on the backends.
    pub async fn scrape_all(&self) {
        let state = self.state.load_full();
        join_all(state.backends.iter().map(|b| self.scrape(b))).await;
    }

    /// Scrape one backend (unless it is not due) and record the outcome on it.
    pub async fn scrape(&self, b: &Backend) -> ScrapeOutcome {
        if !b.state.engine.is_due(Instant::now()) {
            return ScrapeOutcome::Skipped;
        }
        let outcome = match self.fetch(b).await {
            Ok(Some(text)) => match EngineSample::parse(&text) {
                Ok(s) => ScrapeOutcome::Sample(s),
                Err(e) => ScrapeOutcome::Failed(e.into()),
            },
            Ok(None) => ScrapeOutcome::NoMetrics,
            Err(e) => ScrapeOutcome::Failed(e),
        };
        let now = Instant::now();
        match &outcome {
            ScrapeOutcome::Sample(s) => b.record_engine_sample(*s, now, self.stale_after),
            ScrapeOutcome::NoMetrics => b.record_engine_absent(now, NO_METRICS_RETRY),
            ScrapeOutcome::Failed(e) => b.record_engine_failure(e),
            ScrapeOutcome::Skipped => {}
        }
        outcome
    }

    /// The page, or `None` on 404.
    async fn fetch(&self, b: &Backend) -> Result<Option<String>, ScrapeError> {
        let url = format!("{}/metrics", b.config.base_url());
        let mut resp = b.http.get(url).timeout(self.timeout).send().await?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(ScrapeError::Status(status.as_u16()));
        }
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(ScrapeError::TooLarge);
        }
        let mut body = Vec::with_capacity(resp.content_length().unwrap_or(16 << 10) as usize);
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ScrapeError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body)
            .map(Some)
            .map_err(|_| ScrapeError::NotUtf8)
    }
}

#[async_trait::async_trait]
impl BackgroundService for EngineScraper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.scrape_all().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
#[path = "scrape_tests.rs"]
mod tests;
