//! Typed identities: a backend, a pool, a route, an engine's own block hash.
//!
//! Each is a newtype, so a position in one list cannot be passed where another is meant, and
//! an engine's block hash (another seed, maybe another hash function) cannot be looked up as
//! one of Pronto's chained [`crate::tokens::BlockHash`]es.
//!
//! - [`BackendId`]: one backend *instance*, unique in the process and stable across reloads —
//!   a backend a reload keeps (same pool, name and settings) keeps its id and everything learnt
//!   under it; a changed backend is a new instance with a new id. Minted by the gateway's state
//!   builder (or the evaluator) from a counter it owns.
//! - [`BackendKey`]: a stable hash of a backend's *name*, the same in every process and across
//!   restarts: what a consistent-hash ring is built on, so a session keeps its backend when
//!   others come and go.
//! - [`PoolId`], [`RouteId`]: positions in the validated config's pool and route lists (a
//!   route is found by id, never by scanning names per request).
//! - [`EngineBlockHash`]: a block hash as an engine publishes it in its KV events.

use std::fmt;

/// One backend instance (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u64);

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend#{}", self.0)
    }
}

/// A stable hash of a backend's name (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendKey(pub u64);

impl BackendKey {
    /// The key of the backend called `name`: FNV-1a then a 64-bit mix, so it never changes
    /// between builds, processes or platforms.
    pub fn of(name: &str) -> BackendKey {
        BackendKey(crate::routing::rng::stable_hash(name.as_bytes()))
    }
}

/// A pool: its position in the validated config's pool list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u32);

/// A route: its position in the validated config's route list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteId(pub u32);

impl RouteId {
    /// The position as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl PoolId {
    /// The position as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A block hash as an engine publishes it in its KV-cache events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineBlockHash(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_keys_are_stable_and_distinct() {
        assert_eq!(BackendKey::of("gpu-0"), BackendKey::of("gpu-0"));
        assert_ne!(BackendKey::of("b0"), BackendKey::of("b1"));
    }
}
