//! How long a prefix stays in a backend's KV cache after its last use.
//!
//! An engine's prefix cache is bounded (vLLM: `num_gpu_blocks × block_size` tokens) and evicts
//! least recently used blocks when it needs room. The router's index remembers far longer (its
//! TTL is minutes), so a prefix the index still credits to a busy backend may long be gone —
//! and a policy that trusts the credit sends a long prompt to a queue it will not skip.
//!
//! Every token the engine computes takes a block: a prompt's uncached part and each generated
//! token. So a block unused for `t` seconds has been pushed down the LRU by every allocation
//! since, and is gone once those fill the cache: residency ≈ `capacity / allocation rate`. The
//! router knows both parts of the rate (it dispatched the prompts and asked for the outputs),
//! so [`Residency`] keeps an exponentially decayed sum of allocated tokens (time constant
//! [`RATE_TAU_S`]) and answers the rate; [`residency_s`] turns a capacity and a rate into
//! `capacity / rate` (what the routing view does: `BackendView::cache_residency_s`). Unknown
//! capacity or no traffic yet → infinite (the index's TTL alone applies). Pure: the caller
//! passes the time in.

use std::time::Instant;

/// Time constant of the allocation-rate average, seconds.
pub const RATE_TAU_S: f64 = 30.0;

/// The allocation rate into one backend's KV cache, from which its residency follows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Residency {
    /// Σ tokens · exp(−age/τ) at `last`.
    decayed_tokens: f64,
    last: Option<Instant>,
    first: Option<Instant>,
}

impl Residency {
    /// `tokens` will take KV blocks on the backend from `now` (a dispatched prompt's uncached
    /// part plus its expected output).
    pub fn on_alloc(&mut self, tokens: f64, now: Instant) {
        self.decay_to(now);
        self.first.get_or_insert(now);
        if tokens.is_finite() && tokens > 0.0 {
            self.decayed_tokens += tokens;
        }
    }

    /// Tokens allocated per second, averaged over about [`RATE_TAU_S`] (over the time since
    /// the first allocation while that is shorter, so a cold start is not read as idle).
    pub fn rate(&self, now: Instant) -> f64 {
        let (Some(last), Some(first)) = (self.last, self.first) else {
            return 0.0;
        };
        let dt = now.saturating_duration_since(last).as_secs_f64();
        let sum = self.decayed_tokens * (-dt / RATE_TAU_S).exp();
        let span = now.saturating_duration_since(first).as_secs_f64();
        // ∫ exp(−s/τ) ds over the observed span: the weight a constant rate would have.
        let weight = RATE_TAU_S * (1.0 - (-span.max(1.0) / RATE_TAU_S).exp());
        sum / weight
    }

    /// The state as three words relative to `epoch` (for lock-free publication): the decayed
    /// sum's bits and the last and first allocation times in nanoseconds since `epoch`
    /// (`u64::MAX`: none).
    pub fn to_words(&self, epoch: Instant) -> [u64; 3] {
        let ns = |t: Option<Instant>| {
            t.map_or(u64::MAX, |t| {
                (t.saturating_duration_since(epoch).as_nanos() as u64).min(u64::MAX - 1)
            })
        };
        [self.decayed_tokens.to_bits(), ns(self.last), ns(self.first)]
    }

    /// The state [`to_words`](Self::to_words) wrote.
    pub fn from_words(w: [u64; 3], epoch: Instant) -> Residency {
        let at = |ns: u64| (ns != u64::MAX).then(|| epoch + std::time::Duration::from_nanos(ns));
        Residency {
            decayed_tokens: f64::from_bits(w[0]),
            last: at(w[1]),
            first: at(w[2]),
        }
    }

    fn decay_to(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.decayed_tokens *= (-dt / RATE_TAU_S).exp();
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }
}

/// `(capacity − pinned) / rate`: seconds until allocations at `rate_tokens_per_s` have cycled
/// the evictable part of a cache; infinite when the capacity is unknown or nothing allocates.
pub fn residency_s(
    capacity_tokens: Option<f64>,
    pinned_tokens: f64,
    rate_tokens_per_s: f64,
) -> f64 {
    match capacity_tokens {
        Some(c) if rate_tokens_per_s > 0.0 => (c - pinned_tokens).max(0.0) / rate_tokens_per_s,
        _ => f64::INFINITY,
    }
}

/// A published rate, `age_s` seconds old, decayed as [`Residency::rate`] would decay it with no
/// allocation since.
pub fn decayed_rate(rate_tokens_per_s: f64, age_s: f64) -> f64 {
    rate_tokens_per_s * (-age_s.max(0.0) / RATE_TAU_S).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn steady_rate_gives_capacity_over_rate() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        // 1000 tokens every 100 ms = 10k tokens/s for 5 minutes.
        for i in 0..3000 {
            r.on_alloc(1000.0, t0 + Duration::from_millis(100 * i));
        }
        let now = t0 + Duration::from_secs(300);
        let rate = r.rate(now);
        assert!((rate - 10_000.0).abs() / 10_000.0 < 0.05, "rate {rate}");
        let res = residency_s(Some(100_000.0), 0.0, rate);
        assert!((res - 10.0).abs() < 0.6, "residency {res}");
        // Traffic stops: the rate decays, the residency grows.
        let later = now + Duration::from_secs(60);
        assert!(residency_s(Some(100_000.0), 0.0, r.rate(later)) > 5.0 * res);
        // Pinned tokens are not room for old prefixes.
        assert!((residency_s(Some(100_000.0), 50_000.0, rate) - res / 2.0).abs() < 0.3);
    }

    #[test]
    fn cold_start_is_not_read_as_idle() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        for i in 0..20 {
            r.on_alloc(500.0, t0 + Duration::from_millis(100 * i));
        }
        // 10k tokens in 2 s (5k tokens/s): residency ≈ 10 s, not the 30-s-average's 3×.
        let res = residency_s(Some(50_000.0), 0.0, r.rate(t0 + Duration::from_secs(2)));
        assert!((5.0..15.0).contains(&res), "residency {res}");
    }

    #[test]
    fn unknown_capacity_or_no_traffic_is_infinite() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        assert_eq!(r.rate(t0), 0.0);
        assert!(residency_s(Some(1e5), 0.0, r.rate(t0)).is_infinite());
        r.on_alloc(1e6, t0);
        assert!(residency_s(None, 0.0, r.rate(t0)).is_infinite());
        assert!(residency_s(Some(1e5), 0.0, r.rate(t0)).is_finite());
    }
}
