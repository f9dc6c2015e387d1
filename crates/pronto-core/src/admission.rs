//! SLO admission's rules, pure: whether a route's pool can meet a request's TTFT SLO now, what
//! a miss does, and the order of the admission queue. The gateway (`src/admission.rs` and the
//! proxy's admission check) and the offline evaluator (`pronto evaluate --ttft-slo S
//! --on-slo-miss shed|queue`) both apply them; neither reads a clock here.
//!
//! - [`miss`]: a request misses when a request for the same pool of the same or a more urgent
//!   class already waits ([`ShedReason::QueuedAhead`]: a newcomer never overtakes it), when no
//!   backend is eligible ([`ShedReason::NoCapacity`]), or when the decision's predicted TTFT
//!   exceeds the SLO ([`ShedReason::SloMiss`]). A decision without a prediction (no model
//!   anywhere) does not hold the request back.
//! - [`on_miss`]: `shed` refuses it; `fallback` sends it to the fallback pool; `queue` waits —
//!   and once its deadline (arrival + SLO) has passed it is sent anyway if some backend is
//!   eligible (late beats a retry from scratch), and shed ([`ShedReason::Deadline`]) if none is.
//! - [`QueueKey`]: a pool's queue is served by priority class rank, then deadline, then
//!   arrival.

/// Why admission refused a request (a bounded metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// The best predicted TTFT exceeds the route's SLO.
    SloMiss,
    /// No backend of the pool is eligible.
    NoCapacity,
    /// Queued requests of the same or a more urgent class come first.
    QueuedAhead,
    /// The admission queue is full.
    QueueFull,
    /// The request's queue deadline passed with no backend free.
    Deadline,
}

impl ShedReason {
    /// Every reason, for registering the series at zero.
    pub const ALL: [ShedReason; 5] = [
        ShedReason::SloMiss,
        ShedReason::NoCapacity,
        ShedReason::QueuedAhead,
        ShedReason::QueueFull,
        ShedReason::Deadline,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::SloMiss => "slo_miss",
            ShedReason::NoCapacity => "no_capacity",
            ShedReason::QueuedAhead => "queued_ahead",
            ShedReason::QueueFull => "queue_full",
            ShedReason::Deadline => "deadline",
        }
    }
}

/// Whether a request whose route's SLO is `slo_s` misses it now, and why, with the
/// prediction judged (infinite when no backend is eligible): `queued_ahead` when a request of
/// the same or a more urgent class waits for the pool; `decided`: the decision's predicted
/// TTFT — `None` when no backend is eligible, `Some(None)` when it has no prediction.
pub fn miss(
    queued_ahead: bool,
    decided: Option<Option<f64>>,
    slo_s: f64,
) -> Option<(ShedReason, f64)> {
    let predicted = decided.map(|p| p.unwrap_or(0.0));
    if queued_ahead {
        return Some((ShedReason::QueuedAhead, predicted.unwrap_or(f64::INFINITY)));
    }
    match predicted {
        None => Some((ShedReason::NoCapacity, f64::INFINITY)),
        Some(p) if p > slo_s => Some((ShedReason::SloMiss, p)),
        Some(_) => None,
    }
}

/// What a route does with a request that misses its SLO (a route's `on_slo_miss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMiss {
    /// Refuse it (429 with `Retry-After`).
    Shed,
    /// Send it to the route's fallback pool, once.
    Fallback,
    /// Wait in the admission queue.
    Queue,
}

/// What to do with a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Route it on its pool.
    Send,
    /// Refuse it, for this reason.
    Shed(ShedReason),
    /// Send it to the fallback pool.
    Fallback,
    /// Keep (or put) it in the queue; check again when a request of the pool departs.
    Wait,
}

/// The verdict on a request that `missed` (or not, `None`) under `on_miss`; `expired`: its
/// queue deadline has passed (a queued request); `eligible`: some backend of the pool could
/// take it now.
pub fn on_miss(
    missed: Option<ShedReason>,
    on_miss: OnMiss,
    expired: bool,
    eligible: bool,
) -> Verdict {
    let Some(reason) = missed else {
        return Verdict::Send;
    };
    match on_miss {
        OnMiss::Shed => Verdict::Shed(reason),
        OnMiss::Fallback => Verdict::Fallback,
        OnMiss::Queue if !expired => Verdict::Wait,
        OnMiss::Queue if eligible => Verdict::Send,
        OnMiss::Queue => Verdict::Shed(ShedReason::Deadline),
    }
}

/// A queued request's place: by priority class rank (lower first), then deadline, then
/// arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey<T: Ord> {
    /// Priority class rank: 0 is the most urgent.
    pub rank: u32,
    /// Arrival + SLO.
    pub deadline: T,
    /// Arrival order.
    pub seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_is_queued_ahead_then_no_capacity_then_a_late_prediction() {
        assert_eq!(miss(false, Some(Some(0.2)), 0.5), None);
        assert_eq!(
            miss(false, Some(Some(0.8)), 0.5),
            Some((ShedReason::SloMiss, 0.8))
        );
        assert_eq!(
            miss(false, None, 0.5),
            Some((ShedReason::NoCapacity, f64::INFINITY))
        );
        // Nobody overtakes a waiting request, whatever the prediction.
        assert_eq!(
            miss(true, Some(Some(0.1)), 0.5),
            Some((ShedReason::QueuedAhead, 0.1))
        );
        // No model anywhere: nothing holds the request back.
        assert_eq!(miss(false, Some(None), 0.5), None);
    }

    #[test]
    fn a_miss_sheds_falls_back_or_waits_until_its_deadline() {
        let r = Some(ShedReason::SloMiss);
        assert_eq!(on_miss(None, OnMiss::Shed, false, true), Verdict::Send);
        assert_eq!(
            on_miss(r, OnMiss::Shed, false, true),
            Verdict::Shed(ShedReason::SloMiss)
        );
        assert_eq!(on_miss(r, OnMiss::Fallback, false, true), Verdict::Fallback);
        assert_eq!(on_miss(r, OnMiss::Queue, false, true), Verdict::Wait);
        // Past its deadline: late beats never, while a backend can take it.
        assert_eq!(on_miss(r, OnMiss::Queue, true, true), Verdict::Send);
        assert_eq!(
            on_miss(Some(ShedReason::NoCapacity), OnMiss::Queue, true, false),
            Verdict::Shed(ShedReason::Deadline)
        );
    }

    #[test]
    fn the_queue_serves_by_class_then_deadline_then_arrival() {
        let k = |rank, deadline, seq| QueueKey {
            rank,
            deadline,
            seq,
        };
        let mut q = [k(1, 5, 0), k(0, 9, 1), k(0, 9, 2), k(0, 3, 3)];
        q.sort();
        assert_eq!(q.map(|k| k.seq), [3, 1, 2, 0]);
        assert_eq!(ShedReason::ALL.len(), 5);
        assert_eq!(ShedReason::QueueFull.as_str(), "queue_full");
    }
}
