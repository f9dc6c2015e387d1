//! Engine metrics scraping: `GET <url>/metrics` on every backend, each on its own schedule.
//!
//! The [`EngineScraper`] is a pingora background service, like the health checker. It reads
//! the current [`GatewayState`] at every wake-up (so a reload's backends, and a changed
//! interval, are picked up), scrapes each backend that is due over the backend's own
//! `reqwest` client (connections are reused), parses the page ([`EngineSample::parse`]) and
//! stores the result on the backend ([`Backend::record_engine_sample`]), which also sets
//! `pronto_backend_queue_depth` and `pronto_backend_kv_usage_ratio`. Backends are scraped
//! independently: a hung one delays nobody else, and each has at most one scrape in flight.
//!
//! Knobs:
//! - `interval`: the pool's `scrape: {interval}` (default [`DEFAULT_INTERVAL`], 250 ms;
//!   [`EngineScraper::with_interval`] overrides every pool, for tests). While a backend's
//!   scrapes succeed, one starts every `interval`; a slow one delays the next instead of
//!   piling up.
//! - Backoff: after `n` failed scrapes in a row the next one waits [`next_delay`] =
//!   `interval × 2ⁿ`, at most [`MAX_BACKOFF`] (30 s), so a dead backend is not hammered; the
//!   first success returns it to `interval`.
//! - `timeout` ([`DEFAULT_TIMEOUT`], 500 ms): a whole scrape (connect to end of body).
//! - `stale_after` = `pronto_core::engine::stale_after(interval)` = max(4 × interval, 2 s):
//!   how long a sample is trusted (three failures in a row distrust it at once).
//! - A 404 means "not an engine": that backend is scraped again only after
//!   [`NO_METRICS_RETRY`] (30 s). Bodies over [`MAX_BODY_BYTES`] are refused.
//!
//! Every other failure (connect error, timeout, non-2xx, unparsable page) counts in
//! `pronto_engine_scrape_errors_total{backend}`, and the log shows transitions
//! ([`crate::backend::lifecycle`]): `engine metrics scrape failing` with the error at the first, a
//! rate-limited `still failing` while it lasts, `recovered` at the first success.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::backend::lifecycle::{Change, Condition};
use crate::backend::Backend;
use crate::state::GatewayState;
use crate::state::StateHandle;
use pronto_core::engine::{EngineMetricsError, EngineSample};
use pronto_core::ids::BackendId;

/// Default time between two scrapes of a backend.
pub const DEFAULT_INTERVAL: Duration = pronto_core::engine::DEFAULT_SCRAPE_INTERVAL;
/// Default limit on one scrape, connect to end of body.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a backend that answered 404 is left alone.
pub const NO_METRICS_RETRY: Duration = Duration::from_secs(30);
/// Longest wait between two scrapes of a failing backend.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Largest metrics page accepted.
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// Longest the service sleeps before looking at the state again (new backends, reloads).
const RESCAN: Duration = DEFAULT_INTERVAL;

/// Delay before the next scrape of a backend scraped every `interval` after `failures`
/// failed scrapes in a row: `interval` while they succeed, then `interval × 2^failures`, at
/// most [`MAX_BACKOFF`] (never less than `interval`).
pub fn next_delay(interval: Duration, failures: u64) -> Duration {
    if failures == 0 {
        return interval;
    }
    let factor = 1u32 << failures.min(31);
    interval
        .saturating_mul(factor)
        .min(MAX_BACKOFF)
        .max(interval)
}

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

/// One backend's scrape history: failures in a row (the backoff) and what was logged.
#[derive(Debug, Default)]
struct Track {
    condition: Condition,
    /// When the next scrape is due (service loop only).
    next: Option<tokio::time::Instant>,
}

/// The engine metrics scraper (a pingora background service).
#[derive(Debug)]
pub struct EngineScraper {
    state: StateHandle,
    /// Overrides every pool's `scrape.interval` (tests).
    interval: Option<Duration>,
    timeout: Duration,
    tracks: Mutex<HashMap<BackendId, Track>>,
}

impl EngineScraper {
    /// A scraper over whatever state is current, each pool at its `scrape.interval`.
    pub fn new(state: StateHandle) -> EngineScraper {
        EngineScraper {
            state,
            interval: None,
            timeout: DEFAULT_TIMEOUT,
            tracks: Mutex::default(),
        }
    }

    /// A scraper with one interval for every pool; staleness follows.
    pub fn with_interval(state: StateHandle, interval: Duration) -> EngineScraper {
        EngineScraper {
            interval: Some(interval),
            ..EngineScraper::new(state)
        }
    }

    /// How long a sample taken by this scraper at the default (or overriding) interval is
    /// trusted; a pool with its own interval gets `stale_after` of that.
    pub fn stale_after(&self) -> Duration {
        pronto_core::engine::stale_after(self.interval.unwrap_or(DEFAULT_INTERVAL))
    }

    /// Every backend of `state` with its pool's scrape interval.
    fn schedule(&self, state: &GatewayState) -> Vec<(Arc<Backend>, Duration)> {
        state
            .pools
            .values()
            .flat_map(|pool| {
                let interval = self.interval.unwrap_or_else(|| {
                    state
                        .config
                        .pool(&pool.model)
                        .map_or(DEFAULT_INTERVAL, |p| p.scrape.interval)
                });
                pool.backends.iter().map(move |b| (Arc::clone(b), interval))
            })
            .collect()
    }

    fn tracks(&self) -> MutexGuard<'_, HashMap<BackendId, Track>> {
        // Tracks hold no invariant a panicking holder could break.
        self.tracks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Failed scrapes of `b` in a row, as the backoff counts them.
    pub fn failures(&self, b: &Backend) -> u64 {
        self.tracks()
            .get(&b.id())
            .map_or(0, |t| t.condition.failures())
    }

    /// One round: scrape every backend of the current state concurrently (backoff aside;
    /// those that answered 404 recently are skipped) and record the outcomes on them.
    pub async fn scrape_all(&self) {
        let state = self.state.load();
        let all = self.schedule(&state);
        join_all(
            all.iter()
                .map(|(b, interval)| self.scrape_every(b, *interval)),
        )
        .await;
    }

    /// Scrape one backend at the default (or overriding) interval's staleness, unless it
    /// is not due, and record the outcome on it.
    pub async fn scrape(&self, b: &Backend) -> ScrapeOutcome {
        self.scrape_every(b, self.interval.unwrap_or(DEFAULT_INTERVAL))
            .await
    }

    /// Scrape `b`, a backend scraped every `interval`, and record the outcome: on the
    /// backend, in its backoff and, for a transition, in the log.
    async fn scrape_every(&self, b: &Backend, interval: Duration) -> ScrapeOutcome {
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
        if !self.is_current(b) {
            // A reload dropped it while the scrape was out: record nothing, so its series
            // stay forgotten.
            return outcome;
        }
        let now = Instant::now();
        let stale_after = pronto_core::engine::stale_after(interval);
        match &outcome {
            ScrapeOutcome::Sample(s) => b.record_engine_sample(*s, now, stale_after),
            ScrapeOutcome::NoMetrics => b.record_engine_absent(now, NO_METRICS_RETRY),
            ScrapeOutcome::Failed(e) => b.record_engine_failure(e),
            ScrapeOutcome::Skipped => {}
        }
        let mut tracks = self.tracks();
        let track = tracks.entry(b.id()).or_default();
        let change = match &outcome {
            ScrapeOutcome::Failed(_) => track.condition.fail(now),
            _ => track.condition.ok(),
        };
        let failures = track.condition.failures();
        drop(tracks);
        let error = match &outcome {
            ScrapeOutcome::Failed(e) => e.to_string(),
            _ => String::new(),
        };
        let retry_in = next_delay(interval, failures);
        let backend = b.name();
        match change {
            None => {}
            Some(Change::Failing) => tracing::warn!(
                backend,
                %error,
                ?retry_in,
                "engine metrics scrape failing"
            ),
            Some(Change::StillFailing {
                failures,
                suppressed,
            }) => tracing::warn!(
                backend,
                %error,
                failures,
                suppressed,
                ?retry_in,
                "engine metrics scrape still failing"
            ),
            Some(Change::Recovered { failures }) => {
                tracing::info!(backend, failures, "engine metrics scrape recovered")
            }
        }
        outcome
    }

    /// Whether `b` is still a backend of the current state.
    fn is_current(&self, b: &Backend) -> bool {
        self.state
            .load()
            .backends
            .iter()
            .any(|o| std::ptr::eq(Arc::as_ptr(o), b))
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

    /// When `b`, scraped every `interval`, is next due after a scrape that started at
    /// `started` and just ended: a steady cadence while it succeeds, the backoff while it
    /// fails.
    fn reschedule(&self, b: &Backend, interval: Duration, started: tokio::time::Instant) {
        let mut tracks = self.tracks();
        let track = tracks.entry(b.id()).or_default();
        let failures = track.condition.failures();
        let now = tokio::time::Instant::now();
        track.next = Some(if failures == 0 {
            // A steady cadence: one scrape starts every interval (a 404 is kept away by
            // the engine state's own retry time).
            (started + interval).max(now)
        } else {
            now + next_delay(interval, failures)
        });
    }
}

#[async_trait::async_trait]
impl BackgroundService for EngineScraper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut in_flight = FuturesUnordered::new();
        let mut busy: HashSet<BackendId> = HashSet::new();
        loop {
            let state = self.state.load();
            let now = tokio::time::Instant::now();
            let mut wake = now + RESCAN;
            let all = self.schedule(&state);
            {
                let mut tracks = self.tracks();
                tracks.retain(|id, _| all.iter().any(|(b, _)| b.id() == *id));
                for (b, interval) in &all {
                    if busy.contains(&b.id()) {
                        continue;
                    }
                    let next = tracks.entry(b.id()).or_default().next.unwrap_or(now);
                    if next > now {
                        wake = wake.min(next);
                        continue;
                    }
                    busy.insert(b.id());
                    let (b, interval) = (Arc::clone(b), *interval);
                    in_flight.push(async move {
                        let started = tokio::time::Instant::now();
                        self.scrape_every(&b, interval).await;
                        self.reschedule(&b, interval, started);
                        b.id()
                    });
                }
            }
            drop(state);
            tokio::select! {
                Some(id) = in_flight.next(), if !in_flight.is_empty() => {
                    busy.remove(&id);
                }
                _ = tokio::time::sleep_until(wake) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
#[path = "scrape_tests.rs"]
mod tests;
