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
//! [`RATE_TAU_S`]) and answers the rate; [`residency_s`] turns a capacity, the tokens in-flight
//! requests pin and a rate into the window a dispatched prefix stays creditable,
//! `max(capacity, pinned) / rate` (what the routing view does:
//! `BackendView::cache_residency_s`). Unknown
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
    /// exp(−(last − first)/τ), kept at each allocation so a read needs one `exp`, not two.
    first_decay: f64,
}

impl Residency {
    /// `tokens` will take KV blocks on the backend from `now` (a dispatched prompt's uncached
    /// part plus its expected output).
    pub fn on_alloc(&mut self, tokens: f64, now: Instant) {
        self.decay_to(now);
        let first = *self.first.get_or_insert(now);
        if let Some(last) = self.last {
            let span = last.saturating_duration_since(first).as_secs_f64();
            self.first_decay = (-span / RATE_TAU_S).exp();
        }
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
        rate_at(
            self.decayed_tokens,
            now.saturating_duration_since(last).as_secs_f64(),
            last.saturating_duration_since(first).as_secs_f64(),
            self.first_decay,
        )
    }

    /// The state as four words relative to `epoch` (for lock-free publication): the decayed
    /// sum's bits, the last and first allocation times in nanoseconds since `epoch`
    /// (`u64::MAX`: none) and the bits of exp(−(last − first)/τ). [`rate_from_words`] reads the
    /// rate back from them.
    pub fn to_words(&self, epoch: Instant) -> [u64; 4] {
        let ns = |t: Option<Instant>| {
            t.map_or(u64::MAX, |t| {
                (t.saturating_duration_since(epoch).as_nanos() as u64).min(u64::MAX - 1)
            })
        };
        [
            self.decayed_tokens.to_bits(),
            ns(self.last),
            ns(self.first),
            self.first_decay.to_bits(),
        ]
    }

    fn decay_to(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.decayed_tokens *= (-dt / RATE_TAU_S).exp();
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }
}

/// [`Residency::rate`] from [`Residency::to_words`]' words, `now_ns` nanoseconds after their
/// epoch: integer time arithmetic and one `exp`, what a routing view pays per backend.
#[inline]
pub fn rate_from_words(w: [u64; 4], now_ns: u64) -> f64 {
    let [sum, last, first, first_decay] = w;
    if last == u64::MAX || first == u64::MAX {
        return 0.0;
    }
    rate_at(
        f64::from_bits(sum),
        now_ns.saturating_sub(last) as f64 * 1e-9,
        last.saturating_sub(first) as f64 * 1e-9,
        f64::from_bits(first_decay),
    )
}

/// −1/τ: a multiplication where the routing path would otherwise divide (a view is built per
/// backend per decision; a division costs several multiplications).
const NEG_INV_TAU: f64 = -1.0 / RATE_TAU_S;

/// The rate `since_last_s` after the last allocation, from the decayed sum then, the span
/// from the first allocation to the last and exp(−that span/τ).
#[inline]
fn rate_at(decayed_tokens: f64, since_last_s: f64, first_to_last_s: f64, first_decay: f64) -> f64 {
    let e = (since_last_s * NEG_INV_TAU).exp();
    let span = since_last_s + first_to_last_s;
    // ∫ exp(−s/τ) ds over the observed span (at least 1 s): the weight a constant rate would
    // have. exp(−span/τ) = exp(−since_last/τ) · exp(−first_to_last/τ).
    let tail = if span >= 1.0 {
        e * first_decay
    } else {
        (-1.0 / RATE_TAU_S).exp()
    };
    decayed_tokens * e / (RATE_TAU_S * (1.0 - tail))
}

/// Seconds a prefix recorded at a dispatch stays creditable: `max(capacity, pinned) / rate`;
/// infinite when the capacity is unknown or nothing allocates.
///
/// The router's index ages a prefix from the dispatch that last recorded it, but its blocks
/// are not evictable yet then: the request pins them while it is in flight, on average
/// `pinned / rate` seconds (Little's law on KV tokens: the tokens its in-flight requests hold,
/// over the rate they are dispatched). Only then do they sink down the LRU, through the
/// evictable part, `(capacity − pinned)⁺ / rate` more. The sum is `max(capacity, pinned) /
/// rate`. Counting only the second part (as this did before) withdrew every prefix credit once
/// the reservations passed the capacity, exactly when the prefill a hit saves is worth most:
/// on the Mooncake traces at 95 % load that alone made `predicted_ttft` 2–2.75 × slower than
/// `cache_aware` (`docs/benchmarks/eval-95-seeds`).
#[inline]
pub fn residency_s(
    capacity_tokens: Option<f64>,
    pinned_tokens: f64,
    rate_tokens_per_s: f64,
) -> f64 {
    match capacity_tokens {
        Some(c) if rate_tokens_per_s > 0.0 => c.max(pinned_tokens) / rate_tokens_per_s,
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
        // Pinned tokens are held in flight first, then cycle like the rest: below the
        // capacity they do not change the window.
        assert_eq!(residency_s(Some(100_000.0), 50_000.0, rate), res);
        // Reservations past the capacity mean requests stay in flight longer (Little's
        // law): the window grows with them instead of closing.
        let over = residency_s(Some(100_000.0), 150_000.0, rate);
        assert!((over - 1.5 * res).abs() < 1e-9, "over capacity {over}");
    }

    /// The published words give the rate the state itself computes, at any later time.
    #[test]
    fn the_published_words_give_the_same_rate() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        assert_eq!(rate_from_words(r.to_words(t0), 0), 0.0);
        for i in 0..50u32 {
            r.on_alloc(
                100.0 + f64::from(i),
                t0 + Duration::from_millis(37 * u64::from(i)),
            );
        }
        let w = r.to_words(t0);
        for later_ms in [0u64, 300, 1_000, 45_000, 600_000] {
            let now = t0 + Duration::from_millis(37 * 49 + later_ms);
            let ns = now.duration_since(t0).as_nanos() as u64;
            let (a, b) = (r.rate(now), rate_from_words(w, ns));
            assert!(
                (a - b).abs() <= 1e-9 * a.max(1.0),
                "{later_ms} ms: {a} vs {b}"
            );
            assert!(a > 0.0);
        }
    }

    /// One `exp` per read gives what the definition gives: Σ tokens·exp(−age/τ) over
    /// τ·(1 − exp(−max(span, 1 s)/τ)).
    #[test]
    fn the_rate_matches_its_definition() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        let allocs = [(0u64, 500.0), (400, 300.0), (2_500, 800.0), (9_000, 50.0)];
        for (ms, tokens) in allocs {
            r.on_alloc(tokens, t0 + Duration::from_millis(ms));
        }
        for now_ms in [9_000u64, 9_500, 20_000, 200_000] {
            let now = t0 + Duration::from_millis(now_ms);
            let sum: f64 = allocs
                .iter()
                .map(|&(ms, t)| t * (-((now_ms - ms) as f64 / 1e3) / RATE_TAU_S).exp())
                .sum();
            let span = (now_ms as f64 / 1e3).max(1.0);
            let want = sum / (RATE_TAU_S * (1.0 - (-span / RATE_TAU_S).exp()));
            let got = r.rate(now);
            assert!(
                (got - want).abs() <= 1e-9 * want,
                "{now_ms} ms: {got} vs {want}"
            );
        }
        // Within the first second the span counts as one second.
        let mut r = Residency::default();
        r.on_alloc(1_000.0, t0);
        let want =
            1_000.0 * (-0.2 / RATE_TAU_S).exp() / (RATE_TAU_S * (1.0 - (-1.0 / RATE_TAU_S).exp()));
        let got = r.rate(t0 + Duration::from_millis(200));
        assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
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
