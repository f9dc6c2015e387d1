//! A backend's TTFT model as shared state: learned under a small mutex when a first token is
//! observed (off the decision path), published through an `ArcSwap` so every routing decision
//! reads it without a lock.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::predict::{Coefficients, Quality, TtftEstimator, TtftInputs};
use crate::routing::TtftModelView;

/// Prior variance of a fresh estimator (see [`TtftEstimator::new`]).
const PRIOR_VARIANCE: f64 = 1.0;

#[derive(Debug, Clone, Copy)]
struct Published {
    coefficients: Coefficients,
    quality: Quality,
    last_observation: Option<Instant>,
}

/// One backend's TTFT model.
#[derive(Debug)]
pub struct TtftModel {
    estimator: Mutex<TtftEstimator>,
    published: ArcSwap<Published>,
}

impl TtftModel {
    /// A model starting at `prior`.
    pub fn new(prior: Coefficients) -> TtftModel {
        let estimator = TtftEstimator::new(prior, PRIOR_VARIANCE);
        let published = Published {
            coefficients: estimator.coefficients(),
            quality: estimator.quality(),
            last_observation: None,
        };
        TtftModel {
            estimator: Mutex::new(estimator),
            published: ArcSwap::from_pointee(published),
        }
    }

    /// Learn from a TTFT of `actual_s` for a request dispatched with `inputs`; returns the
    /// prediction made before learning.
    pub fn observe(&self, inputs: &TtftInputs, actual_s: f64, now: Instant) -> f64 {
        let mut e = self.estimator.lock().unwrap_or_else(|p| p.into_inner());
        let predicted = e.observe(inputs, actual_s, now);
        self.published.store(Arc::new(Published {
            coefficients: e.coefficients(),
            quality: e.quality(),
            last_observation: Some(now),
        }));
        predicted
    }

    /// The model as a routing policy sees it at `now`.
    pub fn view(&self, now: Instant) -> TtftModelView {
        let p = self.published.load();
        TtftModelView {
            coefficients: p.coefficients,
            quality: p.quality,
            since_last_observation_s: p.last_observation.map_or(f64::INFINITY, |t| {
                now.saturating_duration_since(t).as_secs_f64()
            }),
        }
    }
}
