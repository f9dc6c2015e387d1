//! The gateway's routing state: pools by model name, each with its backends and policy.
//!
//! Built from a validated [`Config`]; held behind an `ArcSwap` so a reload can replace it
//! atomically while in-flight requests keep the `Arc`s they started with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::affinity::{IndexConfig, PrefixIndex};
use crate::backend::Backend;
use crate::config::Config;
use crate::request::RequestFeatures;
use crate::routing::{apply_prefix_matches, limit_to_resident, BackendView, Policy};
use crate::telemetry::Metrics;
use crate::tokens::BLOCK_TOKENS;

/// Prefix blocks indexed per pool at most (about 65 bytes each: ~260 MiB at the cap).
const INDEX_MAX_BLOCKS: usize = 4 << 20;
/// Index entries unused this long are forgotten (engines evict long before).
const INDEX_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// One model's pool.
#[derive(Debug)]
pub struct Pool {
    /// The model name clients send (also the pool's metric label).
    pub model: Arc<str>,
    /// The routing policy.
    pub policy: Arc<dyn Policy>,
    /// Backends, in config order.
    pub backends: Vec<Arc<Backend>>,
    /// Which backend was sent which prompt prefixes (index = position in `backends`).
    pub index: PrefixIndex,
}

impl Pool {
    /// Routing views of every backend at `now` for `features`: load, engine stats, TTFT
    /// model, and the prefix-cache hit expected for this prompt; `tried` backends excluded.
    pub fn views(
        &self,
        features: &RequestFeatures,
        now: Instant,
        tried: &[usize],
    ) -> Vec<BackendView> {
        let mut views: Vec<BackendView> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut v = b.view(now);
                v.excluded = tried.contains(&i);
                v
            })
            .collect();
        if !features.block_hashes.is_empty() {
            let mut matched = vec![0u32; views.len()];
            self.index
                .match_lengths(&features.block_hashes, now, &mut matched);
            limit_to_resident(&self.index, &views, features, now, &mut matched);
            apply_prefix_matches(
                &mut views,
                &matched,
                BLOCK_TOKENS as u32,
                features.prompt_tokens,
            );
        }
        views
    }

    /// Forget what the index believes `backend` holds (it was ejected or restarted).
    pub fn forget(&self, backend: usize) {
        let n = self.index.forget_backend(backend);
        tracing::info!(backend = %self.backends[backend].name(), entries = n, "prefix index forgot backend");
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
                    index: PrefixIndex::new(IndexConfig {
                        max_blocks: INDEX_MAX_BLOCKS,
                        ttl: INDEX_TTL,
                        max_backends: backends.len().max(1),
                    }),
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
