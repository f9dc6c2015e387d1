//! Rate limits per API key and per route: requests per minute, tokens per minute, and
//! requests in flight.
//!
//! **Algorithm.** Each per-minute limit is a token bucket of capacity `L` refilled at `L` per
//! minute, kept as GCRA: one atomic "theoretical arrival time" `tat` (nanoseconds since the
//! limiter's epoch). Taking `n` units at `now` computes `new = max(tat, now) + n·T` with
//! `T = 60 s / L`; it is allowed when `new − now ≤ 60 s` (the bucket holds enough) and then
//! stored with a compare-and-swap, so there is no lock at all. The bucket is full again at
//! `tat`, so `reset = tat − now` and `remaining = (60 s − (tat − now)) / T`; a refusal's
//! `Retry-After` is `new − 60 s − now`. A request larger than the whole bucket is charged the
//! full bucket (it waits for a full bucket instead of never passing).
//!
//! **Tokens** are charged up front with the prompt estimate and corrected when the response's
//! `usage` arrives (`RateLimiter::settle`): the difference moves `tat` forward (more used)
//! or back (less; never before `now`).
//!
//! **Concurrency** is an atomic counter with an RAII [`ConcurrencyPermit`], released when the
//! request ends however it ends.
//!
//! **State** lives in a sharded map (`DashMap`) keyed by scope (key or route name) and
//! survives config reloads; an entry whose configured limits changed starts afresh. The clock
//! is passed in (`now`) so tests run without sleeping. Nothing here awaits.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::config::edge::RateLimit;
use crate::error::GatewayError;

const MINUTE_NS: u64 = 60_000_000_000;

/// What a limit applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// An API key, by name.
    Key(Arc<str>),
    /// A route, by name.
    Route(Arc<str>),
}

impl Scope {
    fn describe(&self) -> String {
        match self {
            Scope::Key(n) => format!("API key `{n}`"),
            Scope::Route(n) => format!("route `{n}`"),
        }
    }
}

/// One GCRA bucket (see the module docs).
#[derive(Debug)]
struct Gcra {
    /// Units per minute.
    per_minute: u32,
    /// Theoretical arrival time, ns since the limiter's epoch.
    tat: AtomicU64,
}

/// The state of a bucket after a take, for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// The configured per-minute limit.
    pub limit: u32,
    /// Units left now.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub reset: Duration,
}

impl Gcra {
    fn new(per_minute: u32) -> Gcra {
        Gcra {
            per_minute,
            tat: AtomicU64::new(0),
        }
    }

    fn interval(&self) -> u64 {
        MINUTE_NS / u64::from(self.per_minute)
    }

    fn state(&self, tat: u64, now: u64) -> BucketState {
        let used = tat.saturating_sub(now);
        let remaining = MINUTE_NS.saturating_sub(used) / self.interval();
        BucketState {
            limit: self.per_minute,
            remaining: remaining.min(u64::from(self.per_minute)) as u32,
            reset: Duration::from_nanos(used),
        }
    }

    /// Take `n` units at `now`; `Err(retry_after)` when the bucket does not hold them.
    fn take(&self, n: u32, now: u64) -> Result<BucketState, (Duration, BucketState)> {
        let cost = u64::from(n.min(self.per_minute)) * self.interval();
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let new = tat.max(now) + cost;
            if new - now > MINUTE_NS {
                let wait = Duration::from_nanos(new - now - MINUTE_NS);
                return Err((wait, self.state(tat, now)));
            }
            match self
                .tat
                .compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(self.state(new, now)),
                Err(actual) => tat = actual,
            }
        }
    }

    /// Charge `delta` more units (negative: give back), unconditionally.
    fn adjust(&self, delta: i64, now: u64) {
        let step = delta.unsigned_abs().saturating_mul(self.interval());
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(if delta >= 0 {
                    tat.max(now).saturating_add(step)
                } else {
                    tat.saturating_sub(step).max(now)
                })
            });
    }
}

/// The live state of one scope.
#[derive(Debug)]
struct Entry {
    limit: RateLimit,
    requests: Option<Gcra>,
    tokens: Option<Gcra>,
    in_flight: AtomicU32,
}

impl Entry {
    fn new(limit: RateLimit) -> Entry {
        Entry {
            limit,
            requests: limit.requests_per_minute.map(Gcra::new),
            tokens: limit.tokens_per_minute.map(Gcra::new),
            in_flight: AtomicU32::new(0),
        }
    }
}

/// Holds one in-flight slot of a scope until dropped.
#[derive(Debug)]
pub struct ConcurrencyPermit {
    entry: Arc<Entry>,
}

impl Drop for ConcurrencyPermit {
    fn drop(&mut self) {
        self.entry.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tokens charged up front to a scope, to be corrected by the actual usage.
#[derive(Debug)]
pub struct TokenCharge {
    entry: Arc<Entry>,
    charged: u32,
}

/// What an admitted request carries: its concurrency permit (if the scope caps it) and the
/// headers describing the scope's buckets.
#[derive(Debug, Default)]
pub struct Grant {
    /// Released when the request ends.
    pub permit: Option<ConcurrencyPermit>,
    /// `x-ratelimit-*` headers.
    pub headers: Vec<(&'static str, String)>,
}

/// All rate-limit state of a gateway (outlives reloads).
#[derive(Debug)]
pub struct RateLimiter {
    epoch: Instant,
    entries: DashMap<Scope, Arc<Entry>>,
}

impl RateLimiter {
    /// An empty limiter; `epoch` is the origin of its clock (any instant not after the first
    /// `now` passed in).
    pub fn new(epoch: Instant) -> RateLimiter {
        RateLimiter {
            epoch,
            entries: DashMap::new(),
        }
    }

    fn ns(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64 + MINUTE_NS
    }

    /// The entry for `scope` under `limit` (a fresh one when the limits changed).
    fn entry(&self, scope: &Scope, limit: &RateLimit) -> Arc<Entry> {
        if let Some(e) = self.entries.get(scope) {
            if e.limit == *limit {
                return Arc::clone(&e);
            }
        }
        // Miss or changed limits: create or replace under the shard's write lock, so requests
        // racing on a new scope share one bucket instead of each inserting its own.
        let mut slot = self
            .entries
            .entry(scope.clone())
            .or_insert_with(|| Arc::new(Entry::new(*limit)));
        if slot.limit != *limit {
            *slot = Arc::new(Entry::new(*limit));
        }
        Arc::clone(&slot)
    }

    /// Admit one request in `scope`: a concurrency slot and one request from the per-minute
    /// bucket; 429 when either is exhausted (nothing is taken then).
    pub fn request(
        &self,
        scope: &Scope,
        limit: &RateLimit,
        now: Instant,
    ) -> Result<Grant, GatewayError> {
        let entry = self.entry(scope, limit);
        let mut grant = Grant::default();
        if let Some(max) = limit.max_concurrent {
            let before = entry.in_flight.fetch_add(1, Ordering::AcqRel);
            let permit = ConcurrencyPermit {
                entry: Arc::clone(&entry),
            };
            if before >= max {
                drop(permit);
                return Err(denied(
                    scope,
                    "concurrent requests",
                    max,
                    Duration::from_secs(1),
                    Vec::new(),
                ));
            }
            grant.permit = Some(permit);
        }
        if let Some(bucket) = &entry.requests {
            match bucket.take(1, self.ns(now)) {
                Ok(s) => push_headers(&mut grant.headers, "requests", s),
                Err((wait, s)) => {
                    let mut h = Vec::new();
                    push_headers(&mut h, "requests", s);
                    return Err(denied(scope, "requests per minute", s.limit, wait, h));
                }
            }
        }
        Ok(grant)
    }

    /// Charge `tokens` (the prompt estimate) to `scope`'s tokens-per-minute bucket; `None`
    /// when the scope has no token limit; 429 when the bucket does not hold them.
    pub fn tokens(
        &self,
        scope: &Scope,
        limit: &RateLimit,
        tokens: u32,
        now: Instant,
        headers: &mut Vec<(&'static str, String)>,
    ) -> Result<Option<TokenCharge>, GatewayError> {
        let entry = self.entry(scope, limit);
        let Some(bucket) = &entry.tokens else {
            return Ok(None);
        };
        match bucket.take(tokens, self.ns(now)) {
            Ok(s) => {
                push_headers(headers, "tokens", s);
                let charged = tokens.min(bucket.per_minute);
                Ok(Some(TokenCharge { entry, charged }))
            }
            Err((wait, s)) => {
                let mut h = Vec::new();
                push_headers(&mut h, "tokens", s);
                Err(denied(scope, "tokens per minute", s.limit, wait, h))
            }
        }
    }

    /// Correct a charge to the tokens the response reported using.
    pub fn settle(&self, charge: TokenCharge, actual: u32, now: Instant) {
        if let Some(bucket) = &charge.entry.tokens {
            let delta = i64::from(actual.min(bucket.per_minute)) - i64::from(charge.charged);
            bucket.adjust(delta, self.ns(now));
        }
    }

    /// Scopes with live state (for tests and debugging).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no scope has state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn denied(
    scope: &Scope,
    what: &'static str,
    limit: u32,
    wait: Duration,
    headers: Vec<(&'static str, String)>,
) -> GatewayError {
    GatewayError::RateLimited {
        scope: scope.describe(),
        limit: what,
        limit_value: limit,
        retry_after_s: (wait.as_secs_f64().ceil() as u32).max(1),
        headers,
    }
}

fn push_headers(out: &mut Vec<(&'static str, String)>, kind: &str, s: BucketState) {
    let (limit, remaining, reset) = if kind == "requests" {
        (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        )
    } else {
        (
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        )
    };
    out.push((limit, s.limit.to_string()));
    out.push((remaining, s.remaining.to_string()));
    out.push((reset, openai_duration(s.reset)));
}

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: `0s`, `120ms`, `17s`, `6m0s`.
pub fn openai_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms < 1000 {
        format!("{ms}ms")
    } else {
        let s = d.as_secs_f64().ceil() as u64;
        if s < 60 {
            format!("{s}s")
        } else {
            format!("{}m{}s", s / 60, s % 60)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rpm: Option<u32>, tpm: Option<u32>, conc: Option<u32>) -> RateLimit {
        RateLimit {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            max_concurrent: conc,
        }
    }

    fn header<'a>(h: &'a [(&'static str, String)], name: &str) -> &'a str {
        &h.iter().find(|(k, _)| *k == name).unwrap().1
    }

    #[test]
    fn requests_per_minute_burst_then_refill() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let s = Scope::Key("a".into());
        let l = limit(Some(3), None, None);
        for left in [2, 1, 0] {
            let g = rl.request(&s, &l, t0).unwrap();
            assert_eq!(
                header(&g.headers, "x-ratelimit-remaining-requests"),
                left.to_string()
            );
            assert_eq!(header(&g.headers, "x-ratelimit-limit-requests"), "3");
        }
        let e = rl.request(&s, &l, t0).unwrap_err();
        assert_eq!(e.status(), 429);
        // One request refills every 20 s.
        assert_eq!(e.retry_after(), Some(20));
        assert_eq!(
            e.headers()
                .iter()
                .find(|(k, _)| *k == "x-ratelimit-reset-requests")
                .unwrap()
                .1,
            "1m0s"
        );
        assert!(rl.request(&s, &l, t0 + Duration::from_secs(19)).is_err());
        assert!(rl.request(&s, &l, t0 + Duration::from_secs(20)).is_ok());
        assert!(rl.request(&s, &l, t0 + Duration::from_secs(20)).is_err());
        // After a quiet minute the whole burst is back, not more.
        let later = t0 + Duration::from_secs(200);
        for _ in 0..3 {
            rl.request(&s, &l, later).unwrap();
        }
        assert!(rl.request(&s, &l, later).is_err());
    }

    #[test]
    fn scopes_are_independent() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let l = limit(Some(1), None, None);
        rl.request(&Scope::Key("a".into()), &l, t0).unwrap();
        rl.request(&Scope::Key("b".into()), &l, t0).unwrap();
        rl.request(&Scope::Route("a".into()), &l, t0).unwrap();
        assert!(rl.request(&Scope::Key("a".into()), &l, t0).is_err());
        assert_eq!(rl.len(), 3);
    }

    #[test]
    fn concurrency_permits_release_on_drop() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let s = Scope::Route("r".into());
        let l = limit(None, None, Some(2));
        let a = rl.request(&s, &l, t0).unwrap();
        let _b = rl.request(&s, &l, t0).unwrap();
        let e = rl.request(&s, &l, t0).unwrap_err();
        assert!(e.to_string().contains("concurrent"));
        drop(a);
        assert!(rl.request(&s, &l, t0).is_ok());
    }

    #[test]
    fn refused_request_takes_nothing() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let s = Scope::Key("a".into());
        // Concurrency refuses first: the request bucket stays untouched.
        let l = limit(Some(2), None, Some(1));
        let held = rl.request(&s, &l, t0).unwrap();
        assert!(rl.request(&s, &l, t0).is_err());
        drop(held);
        let g = rl.request(&s, &l, t0).unwrap();
        assert_eq!(header(&g.headers, "x-ratelimit-remaining-requests"), "0");
    }

    #[test]
    fn tokens_charged_up_front_then_corrected_by_usage() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let s = Scope::Key("a".into());
        let l = limit(None, Some(1000), None);
        let mut h = Vec::new();
        let c = rl.tokens(&s, &l, 600, t0, &mut h).unwrap().unwrap();
        assert_eq!(header(&h, "x-ratelimit-remaining-tokens"), "400");
        // 600 more do not fit; after usage says only 100 were used, they do.
        assert!(rl.tokens(&s, &l, 600, t0, &mut Vec::new()).is_err());
        rl.settle(c, 100, t0);
        let c2 = rl
            .tokens(&s, &l, 600, t0, &mut Vec::new())
            .unwrap()
            .unwrap();
        // Usage above the estimate charges the difference: the bucket is then empty.
        rl.settle(c2, 900, t0);
        let e = rl.tokens(&s, &l, 1, t0, &mut Vec::new()).unwrap_err();
        assert_eq!(e.code(), "rate_limit_exceeded");
        assert!(e
            .headers()
            .iter()
            .any(|(k, v)| *k == "x-ratelimit-remaining-tokens" && v == "0"));
    }

    #[test]
    fn oversized_request_waits_for_a_full_bucket() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let s = Scope::Key("a".into());
        let l = limit(None, Some(100), None);
        assert!(rl.tokens(&s, &l, 5000, t0, &mut Vec::new()).is_ok());
        assert!(rl
            .tokens(&s, &l, 5000, t0 + Duration::from_secs(30), &mut Vec::new())
            .is_err());
        assert!(rl
            .tokens(&s, &l, 5000, t0 + Duration::from_secs(60), &mut Vec::new())
            .is_ok());
    }

    #[test]
    fn changed_limits_start_afresh() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let s = Scope::Key("a".into());
        rl.request(&s, &limit(Some(1), None, None), t0).unwrap();
        assert!(rl.request(&s, &limit(Some(1), None, None), t0).is_err());
        assert!(rl.request(&s, &limit(Some(2), None, None), t0).is_ok());
    }

    #[test]
    fn concurrent_takes_never_exceed_the_bucket() {
        let t0 = Instant::now();
        let rl = Arc::new(RateLimiter::new(t0));
        let l = limit(Some(1000), None, None);
        let ok = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (rl, ok) = (Arc::clone(&rl), Arc::clone(&ok));
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        if rl.request(&Scope::Key("k".into()), &l, t0).is_ok() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(ok.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn durations_like_openai() {
        assert_eq!(openai_duration(Duration::ZERO), "0s");
        assert_eq!(openai_duration(Duration::from_millis(120)), "120ms");
        assert_eq!(openai_duration(Duration::from_millis(16_200)), "17s");
        assert_eq!(openai_duration(Duration::from_secs(360)), "6m0s");
    }
}
