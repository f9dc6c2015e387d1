//! The sending side: what this replica has told the others and still holds.

use std::collections::HashMap;
use std::time::Instant;

use super::{BackendRef, LiveBooking, SyncEvent};

/// This replica's own bookings as the others know them, and the rate limit on TTFT
/// observations. Every event goes through [`Outbox::note`] before it is sent, so
/// [`Outbox::snapshot`] says exactly what the others should hold.
///
/// The rate limit is a token bucket per backend: `limit.per_second` observations on average,
/// bursts of up to `limit.burst` (an engine step often ends several prefills at once, and
/// each is worth learning from; a flood is not).
#[derive(Debug)]
pub struct Outbox {
    live: HashMap<u64, LiveBooking>,
    buckets: HashMap<BackendRef, (f64, Instant)>,
    limit: ObserveLimit,
}

/// How many TTFT observations per backend a replica sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObserveLimit {
    /// On average, per second.
    pub per_second: f64,
    /// At once.
    pub burst: f64,
}

impl ObserveLimit {
    /// What the gateway and the evaluator send: 20 per backend per second, 20 at once.
    pub const DEFAULT: ObserveLimit = ObserveLimit {
        per_second: 20.0,
        burst: 20.0,
    };
}

impl Outbox {
    /// Nothing sent yet; observations limited by `limit`.
    pub fn new(limit: ObserveLimit) -> Outbox {
        Outbox {
            live: HashMap::new(),
            buckets: HashMap::new(),
            limit,
        }
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
                        let ObserveLimit { per_second, burst } = self.limit;
                        let (tokens, at) = self.buckets.entry(l.backend).or_insert((burst, now));
                        let refill = now.saturating_duration_since(*at).as_secs_f64() * per_second;
                        *tokens = (*tokens + refill).min(burst);
                        *at = now;
                        if *tokens >= 1.0 {
                            *tokens -= 1.0;
                        } else {
                            *observed = None;
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
