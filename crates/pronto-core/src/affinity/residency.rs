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
//! `RATE_TAU_S`) and answers the rate; `residency_s` turns a capacity, the tokens in-flight
//! requests pin and a rate into the window a dispatched prefix stays creditable,
//! `max(capacity, pinned) / rate` (what the routing view does:
//! `BackendView::cache_residency_s`). Unknown
//! capacity or no traffic yet → infinite (the index's TTL alone applies). Pure: the caller
//! passes the time in.

use std::time::Instant;

use crate::time::secs_from_ns;

/// Time constant of the allocation-rate average, seconds.
pub(crate) const RATE_TAU_S: f64 = 30.0;

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
    pub(crate) fn on_alloc(&mut self, tokens: f64, now: Instant) {
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

    /// Tokens allocated per second, averaged over about `RATE_TAU_S` (over the time since
    /// the first allocation while that is shorter, so a cold start is not read as idle).
    pub(crate) fn rate(&self, now: Instant) -> f64 {
        self.alloc_rate(now).per_s()
    }

    /// The rate at `now` as a routing view carries it (evaluated on demand).
    pub(crate) fn alloc_rate(&self, now: Instant) -> AllocRate {
        let (Some(last), Some(first)) = (self.last, self.first) else {
            return AllocRate::NONE;
        };
        AllocRate {
            tau_over_sum: tau_over(self.decayed_tokens),
            since_last_s: now.saturating_duration_since(last).as_secs_f64(),
            first_to_last_s: last.saturating_duration_since(first).as_secs_f64(),
            first_decay: self.first_decay,
        }
    }

    /// The state as four words relative to `epoch` (for lock-free publication): the bits of
    /// τ over the decayed sum, the last and first allocation times in nanoseconds since
    /// `epoch` (`u64::MAX`: none) and the bits of exp(−(last − first)/τ).
    /// `alloc_rate_from_words` reads the rate back from them.
    pub(crate) fn to_words(self, epoch: Instant) -> [u64; 4] {
        let ns = |t: Option<Instant>| {
            t.map_or(u64::MAX, |t| {
                (t.saturating_duration_since(epoch).as_nanos() as u64).min(u64::MAX - 1)
            })
        };
        [
            tau_over(self.decayed_tokens).to_bits(),
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

/// τ / `decayed_tokens` (infinite when nothing was allocated): the division a rate read
/// would otherwise pay, paid once per allocation instead.
fn tau_over(decayed_tokens: f64) -> f64 {
    if decayed_tokens > 0.0 {
        RATE_TAU_S / decayed_tokens
    } else {
        f64::INFINITY
    }
}

/// [`Residency::alloc_rate`] from [`Residency::to_words`]' words, `now_ns` nanoseconds after
/// their epoch: integer time arithmetic, no `exp` and no division — what a routing view pays
/// per backend.
#[inline]
pub(crate) fn alloc_rate_from_words(w: [u64; 4], now_ns: u64) -> AllocRate {
    let [tau_over_sum, last, first, first_decay] = w;
    if last == u64::MAX || first == u64::MAX {
        return AllocRate::NONE;
    }
    AllocRate {
        tau_over_sum: f64::from_bits(tau_over_sum),
        since_last_s: secs_from_ns(now_ns.saturating_sub(last)),
        first_to_last_s: secs_from_ns(last.saturating_sub(first)),
        first_decay: f64::from_bits(first_decay),
    }
}

/// A backend's KV allocation rate as one routing decision reads it: [`Residency`]'s state at
/// its last allocation and the time since, evaluated only where a decision needs it (the
/// residency of a backend holding part of the prompt, the wait of one the prompt does not
/// fit) — and then as its inverse, seconds per token, which takes one `exp` and no division:
/// ```text
/// rate = S·e / (τ·(1 − e·f))      e = exp(−since_last/τ), f = exp(−(last − first)/τ), S the decayed sum
/// 1/rate = (τ/S)·(1/e − f)        (over the first second of traffic: (τ/S)·(1 − exp(−1/τ))/e)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocRate {
    /// τ over the decayed sum at the last allocation; infinite when nothing was allocated.
    tau_over_sum: f64,
    since_last_s: f64,
    first_to_last_s: f64,
    /// exp(−first_to_last_s/τ).
    first_decay: f64,
}

impl AllocRate {
    /// Nothing allocated yet: rate 0.
    pub(crate) const NONE: AllocRate = AllocRate {
        tau_over_sum: f64::INFINITY,
        since_last_s: 0.0,
        first_to_last_s: f64::INFINITY,
        first_decay: 0.0,
    };

    /// A steady `tokens_per_s` (tests and tools); ≤ 0: [`AllocRate::NONE`].
    #[cfg(test)]
    pub(crate) fn constant(tokens_per_s: f64) -> AllocRate {
        AllocRate {
            tau_over_sum: if tokens_per_s > 0.0 {
                1.0 / tokens_per_s
            } else {
                f64::INFINITY
            },
            ..AllocRate::NONE
        }
    }

    /// Seconds per allocated token (infinite when nothing allocates).
    #[inline]
    pub(crate) fn secs_per_token(&self) -> f64 {
        if self.tau_over_sum.is_infinite() {
            return f64::INFINITY;
        }
        // 1/e, for exp(−since_last/τ).
        let inv_e = (self.since_last_s * INV_TAU).exp();
        // ∫ exp(−s/τ) ds over the observed span (at least 1 s): the weight a constant rate
        // would have. exp(−span/τ)/e = exp(−first_to_last/τ) when the span reaches a second.
        if self.since_last_s + self.first_to_last_s >= 1.0 {
            self.tau_over_sum * (inv_e - self.first_decay)
        } else {
            self.tau_over_sum * (1.0 - FIRST_SECOND_DECAY) * inv_e
        }
    }

    /// Tokens allocated per second (0 when nothing allocates).
    pub fn per_s(&self) -> f64 {
        let spt = self.secs_per_token();
        if spt.is_finite() && spt > 0.0 {
            1.0 / spt
        } else {
            0.0
        }
    }
}

impl Default for AllocRate {
    fn default() -> Self {
        AllocRate::NONE
    }
}

/// 1/τ: a multiplication where a read would otherwise divide.
const INV_TAU: f64 = 1.0 / RATE_TAU_S;
/// exp(−1 s/τ): the decay over the shortest span a rate is averaged on.
const FIRST_SECOND_DECAY: f64 = 0.967_216_100_482_005_9;

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
pub(crate) fn residency_s(
    capacity_tokens: Option<f64>,
    pinned_tokens: f64,
    rate: AllocRate,
) -> f64 {
    // The rate is evaluated only when the capacity is known: its `exp` is the costly part.
    let Some(c) = capacity_tokens else {
        return f64::INFINITY;
    };
    let secs_per_token = rate.secs_per_token();
    if secs_per_token.is_finite() {
        c.max(pinned_tokens) * secs_per_token
    } else {
        f64::INFINITY
    }
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
        let res = residency_s(Some(100_000.0), 0.0, r.alloc_rate(now));
        assert!((res - 10.0).abs() < 0.6, "residency {res}");
        // Traffic stops: the rate decays, the residency grows.
        let later = now + Duration::from_secs(60);
        assert!(residency_s(Some(100_000.0), 0.0, r.alloc_rate(later)) > 5.0 * res);
        // Pinned tokens are held in flight first, then cycle like the rest: below the
        // capacity they do not change the window.
        assert_eq!(
            residency_s(Some(100_000.0), 50_000.0, r.alloc_rate(now)),
            res
        );
        // Reservations past the capacity mean requests stay in flight longer (Little's
        // law): the window grows with them instead of closing.
        let over = residency_s(Some(100_000.0), 150_000.0, r.alloc_rate(now));
        assert!((over - 1.5 * res).abs() < 1e-9, "over capacity {over}");
    }

    /// The published words give the rate the state itself computes, at any later time.
    #[test]
    fn the_published_words_give_the_same_rate() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        assert_eq!(alloc_rate_from_words(r.to_words(t0), 0), AllocRate::NONE);
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
            let (a, b) = (r.rate(now), alloc_rate_from_words(w, ns).per_s());
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
        let res = residency_s(
            Some(50_000.0),
            0.0,
            r.alloc_rate(t0 + Duration::from_secs(2)),
        );
        assert!((5.0..15.0).contains(&res), "residency {res}");
    }

    /// The inverse read gives the definition's rate, and the constants are what they say.
    #[test]
    fn seconds_per_token_invert_the_rate() {
        // The hand-written literal is the exp it stands for.
        assert_eq!(FIRST_SECOND_DECAY, (-1.0 / RATE_TAU_S).exp());
        assert_eq!(AllocRate::constant(2_000.0).secs_per_token(), 1.0 / 2_000.0);
        assert_eq!(AllocRate::constant(2_000.0).per_s(), 2_000.0);
        assert_eq!(AllocRate::constant(0.0), AllocRate::NONE);
        assert!(AllocRate::NONE.secs_per_token().is_infinite());
        assert_eq!(AllocRate::NONE.per_s(), 0.0);
        let t0 = Instant::now();
        let mut r = Residency::default();
        r.on_alloc(0.0, t0);
        assert_eq!(
            r.rate(t0 + Duration::from_secs(1)),
            0.0,
            "nothing allocated"
        );
        r.on_alloc(600.0, t0 + Duration::from_millis(500));
        for ms in [500u64, 900, 1_600, 40_000] {
            let a = r.alloc_rate(t0 + Duration::from_millis(ms));
            let (rate, spt) = (a.per_s(), a.secs_per_token());
            assert!(rate > 0.0 && (rate * spt - 1.0).abs() < 1e-12, "{ms} ms");
        }
    }

    #[test]
    fn unknown_capacity_or_no_traffic_is_infinite() {
        let t0 = Instant::now();
        let mut r = Residency::default();
        assert_eq!(r.rate(t0), 0.0);
        assert!(residency_s(Some(1e5), 0.0, r.alloc_rate(t0)).is_infinite());
        r.on_alloc(1e6, t0);
        assert!(residency_s(None, 0.0, r.alloc_rate(t0)).is_infinite());
        assert!(residency_s(Some(1e5), 0.0, r.alloc_rate(t0)).is_finite());
    }
}
