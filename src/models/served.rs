//! Which backends of a pool serve which model, from what each lists at `GET /v1/models`.
//!
//! A pool that serves its backends' models (`pronto serve --backend URL ...` without
//! `--model`: [`crate::config::Pool::serve_listed_models`]) answers every model some backend
//! lists. A request for model `m` is routed within the pool among the backends that list `m`:
//! the others are excluded from its decisions as a tried backend is. A backend whose list is
//! not known (down since start, or answering no list) serves none of the listed models; the
//! pool's own name still reaches every backend.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use pronto_core::ids::BackendId;

use crate::backend::Backend;

/// What each backend (by name) last listed: its model ids, sorted. A backend absent here has
/// not answered a list yet.
pub type Listed = BTreeMap<Arc<str>, Vec<Arc<str>>>;

/// The models of one pool and, for each, the pool's backends that do not serve it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedModels {
    excluded: BTreeMap<Arc<str>, Vec<BackendId>>,
}

impl ServedModels {
    /// The models `listed` names for the pool's `backends` (entries of other backends are
    /// ignored).
    pub fn new(backends: &[Arc<Backend>], listed: &Listed) -> ServedModels {
        let mut serving: BTreeMap<Arc<str>, BTreeSet<BackendId>> = BTreeMap::new();
        for b in backends {
            for m in listed.get(&b.config.name).into_iter().flatten() {
                serving.entry(m.clone()).or_default().insert(b.id());
            }
        }
        let excluded = serving
            .into_iter()
            .map(|(m, by)| {
                let others = backends
                    .iter()
                    .map(|b| b.id())
                    .filter(|id| !by.contains(id))
                    .collect();
                (m, others)
            })
            .collect();
        ServedModels { excluded }
    }

    /// The backends a request for `model` must not go to; `None` when no backend lists it.
    pub fn excluded(&self, model: &str) -> Option<&[BackendId]> {
        self.excluded.get(model).map(Vec::as_slice)
    }

    /// Every model some backend lists, sorted.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.excluded.keys().map(|m| &**m)
    }

    /// Whether no backend lists a model.
    pub fn is_empty(&self) -> bool {
        self.excluded.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::telemetry::Metrics;

    fn backends(n: usize) -> Vec<Arc<Backend>> {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 9000 + i))
            .collect();
        let config =
            Config::from_backend_urls(&urls, "p", pronto_core::routing::PolicyKind::RoundRobin)
                .unwrap();
        config.pools[0]
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                Arc::new(Backend::new(
                    BackendId(i as u64 + 1),
                    b.clone(),
                    config.limits.connect_timeout,
                    Metrics::new(),
                ))
            })
            .collect()
    }

    fn list(pairs: &[(&str, &[&str])]) -> Listed {
        pairs
            .iter()
            .map(|(b, ms)| (Arc::from(*b), ms.iter().map(|m| Arc::from(*m)).collect()))
            .collect()
    }

    #[test]
    fn each_model_excludes_the_backends_that_do_not_list_it() {
        let b = backends(3);
        let served = ServedModels::new(
            &b,
            &list(&[
                ("backend-0", &["llama", "llama-lora"]),
                ("backend-1", &["llama"]),
                ("elsewhere", &["qwen"]),
            ]),
        );
        assert_eq!(served.models().collect::<Vec<_>>(), ["llama", "llama-lora"]);
        // backend-2 listed nothing (it was down): excluded from both.
        assert_eq!(served.excluded("llama"), Some(&[BackendId(3)][..]));
        assert_eq!(
            served.excluded("llama-lora"),
            Some(&[BackendId(2), BackendId(3)][..])
        );
        assert_eq!(served.excluded("qwen"), None, "not a backend of this pool");
        assert!(ServedModels::new(&b, &Listed::new()).is_empty());
    }
}
