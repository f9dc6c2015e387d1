//! Several router replicas that route as one: what one replica tells the others, and how a
//! replica folds the others' news into its own state.
//!
//! ## What is shared
//! Each replica routes on its own ledger, prefix index and TTFT models, plus the engines'
//! scraped metrics and KV events (shared facts, but late). What only a router knows — what it
//! has just sent where — it tells the other replicas as [`SyncEvent`]s:
//! - [`SyncEvent::Dispatch`]: a booking (backend, uncached prefill tokens, KV tokens, the
//!   replica's own booking number) and the prompt's block hashes (its prefix record);
//! - [`SyncEvent::FirstToken`]: the booking left prefill; with the TTFT observation when the
//!   sender's rate limit let it through ([`Outbox`]);
//! - [`SyncEvent::Release`]: finished, failed or cancelled;
//! - [`SyncEvent::Snapshot`]: every booking the sender still holds, sent every heartbeat —
//!   the heartbeat itself, and the resync after a loss.
//!
//! ## Folding ([`Remote`])
//! A remote dispatch is booked in the backend's own [`crate::load::Ledger`] — the same
//! counters as local bookings, so views and policies need nothing new — and its prefix is
//! recorded in the pool's index under the backend's slot with [`PrefixIndex::record`]. The
//! booking is kept under (replica, booking number) until its release. A remote first token
//! ends its prefill and, with an observation, teaches the backend's TTFT model.
//!
//! Every message refreshes its sender's liveness. A replica silent for longer than the peer
//! timeout has all its bookings released ([`Remote::expire`]): a replica that vanishes
//! (crashed, partitioned, or the channel is down) stops counting, and each replica routes on
//! its own state. A snapshot replaces what is known of its sender: bookings missing from it
//! are released (a lost release), bookings only in it are booked (a lost dispatch, or the
//! first message after a reconnection). A sender that restarted (another incarnation) starts
//! from nothing.
//!
//! ## What is not heard yet ([`Unseen`], [`repair`])
//! What the others dispatched within the last sync delay is missing from every replica's
//! view; [`Remote::unseen`] estimates how much. [`repair::relocation`] is the rule for a
//! request that a booking heard late now shows to be on the wrong backend.
//!
//! Pure data operations with the clock passed in: the gateway folds what NATS delivers
//! (`src/cluster/` in the `pronto` crate), the evaluator what its simulated channel delivers
//! after a delay — through this same code.
//!
//! [`PrefixIndex::record`]: crate::affinity::PrefixIndex::record

mod outbox;
pub mod repair;
#[cfg(test)]
mod tests;
mod unseen;
pub mod wire;

pub use outbox::{ObserveLimit, Outbox};
pub use unseen::Unseen;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::load::{Booking, RequestLoad, Storage};
use crate::predict::TtftInputs;
use crate::state::BackendState;
use crate::tokens::BlockHash;

/// A replica: a stable hash of its name (the same in every process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub u64);

impl ReplicaId {
    /// The id of the replica called `name`.
    pub fn of(name: &str) -> ReplicaId {
        ReplicaId(crate::routing::rng::stable_hash(name.as_bytes()))
    }
}

/// A backend as every replica names it: a stable hash of its pool's model name and its own
/// name (positions, slots and [`crate::ids::BackendId`]s differ between replicas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendRef(pub u64);

impl BackendRef {
    /// The reference of backend `backend` in pool `pool`.
    pub fn of(pool: &str, backend: &str) -> BackendRef {
        let mut bytes = Vec::with_capacity(pool.len() + backend.len() + 1);
        bytes.extend_from_slice(pool.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(backend.as_bytes());
        BackendRef(crate::routing::rng::stable_hash(&bytes))
    }
}

/// A TTFT the sender observed, with the inputs the request was routed on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// What the request was routed on.
    pub inputs: TtftInputs,
    /// The measured TTFT, seconds.
    pub ttft_s: f64,
}

/// One booking in a [`SyncEvent::Snapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBooking {
    /// The sender's booking number.
    pub seq: u64,
    /// Where it was booked.
    pub backend: BackendRef,
    /// What was booked.
    pub load: RequestLoad,
    /// Past its prefill.
    pub decoding: bool,
}

/// What one replica tells the others (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum SyncEvent {
    /// A request was dispatched: booked on `backend`, its prompt's blocks recorded there.
    Dispatch {
        /// The sender's booking number (unique per incarnation).
        seq: u64,
        /// Where it went.
        backend: BackendRef,
        /// What was booked.
        load: RequestLoad,
        /// The prompt's chained block hashes.
        hashes: Vec<BlockHash>,
    },
    /// Booking `seq` left prefill (its first token, or a non-streamed response's head).
    FirstToken {
        /// The booking.
        seq: u64,
        /// The TTFT observed, when the sender's rate limit passed it.
        observed: Option<Observation>,
    },
    /// Booking `seq` ended.
    Release {
        /// The booking.
        seq: u64,
    },
    /// Every booking the sender holds now.
    Snapshot {
        /// The live bookings.
        live: Vec<LiveBooking>,
    },
}

/// The replica's own state, as remote events change it: the gateway's pools, or one of the
/// evaluator's routers.
pub trait Local {
    /// What a remote booking keeps to be released later (a backend and where its prefixes go).
    type Handle: Clone;
    /// The ledgers' storage.
    type Storage: Storage;
    /// The backend `backend` names here, if this replica has it.
    fn resolve(&self, backend: BackendRef) -> Option<Self::Handle>;
    /// Its routing state.
    fn state<'a>(&'a self, h: &'a Self::Handle) -> &'a BackendState<Self::Storage>;
    /// Record that it was sent a prompt with these block hashes, at `now`.
    fn record(&self, h: &Self::Handle, hashes: &[BlockHash], now: Instant);
}

/// What one [`Remote::apply`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Folded {
    /// Events applied.
    pub applied: u32,
    /// Events about a backend this replica does not have (another config), skipped.
    pub unknown_backend: u32,
    /// Events about a booking this replica does not know (its dispatch was lost), skipped.
    pub unknown_booking: u32,
    /// Bookings released because a snapshot no longer held them, or the sender restarted.
    pub reconciled: u32,
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    incarnation: u64,
    last_seen: Instant,
}

/// The other replicas' bookings as this replica holds them (see the module docs).
#[derive(Debug)]
pub struct Remote<H> {
    peer_timeout: Duration,
    peers: HashMap<ReplicaId, Peer>,
    bookings: HashMap<(ReplicaId, u64), (H, Booking)>,
    unseen: Unseen,
}

impl<H: Clone> Remote<H> {
    /// Nothing known yet; a replica silent for longer than `peer_timeout` is expired.
    pub fn new(peer_timeout: Duration) -> Remote<H> {
        Remote {
            peer_timeout,
            peers: HashMap::new(),
            bookings: HashMap::new(),
            unseen: Unseen::new(),
        }
    }

    /// One of this replica's own messages came back through the channel `delay` after it
    /// was sent: the sync delay the others see ([`Unseen`]).
    pub fn on_echo(&mut self, delay: Duration) {
        self.unseen.on_echo(delay);
    }

    /// What this replica expects not to have heard of yet.
    pub fn unseen(&self) -> &Unseen {
        &self.unseen
    }

    /// Replicas heard from and not expired.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Remote bookings held.
    pub fn bookings(&self) -> usize {
        self.bookings.len()
    }

    /// Fold `events`, sent by incarnation `incarnation` of replica `from`, into `local` at
    /// `now`.
    pub fn apply<L: Local<Handle = H>>(
        &mut self,
        local: &L,
        from: ReplicaId,
        incarnation: u64,
        events: &[SyncEvent],
        now: Instant,
    ) -> Folded {
        let mut out = Folded::default();
        match self.peers.get_mut(&from) {
            Some(p) if p.incarnation == incarnation => p.last_seen = p.last_seen.max(now),
            Some(_) => {
                out.reconciled += self.release_where(local, |r, _| r == from);
                self.peers.insert(
                    from,
                    Peer {
                        incarnation,
                        last_seen: now,
                    },
                );
            }
            None => {
                self.peers.insert(
                    from,
                    Peer {
                        incarnation,
                        last_seen: now,
                    },
                );
            }
        }
        for ev in events {
            match ev {
                SyncEvent::Dispatch {
                    seq,
                    backend,
                    load,
                    hashes,
                } => {
                    let Some(h) = local.resolve(*backend) else {
                        out.unknown_backend += 1;
                        continue;
                    };
                    local.record(&h, hashes, now);
                    self.book(local, from, *seq, h, *load, now);
                    self.unseen.on_remote_dispatch(now);
                    out.applied += 1;
                }
                SyncEvent::FirstToken { seq, observed } => {
                    let Some((h, b)) = self.bookings.get_mut(&(from, *seq)) else {
                        out.unknown_booking += 1;
                        continue;
                    };
                    let state = local.state(h);
                    if state.ledger.end_prefill(b) {
                        if let Some(o) = observed {
                            state.ttft.observe(&o.inputs, o.ttft_s, now);
                        }
                    }
                    out.applied += 1;
                }
                SyncEvent::Release { seq } => match self.bookings.remove(&(from, *seq)) {
                    Some((h, mut b)) => {
                        local.state(&h).ledger.release(&mut b);
                        out.applied += 1;
                    }
                    None => out.unknown_booking += 1,
                },
                SyncEvent::Snapshot { live } => {
                    let held: HashSet<u64> = live.iter().map(|l| l.seq).collect();
                    out.reconciled +=
                        self.release_where(local, |r, s| r == from && !held.contains(&s));
                    for l in live {
                        if !self.bookings.contains_key(&(from, l.seq)) {
                            let Some(h) = local.resolve(l.backend) else {
                                out.unknown_backend += 1;
                                continue;
                            };
                            self.book(local, from, l.seq, h, l.load, now);
                        }
                        if l.decoding {
                            if let Some((h, b)) = self.bookings.get_mut(&(from, l.seq)) {
                                local.state(h).ledger.end_prefill(b);
                            }
                        }
                    }
                    out.applied += 1;
                }
            }
        }
        out
    }

    /// Release the bookings of every replica silent for longer than the peer timeout at
    /// `now`, and forget it; returns how many replicas were expired.
    pub fn expire<L: Local<Handle = H>>(&mut self, local: &L, now: Instant) -> usize {
        let timeout = self.peer_timeout;
        let gone: Vec<ReplicaId> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.last_seen) > timeout)
            .map(|(&r, _)| r)
            .collect();
        for r in &gone {
            self.forget(local, *r);
        }
        gone.len()
    }

    /// Release every remote booking and forget every replica (the channel is gone for good).
    pub fn clear<L: Local<Handle = H>>(&mut self, local: &L) {
        self.release_where(local, |_, _| true);
        self.peers.clear();
    }

    /// Release every booking of replica `from` and forget it.
    pub(crate) fn forget<L: Local<Handle = H>>(&mut self, local: &L, from: ReplicaId) {
        self.release_where(local, |r, _| r == from);
        self.peers.remove(&from);
    }

    fn book<L: Local<Handle = H>>(
        &mut self,
        local: &L,
        from: ReplicaId,
        seq: u64,
        h: H,
        load: RequestLoad,
        now: Instant,
    ) {
        // A remote booking leaves prefill when its sender says so: no local deadline.
        let b = local.state(&h).ledger.book_remote(load, now);
        if let Some((old_h, mut old)) = self.bookings.insert((from, seq), (h, b)) {
            local.state(&old_h).ledger.release(&mut old);
        }
    }

    fn release_where<L: Local<Handle = H>>(
        &mut self,
        local: &L,
        mut gone: impl FnMut(ReplicaId, u64) -> bool,
    ) -> u32 {
        let mut n = 0;
        self.bookings.retain(|&(r, s), (h, b)| {
            if gone(r, s) {
                local.state(h).ledger.release(b);
                n += 1;
                false
            } else {
                true
            }
        });
        n
    }
}
