//! Model discovery: what each backend of a pool that asks ([`crate::config::Pool::asks_models`])
//! lists at `GET /v1/models` — a pool that serves its backends' models
//! ([`crate::config::Pool::serve_listed_models`], `pronto serve --backend URL` without
//! `--model`), or one whose backends' `served_model_name` is `discover`
//! ([`crate::models::rename`]).
//!
//! ## When a backend is asked
//! - **At start**, before the gateway accepts a request ([`ModelDiscovery::initial_round`]):
//!   every backend at once, each within [`QUERY_TIMEOUT`], so the first request already finds
//!   its model. A backend that is down does not hold the start up for longer.
//! - **While its list is unknown** (down, or answering no list yet, as an engine still loading
//!   its weights does): again every [`RETRY`].
//! - **Once known**: again every [`REFRESH`] (an engine restarted with another model, a LoRA
//!   adapter loaded), and at once when its active health check recovers (a backend that went
//!   down may come back serving something else).
//!
//! A failed ask keeps the backend's last list: a backend that is down is kept out of routing
//! by health checking, not by forgetting its models. When the lists change,
//! [`GatewayState::with_listed_models`](crate::state::GatewayState::with_listed_models) builds the state anew — the rebuild a reload does, so
//! everything learnt about each backend is carried over — and it is swapped in through
//! [`crate::state::StateHandle::update`]. The log says which backend lists what, and why one cannot
//! be asked, once per change rather than once per ask.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::backend::Backend;
use crate::config::ServedName;
use crate::models::served::Listed;
use crate::state::StateHandle;
use crate::telemetry::Metrics;

/// How often the service looks for backends to ask.
pub const TICK: Duration = Duration::from_millis(500);
/// Time between asks of a backend whose list is unknown.
pub const RETRY: Duration = Duration::from_secs(2);
/// Time between asks of a backend whose list is known.
pub const REFRESH: Duration = Duration::from_secs(30);
/// Longest wait for one backend's answer.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest model list read, in bytes.
const MAX_LIST_BYTES: usize = 1 << 20;
/// Most models kept from one backend's list.
const MAX_MODELS: usize = 1024;
/// Longest model id kept.
const MAX_ID_LEN: usize = 512;

/// What one pool's backends list and when each was last asked (pure: time is passed in).
#[derive(Debug, Default)]
pub struct Directory {
    entries: BTreeMap<Arc<str>, Entry>,
}

#[derive(Debug)]
struct Entry {
    models: Option<Vec<Arc<str>>>,
    asked_at: Option<Instant>,
    healthy: bool,
    error: Option<String>,
}

impl Directory {
    /// The backends to ask at `now`, of the pool's `backends` (name, healthy now); backends
    /// no longer in the pool are forgotten. Each returned backend counts as asked at `now`.
    pub fn due(&mut self, backends: &[(Arc<str>, bool)], now: Instant) -> Vec<Arc<str>> {
        self.entries
            .retain(|name, _| backends.iter().any(|(n, _)| n == name));
        let mut out = Vec::new();
        for (name, healthy) in backends {
            let e = self.entries.entry(name.clone()).or_insert(Entry {
                models: None,
                asked_at: None,
                healthy: *healthy,
                error: None,
            });
            let recovered = *healthy && !e.healthy;
            e.healthy = *healthy;
            let wait = if e.models.is_some() { REFRESH } else { RETRY };
            let due = recovered
                || e.asked_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= wait);
            if due {
                e.asked_at = Some(now);
                out.push(name.clone());
            }
        }
        out
    }

    /// Record what asking `backend` of pool `pool` gave; whether its list changed. Logs
    /// what changed: a new list, or a new reason it cannot be asked.
    pub fn record(
        &mut self,
        pool: &str,
        backend: &str,
        result: Result<Vec<String>, String>,
    ) -> bool {
        let Some(e) = self.entries.get_mut(backend) else {
            return false;
        };
        match result {
            Ok(ids) => {
                let models: Vec<Arc<str>> = ids.into_iter().map(Arc::from).collect();
                e.error = None;
                if e.models.as_ref() == Some(&models) {
                    return false;
                }
                tracing::info!(pool, backend, models = ?models, "backend lists models");
                e.models = Some(models);
                true
            }
            Err(reason) => {
                if e.error.as_ref() != Some(&reason) {
                    match &e.models {
                        Some(m) => {
                            tracing::warn!(pool, backend, %reason, kept = ?m, "cannot list the backend's models; keeping its last list")
                        }
                        None => {
                            tracing::info!(pool, backend, %reason, retry = ?RETRY, "cannot list the backend's models yet")
                        }
                    }
                    e.error = Some(reason);
                }
                false
            }
        }
    }

    /// Every known list.
    pub fn listed(&self) -> Listed {
        self.entries
            .iter()
            .filter_map(|(name, e)| Some((name.clone(), e.models.clone()?)))
            .collect()
    }
}

/// The model ids of a `GET /v1/models` answer (`{"data": [{"id": ...}, ...]}`), sorted and
/// deduplicated; empty or overlong ids are skipped.
pub fn parse_model_list(body: &[u8]) -> Result<Vec<String>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let data = v
        .get("data")
        .and_then(serde_json::Value::as_array)
        .ok_or("no `data` list")?;
    let mut ids: Vec<String> = data
        .iter()
        .filter_map(|m| m.get("id")?.as_str())
        .filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN)
        .take(MAX_MODELS)
        .map(str::to_string)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Ask `backend` for its models with `http`.
async fn ask(http: &reqwest::Client, backend: &Backend) -> Result<Vec<String>, String> {
    let url = format!("{}/v1/models", backend.config.base_url());
    let r = http
        .get(url)
        .timeout(QUERY_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("{e}"))?;
    if !r.status().is_success() {
        return Err(format!("GET /v1/models answered {}", r.status().as_u16()));
    }
    if r.content_length()
        .is_some_and(|n| n > MAX_LIST_BYTES as u64)
    {
        return Err(format!("model list over {MAX_LIST_BYTES} bytes"));
    }
    let body = r.bytes().await.map_err(|e| format!("reading: {e}"))?;
    if body.len() > MAX_LIST_BYTES {
        return Err(format!("model list over {MAX_LIST_BYTES} bytes"));
    }
    parse_model_list(&body)
}

/// Which HTTP clients a round asks with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clients {
    /// Each backend's own (pooled, bound to the runtime they were first used on).
    Backends,
    /// A fresh client per backend (a round on a runtime of its own).
    Fresh,
}

/// The model discovery service (a pingora background service).
pub struct ModelDiscovery {
    state: StateHandle,
    metrics: Metrics,
    directories: Mutex<HashMap<Arc<str>, Directory>>,
}

impl std::fmt::Debug for ModelDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDiscovery").finish_non_exhaustive()
    }
}

impl ModelDiscovery {
    /// A service over whatever state is current.
    pub fn new(state: StateHandle, metrics: Metrics) -> ModelDiscovery {
        ModelDiscovery {
            state,
            metrics,
            directories: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any pool of the current state asks its backends for their models.
    pub fn has_work(&self) -> bool {
        self.state
            .load()
            .config
            .pools
            .iter()
            .any(|p| p.asks_models())
    }

    /// The first round, on a thread and runtime of its own (callable from inside another
    /// runtime); blocks for about [`QUERY_TIMEOUT`] at most.
    pub fn initial_round(&self) {
        std::thread::scope(|s| {
            s.spawn(|| match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(self.round(Instant::now(), Clients::Fresh)),
                Err(e) => tracing::warn!(error = %e, "model discovery: no runtime for the first round; the service will ask"),
            });
        });
    }

    /// Ask the backends due at `now` and swap in what changed.
    async fn round(&self, now: Instant, clients: Clients) {
        let state = self.state.load();
        let asks = |model: &str| state.config.pool(model).is_some_and(|p| p.asks_models());
        for pool in state.pools.values().filter(|p| asks(&p.model)) {
            let health: Vec<(Arc<str>, bool)> = pool
                .backends
                .iter()
                .map(|b| (b.config.name.clone(), b.is_healthy(now)))
                .collect();
            let due = lock(&self.directories)
                .entry(pool.model.clone())
                .or_default()
                .due(&health, now);
            if due.is_empty() {
                continue;
            }
            let asks = pool
                .backends
                .iter()
                .filter(|b| due.contains(&b.config.name))
                .map(|b| async move {
                    let result = match clients {
                        Clients::Backends => ask(&b.http, b).await,
                        Clients::Fresh => ask(&crate::tls::backend_http_client(&b.config), b).await,
                    };
                    (b.config.name.clone(), result)
                });
            let results = join_all(asks).await;
            let listed = {
                let mut dirs = lock(&self.directories);
                let dir = dirs.entry(pool.model.clone()).or_default();
                for (name, result) in results {
                    dir.record(&pool.model, &name, result);
                }
                dir.listed()
            };
            self.apply(&pool.model, listed);
        }
    }

    /// Swap in a state where pool `model`'s backends list `listed`, unless it has that already.
    fn apply(&self, model: &str, listed: Listed) {
        let swapped = self.state.update(|current| {
            let serving = current.config.pool(model).is_some_and(|p| p.asks_models());
            let same = match current.listed_models(model) {
                Some(l) => *l == listed,
                None => listed.is_empty(),
            };
            if !serving || same {
                return None;
            }
            Some(current.with_listed_models(model, listed.clone(), &self.metrics))
        });
        let Some((next, _)) = swapped else { return };
        let Some(pool) = next.pool(model) else { return };
        if let Some(served) = &pool.served {
            let models: Vec<&str> = served.models().collect();
            tracing::info!(
                pool = model,
                ?models,
                "serving the models the backends list"
            );
        }
        let asked =
            |b: &&Arc<Backend>| matches!(b.config.served_model_name, Some(ServedName::Discover));
        for (i, b) in pool.backends.iter().enumerate().filter(|(_, b)| asked(b)) {
            let listed = next
                .listed_models(model)
                .and_then(|l| l.get(&b.config.name));
            match (pool.upstream_model(i), listed) {
                (Some(name), _) => {
                    tracing::info!(pool = model, backend = %b.name(), served_model_name = name, "the pool's requests go to the backend as the model it lists")
                }
                (None, Some(listed)) => {
                    tracing::warn!(pool = model, backend = %b.name(), ?listed, "served_model_name: discover: the backend lists neither one model nor the pool's name; it is not routed to")
                }
                (None, None) => {}
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl BackgroundService for ModelDiscovery {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.changed() => return,
            }
            self.round(tokio::time::Instant::now().into_std(), Clients::Backends)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[Arc<str>]) -> Vec<&str> {
        v.iter().map(|n| &**n).collect()
    }

    #[test]
    fn unknown_lists_are_asked_often_known_ones_rarely_and_at_recovery() {
        let t0 = Instant::now();
        let mut d = Directory::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let both = |ha, hb| vec![(a.clone(), ha), (b.clone(), hb)];
        assert_eq!(names(&d.due(&both(true, true), t0)), ["a", "b"]);
        assert!(d.record("p", "a", Ok(vec!["m".into()])));
        assert!(!d.record("p", "b", Err("connection refused".into())));
        assert!(d.due(&both(true, false), t0 + RETRY / 2).is_empty());
        // b's list is unknown: asked again after RETRY; a's is known: not until REFRESH.
        assert_eq!(names(&d.due(&both(true, false), t0 + RETRY)), ["b"]);
        assert!(!d.record("p", "b", Err("connection refused".into())));
        assert_eq!(names(&d.due(&both(true, false), t0 + REFRESH)), ["a", "b"]);
        // Recovery of its health check: at once.
        let t1 = t0 + REFRESH + Duration::from_millis(100);
        assert_eq!(names(&d.due(&both(true, true), t1)), ["b"]);
        assert!(d.record("p", "b", Ok(vec!["n".into()])));
        assert!(!d.record("p", "b", Ok(vec!["n".into()])), "unchanged");
        let listed = d.listed();
        assert_eq!(listed.len(), 2);
        assert_eq!(names(&listed[&a]), ["m"]);
        // A failed ask keeps the last list; a backend that left the pool is forgotten.
        assert!(!d.record("p", "a", Err("timeout".into())));
        assert_eq!(names(&d.listed()[&a]), ["m"]);
        d.due(&[(b.clone(), true)], t1);
        assert_eq!(d.listed().len(), 1);
        assert!(!d.record("p", "a", Ok(vec!["x".into()])), "not in the pool");
    }

    #[test]
    fn model_lists_parse_like_openai_and_vllm_answers() {
        let vllm = br#"{"object":"list","data":[
            {"id":"meta-llama/Llama-3.1-8B","object":"model","owned_by":"vllm","max_model_len":8192},
            {"id":"sql-lora","object":"model","parent":"meta-llama/Llama-3.1-8B"},
            {"id":"sql-lora"},{"id":""},{"object":"model"}]}"#;
        assert_eq!(
            parse_model_list(vllm).unwrap(),
            ["meta-llama/Llama-3.1-8B", "sql-lora"]
        );
        assert_eq!(
            parse_model_list(br#"{"data":[]}"#).unwrap(),
            Vec::<String>::new()
        );
        assert!(parse_model_list(b"<html>")
            .unwrap_err()
            .starts_with("not JSON"));
        assert_eq!(
            parse_model_list(br#"{"models":[]}"#).unwrap_err(),
            "no `data` list"
        );
        let long = format!(r#"{{"data":[{{"id":"{}"}}]}}"#, "x".repeat(MAX_ID_LEN + 1));
        assert!(parse_model_list(long.as_bytes()).unwrap().is_empty());
    }
}
