//! The gateway's routing state: pools by model name, each with its backends and policy.
//!
//! Built from a validated [`Config`]; held behind an `ArcSwap` so a reload can replace it
//! atomically while in-flight requests keep the `Arc`s they started with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::Backend;
use crate::config::Config;
use crate::routing::{BackendView, Policy};
use crate::telemetry::Metrics;

/// One model's pool.
#[derive(Debug)]
pub struct Pool {
    /// The model name clients send (also the pool's metric label).
    pub model: Arc<str>,
    /// The routing policy.
    pub policy: Arc<dyn Policy>,
    /// Backends, in config order.
    pub backends: Vec<Arc<Backend>>,
}

impl Pool {
    /// Routing views of every backend at `now`, with `tried` backends excluded.
    pub fn views(&self, now: Instant, tried: &[usize]) -> Vec<BackendView> {
        self.backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut v = b.view(now);
                v.excluded = tried.contains(&i);
                v
            })
            .collect()
    }
}

/// Everything a request needs to be routed.
#[derive(Debug)]
pub struct GatewayState {
    /// The config this state was built from.
    pub config: Arc<Config>,
    /// Pools by model name.
    pub pools: HashMap<Arc<str>, Pool>,
    /// Every backend of every pool, in config order.
    pub backends: Vec<Arc<Backend>>,
}

impl GatewayState {
    /// Build the state for `config`.
    pub fn new(config: Arc<Config>, metrics: &Metrics) -> GatewayState {
        let mut pools = HashMap::new();
        let mut all = Vec::new();
        for p in &config.pools {
            let backends: Vec<Arc<Backend>> = p
                .backends
                .iter()
                .map(|b| {
                    Arc::new(Backend::new(
                        b.clone(),
                        config.limits.connect_timeout,
                        metrics.clone(),
                    ))
                })
                .collect();
            all.extend(backends.iter().cloned());
            pools.insert(
                p.model.clone(),
                Pool {
                    model: p.model.clone(),
                    policy: p.policy.build(),
                    backends,
                },
            );
        }
        GatewayState {
            config,
            pools,
            backends: all,
        }
    }

    /// The pool serving `model`.
    pub fn pool(&self, model: &str) -> Option<&Pool> {
        self.pools.get(model)
    }

    /// `GET /v1/models` body: one entry per pool, sorted by name.
    pub fn models_json(&self) -> serde_json::Value {
        let mut names: Vec<&str> = self.pools.keys().map(|k| &**k).collect();
        names.sort_unstable();
        let data: Vec<serde_json::Value> = names
            .into_iter()
            .map(|m| {
                serde_json::json!({
                    "id": m, "object": "model", "created": 0, "owned_by": "pronto"
                })
            })
            .collect();
        serde_json::json!({ "object": "list", "data": data })
    }
}
