//! Wake-ups that are right on average.
//!
//! tokio's timer has millisecond granularity and rounds every deadline *up* to its next tick,
//! so `sleep_until(at)` wakes between `at` and a tick later, plus scheduling: late by about
//! half a tick on average. A simulated backend sleeps several times per request (the front
//! end's hand-over, each step's end, the output release), so every simulated latency came out
//! a millisecond or two longer than the profile says — at concurrency 1 on a CPU engine, where
//! a TTFT is 10–20 ms, a bias of 10–20 % (`scripts/fidelity.sh` measured the simulator
//! 1.6–2.4 ms slower than its own fitted model).
//!
//! [`Timer`] learns its own mean lateness (an exponentially weighted average of wake-up minus
//! deadline, both signs) and aims that much early. Single wake-ups are still off by up to a
//! tick either way; their mean is the deadline. Under paused tokio time (tests) every wake-up
//! is exact and the aim stays at the deadline.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Most the timer aims early (a wake-up later than this is load, not granularity).
const MAX_EARLY_NS: i64 = 2_000_000;
/// Weight of the newest lateness sample in the average.
const GAIN: i64 = 8;

/// One backend's sleeps (see the module docs). Shared by its engine task and its responses.
#[derive(Debug, Default)]
pub(crate) struct Timer {
    /// How early to aim, nanoseconds (0..=[`MAX_EARLY_NS`]).
    early_ns: AtomicI64,
}

impl Timer {
    /// The instant to ask tokio for, for a wake-up due at `at`.
    pub fn aim(&self, at: Instant) -> Instant {
        let early = self.early_ns.load(Ordering::Relaxed);
        at.checked_sub(Duration::from_nanos(early as u64))
            .unwrap_or(at)
    }

    /// A wake-up due at `at` (aimed with [`aim`](Self::aim)) happened at `woke`: learn the
    /// error. Concurrent updates may overwrite each other; it is an estimate.
    pub fn woke(&self, at: Instant, woke: Instant) {
        let late_ns = if woke >= at {
            woke.duration_since(at).as_nanos().min(i64::MAX as u128) as i64
        } else {
            -(at.duration_since(woke).as_nanos().min(i64::MAX as u128) as i64)
        };
        let early = self.early_ns.load(Ordering::Relaxed);
        let next = (early + late_ns / GAIN).clamp(0, MAX_EARLY_NS);
        self.early_ns.store(next, Ordering::Relaxed);
    }

    /// Sleep until about `at` (see the module docs).
    pub async fn sleep_until(&self, at: Instant) {
        tokio::time::sleep_until(self.aim(at)).await;
        self.woke(at, Instant::now());
    }

    /// How early it aims now.
    #[cfg(test)]
    fn early(&self) -> Duration {
        Duration::from_nanos(self.early_ns.load(Ordering::Relaxed) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timer that always wakes 0.6 ms late learns to aim 0.6 ms early; one that wakes on
    /// time after that unlearns it; it never aims later than the deadline.
    #[test]
    fn it_learns_the_mean_lateness_and_never_aims_late() {
        let t = Timer::default();
        let t0 = Instant::now();
        let late = Duration::from_micros(600);
        for i in 0..200u64 {
            let at = t0 + Duration::from_millis(i);
            // The clock wakes 0.6 ms after what it was asked for.
            let woke = t.aim(at) + late;
            t.woke(at, woke);
        }
        let learnt = t.early();
        assert!(
            learnt > Duration::from_micros(590) && learnt <= late,
            "{learnt:?}"
        );
        let at = t0 + Duration::from_secs(1);
        assert_eq!(t.aim(at) + learnt, at);
        // Now every wake-up is exactly what was asked for: early ones pull the aim back.
        for i in 0..400u64 {
            let at = t0 + Duration::from_secs(2) + Duration::from_millis(i);
            t.woke(at, t.aim(at));
        }
        assert!(t.early() < Duration::from_micros(5), "{:?}", t.early());
        // Very late wake-ups (load) move the aim at most MAX_EARLY_NS early.
        for i in 0..100u64 {
            let at = t0 + Duration::from_secs(3) + Duration::from_millis(i);
            t.woke(at, at + Duration::from_millis(50));
        }
        assert_eq!(t.early(), Duration::from_nanos(MAX_EARLY_NS as u64));
    }

    /// Through tokio's own timer (paused clock: deterministic, and rounding like the real
    /// one): plain `sleep_until` wakes late on average by a good part of a millisecond; the
    /// timer's wake-ups, once it has learnt, are right on average.
    #[tokio::test(start_paused = true)]
    async fn through_tokio_wake_ups_are_right_on_average() {
        async fn mean_late_us(timer: Option<&Timer>) -> f64 {
            let (mut sum, mut n) = (0.0, 0);
            for i in 0..400 {
                // Deadlines at every sub-millisecond phase.
                let at = Instant::now() + Duration::from_micros(1_370);
                match timer {
                    Some(t) => t.sleep_until(at).await,
                    None => tokio::time::sleep_until(at).await,
                }
                if i >= 200 {
                    let now = Instant::now();
                    sum += if now >= at {
                        now.duration_since(at).as_secs_f64()
                    } else {
                        -at.duration_since(now).as_secs_f64()
                    } * 1e6;
                    n += 1;
                }
            }
            sum / f64::from(n)
        }
        let plain = mean_late_us(None).await;
        let t = Timer::default();
        let aimed = mean_late_us(Some(&t)).await;
        assert!(
            plain > 300.0,
            "plain sleeps are late by {plain} us on average"
        );
        assert!(
            aimed.abs() < 150.0,
            "aimed sleeps are off by {aimed} us on average"
        );
    }
}
