//! DNS discovery: a pool's `discover: {dns: "host:port"}` name, resolved periodically, supplies
//! the pool's backends.
//!
//! ## Algorithm
//! [`Discovery::start`] (a pingora background service) wakes every [`POLL`] and resolves each
//! `discover:` pool whose `interval` has passed since its last resolution — or at once, for
//! every pool, when the config changed (a reload), so a new or edited `discover:` section takes
//! effect without waiting. A resolution ([`Resolver`]; the real one is
//! `tokio::net::lookup_host`, which runs `getaddrinfo` on tokio's blocking pool, never on a
//! proxy thread) yields addresses; those of the section's `family` are sorted and
//! deduplicated. When that set differs from the one the live state was built with,
//! [`GatewayState::with_discovered`](crate::state::GatewayState::with_discovered) builds a new state — the rebuild a reload does, so
//! unchanged backends keep their learned state and removed ones drain — and it is swapped in.
//!
//! A failed resolution, or one with no address of the wanted family, keeps the last known set
//! (a DNS outage must not empty a pool), logs a warning and counts
//! `pronto_discovery_errors_total{pool}`. A pool that never resolved has no discovered
//! backends and answers 503 (`no_backend_available`). `pronto_discovery_backends{pool}` is
//! the size of the set in use.
//!
//! ## Racing a reload
//! Both this task and a reload replace the state through [`crate::state::StateHandle::update`]:
//! a compare-and-swap against the state the new one was built from, rebuilt from the newer
//! state when the other got in first. Neither update is lost: a reload carries the addresses
//! discovery last stored ([`GatewayState::rebuild`](crate::state::GatewayState::rebuild)), and discovery rebuilds on the reloaded
//! config.
//!
//! Discovered backends are named `<pool>-<ip>:<port>` (see [`crate::config::Discover`]).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio::time::Instant;

use crate::config::{AddressFamily, Config};
use crate::state::StateHandle;
use crate::telemetry::Metrics;

/// How often the task looks for due pools and for a changed config.
pub const POLL: Duration = Duration::from_secs(1);

/// Resolves `host:port` to socket addresses.
pub trait Resolver: Send + Sync + 'static {
    /// Every address `target` (`host:port`) resolves to now. Must not block the caller's
    /// thread.
    fn resolve<'a>(&'a self, target: &'a str) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>>;
}

/// The system resolver, through `tokio::net::lookup_host`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, target: &'a str) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host(target).await?.collect()) })
    }
}

/// The addresses of `family` in `resolved`, sorted and deduplicated; an error when none is
/// left.
pub fn usable_addresses(
    mut resolved: Vec<SocketAddr>,
    family: AddressFamily,
) -> Result<Vec<SocketAddr>, String> {
    let total = resolved.len();
    resolved.retain(|a| family.admits(a));
    resolved.sort_unstable();
    resolved.dedup();
    if resolved.is_empty() {
        return Err(match (total, family) {
            (0, _) => "resolved to no address".to_string(),
            (n, f) => format!("resolved to {n} addresses, none of family {}", f.as_str()),
        });
    }
    Ok(resolved)
}

/// What one resolution of one pool did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The set is the one in use.
    Unchanged,
    /// A new state with this set was swapped in.
    Changed {
        /// Addresses now in use.
        addrs: Vec<SocketAddr>,
        /// Backend names that left the pool.
        removed: Vec<Arc<str>>,
    },
    /// Resolution failed; the last known set stays.
    Failed(String),
    /// The pool has no `discover:` section (any more).
    NotDiscovered,
}

/// The discovery task.
pub struct Discovery {
    state: StateHandle,
    metrics: Metrics,
    resolver: Arc<dyn Resolver>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl Discovery {
    /// A task over whatever state is current, resolving with `resolver`.
    pub fn new(state: StateHandle, metrics: Metrics, resolver: Arc<dyn Resolver>) -> Discovery {
        Discovery {
            state,
            metrics,
            resolver,
        }
    }

    /// Resolve pool `model`'s name once and apply the result.
    pub async fn refresh(&self, model: &str) -> Outcome {
        let Some(d) = self
            .state
            .load()
            .config
            .pool(model)
            .and_then(|p| p.discover.clone())
        else {
            return Outcome::NotDiscovered;
        };
        let target = d.target();
        let resolved = self
            .resolver
            .resolve(&target)
            .await
            .map_err(|e| e.to_string())
            .and_then(|addrs| usable_addresses(addrs, d.family));
        match resolved {
            Ok(addrs) => self.apply(model, addrs),
            Err(reason) => {
                self.metrics
                    .discovery_errors_total
                    .with_label_values(&[model])
                    .inc();
                let kept = self.state.load().discovered(model).map_or(0, <[_]>::len);
                tracing::warn!(pool = model, %target, %reason, kept, "DNS discovery failed; keeping the last known backends");
                Outcome::Failed(reason)
            }
        }
    }

    /// Swap in a state whose pool `model` has exactly `addrs` (sorted, deduplicated).
    fn apply(&self, model: &str, addrs: Vec<SocketAddr>) -> Outcome {
        self.metrics
            .discovery_backends
            .with_label_values(&[model])
            .set(addrs.len() as i64);
        let mut outcome = None;
        let swapped = self.state.update(|current| {
            if current
                .config
                .pool(model)
                .is_none_or(|p| p.discover.is_none())
            {
                outcome = Some(Outcome::NotDiscovered);
                return None;
            }
            if current.discovered(model) == Some(addrs.as_slice()) {
                outcome = Some(Outcome::Unchanged);
                return None;
            }
            Some(current.with_discovered(model, addrs.clone(), &self.metrics))
        });
        let Some((next, carried)) = swapped else {
            return outcome.expect("set when nothing was swapped");
        };
        for name in &carried.backends_removed {
            if !next.backends.iter().any(|b| b.config.name == *name) {
                self.metrics.forget_backend(name);
            }
        }
        tracing::info!(
            pool = model,
            backends = addrs.len(),
            new = carried.backends_new,
            removed = carried.backends_removed.len(),
            "DNS discovery changed the pool"
        );
        Outcome::Changed {
            addrs,
            removed: carried.backends_removed,
        }
    }

    /// Resolve the pools that are due at `now` (all of them when `config` is not the one of
    /// the last round), recording when each is next due.
    async fn round(
        &self,
        now: Instant,
        last_config: &mut Option<Arc<Config>>,
        due: &mut HashMap<Arc<str>, Instant>,
    ) {
        let config = Arc::clone(&self.state.load().config);
        if !last_config
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &config))
        {
            due.clear();
            *last_config = Some(Arc::clone(&config));
        }
        for pool in &config.pools {
            let Some(d) = &pool.discover else { continue };
            if due.get(&pool.model).is_some_and(|t| *t > now) {
                continue;
            }
            self.refresh(&pool.model).await;
            due.insert(pool.model.clone(), now + d.interval);
        }
    }

    /// Run until `shutdown`: a round at once, then every [`POLL`].
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let mut last_config = None;
        let mut due = HashMap::new();
        loop {
            self.round(Instant::now(), &mut last_config, &mut due).await;
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Discovery {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.run(shutdown).await;
    }
}

#[cfg(test)]
#[path = "discovery_tests.rs"]
mod tests;
