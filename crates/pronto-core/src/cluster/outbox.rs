//! The sending side: what this replica has told the others and still holds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{BackendRef, LiveBooking, SyncEvent};

/// This replica's own bookings as the others know them, and the rate limit on TTFT
/// observations. Every event goes through [`Outbox::note`] before it is sent, so
/// [`Outbox::snapshot`] says exactly what the others should hold.
#[derive(Debug)]
pub struct Outbox {
    live: HashMap<u64, LiveBooking>,
    observed_at: HashMap<BackendRef, Instant>,
    observe_every: Duration,
}

impl Outbox {
    /// Nothing sent yet; at most one TTFT observation per backend per `observe_every`
    /// (`Duration::ZERO`: all of them).
    pub fn new(observe_every: Duration) -> Outbox {
        Outbox {
            live: HashMap::new(),
            observed_at: HashMap::new(),
            observe_every,
        }
    }

    /// Bookings live now.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// `ev` is about to be sent at `now`: update the live bookings, and drop a first token's
    /// observation over the rate limit. Returns the event as it should go out.
    pub fn note(&mut self, mut ev: SyncEvent, now: Instant) -> SyncEvent {
        match &mut ev {
            SyncEvent::Dispatch {
                seq, backend, load, ..
            } => {
                self.live.insert(
                    *seq,
                    LiveBooking {
                        seq: *seq,
                        backend: *backend,
                        load: *load,
                        decoding: false,
                    },
                );
            }
            SyncEvent::FirstToken { seq, observed } => match self.live.get_mut(seq) {
                Some(l) => {
                    l.decoding = true;
                    if observed.is_some() {
                        let every = self.observe_every;
                        let last = self.observed_at.get(&l.backend);
                        if last.is_some_and(|&t| now.saturating_duration_since(t) < every) {
                            *observed = None;
                        } else {
                            self.observed_at.insert(l.backend, now);
                        }
                    }
                }
                None => *observed = None,
            },
            SyncEvent::Release { seq } => {
                self.live.remove(seq);
            }
            SyncEvent::Snapshot { .. } => {}
        }
        ev
    }

    /// Every live booking, in booking order (the heartbeat).
    pub fn snapshot(&self) -> SyncEvent {
        let mut live: Vec<LiveBooking> = self.live.values().copied().collect();
        live.sort_unstable_by_key(|l| l.seq);
        SyncEvent::Snapshot { live }
    }
}
