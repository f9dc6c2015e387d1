//! The proxy's side of replica sync: a non-blocking hand-off of small events to the publisher.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
/// Published messages remembered to time their echoes; an older one's echo is not timed.
const SENT_KEPT: usize = 256;

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
    /// Fingerprints of this replica's recent messages and when each was published, oldest
    /// first (the sync tasks only).
    sent: Mutex<VecDeque<(u64, Instant)>>,
    /// `cluster.collision_repair` (bound at start, as the rest of `cluster:`).
    repair_margin: Option<f64>,
}

impl Link {
    /// A link and the publisher's end of it; `repair_margin`: `cluster.collision_repair`.
    pub fn new(
        metrics: &Metrics,
        repair_margin: Option<f64>,
    ) -> (Arc<Link>, mpsc::Receiver<SyncEvent>) {
        let (tx, rx) = mpsc::channel(QUEUE_EVENTS);
        let link = Link {
            tx,
            next_seq: AtomicU64::new(1),
            lost: Mutex::new(Vec::new()),
            any_lost: AtomicBool::new(false),
            metrics: metrics.clone(),
            sent: Mutex::new(VecDeque::with_capacity(SENT_KEPT)),
            repair_margin,
        };
        (Arc::new(link), rx)
    }

    /// Collision repair's margin, when it is on (the proxy's `repair`).
    pub fn repair_margin(&self) -> Option<f64> {
        self.repair_margin
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

    /// The publisher published `payload` at `at`.
    pub fn published(&self, payload: &[u8], at: Instant) {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        if sent.len() == SENT_KEPT {
            sent.pop_front();
        }
        sent.push_back((fingerprint(payload), at));
    }

    /// `payload`, one of this replica's own messages, came back at `at`: how long after it
    /// was published (`None` for a message not remembered). Messages published before it
    /// are forgotten (NATS delivers one publisher's messages in order; theirs were lost).
    pub fn echoed(&self, payload: &[u8], at: Instant) -> Option<Duration> {
        let f = fingerprint(payload);
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        let i = sent.iter().position(|&(g, _)| g == f)?;
        let (_, t) = sent[i];
        sent.drain(..=i);
        Some(at.saturating_duration_since(t))
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

/// A message's fingerprint, within this process: its length and its first and last 64
/// bytes (a bounded cost for a message of up to 64 KiB; messages in flight together that share
/// all three are matched in publication order, which is their echoes' order).
fn fingerprint(payload: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    payload.len().hash(&mut h);
    payload[..payload.len().min(64)].hash(&mut h);
    payload[payload.len().saturating_sub(64)..].hash(&mut h);
    h.finish()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_is_timed_from_its_publication_and_older_ones_are_forgotten() {
        let (link, _rx) = Link::new(&Metrics::new(), None);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        link.published(b"one", t0);
        link.published(b"two", t0 + ms(1));
        link.published(b"three", t0 + ms(2));
        assert_eq!(link.echoed(b"two", t0 + ms(5)), Some(ms(4)));
        assert_eq!(link.echoed(b"one", t0 + ms(6)), None, "lost before two");
        assert_eq!(link.echoed(b"never", t0 + ms(6)), None);
        assert_eq!(link.echoed(b"three", t0 + ms(7)), Some(ms(5)));
        assert_eq!(link.echoed(b"three", t0 + ms(8)), None, "timed once");
        for i in 0..SENT_KEPT + 10 {
            link.published(format!("m{i}").as_bytes(), t0);
        }
        assert_eq!(link.echoed(b"m0", t0), None, "past what is kept");
        assert!(link
            .echoed(format!("m{}", SENT_KEPT + 9).as_bytes(), t0)
            .is_some());
    }
}
