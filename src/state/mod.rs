//! The gateway's routing state: pools by model name, each with its backends and policy.
//!
//! Built from a validated [`Config`]; held behind an `ArcSwap` so a reload can replace it
//! atomically while in-flight requests keep the `Arc`s they started with.
//!
//! ## Rebuilding on reload: what is carried over
//! [`GatewayState::rebuild`] builds the state for a new config from the current one, keeping
//! what the gateway has learned wherever the config did not change it:
//! - **Backends.** A backend's identity is *(pool model name, backend name, its whole static
//!   config — URL, weight, max_inflight, labels — and `limits.connect_timeout`)*. An identical
//!   backend keeps its `Arc<Backend>`: TTFT model, in-flight and prefill counters, health,
//!   ejection, scraped engine state. Anything else is a new backend with fresh state (editing
//!   a backend's weight or labels re-creates it; the pingora peer carries the connect
//!   timeout, so changing it re-creates every backend). In-flight requests hold the `Arc` of
//!   the backend they were sent to, so a removed backend drains: its streams finish, and no
//!   new request can reach it because it is in no pool of the new state.
//! - **Prefix index** (keyed by a backend's position in its pool). A pool keeps its index
//!   when it exists under the same model name and its new backend list fits the index's
//!   capacity (backends rounded up to a multiple of 64, which costs no memory). Positions
//!   whose occupant changed are forgotten, so appending or removing the last backend keeps
//!   every other backend's entries, and an unchanged pool keeps them all; a removal in the
//!   middle shifts the later backends, which start cold. (Requests still in flight on the old
//!   state may record one prompt's prefix under a re-used position: the index is a guess.)
//! - **Discovered backends** (`services::discovery`): the addresses last resolved for a pool's
//!   `discover:` name are kept while the new config resolves the same name (`host:port` and
//!   address family) for a pool of the same model name, so a reload does not drop them
//!   before the resolver's next look; they are then backends like any other (their identity
//!   includes the discover section's weight and cap, and the pool's profile).
//! - **Policy** object (round-robin cursor, seeded random stream, hash ring): kept when the
//!   policy spec is equal and the backend list is identical, else built fresh.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pronto_core::cluster::BackendRef;
use pronto_core::ids::{BackendId, RouteId};

use crate::backend::Backend;
use crate::cluster::Link;
use crate::config::{Config, Resources, Route};
use crate::models::rename;
use crate::models::served::{Listed, ServedModels};
use crate::telemetry::Metrics;
use pronto_core::affinity::{IndexConfig, PrefixIndex, MAX_BACKENDS};
use pronto_core::routing::Policy;

pub mod activity;
mod handle;
mod pool;
pub use handle::StateHandle;
pub use pool::{Attempted, Pool, Routed};

/// The next backend instance's id (ids are never reused within the process).
fn mint_backend_id() -> BackendId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    BackendId(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Where [`GatewayState::route`] sends a request.
#[derive(Debug, Clone, Copy)]
pub struct Target<'s> {
    /// The pool.
    pub pool: &'s Pool,
    /// The route that matched (with `routes:`), and its id: what [`GatewayState::policy_for`]
    /// takes, so that the route is never looked up again by name.
    pub route: Option<(RouteId, &'s Route)>,
    /// Backends of the pool that must not serve it (they do not list its model).
    pub excluded: &'s [BackendId],
}

/// Prefix blocks indexed per pool at most (about 97 bytes each with up to 256 backends, 65
/// without the four per-backend recency words: ~390 MiB at the cap).
const INDEX_MAX_BLOCKS: usize = 4 << 20;
/// Index entries unused this long are forgotten (engines evict long before).
const INDEX_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// Backend positions a pool's prefix index holds for `backends`: rounded up to a whole
/// 64-bit word of its bitsets (no extra memory), so a reload can add backends and keep it.
fn index_capacity(backends: usize) -> usize {
    backends.max(1).next_multiple_of(64).min(MAX_BACKENDS)
}

/// Slots in `old`'s index for `backends`: a backend `old` had keeps its slot, a new one takes
/// the lowest slot no kept backend holds; `None` when they do not fit the index.
fn keep_slots(old: &Pool, backends: &[Arc<Backend>]) -> Option<Vec<usize>> {
    let cap = old.index.max_backends();
    let mut taken = vec![false; cap];
    let mut slots: Vec<Option<usize>> = backends
        .iter()
        .map(|b| {
            let j = old.backends.iter().position(|o| Arc::ptr_eq(o, b))?;
            taken[old.slots[j]] = true;
            Some(old.slots[j])
        })
        .collect();
    let mut free = (0..cap).filter(|&s| !taken[s]);
    for s in slots.iter_mut().filter(|s| s.is_none()) {
        *s = Some(free.next()?);
    }
    slots.into_iter().collect()
}

/// Everything a request needs to be routed.
#[derive(Debug)]
pub struct GatewayState {
    /// The config this state was built from.
    pub config: Arc<Config>,
    /// What the config's files were loaded into (tokenizers, the TLS identity).
    pub resources: Arc<Resources>,
    /// Pools by model name.
    pub pools: HashMap<Arc<str>, Pool>,
    /// Every backend of every pool, in config order (each pool's discovered ones after its
    /// static ones).
    pub backends: Vec<Arc<Backend>>,
    /// The addresses each `discover:` pool's name last resolved to, sorted; a pool absent
    /// here has not resolved yet (it has only its static backends).
    discovered: HashMap<Arc<str>, Vec<SocketAddr>>,
    /// What the backends of each pool that serves its backends' models last listed.
    listed: HashMap<Arc<str>, Arc<Listed>>,
    /// The policy object of each route with its own `policy:`, indexed by [`RouteId`].
    route_policies: Vec<Option<Arc<dyn Policy>>>,
    /// Replica sync (with `cluster:`), carried over by every rebuild.
    cluster: Option<Arc<Link>>,
}

/// What [`GatewayState::rebuild`] carried over from the previous state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    /// Backends that kept their `Arc<Backend>` and everything learned on it.
    pub backends_kept: usize,
    /// Backends built fresh (new, or changed).
    pub backends_new: usize,
    /// Backends of the previous state that are in no pool any more, by name (a name may
    /// come back as a new backend when only its settings changed).
    pub backends_removed: Vec<Arc<str>>,
    /// Pools that kept their prefix index.
    pub indexes_kept: usize,
    /// Pools that kept their policy object.
    pub policies_kept: usize,
}

impl GatewayState {
    /// Build the state for `config` and its loaded `resources`.
    pub fn new(config: Arc<Config>, resources: Arc<Resources>, metrics: &Metrics) -> GatewayState {
        GatewayState::build(
            config,
            resources,
            metrics,
            None,
            HashMap::new(),
            HashMap::new(),
        )
        .0
    }

    /// Build the state for `config`, carrying over from `self` every backend, prefix index
    /// and policy the new config leaves unchanged (see the module docs). `self` is not
    /// modified except that its prefix indexes forget the positions whose backend changed
    /// (an index is shared with the new state only when kept).
    pub fn rebuild(
        &self,
        config: Arc<Config>,
        resources: Arc<Resources>,
        metrics: &Metrics,
    ) -> (GatewayState, Carried) {
        let discovered = self
            .discovered
            .iter()
            .filter(|(model, _)| {
                let spec = |c: &Config| {
                    let d = c.pool(model)?.discover.as_ref()?;
                    Some((d.target(), d.family))
                };
                spec(&config).is_some() && spec(&config) == spec(&self.config)
            })
            .map(|(m, a)| (m.clone(), a.clone()))
            .collect();
        let listed = self.listed.clone();
        GatewayState::build(config, resources, metrics, Some(self), discovered, listed)
    }

    /// The same config with pool `model`'s discovered addresses replaced by `addrs` (see
    /// `services::discovery`); everything else is carried over as by [`GatewayState::rebuild`].
    pub fn with_discovered(
        &self,
        model: &str,
        mut addrs: Vec<SocketAddr>,
        metrics: &Metrics,
    ) -> (GatewayState, Carried) {
        addrs.sort_unstable();
        addrs.dedup();
        let mut discovered = self.discovered.clone();
        discovered.insert(Arc::from(model), addrs);
        GatewayState::build(
            Arc::clone(&self.config),
            Arc::clone(&self.resources),
            metrics,
            Some(self),
            discovered,
            self.listed.clone(),
        )
    }

    /// The same config with what pool `model`'s backends list at `GET /v1/models` replaced by
    /// `listed` (see `services::models`); everything else carried over.
    pub fn with_listed_models(
        &self,
        model: &str,
        listed: Listed,
        metrics: &Metrics,
    ) -> (GatewayState, Carried) {
        let mut all = self.listed.clone();
        all.insert(Arc::from(model), Arc::new(listed));
        GatewayState::build(
            Arc::clone(&self.config),
            Arc::clone(&self.resources),
            metrics,
            Some(self),
            self.discovered.clone(),
            all,
        )
    }

    /// What pool `model`'s backends last listed; `None` before any answered.
    pub fn listed_models(&self, model: &str) -> Option<&Listed> {
        self.listed.get(model).map(|l| &**l)
    }

    /// The addresses pool `model`'s `discover:` name last resolved to (sorted); `None` before
    /// the first successful resolution.
    pub fn discovered(&self, model: &str) -> Option<&[SocketAddr]> {
        self.discovered.get(model).map(Vec::as_slice)
    }

    fn build(
        config: Arc<Config>,
        resources: Arc<Resources>,
        metrics: &Metrics,
        previous: Option<&GatewayState>,
        mut discovered: HashMap<Arc<str>, Vec<SocketAddr>>,
        mut listed: HashMap<Arc<str>, Arc<Listed>>,
    ) -> (GatewayState, Carried) {
        discovered.retain(|model, _| config.pool(model).is_some_and(|p| p.discover.is_some()));
        listed.retain(|model, _| config.pool(model).is_some_and(|p| p.asks_models()));
        let mut carried = Carried::default();
        let mut pools = HashMap::new();
        let mut all: Vec<Arc<Backend>> = Vec::new();
        let connect_timeout = config.limits.connect_timeout;
        for p in &config.pools {
            let old = previous.and_then(|prev| {
                let pool = prev.pools.get(&p.model)?;
                let spec = &prev.config.pool(&p.model)?.policy;
                Some((pool, spec, prev.config.limits.connect_timeout))
            });
            let found: Vec<crate::config::Backend> = match (&p.discover, discovered.get(&p.model)) {
                (Some(d), Some(addrs)) => addrs.iter().map(|&a| d.backend(p, a)).collect(),
                _ => Vec::new(),
            };
            let backends: Vec<Arc<Backend>> = p
                .backends
                .iter()
                .chain(&found)
                .map(|b| {
                    let same = old.and_then(|(pool, _, old_timeout)| {
                        (old_timeout == connect_timeout)
                            .then(|| pool.backends.iter().find(|o| o.config == *b))
                            .flatten()
                    });
                    match same {
                        Some(o) => {
                            carried.backends_kept += 1;
                            Arc::clone(o)
                        }
                        None => {
                            carried.backends_new += 1;
                            Arc::new(Backend::new(
                                mint_backend_id(),
                                b.clone(),
                                connect_timeout,
                                metrics.clone(),
                            ))
                        }
                    }
                })
                .collect();
            let identical = old.is_some_and(|(pool, _, _)| {
                pool.backends.len() == backends.len()
                    && pool
                        .backends
                        .iter()
                        .zip(&backends)
                        .all(|(a, b)| Arc::ptr_eq(a, b))
            });
            let policy = match old {
                Some((pool, spec, _)) if identical && *spec == p.policy => {
                    carried.policies_kept += 1;
                    Arc::clone(&pool.policy)
                }
                _ => p.policy.build(),
            };
            // Block hashes and the learned token ratio are in the tokenizer's terms: a pool
            // whose tokenizer changed (added, removed or edited) starts both afresh.
            let same_tokens = previous
                .and_then(|prev| prev.config.pool(&p.model))
                .is_some_and(|o| o.tokenizer == p.tokenizer);
            let kept_index = old
                .filter(|_| same_tokens)
                .and_then(|(pool, _, _)| Some((pool, keep_slots(pool, &backends)?)));
            let (index, slots) = match kept_index {
                Some((pool, slots)) => {
                    carried.indexes_kept += 1;
                    // A slot whose backend is gone is forgotten before anyone else gets it.
                    for (o, &slot) in pool.backends.iter().zip(&pool.slots) {
                        if !backends.iter().any(|b| Arc::ptr_eq(b, o)) {
                            pool.index.forget_backend(slot);
                        }
                    }
                    (Arc::clone(&pool.index), slots)
                }
                None => (
                    Arc::new(PrefixIndex::new(IndexConfig {
                        max_blocks: INDEX_MAX_BLOCKS,
                        ttl: INDEX_TTL,
                        max_backends: index_capacity(backends.len()),
                    })),
                    (0..backends.len()).collect(),
                ),
            };
            all.extend(backends.iter().cloned());
            let pool_listed = listed.get(&p.model).map(|l| &**l);
            let mut unnamed = Vec::new();
            let upstream_models = backends
                .iter()
                .map(|b| {
                    rename::upstream_name(&b.config, &p.model, pool_listed).unwrap_or_else(|()| {
                        unnamed.push(b.id());
                        None
                    })
                })
                .collect();
            let sync_refs = backends
                .iter()
                .map(|b| BackendRef::of(&p.model, &b.config.name))
                .collect();
            pools.insert(
                p.model.clone(),
                Pool {
                    model: p.model.clone(),
                    policy,
                    index,
                    slots,
                    token_ratio: match old {
                        Some((pool, _, _)) if same_tokens => Arc::clone(&pool.token_ratio),
                        _ => Arc::default(),
                    },
                    reasoning: match old {
                        Some((pool, _, _)) => Arc::clone(&pool.reasoning),
                        None => Arc::default(),
                    },
                    tokenizer: resources.tokenizer(&p.model).cloned(),
                    served: p.serve_listed_models.then(|| {
                        let none = Listed::new();
                        ServedModels::new(&backends, pool_listed.unwrap_or(&none))
                    }),
                    upstream_models,
                    unnamed,
                    sync_refs,
                    cluster: previous.and_then(|prev| prev.cluster.clone()),
                    stall: config.health.stall.rule(),
                    backends,
                },
            );
        }
        if let Some(prev) = previous {
            carried.backends_removed = prev
                .backends
                .iter()
                .filter(|o| !all.iter().any(|b| Arc::ptr_eq(b, o)))
                .map(|o| o.config.name.clone())
                .collect();
        }
        // A route's own policy object is kept while its name, pool and spec are unchanged.
        let route_policies = config
            .routes
            .iter()
            .map(|r| {
                let spec = r.policy.as_ref()?;
                let kept = previous.and_then(|prev| {
                    let (i, old) = prev
                        .config
                        .routes
                        .iter()
                        .enumerate()
                        .find(|(_, o)| o.name == r.name)?;
                    (old.pool == r.pool && old.policy.as_ref() == Some(spec))
                        .then(|| prev.route_policies.get(i)?.clone())?
                });
                Some(kept.unwrap_or_else(|| spec.build()))
            })
            .collect();
        debug_assert!(resources.cover(&config), "resources of another config");
        let state = GatewayState {
            config,
            resources,
            pools,
            backends: all,
            discovered,
            listed,
            route_policies,
            cluster: previous.and_then(|prev| prev.cluster.clone()),
        };
        (state, carried)
    }

    /// The same state, telling the other replicas of every dispatch through `link`; every
    /// rebuild keeps it.
    pub fn with_cluster(mut self, link: Arc<Link>) -> GatewayState {
        for pool in self.pools.values_mut() {
            pool.cluster = Some(Arc::clone(&link));
        }
        self.cluster = Some(link);
        self
    }

    /// The pool serving `model`.
    pub fn pool(&self, model: &str) -> Option<&Pool> {
        self.pools.get(model)
    }

    /// Where a request goes: the first route matching `model`, `path` and `headers`, and its
    /// pool; without `routes:` in the config, the pool named by `model`, else a pool one of
    /// whose backends lists `model` (on those backends only). `None`: nothing serves it (404).
    pub fn route(&self, model: &str, path: &str, headers: &http::HeaderMap) -> Option<Target<'_>> {
        let target = |pool, route| Target {
            pool,
            route,
            excluded: &[],
        };
        if self.config.routes.is_empty() {
            if let Some(p) = self.pool(model) {
                return Some(target(p, None));
            }
            // Few pools serve listed models (one, from `serve --backend`): a scan.
            return self.pools.values().find_map(|p| {
                let excluded = p.served.as_ref()?.excluded(model)?;
                Some(Target {
                    pool: p,
                    route: None,
                    excluded,
                })
            });
        }
        let (i, route) = self
            .config
            .routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.matcher.matches(model, path, headers))?;
        let id = RouteId(u32::try_from(i).ok()?);
        Some(target(self.pools.get(&route.pool)?, Some((id, route))))
    }

    /// The policy that routes a request of route `route` (if any) within `pool`: the route's
    /// own when it has one and targets this pool (not after a fallback to another pool), else
    /// the pool's. Two indexed reads, no name lookup.
    pub fn policy_for<'a>(&'a self, pool: &'a Pool, route: Option<RouteId>) -> &'a Arc<dyn Policy> {
        route
            .and_then(|id| {
                let r = self.config.routes.get(id.index())?;
                let own = self.route_policies.get(id.index())?.as_ref()?;
                (r.pool == pool.model).then_some(own)
            })
            .unwrap_or(&pool.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pronto_core::tokens::BlockHash;
    use std::time::Instant;

    fn config(policy: &str, backends: &[(&str, u16)]) -> Arc<Config> {
        let mut yaml = format!(
            "retry: {{max_retries: 0}}\npools:\n  m:\n    policy: {policy}\n    backends:\n"
        );
        for (name, port) in backends {
            yaml.push_str(&format!(
                "      - {{name: {name}, url: 'http://127.0.0.1:{port}'}}\n"
            ));
        }
        Arc::new(Config::from_yaml_str(&yaml, "t").unwrap())
    }

    /// Match lengths of one two-block chain that every backend position was sent.
    /// Match lengths of the chain for each backend of the pool, in pool order (by its slot).
    fn matched(pool: &Pool, now: Instant) -> Vec<u32> {
        let mut by_slot = vec![0; pool.index.max_backends()];
        pool.index.match_lengths(&CHAIN, now, &mut by_slot);
        pool.slots.iter().map(|&s| by_slot[s]).collect()
    }

    const CHAIN: [BlockHash; 2] = [BlockHash(11), BlockHash(22)];

    fn state_with_history(backends: &[(&str, u16)], now: Instant) -> (Metrics, GatewayState) {
        let metrics = Metrics::new();
        let s = GatewayState::new(
            config("round_robin", backends),
            Default::default(),
            &metrics,
        );
        let pool = s.pool("m").unwrap();
        for i in 0..pool.backends.len() {
            pool.index.record(i, &CHAIN, now);
        }
        (metrics, s)
    }

    #[test]
    fn identical_config_keeps_everything() {
        let now = Instant::now();
        let backends = [("a", 1), ("b", 2)];
        let (metrics, old) = state_with_history(&backends, now);
        let (new, carried) = old.rebuild(
            config("round_robin", &backends),
            Default::default(),
            &metrics,
        );
        let (p, q) = (old.pool("m").unwrap(), new.pool("m").unwrap());
        assert!(Arc::ptr_eq(&p.index, &q.index));
        assert!(Arc::ptr_eq(&p.policy, &q.policy));
        assert!(p
            .backends
            .iter()
            .zip(&q.backends)
            .all(|(x, y)| Arc::ptr_eq(x, y)));
        assert_eq!(matched(q, now), [2, 2]);
        assert_eq!(
            carried,
            Carried {
                backends_kept: 2,
                backends_new: 0,
                backends_removed: vec![],
                indexes_kept: 1,
                policies_kept: 1,
            }
        );
    }

    #[test]
    fn appending_keeps_the_index_entries_and_builds_a_new_policy() {
        let now = Instant::now();
        let (metrics, old) = state_with_history(&[("a", 1), ("b", 2)], now);
        let (new, carried) = old.rebuild(
            config("round_robin", &[("a", 1), ("b", 2), ("c", 3)]),
            Default::default(),
            &metrics,
        );
        let q = new.pool("m").unwrap();
        assert!(Arc::ptr_eq(&old.pool("m").unwrap().index, &q.index));
        assert!(!Arc::ptr_eq(&old.pool("m").unwrap().policy, &q.policy));
        assert_eq!(matched(q, now), [2, 2, 0]);
        assert_eq!((carried.backends_kept, carried.backends_new), (2, 1));
    }

    #[test]
    fn a_removal_keeps_every_other_backends_slot_and_entries() {
        let now = Instant::now();
        let (metrics, old) = state_with_history(&[("a", 1), ("b", 2), ("c", 3)], now);
        let (new, carried) = old.rebuild(
            config("round_robin", &[("a", 1), ("c", 3)]),
            Default::default(),
            &metrics,
        );
        let q = new.pool("m").unwrap();
        assert!(Arc::ptr_eq(&old.pool("m").unwrap().index, &q.index));
        // `c` moved from position 2 to 1 but kept its slot, and so what the index knows.
        assert_eq!(q.slots, [0, 2]);
        assert_eq!(matched(q, now), [2, 2]);
        assert!(Arc::ptr_eq(
            &q.backends[1],
            &old.pool("m").unwrap().backends[2]
        ));
        assert_eq!(carried.backends_removed, [Arc::<str>::from("b")]);
        // Nothing is left in the removed backend's slot, and a newcomer takes it.
        let mut out = [0u32; 3];
        q.index.match_lengths(&CHAIN, now, &mut out);
        assert_eq!(out, [2, 0, 2]);
        let (newer, _) = new.rebuild(
            config("round_robin", &[("a", 1), ("c", 3), ("d", 4)]),
            Default::default(),
            &metrics,
        );
        let r = newer.pool("m").unwrap();
        assert_eq!(r.slots, [0, 2, 1]);
        assert_eq!(matched(r, now), [2, 2, 0]);
    }

    #[test]
    fn a_changed_backend_or_timeout_is_a_new_backend() {
        let now = Instant::now();
        let (metrics, old) = state_with_history(&[("a", 1), ("b", 2)], now);
        let (new, carried) = old.rebuild(
            config("round_robin", &[("a", 1), ("b", 9)]),
            Default::default(),
            &metrics,
        );
        let q = new.pool("m").unwrap();
        assert!(Arc::ptr_eq(&q.backends[0], &old.backends[0]));
        assert!(!Arc::ptr_eq(&q.backends[1], &old.backends[1]));
        assert_eq!(matched(q, now), [2, 0]);
        assert_eq!(carried.backends_removed, [Arc::<str>::from("b")]);

        let mut slower = (*config("round_robin", &[("a", 1), ("b", 9)])).clone();
        slower.limits.connect_timeout *= 2;
        let (newer, carried) = new.rebuild(Arc::new(slower), Default::default(), &metrics);
        assert_eq!((carried.backends_kept, carried.backends_new), (0, 2));
        assert!(!Arc::ptr_eq(&newer.backends[0], &new.backends[0]));
    }

    #[test]
    fn a_new_model_gets_a_fresh_pool() {
        let now = Instant::now();
        let (metrics, old) = state_with_history(&[("a", 1)], now);
        let yaml = "pools:\n  other:\n    backends: [{name: a, url: 'http://127.0.0.1:1'}]\n";
        let (new, carried) = old.rebuild(
            Arc::new(Config::from_yaml_str(yaml, "t").unwrap()),
            Default::default(),
            &metrics,
        );
        assert!(new.pool("m").is_none());
        assert_eq!((carried.backends_kept, carried.indexes_kept), (0, 0));
        assert!(
            !Arc::ptr_eq(&new.backends[0], &old.backends[0]),
            "identity includes the pool"
        );
    }

    #[test]
    fn a_route_is_matched_once_to_its_id_and_its_policy_applies_on_its_own_pool_only() {
        let yaml = "routes:\n  \
            - {name: own, match: {model: a}, pool: pa, policy: round_robin}\n  \
            - {name: plain, match: {model: b}, pool: pb}\n\
            pools:\n  \
            pa: {policy: random, backends: [{name: a0, url: 'http://127.0.0.1:1'}]}\n  \
            pb: {policy: random, backends: [{name: b0, url: 'http://127.0.0.1:2'}]}\n";
        let config = Arc::new(Config::from_yaml_str(yaml, "t").unwrap());
        let s = GatewayState::new(config, Default::default(), &Metrics::new());
        let headers = http::HeaderMap::new();
        let target = |model| s.route(model, "/v1/chat/completions", &headers).unwrap();
        let (own, plain) = (target("a"), target("b"));
        let (own_id, own_route) = own.route.unwrap();
        assert_eq!((own_id, &*own_route.name), (RouteId(0), "own"));
        assert_eq!(plain.route.map(|(id, _)| id), Some(RouteId(1)));
        let (pa, pb) = (s.pool("pa").unwrap(), s.pool("pb").unwrap());
        // The route's own policy on its pool; the pool's after a fallback elsewhere, for a
        // route without one, and for no route.
        let policy = s.policy_for(pa, Some(own_id));
        assert!(!Arc::ptr_eq(policy, &pa.policy));
        assert_eq!(policy.name(), "round_robin");
        assert!(Arc::ptr_eq(s.policy_for(pb, Some(own_id)), &pb.policy));
        assert!(Arc::ptr_eq(s.policy_for(pb, Some(RouteId(1))), &pb.policy));
        assert!(Arc::ptr_eq(s.policy_for(pa, None), &pa.policy));
    }
}
