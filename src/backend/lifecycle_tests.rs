//! The transition rules on synthetic instants: what each sequence of observations logs.

use super::*;

fn secs(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

#[test]
fn a_condition_reports_the_first_failure_then_at_most_one_repeat_per_interval() {
    let t0 = Instant::now();
    let mut c = Condition::default();
    assert_eq!(c.ok(), None, "fine stays fine, silently");
    assert_eq!(c.fail(t0), Some(Change::Failing));
    // A probe every second for a minute: a line at 30 s and at 60 s, nothing in between.
    let mut lines = Vec::new();
    for s in 1..=60 {
        if let Some(change) = c.fail(secs(t0, s)) {
            lines.push((s, change));
        }
    }
    assert_eq!(
        lines,
        vec![
            (
                30,
                Change::StillFailing {
                    failures: 31,
                    suppressed: 29
                }
            ),
            (
                60,
                Change::StillFailing {
                    failures: 61,
                    suppressed: 29
                }
            ),
        ]
    );
    assert!(c.is_failing());
    assert_eq!(c.ok(), Some(Change::Recovered { failures: 61 }));
    assert_eq!(c.ok(), None);
    // A new failure is a new transition, not a repeat of the old one.
    assert_eq!(c.fail(secs(t0, 61)), Some(Change::Failing));
    assert_eq!(c.fail(secs(t0, 62)), None);
}

#[test]
fn a_clock_that_does_not_move_never_repeats() {
    let t0 = Instant::now();
    let mut c = Condition::default();
    assert_eq!(c.fail(t0), Some(Change::Failing));
    for _ in 0..1000 {
        assert_eq!(c.fail(t0), None);
    }
    assert_eq!(
        c.fail(t0 + REPEAT_EVERY),
        Some(Change::StillFailing {
            failures: 1002,
            suppressed: 1000
        })
    );
}

#[test]
fn health_logs_down_once_and_up_once() {
    let t0 = Instant::now();
    let mut h = HealthTracker::default();
    assert_eq!(h.on_check(Ok(()), false, t0), None, "healthy at start");
    let refused = Err(CheckFailure::Refused);
    assert_eq!(
        h.on_check(refused, false, t0),
        Some(HealthChange::Down(CheckFailure::Refused))
    );
    assert!(h.is_down());
    assert_eq!(
        h.on_check(Err(CheckFailure::Timeout), false, secs(t0, 5)),
        None
    );
    assert_eq!(
        h.on_check(Err(CheckFailure::Status(503)), false, secs(t0, 30)),
        Some(HealthChange::StillDown {
            reason: CheckFailure::Status(503),
            failures: 3,
            suppressed: 1
        }),
        "the repeat carries the latest reason"
    );
    assert_eq!(
        h.on_check(Ok(()), false, secs(t0, 35)),
        Some(HealthChange::Up { failures: 3 })
    );
    assert_eq!(h.on_check(Ok(()), false, secs(t0, 40)), None);
    assert!(!h.is_down());
}

#[test]
fn ejection_is_logged_and_readmission_waits_for_its_end_and_a_pass() {
    let t0 = Instant::now();
    let mut h = HealthTracker::default();
    assert_eq!(h.on_ejected(3), HealthChange::Ejected { failures: 3 });
    // Checks pass while the ejection holds: nothing to say.
    assert_eq!(h.on_check(Ok(()), true, secs(t0, 5)), None);
    assert_eq!(
        h.on_check(Ok(()), false, secs(t0, 10)),
        Some(HealthChange::Readmitted)
    );
    assert_eq!(h.on_check(Ok(()), false, secs(t0, 15)), None, "once");

    // Ejected, then the active check fails too: down; its recovery after the ejection
    // period is the one `up` line (re-admission included).
    h.on_ejected(5);
    assert_eq!(
        h.on_check(Err(CheckFailure::Connect), true, secs(t0, 20)),
        Some(HealthChange::Down(CheckFailure::Connect))
    );
    assert_eq!(
        h.on_check(Err(CheckFailure::Connect), false, secs(t0, 25)),
        None
    );
    assert_eq!(
        h.on_check(Ok(()), false, secs(t0, 30)),
        Some(HealthChange::Up { failures: 2 })
    );
    assert_eq!(h.on_check(Ok(()), false, secs(t0, 35)), None);

    // The check recovers while still ejected: `up` now, `re-admitted` when the period ends.
    h.on_ejected(3);
    assert!(h
        .on_check(Err(CheckFailure::Io), true, secs(t0, 40))
        .is_some());
    assert_eq!(
        h.on_check(Ok(()), true, secs(t0, 45)),
        Some(HealthChange::Up { failures: 1 })
    );
    assert_eq!(
        h.on_check(Ok(()), false, secs(t0, 50)),
        Some(HealthChange::Readmitted)
    );
}

#[test]
fn kv_link_reports_connect_loss_failures_and_resumption() {
    let t0 = Instant::now();
    let mut k = KvLink::default();
    assert_eq!(
        k.on_connect_failed("refused".into(), t0),
        Some(KvChange::ConnectFailing("refused".into()))
    );
    assert_eq!(k.on_connect_failed("refused".into(), secs(t0, 1)), None);
    assert_eq!(
        k.on_connected(),
        Some(KvChange::Connected),
        "the first connection, even after failures"
    );
    assert_eq!(k.on_connected(), None);
    assert_eq!(
        k.on_lost("eof".into(), secs(t0, 2)),
        Some(KvChange::Lost("eof".into()))
    );
    for s in 3..32 {
        assert_eq!(k.on_connect_failed("refused".into(), secs(t0, s)), None);
    }
    assert_eq!(
        k.on_connect_failed("refused".into(), secs(t0, 32)),
        Some(KvChange::StillDown {
            reason: "refused".into(),
            failures: 31,
            suppressed: 29
        })
    );
    assert_eq!(k.on_connected(), Some(KvChange::Resumed { failures: 31 }));
    // A clean reconnect after a loss with no failed attempt in between.
    assert!(k.on_lost("eof".into(), secs(t0, 40)).is_some());
    assert_eq!(k.on_connected(), Some(KvChange::Resumed { failures: 1 }));
}

#[test]
fn check_failure_labels_are_the_listed_ones() {
    let all = [
        CheckFailure::Status(500),
        CheckFailure::Timeout,
        CheckFailure::Refused,
        CheckFailure::Connect,
        CheckFailure::Io,
    ];
    let labels: Vec<_> = all.iter().map(|f| f.label()).collect();
    assert_eq!(labels, CheckFailure::LABELS);
    assert_eq!(CheckFailure::Status(503).to_string(), "HTTP status 503");
}
