//! [`StateHandle`]: the one way every component reads and replaces the gateway state.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::GatewayState;

/// The gateway's current [`GatewayState`], shared by the proxy, the admin listener and every
/// background service: [`load`](StateHandle::load) the state in effect now (requests keep the
/// `Arc` they started with, so a replacement never changes a request midway),
/// [`update`](StateHandle::update) to replace it. Cloning shares the same state.
#[derive(Debug, Clone)]
pub struct StateHandle(Arc<ArcSwap<GatewayState>>);

impl StateHandle {
    /// A handle on `state`.
    pub fn new(state: GatewayState) -> StateHandle {
        StateHandle(Arc::new(ArcSwap::from_pointee(state)))
    }

    /// The state in effect now (one atomic load, no lock).
    pub fn load(&self) -> Arc<GatewayState> {
        self.0.load_full()
    }

    /// The one way the state is replaced (config reloads, DNS discovery and model listing all
    /// go through it): `next` builds a new state from the current one — or `None` to leave it
    /// — and the result is swapped in only if nothing else was swapped in meanwhile; otherwise
    /// it is built again from the newer state. So no writer's update is lost. Returns the
    /// state swapped in and what `next` reported with it.
    pub fn update<R>(
        &self,
        mut next: impl FnMut(&Arc<GatewayState>) -> Option<(GatewayState, R)>,
    ) -> Option<(Arc<GatewayState>, R)> {
        loop {
            let current = self.0.load_full();
            let (built, report) = next(&current)?;
            let built = Arc::new(built);
            let prev = self.0.compare_and_swap(&current, Arc::clone(&built));
            if Arc::ptr_eq(&prev, &current) {
                return Some((built, report));
            }
        }
    }

    /// Replace the state outright (tests that stage a reload at a chosen moment).
    #[cfg(test)]
    pub(crate) fn store(&self, state: Arc<GatewayState>) {
        self.0.store(state);
    }
}
