//! What a replica cannot see yet: the other replicas' dispatches still on their way.
//!
//! A replica hears of another's dispatch one sync delay after it happened; inside that window
//! every replica routes on the same fleet minus the others' newest bookings, so requests that
//! arrive at different replicas close together can land on the same backend. [`Unseen`]
//! measures how much is missing: the rate of the remote dispatches folded (the decayed
//! average [`Residency`] keeps of KV allocations, here one unit per dispatch: time constant
//! `RATE_TAU_S`, over the time since the first
//! while that is shorter), and the sync delay — the time a replica's own messages take to come back to it through the channel, which is
//! what its messages take to reach the others, with no clock shared. Their product
//! ([`Unseen::expected`]) is the number of remote dispatches a decision has not heard of:
//! the gateway exports both (`pronto_cluster_sync_delay_seconds`,
//! `pronto_cluster_unseen_dispatches`).

use std::time::{Duration, Instant};

use crate::affinity::residency::Residency;

/// Weight of a new echo in the delay's moving average.
const DELAY_WEIGHT: f64 = 0.2;

/// The estimate (see the module docs). Fed by [`super::Remote`] (remote dispatches) and by
/// whoever sees the replica's own messages come back (`Unseen::on_echo`).
#[derive(Debug, Clone, Default)]
pub struct Unseen {
    /// The remote dispatches' rate (one "token" each).
    dispatches: Residency,
    delay_s: Option<f64>,
}

impl Unseen {
    /// Nothing seen yet.
    pub(crate) fn new() -> Unseen {
        Unseen::default()
    }

    /// A remote dispatch was folded at `now`.
    pub(crate) fn on_remote_dispatch(&mut self, now: Instant) {
        self.dispatches.on_alloc(1.0, now);
    }

    /// One of this replica's own messages came back through the channel `delay` after it
    /// was sent.
    pub(crate) fn on_echo(&mut self, delay: Duration) {
        let d = delay.as_secs_f64();
        self.delay_s = Some(match self.delay_s {
            Some(s) => s + DELAY_WEIGHT * (d - s),
            None => d,
        });
    }

    /// The sync delay (a moving average of the echoes), if any echo was seen.
    pub fn delay(&self) -> Option<Duration> {
        self.delay_s.map(Duration::from_secs_f64)
    }

    /// Remote dispatches per second at `now` ([`Residency::rate`]: not biased low while
    /// the traffic is younger than the time constant).
    pub(crate) fn rate(&self, now: Instant) -> f64 {
        self.dispatches.rate(now)
    }

    /// Remote dispatches a decision at `now` has not heard of yet: rate × delay (0 before
    /// the first echo).
    pub fn expected(&self, now: Instant) -> f64 {
        self.delay_s.map_or(0.0, |d| self.rate(now) * d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::residency::RATE_TAU_S;

    #[test]
    fn nothing_is_expected_before_an_echo_or_a_remote_dispatch() {
        let t0 = Instant::now();
        let mut u = Unseen::new();
        assert_eq!((u.expected(t0), u.rate(t0), u.delay()), (0.0, 0.0, None));
        for i in 0..100 {
            u.on_remote_dispatch(t0 + Duration::from_millis(100 * i));
        }
        let now = t0 + Duration::from_secs(10);
        assert!(u.rate(now) > 9.0);
        assert_eq!(u.expected(now), 0.0, "no delay known yet");
        let mut v = Unseen::new();
        v.on_echo(Duration::from_millis(50));
        assert_eq!(v.expected(now), 0.0, "no remote traffic");
    }

    #[test]
    fn rate_times_delay_is_the_expected_unseen_count() {
        let t0 = Instant::now();
        let mut u = Unseen::new();
        // 10 remote dispatches a second: the rate is right after 3 s already (the window
        // correction) and after a minute.
        for i in 0..600 {
            u.on_remote_dispatch(t0 + Duration::from_millis(100 * i));
            if i == 30 {
                let r = u.rate(t0 + Duration::from_secs(3));
                assert!((r - 10.0).abs() < 0.6, "{r}");
            }
        }
        let now = t0 + Duration::from_millis(59_900);
        assert!((u.rate(now) - 10.0).abs() < 0.6, "{}", u.rate(now));
        u.on_echo(Duration::from_millis(50));
        assert!((u.expected(now) - 0.5).abs() < 0.05, "{}", u.expected(now));
        // The delay is a moving average of echoes.
        u.on_echo(Duration::from_millis(150));
        assert!((u.delay().unwrap().as_secs_f64() - 0.07).abs() < 1e-9);
        // Traffic stops: the rate decays, and so does what is unseen.
        let later = now + Duration::from_secs_f64(6.0 * RATE_TAU_S);
        assert!(u.expected(later) < 0.01);
    }
}
