//! A backend's TTFT model as shared state: learned under a small mutex when a first token is
//! observed (off the decision path), published through a [`SeqCell`] so every routing decision
//! reads it without a lock or a pointer chase.

use std::sync::Mutex;
use std::time::Instant;

use super::{Coefficients, Quality, TtftEstimator, TtftInputs};
use crate::routing::TtftModelView;
use crate::seq_cell::SeqCell;

/// Prior variance of a fresh estimator (see [`TtftEstimator::new`]).
const PRIOR_VARIANCE: f64 = 1.0;
/// `last_observation` word meaning "never".
const NEVER: u64 = u64::MAX;

/// One backend's TTFT model.
#[derive(Debug)]
pub struct TtftModel {
    estimator: Mutex<TtftEstimator>,
    /// Coefficients (5 × f64 bits), samples, rel_error bits, last observation (ns since
    /// `epoch`, or [`NEVER`]).
    published: SeqCell<8>,
    epoch: Instant,
}

fn words(c: Coefficients, q: Quality, last_ns: u64) -> [u64; 8] {
    [
        c.base_s.to_bits(),
        c.s_per_token.to_bits(),
        c.s_per_token_sq.to_bits(),
        c.s_per_decode.to_bits(),
        c.s_per_waiting.to_bits(),
        u64::from(q.samples),
        q.rel_error.to_bits(),
        last_ns,
    ]
}

impl TtftModel {
    /// A model starting at `prior`.
    pub(crate) fn new(prior: Coefficients, epoch: Instant) -> TtftModel {
        let estimator = TtftEstimator::new(prior, PRIOR_VARIANCE);
        let published = SeqCell::new(words(estimator.coefficients(), estimator.quality(), NEVER));
        TtftModel {
            estimator: Mutex::new(estimator),
            published,
            epoch,
        }
    }

    /// Learn from a TTFT of `actual_s` for a request dispatched with `inputs`; returns the
    /// prediction made before learning.
    pub fn observe(&self, inputs: &TtftInputs, actual_s: f64, now: Instant) -> f64 {
        let mut e = self.estimator.lock().unwrap_or_else(|p| p.into_inner());
        let predicted = e.observe(inputs, actual_s, now);
        let at = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        self.published
            .store(words(e.coefficients(), e.quality(), at.min(NEVER - 1)));
        predicted
    }

    /// The model as a routing policy sees it at `now`.
    #[inline]
    pub fn view(&self, now: Instant) -> TtftModelView {
        self.view_at(now.saturating_duration_since(self.epoch).as_nanos() as u64)
    }

    /// [`view`](Self::view) at `now_ns` nanoseconds since the model's epoch.
    #[inline]
    pub(crate) fn view_at(&self, now_ns: u64) -> TtftModelView {
        let w = self.published.load();
        let f = f64::from_bits;
        TtftModelView {
            coefficients: Coefficients {
                base_s: f(w[0]),
                s_per_token: f(w[1]),
                s_per_token_sq: f(w[2]),
                s_per_decode: f(w[3]),
                s_per_waiting: f(w[4]),
            },
            quality: Quality {
                samples: w[5] as u32,
                rel_error: f(w[6]),
            },
            since_last_observation_s: if w[7] == NEVER {
                f64::INFINITY
            } else {
                crate::time::secs_from_ns(now_ns.saturating_sub(w[7]))
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn view_publishes_what_was_learned() {
        let m = TtftModel::new(Coefficients::default(), Instant::now());
        let t0 = Instant::now();
        let v = m.view(t0);
        assert_eq!(v.coefficients, Coefficients::default());
        assert_eq!(v.quality.samples, 0);
        assert!(v.since_last_observation_s.is_infinite());
        let x = TtftInputs {
            uncached_tokens: 1000.0,
            ..TtftInputs::default()
        };
        m.observe(&x, 0.5, t0);
        let v = m.view(t0 + Duration::from_secs(2));
        assert_eq!(v.quality.samples, 1);
        assert_ne!(v.coefficients, Coefficients::default());
        assert!((v.since_last_observation_s - 2.0).abs() < 1e-3);
    }
}
