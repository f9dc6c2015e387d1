//! Run-time fault knobs of one simulated backend.
//!
//! A [`FaultControl`] is a cheap clonable handle shared by the backend's HTTP handlers, its
//! engine task and whoever drives a test or demo. Knobs start from the backend's
//! [`FaultConfig`] and can be changed at any time:
//!
//! - `error_rate` (0–1): each generation request is failed with a 500 OpenAI error before any
//!   byte of a response, drawn from a seeded random stream (deterministic for a given order
//!   of requests).
//! - `stall_first_token`: the first token of each request is held back this long (wall time,
//!   not scaled by the fleet's time scale) before it is sent; with `stall_probability` (0–1,
//!   default 1) only that share of requests is, drawn from a seeded stream of its own.
//! - `slowdown`: multiplies every engine step's duration (2.0 = half speed).
//! - [`FaultControl::crash`]: every open request is cut off mid-flight (its connection is
//!   closed without a final chunk), the engine's prefix cache is cleared, and the backend
//!   answers 503 to everything (including `/health`) for `restart_after` (wall time), then
//!   serves again with a cold cache. `crash_after` / `crash_every` in the YAML schedule crashes.
//! - `wedged` ([`FaultControl::set_wedged`]): the engine stops stepping — no token on any
//!   stream, no request finishes — while the backend stays alive: `/health` answers 200,
//!   requests are accepted and queue, aborts are applied. Unwedged, it resumes where it was.
//!   `wedge_after` (with `wedge_for`) in the YAML schedules it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::fleet_config::FaultConfig;
use super::fleet_driver::Cmd;

/// Handle on one backend's fault knobs.
#[derive(Clone)]
pub struct FaultControl {
    inner: Arc<FaultState>,
}

struct FaultState {
    error_rate: AtomicU64,
    stall_ns: AtomicU64,
    stall_probability: AtomicU64,
    stall_rng: Mutex<SmallRng>,
    slowdown: AtomicU64,
    restart_after_ns: AtomicU64,
    down_until: Mutex<Option<Instant>>,
    wedged: tokio::sync::watch::Sender<bool>,
    rng: Mutex<SmallRng>,
    cmd: mpsc::UnboundedSender<Cmd>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for FaultControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultControl")
            .field("error_rate", &self.error_rate())
            .field("stall_first_token", &self.stall_first_token())
            .field("slowdown", &self.slowdown())
            .field("restart_after", &self.restart_after())
            .field("down", &self.is_down())
            .field("wedged", &self.is_wedged())
            .finish()
    }
}

impl FaultControl {
    /// Knobs from `cfg`, the random stream seeded with `seed`, crashes sent to the engine task
    /// through `cmd`.
    pub(crate) fn new(cfg: &FaultConfig, seed: u64, cmd: mpsc::UnboundedSender<Cmd>) -> Self {
        let c = FaultControl {
            inner: Arc::new(FaultState {
                error_rate: AtomicU64::new(0),
                stall_ns: AtomicU64::new(0),
                stall_probability: AtomicU64::new(1f64.to_bits()),
                stall_rng: Mutex::new(SmallRng::seed_from_u64(seed ^ 0x0574_7a11)),
                slowdown: AtomicU64::new(1f64.to_bits()),
                restart_after_ns: AtomicU64::new(0),
                down_until: Mutex::new(None),
                wedged: tokio::sync::watch::Sender::new(false),
                rng: Mutex::new(SmallRng::seed_from_u64(seed)),
                cmd,
            }),
        };
        c.set_error_rate(cfg.error_rate);
        c.set_stall_first_token(cfg.stall_first_token);
        c.set_stall_probability(cfg.stall_probability);
        c.set_slowdown(cfg.slowdown);
        c.set_restart_after(cfg.restart_after);
        c
    }

    /// Probability that a generation request is failed with a 500.
    pub fn error_rate(&self) -> f64 {
        f64::from_bits(self.inner.error_rate.load(Ordering::Relaxed))
    }

    /// Set the error rate (clamped to 0–1; NaN counts as 0).
    pub fn set_error_rate(&self, p: f64) {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        self.inner.error_rate.store(p.to_bits(), Ordering::Relaxed);
    }

    /// How long each first token is held back, if at all.
    pub fn stall_first_token(&self) -> Option<Duration> {
        match self.inner.stall_ns.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    /// Hold each first token back for `d` (`None` or zero: no stall).
    pub fn set_stall_first_token(&self, d: Option<Duration>) {
        self.inner
            .stall_ns
            .store(d.map_or(0, nanos), Ordering::Relaxed);
    }

    /// Probability that a request is stalled (when `stall_first_token` is set).
    pub fn stall_probability(&self) -> f64 {
        f64::from_bits(self.inner.stall_probability.load(Ordering::Relaxed))
    }

    /// Set the stall probability (clamped to 0–1; NaN counts as 0).
    pub fn set_stall_probability(&self, p: f64) {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        self.inner
            .stall_probability
            .store(p.to_bits(), Ordering::Relaxed);
    }

    /// Draw this request's stall: `stall_first_token` with probability `stall_probability`.
    pub(crate) fn roll_stall(&self) -> Option<Duration> {
        let d = self.stall_first_token()?;
        let p = self.stall_probability();
        if p >= 1.0 {
            return Some(d);
        }
        (self
            .inner
            .stall_rng
            .lock()
            .expect("fault lock")
            .gen::<f64>()
            < p)
            .then_some(d)
    }

    /// Factor multiplying every step's duration.
    pub fn slowdown(&self) -> f64 {
        f64::from_bits(self.inner.slowdown.load(Ordering::Relaxed))
    }

    /// Set the slowdown factor (non-finite or non-positive values are ignored).
    pub fn set_slowdown(&self, factor: f64) {
        if factor.is_finite() && factor > 0.0 {
            self.inner
                .slowdown
                .store(factor.to_bits(), Ordering::Relaxed);
        }
    }

    /// How long a crashed backend stays down.
    pub fn restart_after(&self) -> Duration {
        Duration::from_nanos(self.inner.restart_after_ns.load(Ordering::Relaxed))
    }

    /// Set how long a crashed backend stays down.
    pub fn set_restart_after(&self, d: Duration) {
        self.inner
            .restart_after_ns
            .store(nanos(d), Ordering::Relaxed);
    }

    /// Crash now: cut every open request off, lose the cache, answer 503 for `restart_after`.
    pub fn crash(&self) {
        let until = Instant::now() + self.restart_after();
        *self.inner.down_until.lock().expect("fault lock") = Some(until);
        // The engine task is gone only when the fleet shut down; nothing to cut off then.
        let _ = self.inner.cmd.send(Cmd::Crash);
    }

    /// Whether the backend is down after a crash (it restarts by itself when the time is up).
    pub fn is_down(&self) -> bool {
        let mut g = self.inner.down_until.lock().expect("fault lock");
        match *g {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *g = None;
                false
            }
            None => false,
        }
    }

    /// Whether the engine is wedged (alive, accepting requests, producing nothing).
    pub fn is_wedged(&self) -> bool {
        *self.inner.wedged.borrow()
    }

    /// Wedge the engine (`true`) or let it go on (`false`).
    pub fn set_wedged(&self, wedged: bool) {
        self.inner.wedged.send_replace(wedged);
    }

    /// The wedge state from now on: what the engine task waits on while wedged.
    pub(crate) fn wedge_changes(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.wedged.subscribe()
    }

    /// Draw whether this request fails (one draw per generation request when the rate is set).
    pub(crate) fn roll_error(&self) -> bool {
        let p = self.error_rate();
        if p <= 0.0 {
            return false;
        }
        self.inner.rng.lock().expect("fault lock").gen::<f64>() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(cfg: &FaultConfig) -> (FaultControl, mpsc::UnboundedReceiver<Cmd>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (FaultControl::new(cfg, 7, tx), rx)
    }

    #[test]
    fn knobs_clamp_and_error_draws_are_seeded() {
        let (c, _rx) = control(&FaultConfig::default());
        assert_eq!(c.error_rate(), 0.0);
        assert!(!c.roll_error());
        c.set_error_rate(3.0);
        assert_eq!(c.error_rate(), 1.0);
        assert!((0..50).all(|_| c.roll_error()));
        c.set_slowdown(-1.0);
        assert_eq!(c.slowdown(), 1.0);
        c.set_slowdown(2.5);
        assert_eq!(c.slowdown(), 2.5);
        c.set_stall_first_token(Some(Duration::ZERO));
        assert_eq!(c.stall_first_token(), None);
        assert_eq!(c.roll_stall(), None);
        let stall = Some(Duration::from_secs(2));
        c.set_stall_first_token(stall);
        assert!(
            (0..20).all(|_| c.roll_stall() == stall),
            "p = 1: every request"
        );
        c.set_stall_probability(0.05);
        let stalled = (0..2000).filter(|_| c.roll_stall().is_some()).count();
        assert!(
            (50..=150).contains(&stalled),
            "{stalled} of 2000 at p = 0.05"
        );
        c.set_stall_probability(0.0);
        assert!((0..20).all(|_| c.roll_stall().is_none()));

        let draws = |seed| {
            let (tx, _rx) = mpsc::unbounded_channel();
            let c = FaultControl::new(&FaultConfig::default(), seed, tx);
            c.set_error_rate(0.5);
            (0..64).map(|_| c.roll_error()).collect::<Vec<_>>()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
        let hits = draws(3).iter().filter(|&&b| b).count();
        assert!((16..=48).contains(&hits), "{hits} of 64 at p=0.5");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wedge_is_held_until_let_go_and_its_changes_are_told() {
        let (c, mut rx) = control(&FaultConfig::default());
        assert!(!c.is_wedged());
        let mut changes = c.wedge_changes();
        c.set_wedged(true);
        assert!(c.is_wedged() && !c.is_down(), "alive while wedged");
        changes.changed().await.unwrap();
        assert!(*changes.borrow_and_update());
        c.set_wedged(false);
        changes.changed().await.unwrap();
        assert!(!*changes.borrow_and_update() && !c.is_wedged());
        assert!(
            rx.try_recv().is_err(),
            "no command: the engine keeps its requests"
        );
        let bad = FaultConfig {
            wedge_for: Some(Duration::from_secs(1)),
            ..FaultConfig::default()
        };
        assert_eq!(bad.validate(), Err(("wedge_for", "needs wedge_after")));
    }

    #[tokio::test(start_paused = true)]
    async fn crash_is_down_for_restart_after() {
        let (c, mut rx) = control(&FaultConfig::default());
        c.set_restart_after(Duration::from_secs(2));
        assert!(!c.is_down());
        c.crash();
        assert!(matches!(rx.try_recv(), Ok(Cmd::Crash)));
        assert!(c.is_down());
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(c.is_down());
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!c.is_down());
    }
}
