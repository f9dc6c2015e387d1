//! The gateway's state as other replicas' events change it: the core's [`Local`] over the
//! current [`GatewayState`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use pronto_core::affinity::PrefixIndex;
use pronto_core::cluster::{BackendRef, Local, SyncEvent};
use pronto_core::load::Atomic;
use pronto_core::state::BackendState;
use pronto_core::tokens::BlockHash;

use crate::backend::Backend;
use crate::state::GatewayState;

/// A backend a remote booking was made on, and where its prefixes are recorded.
#[derive(Debug, Clone)]
pub struct Target {
    backend: Arc<Backend>,
    index: Arc<PrefixIndex>,
    slot: usize,
}

/// Every backend of one gateway state, by the name all replicas give it.
#[derive(Debug)]
pub struct Targets {
    state: Arc<GatewayState>,
    by_ref: HashMap<BackendRef, Target>,
}

impl Targets {
    /// The backends of `state`.
    pub fn of(state: Arc<GatewayState>) -> Targets {
        let mut by_ref = HashMap::new();
        for pool in state.pools.values() {
            for ((b, &slot), &r) in pool.backends.iter().zip(&pool.slots).zip(&pool.sync_refs) {
                by_ref.insert(
                    r,
                    Target {
                        backend: Arc::clone(b),
                        index: Arc::clone(&pool.index),
                        slot,
                    },
                );
            }
        }
        Targets { state, by_ref }
    }

    /// Another replica's message with `events`, sent (by this replica's estimate) at
    /// `sent_at`, was folded: each backend it dispatched to wakes the requests waiting on it
    /// for collision repair ([`Backend::heard_remote_dispatch`]), once per message.
    pub fn heard_dispatches(&self, events: &[SyncEvent], sent_at: Instant) {
        let mut woken: Vec<BackendRef> = Vec::new();
        for ev in events {
            if let SyncEvent::Dispatch { backend, .. } = ev {
                if woken.contains(backend) {
                    continue;
                }
                woken.push(*backend);
                if let Some(t) = self.by_ref.get(backend) {
                    t.backend.heard_remote_dispatch(sent_at);
                }
            }
        }
    }

    /// Whether these are the backends of `state`.
    pub fn is_of(&self, state: &Arc<GatewayState>) -> bool {
        Arc::ptr_eq(&self.state, state)
    }
}

impl Local for Targets {
    type Handle = Target;
    type Storage = Atomic;

    fn resolve(&self, backend: BackendRef) -> Option<Target> {
        self.by_ref.get(&backend).cloned()
    }

    fn state<'a>(&'a self, h: &'a Target) -> &'a BackendState<Atomic> {
        &h.backend.state
    }

    fn record(&self, h: &Target, hashes: &[BlockHash], now: Instant) {
        h.index.record(h.slot, hashes, now);
    }
}
