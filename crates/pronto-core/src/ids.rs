//! Typed identities: a backend instance, a backend's name, a route.
//!
//! Each is a newtype, so an id of one kind cannot be passed where another is meant. (An
//! engine's own block hash, as its KV events publish it, is a plain `u64`
//! (`EngineHash` in [`crate::kv_index::KvEvent`]) and so can never be looked up as one of Pronto's
//! chained [`crate::tokens::BlockHash`]es, which are a newtype.)
//!
//! - [`BackendId`]: one backend *instance*, unique in the process and stable across reloads —
//!   a backend a reload keeps (same pool, name and settings) keeps its id and everything learnt
//!   under it; a changed backend is a new instance with a new id. Minted by the gateway's state
//!   builder (or the evaluator) from a counter it owns.
//! - [`BackendKey`]: a stable hash of a backend's *name*, the same in every process and across
//!   restarts: what a consistent-hash ring is built on, so a session keeps its backend when
//!   others come and go.
//! - [`RouteId`]: a position in the validated config's route list. The gateway matches a
//!   request to a route once and from then on finds the route's policy by this id, never by
//!   scanning names. (Pools are found by model name, in a hash map: they need no id.)

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

/// A route: its position in the validated config's route list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteId(pub u32);

impl RouteId {
    /// The position as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_keys_are_stable_and_distinct() {
        assert_eq!(BackendKey::of("gpu-0"), BackendKey::of("gpu-0"));
        assert_ne!(BackendKey::of("b0"), BackendKey::of("b1"));
    }
}
