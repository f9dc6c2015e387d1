//! What the scraper last learnt about one backend's engine, readable lock-free on the hot path.
//!
//! The last good [`EngineSample`] sits in an `ArcSwapOption` with the time it was taken
//! (nanoseconds since the state's epoch, the backend's creation) and how long it may be
//! trusted. [`EngineState::load`] returns an [`EngineLoad`] with its `age_s` only while the data
//! is trustworthy:
//! - there was a successful scrape, and it is younger than its `stale_after` bound (the scraper
//!   passes `max(4 × interval, 2 s)` by default — see `scrape.rs`);
//! - fewer than [`STALE_AFTER_FAILURES`] scrapes in a row have failed since (after that many the
//!   data is stale at once, whatever its age);
//! - the backend did not answer its last scrape with "no metrics here" (HTTP 404).
//!
//! All times are passed in (`now`), so the logic is tested without a clock.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::seq_cell::SeqCell;
use crate::time::secs_from_ns;

use super::metrics::EngineSample;
use crate::routing::EngineLoad;

/// `at_ns` of the routing snapshot when there is no sample.
const ABSENT: u64 = u64::MAX;

/// How often the gateway scrapes each engine by default (and the evaluator simulates it).
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_millis(250);

/// Shortest time a sample is trusted, whatever the interval.
pub const MIN_STALE_AFTER: Duration = Duration::from_secs(2);

/// How long a sample taken every `interval` is trusted: `max(4 × interval, 2 s)` — a few
/// missed rounds are tolerated, a dead scraper is not.
pub fn stale_after(interval: Duration) -> Duration {
    (interval * 4).max(MIN_STALE_AFTER)
}

/// Consecutive failed scrapes after which the last sample is no longer trusted.
pub const STALE_AFTER_FAILURES: u32 = 3;

/// A good scrape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scraped {
    /// What the engine reported.
    pub sample: EngineSample,
    /// When, in nanoseconds since the state's epoch.
    pub at_ns: u64,
    /// How long after `at_ns` it may be used, nanoseconds.
    pub stale_after_ns: u64,
}

/// Per-backend engine state (see the module docs).
#[derive(Debug)]
pub struct EngineState {
    epoch: Instant,
    last: ArcSwapOption<Scraped>,
    /// What routing reads of `last`, without a pointer chase: waiting, running, kv_usage (f64
    /// bits), at_ns, stale_after_ns; at_ns = [`ABSENT`] when there is no sample.
    routing: SeqCell<5>,
    consecutive_failures: AtomicU32,
    /// Nanoseconds since `epoch` before which the backend is not scraped again (0 = due now).
    next_due_ns: AtomicU64,
    /// The last answer was 404: the backend exports no engine metrics.
    no_metrics: AtomicBool,
}

impl EngineState {
    /// Empty state; times are measured from `epoch`.
    pub(crate) fn new(epoch: Instant) -> EngineState {
        EngineState {
            epoch,
            last: ArcSwapOption::empty(),
            routing: SeqCell::new([0, 0, 0, ABSENT, 0]),
            consecutive_failures: AtomicU32::new(0),
            next_due_ns: AtomicU64::new(0),
            no_metrics: AtomicBool::new(false),
        }
    }

    #[inline]
    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// A successful scrape at `now`, trusted for `stale_after`.
    pub fn record_success(&self, sample: EngineSample, now: Instant, stale_after: Duration) {
        let at_ns = self.ns(now).min(ABSENT - 1);
        let stale_after_ns = stale_after.as_nanos() as u64;
        self.last.store(Some(Arc::new(Scraped {
            sample,
            at_ns,
            stale_after_ns,
        })));
        self.routing.store([
            sample.waiting.to_bits(),
            sample.running.to_bits(),
            sample.kv_usage.to_bits(),
            at_ns,
            stale_after_ns,
        ]);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.no_metrics.store(false, Ordering::Relaxed);
        self.next_due_ns.store(0, Ordering::Relaxed);
    }

    /// A failed scrape (timeout, connection error, non-2xx, unparsable page). Returns true when
    /// this failure made the data stale.
    pub fn record_failure(&self) -> bool {
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1 == STALE_AFTER_FAILURES
    }

    /// The backend answered 404 at `now`: it is not an engine (or hides its metrics). Its data
    /// is dropped and it is not scraped again before `now + retry_after`.
    pub fn record_no_metrics(&self, now: Instant, retry_after: Duration) {
        self.last.store(None);
        self.routing.store([0, 0, 0, ABSENT, 0]);
        self.no_metrics.store(true, Ordering::Relaxed);
        self.next_due_ns.store(
            self.ns(now) + retry_after.as_nanos() as u64,
            Ordering::Relaxed,
        );
    }

    /// Whether the scraper should scrape this backend at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.ns(now) >= self.next_due_ns.load(Ordering::Relaxed)
    }

    /// Scrapes failed in a row since the last success.
    #[inline]
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// The last answer was a 404.
    pub fn no_metrics(&self) -> bool {
        self.no_metrics.load(Ordering::Relaxed)
    }

    /// The last good scrape, trusted or not.
    pub fn last(&self) -> Option<Scraped> {
        self.last.load().as_deref().copied()
    }

    /// The last good scrape and its age in seconds, when it may still be trusted at `now`.
    pub(crate) fn fresh(&self, now: Instant) -> Option<(EngineSample, f64)> {
        if self.consecutive_failures() >= STALE_AFTER_FAILURES {
            return None;
        }
        let guard = self.last.load();
        let s = guard.as_deref()?;
        let age_ns = self.ns(now).saturating_sub(s.at_ns);
        (age_ns <= s.stale_after_ns).then_some((s.sample, secs_from_ns(age_ns)))
    }

    /// The routing view: engine load with its age, or `None` when there is no trustworthy
    /// scrape at `now`.
    #[inline]
    pub fn load(&self, now: Instant) -> Option<EngineLoad> {
        self.load_at(self.ns(now))
    }

    /// [`load`](Self::load) at `now_ns` nanoseconds since the state's epoch.
    #[inline]
    pub(crate) fn load_at(&self, now_ns: u64) -> Option<EngineLoad> {
        if self.consecutive_failures() >= STALE_AFTER_FAILURES {
            return None;
        }
        let [waiting, running, kv_usage, at_ns, stale_after_ns] = self.routing.load();
        if at_ns == ABSENT {
            return None;
        }
        let age_ns = now_ns.saturating_sub(at_ns);
        (age_ns <= stale_after_ns).then(|| EngineLoad {
            waiting: f64::from_bits(waiting),
            running: f64::from_bits(running),
            kv_usage: f64::from_bits(kv_usage),
            age_s: secs_from_ns(age_ns),
        })
    }

    /// JSON for `GET /admin/backends`.
    pub fn admin_json(&self, now: Instant) -> serde_json::Value {
        let status = if self.no_metrics() {
            "no_metrics"
        } else if self.fresh(now).is_some() {
            "fresh"
        } else if self.last().is_some() {
            "stale"
        } else {
            "never_scraped"
        };
        let mut v = serde_json::json!({
            "status": status,
            "consecutive_failures": self.consecutive_failures(),
        });
        if let Some(s) = self.last() {
            let age_s = secs_from_ns(self.ns(now).saturating_sub(s.at_ns));
            let m = &s.sample;
            v["flavor"] = m.flavor.as_str().into();
            v["waiting"] = m.waiting.into();
            v["running"] = m.running.into();
            v["kv_usage"] = m.kv_usage.into();
            v["prefix_queries"] = m.prefix_queries.into();
            v["prefix_hits"] = m.prefix_hits.into();
            v["cache_hit_rate"] = m.cache_hit_rate.into();
            v["age_s"] = age_s.into();
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::metrics::EngineFlavor;

    fn sample(waiting: f64) -> EngineSample {
        EngineSample {
            waiting,
            running: 2.0,
            kv_usage: 0.5,
            prefix_queries: None,
            prefix_hits: None,
            cache_hit_rate: None,
            kv_capacity_tokens: None,
            flavor: EngineFlavor::Vllm,
        }
    }

    const STALE: Duration = Duration::from_secs(2);

    #[test]
    fn never_scraped_is_none() {
        let t0 = Instant::now();
        let s = EngineState::new(t0);
        assert_eq!(s.load(t0), None);
        assert_eq!(s.admin_json(t0)["status"], "never_scraped");
    }

    #[test]
    fn fresh_sample_has_age_until_stale_bound() {
        let t0 = Instant::now();
        let s = EngineState::new(t0);
        let at = t0 + Duration::from_secs(1);
        s.record_success(sample(3.0), at, STALE);
        let l = s.load(at + Duration::from_millis(500)).unwrap();
        assert_eq!((l.waiting, l.running, l.kv_usage), (3.0, 2.0, 0.5));
        assert!((l.age_s - 0.5).abs() < 1e-9);
        assert!(s.load(at + STALE).is_some());
        assert_eq!(s.load(at + STALE + Duration::from_millis(1)), None);
        assert_eq!(s.admin_json(at + STALE * 2)["status"], "stale");
        // A newer scrape is fresh again.
        s.record_success(sample(4.0), at + STALE * 2, STALE);
        assert_eq!(s.load(at + STALE * 2).unwrap().waiting, 4.0);
    }

    #[test]
    fn three_failures_make_it_stale_at_once_and_success_recovers() {
        let t0 = Instant::now();
        let s = EngineState::new(t0);
        s.record_success(sample(1.0), t0, STALE);
        assert!(!s.record_failure());
        assert!(!s.record_failure());
        assert!(s.load(t0).is_some(), "two failures still trusted");
        assert!(s.record_failure(), "third failure flips to stale");
        assert_eq!(s.load(t0), None);
        assert!(!s.record_failure(), "only the third reports the flip");
        assert_eq!(s.admin_json(t0)["status"], "stale");
        assert_eq!(s.admin_json(t0)["consecutive_failures"], 4);
        s.record_success(sample(5.0), t0 + Duration::from_millis(1), STALE);
        assert_eq!(s.consecutive_failures(), 0);
        assert_eq!(s.load(t0 + Duration::from_millis(1)).unwrap().waiting, 5.0);
    }

    #[test]
    fn no_metrics_drops_data_and_delays_next_scrape() {
        let t0 = Instant::now();
        let s = EngineState::new(t0);
        assert!(s.is_due(t0));
        s.record_success(sample(1.0), t0, STALE);
        let retry = Duration::from_secs(30);
        s.record_no_metrics(t0, retry);
        assert_eq!(s.load(t0), None);
        assert_eq!(s.admin_json(t0)["status"], "no_metrics");
        assert!(!s.is_due(t0 + Duration::from_secs(29)));
        assert!(s.is_due(t0 + retry));
        s.record_success(sample(1.0), t0 + retry, STALE);
        assert!(!s.no_metrics());
        assert!(s.is_due(t0 + retry));
    }

    #[test]
    fn time_before_the_scrape_counts_as_age_zero() {
        let t0 = Instant::now();
        let s = EngineState::new(t0);
        let at = t0 + Duration::from_secs(5);
        s.record_success(sample(1.0), at, STALE);
        assert_eq!(s.load(t0).unwrap().age_s, 0.0);
    }
}
