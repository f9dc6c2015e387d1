//! The proxy's side of replica sync: a non-blocking hand-off of small events to the publisher.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pronto_core::cluster::{BackendRef, Observation, SyncEvent};
use pronto_core::load::RequestLoad;
use pronto_core::tokens::BlockHash;
use tokio::sync::mpsc;

use crate::telemetry::{Metrics, SyncDrop};

/// Events the proxy may have queued for the publisher at once; past that they are dropped
/// (and counted), never waited for.
pub const QUEUE_EVENTS: usize = 16_384;
/// Leading prompt blocks sent with a dispatch at most (256k tokens): the prefix record of a
/// longer prompt is its head.
pub const MAX_SYNC_BLOCKS: usize = 16_384;

/// Where the proxy tells the publisher what it dispatched ([`Link::dispatch`]); one per
/// gateway, shared by every pool.
#[derive(Debug)]
pub struct Link {
    tx: mpsc::Sender<SyncEvent>,
    next_seq: AtomicU64,
    /// First tokens and releases the queue refused: kept so the publisher's live set (and so
    /// its snapshots) never keeps a booking that ended. Touched only when the queue is full.
    lost: Mutex<Vec<SyncEvent>>,
    any_lost: AtomicBool,
    metrics: Metrics,
}

impl Link {
    /// A link and the publisher's end of it.
    pub fn new(metrics: &Metrics) -> (Arc<Link>, mpsc::Receiver<SyncEvent>) {
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        let link = Link {
            tx,
            next_seq: AtomicU64::new(1),
            lost: Mutex::new(Vec::new()),
            any_lost: AtomicBool::new(false),
            metrics: metrics.clone(),
        };
        (Arc::new(link), rx)
    }

    /// A request was dispatched to `backend` with `load` and these prompt blocks: tell the
    /// other replicas. The returned [`Tracked`] says when its prefill ends and (on drop) that
    /// it ended.
    pub fn dispatch(
        self: &Arc<Self>,
        backend: BackendRef,
        load: RequestLoad,
        hashes: &[BlockHash],
    ) -> Tracked {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let hashes = hashes[..hashes.len().min(MAX_SYNC_BLOCKS)].to_vec();
        let ev = SyncEvent::Dispatch {
            seq,
            backend,
            load,
            hashes,
        };
        if self.tx.try_send(ev).is_err() {
            self.metrics.cluster.dropped(SyncDrop::QueueFull, 1);
        }
        Tracked {
            link: Arc::clone(self),
            seq,
        }
    }

    /// Hand `ev` (a first token or a release) over; if the queue is full, keep it aside.
    fn send(&self, ev: SyncEvent) {
        match self.tx.try_send(ev) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(ev)) => {
                self.metrics.cluster.dropped(SyncDrop::QueueFull, 1);
                let mut lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
                // Bounded like the queue: past it, the peers' timeout is the safety net.
                if lost.len() < QUEUE_EVENTS {
                    lost.push(ev);
                }
                self.any_lost.store(true, Ordering::Release);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// The first tokens and releases the queue refused since the last call (the publisher
    /// applies them to its live set before its next snapshot).
    pub fn take_lost(&self) -> Vec<SyncEvent> {
        if !self.any_lost.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.lost.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One dispatched request as the other replicas know it; dropping it says it ended.
#[derive(Debug)]
pub struct Tracked {
    link: Arc<Link>,
    seq: u64,
}

impl Tracked {
    /// Its prefill is over, with the TTFT observed when there is one to learn from.
    pub fn first_token(&self, observed: Option<Observation>) {
        self.link.send(SyncEvent::FirstToken {
            seq: self.seq,
            observed,
        });
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.link.send(SyncEvent::Release { seq: self.seq });
    }
}
