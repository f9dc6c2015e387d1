//! SLO admission: the bounded gateway queue in front of the pools. The rules (what a miss is,
//! what it does, the queue's order) are [`pronto_core::admission`]'s, shared with the
//! evaluator; this module is their gateway driver.
//!
//! A route with a `ttft_slo` is admission-controlled (see [`crate::config::route`]). When a
//! request arrives, before the routing policy runs, the proxy asks whether the route's pool can
//! meet the SLO *now*. It cannot ("a miss") when:
//! - `queued_ahead`: the queue already holds a request for the same pool of the same or a more
//!   urgent priority class: a newcomer never overtakes it (batch yields to interactive, and a
//!   class is first-come first-served);
//! - `no_capacity`: no backend of the pool is eligible (all at `max_inflight`, or those not
//!   at it unhealthy or ejected);
//! - `slo_miss`: the best predicted TTFT over the eligible backends exceeds the SLO. (The
//!   minimum over backends, not the policy's pick: the gate runs no policy, so a stateful policy
//!   such as round-robin is not advanced twice.)
//!
//! **An outage is not an overload.** When no backend of the pool is up (every one unhealthy
//! or ejected, or none at all), a `shed` or `queue` route answers 503 `no_backend_available`
//! with `Retry-After` at once, before any of the above: waiting for the SLO cannot help, and a
//! 429 would send clients retrying as for a busy service. A request already queued when the
//! last backend goes down gets the same 503 within half a second, and so does one whose
//! deadline passes with none up. A `fallback` route still falls back.
//!
//! On a miss the route's `on_slo_miss` applies: `shed` answers 429 with `Retry-After`;
//! `fallback` sends the request to the fallback pool once, without a second admission check
//! (503 there if no backend is free); `queue` puts it in this queue.
//!
//! **The queue** holds at most `admission.queue_size` requests over all pools (a full queue
//! sheds with reason `queue_full`). Per pool it is ordered by priority class rank, then deadline
//! (arrival + `ttft_slo`), then arrival. Only the head of a pool's queue is woken: each request
//! that finishes on the pool ([`Departure`], an RAII guard every proxied request holds) wakes the
//! first waiter not already woken, which re-checks the miss conditions and either dispatches or
//! waits again. A woken waiter that finds it is no longer the head (a more urgent request
//! arrived) passes the wake-up to the head; one that leaves without dispatching (its client hung
//! up) passes it on too, so a freed slot is never lost.
//!
//! **Deadline.** When a queued request's deadline passes, its SLO is already lost; it is sent
//! anyway if some backend of the pool is eligible (late is more useful than a retry from
//! scratch), and shed with reason `deadline` otherwise (503 when none is up).
//!
//! **Client hang-up.** The proxy races the wait against the client connection
//! (`read_body_or_idle`), so a queued request whose client goes away leaves the queue at once
//! ([`Ticket`] removes itself when dropped).
//!
//! The queue is a `Vec` under a `std::sync::Mutex`, held only for short scans, never across an
//! await; an atomic count lets every [`Departure`] skip the lock while the queue is empty.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use crate::telemetry::Metrics;

use pronto_core::admission::QueueKey;

/// The gateway's admission queue (one per gateway; it outlives config reloads).
#[derive(Debug)]
pub struct Admission {
    inner: Mutex<Inner>,
    queued: AtomicUsize,
    metrics: Metrics,
}

#[derive(Debug, Default)]
struct Inner {
    entries: Vec<Entry>,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    pool: Arc<str>,
    rank: u32,
    deadline: Instant,
    notify: Arc<Notify>,
    woken: bool,
}

impl Entry {
    /// Its place in its pool's queue ([`QueueKey`]: class, deadline, arrival).
    fn key(&self) -> QueueKey<Instant> {
        QueueKey {
            rank: self.rank,
            deadline: self.deadline,
            seq: self.id,
        }
    }
}

impl Inner {
    /// Position of the head of `pool`'s queue.
    fn head(&self, pool: &str) -> Option<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| &*e.pool == pool)
            .min_by_key(|(_, e)| e.key())
            .map(|(i, _)| i)
    }

    /// Wake the first waiter of `pool` not already woken.
    fn wake_next(&mut self, pool: &str) {
        let next = self
            .entries
            .iter_mut()
            .filter(|e| &*e.pool == pool && !e.woken)
            .min_by_key(|e| e.key());
        if let Some(e) = next {
            e.woken = true;
            e.notify.notify_one();
        }
    }
}

impl Admission {
    /// An empty queue reporting to `metrics`.
    pub fn new(metrics: Metrics) -> Admission {
        Admission {
            inner: Mutex::new(Inner::default()),
            queued: AtomicUsize::new(0),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests waiting, over all pools.
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `pool`'s queue holds a request of class `rank` or more urgent (lower).
    pub fn waiting_ahead(&self, pool: &str, rank: u32) -> bool {
        !self.is_empty()
            && self
                .lock()
                .entries
                .iter()
                .any(|e| &*e.pool == pool && e.rank <= rank)
    }

    /// Queue a request for `pool` from `route`; `None` when `capacity` requests already wait.
    pub fn enqueue(
        &self,
        pool: Arc<str>,
        route: Arc<str>,
        rank: u32,
        deadline: Instant,
        capacity: usize,
    ) -> Option<Ticket<'_>> {
        let notify = Arc::new(Notify::new());
        let id = {
            let mut inner = self.lock();
            if inner.entries.len() >= capacity {
                return None;
            }
            let id = inner.next_id;
            inner.next_id += 1;
            inner.entries.push(Entry {
                id,
                pool: pool.clone(),
                rank,
                deadline,
                notify: Arc::clone(&notify),
                woken: false,
            });
            self.queued.fetch_add(1, Ordering::AcqRel);
            id
        };
        self.metrics
            .admission_queue_length
            .with_label_values(&[&route])
            .inc();
        Some(Ticket {
            admission: self,
            id,
            pool,
            route,
            notify,
            enqueued_at: Instant::now(),
        })
    }

    /// A guard for a request sent to `pool`: when it drops (the request finished), the next
    /// waiter of the pool is woken.
    pub fn departure(&self, pool: Arc<str>) -> Departure<'_> {
        Departure {
            admission: self,
            pool,
        }
    }
}

/// A place in the queue; leaving (drop) removes it.
#[derive(Debug)]
pub struct Ticket<'a> {
    admission: &'a Admission,
    id: u64,
    pool: Arc<str>,
    route: Arc<str>,
    notify: Arc<Notify>,
    enqueued_at: Instant,
}

impl Ticket<'_> {
    /// Resolves when this waiter is woken (a slot may have freed). A wake-up that came while
    /// the waiter was busy is kept, not lost.
    pub async fn woken(&self) {
        self.notify.notified().await;
    }

    /// Take a wake-up: `true` when this waiter is the head of its pool's queue and should
    /// re-check. A woken non-head passes its wake-up to the head.
    pub fn claim(&self) -> bool {
        let mut inner = self.admission.lock();
        let Some(me) = inner.entries.iter().position(|e| e.id == self.id) else {
            return false;
        };
        let was_woken = std::mem::replace(&mut inner.entries[me].woken, false);
        if inner.head(&self.pool) == Some(me) {
            return true;
        }
        if was_woken {
            inner.wake_next(&self.pool);
        }
        false
    }

    /// Leave the queue to be sent to a backend now.
    pub fn dispatch(self) {
        // Drop does the bookkeeping; a dispatched waiter's wake-up was consumed by `claim`.
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        {
            let mut inner = self.admission.lock();
            if let Some(i) = inner.entries.iter().position(|e| e.id == self.id) {
                let e = inner.entries.swap_remove(i);
                self.admission.queued.fetch_sub(1, Ordering::AcqRel);
                if e.woken {
                    // Woken but leaving unserved (client gone): the slot is someone else's.
                    inner.wake_next(&self.pool);
                }
            }
        }
        let m = &self.admission.metrics;
        m.admission_queue_length
            .with_label_values(&[&self.route])
            .dec();
        m.admission_queue_wait_seconds
            .with_label_values(&[&self.route])
            .observe(self.enqueued_at.elapsed().as_secs_f64());
    }
}

/// Held by every request sent to a pool; dropping it wakes the pool's next waiter.
#[derive(Debug)]
pub struct Departure<'a> {
    admission: &'a Admission,
    pool: Arc<str>,
}

impl Drop for Departure<'_> {
    fn drop(&mut self) {
        if !self.admission.is_empty() {
            self.admission.lock().wake_next(&self.pool);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pool(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[tokio::test(start_paused = true)]
    async fn releases_wake_waiters_by_class_then_deadline() {
        let a = Admission::new(Metrics::new());
        let t0 = Instant::now();
        let late_batch = a.enqueue(pool("p"), pool("b"), 1, t0, 10).unwrap();
        let interactive_late = a
            .enqueue(pool("p"), pool("i"), 0, t0 + Duration::from_secs(9), 10)
            .unwrap();
        let interactive_early = a
            .enqueue(pool("p"), pool("i"), 0, t0 + Duration::from_secs(1), 10)
            .unwrap();
        let other_pool = a.enqueue(pool("q"), pool("i"), 0, t0, 10).unwrap();
        assert_eq!(a.len(), 4);
        assert!(a.waiting_ahead("p", 1) && a.waiting_ahead("p", 0));
        assert!(!a.waiting_ahead("r", 1));

        let mut waiting = [
            ("batch", Some(late_batch)),
            ("i-late", Some(interactive_late)),
            ("i-early", Some(interactive_early)),
        ];
        let mut order = Vec::new();
        for _ in 0..3 {
            drop(a.departure(pool("p")));
            let mut served = None;
            for (name, slot) in waiting.iter_mut() {
                let Some(t) = slot else { continue };
                let woken = tokio::time::timeout(Duration::from_millis(1), t.woken())
                    .await
                    .is_ok();
                if woken && t.claim() {
                    served = Some(*name);
                    slot.take().expect("waiting").dispatch();
                    break;
                }
            }
            order.push(served.expect("one waiter served per release"));
        }
        assert_eq!(order, ["i-early", "i-late", "batch"]);
        // The other pool's waiter was never woken by this pool's releases.
        assert!(
            tokio::time::timeout(Duration::from_millis(1), other_pool.woken())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_departing_woken_waiter_passes_its_wake_up_on() {
        let a = Admission::new(Metrics::new());
        let t0 = Instant::now();
        let first = a.enqueue(pool("p"), pool("r"), 0, t0, 10).unwrap();
        let second = a.enqueue(pool("p"), pool("r"), 0, t0, 10).unwrap();
        drop(a.departure(pool("p")));
        // `first` was woken but hangs up before claiming: `second` gets the slot.
        drop(first);
        tokio::time::timeout(Duration::from_millis(1), second.woken())
            .await
            .expect("woken");
        assert!(second.claim());
        second.dispatch();
        assert!(a.is_empty());
    }

    #[test]
    fn capacity_bounds_the_queue_and_metrics_follow() {
        let m = Metrics::new();
        let a = Admission::new(m.clone());
        let t0 = Instant::now();
        let t1 = a.enqueue(pool("p"), pool("r"), 0, t0, 2).unwrap();
        let t2 = a.enqueue(pool("q"), pool("r"), 0, t0, 2).unwrap();
        assert!(a.enqueue(pool("p"), pool("r"), 0, t0, 2).is_none());
        let gauge = || m.admission_queue_length.with_label_values(&["r"]).get();
        assert_eq!(gauge(), 2);
        drop(t1);
        t2.dispatch();
        assert_eq!((gauge(), a.len()), (0, 0));
        let waits = m
            .admission_queue_wait_seconds
            .with_label_values(&["r"])
            .get_sample_count();
        assert_eq!(waits, 2);
    }

    #[test]
    fn a_woken_non_head_hands_the_wake_up_to_the_head() {
        let a = Admission::new(Metrics::new());
        let t0 = Instant::now();
        let batch = a.enqueue(pool("p"), pool("b"), 1, t0, 10).unwrap();
        drop(a.departure(pool("p")));
        // An interactive request queues after batch was woken: batch must not go first.
        let interactive = a.enqueue(pool("p"), pool("i"), 0, t0, 10).unwrap();
        assert!(!batch.claim());
        assert!(interactive.claim());
    }
}
