//! The sequencing of one race, as a pure state machine: when a second copy goes out, and what
//! each copy's end means for the other. The gateway (`src/proxy/race.rs`, on tokio time) and
//! the offline evaluator (`pronto_sim::evaluate::race`, on the virtual clock) both drive it,
//! so they decide the same way by construction; each only carries out the [`Action`]s.
//!
//! ```text
//!            trigger (hedge granted, or deadline)      first token of X
//! Alone ───────────────────────────────▶ Launch ──▶ Racing ──────────────▶ Decided(X)
//!   │ first token / failure: the first copy's outcome     │ Y fails: X alone (Adopt X)
//!   ▼                                                     ▼
//! Decided(First)                                        Decided(X)
//! ```
//!
//! Events in: a trigger due ([`Race::on_trigger`]; the driver schedules [`Race::triggers`] and
//! the evaluator's failover oracle may fire one of its own), the launch's result
//! ([`Race::launched`] / [`Race::launch_failed`]), a copy's first token
//! ([`Race::on_first_token`]), a copy's failure ([`Race::on_failed`]). Every time is the
//! time since the first copy was dispatched, passed in: nothing here reads a clock.
//!
//! The rules, as the gateway has always applied them:
//! - The first copy runs alone until a trigger: a hedge (when the route's budget grants one
//!   then — the driver's `grant` asks it), else the first-token deadline. A second copy goes
//!   out at most once; if no other backend can take it, the first copy is awaited alone and
//!   no later trigger races it.
//! - The first copy to deliver its first token wins ([`Action::Adopt`]). The other is
//!   cancelled: its attempt dropped, its prefix record undone, its booking released — and a
//!   first copy that loses a *failover* was late: its TTFT model observes the time it was
//!   given, a lower bound of its real TTFT ([`Action::ObserveCensored`]).
//! - A copy that fails while the other is alive is counted and its backend marked tried
//!   ([`Action::Tried`]), its record undone and booking released; the other is awaited alone
//!   and its outcome is the request's.

use std::time::Duration;

/// A race's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first attempt, dispatched at time zero.
    First,
    /// The copy sent at a trigger.
    Second,
}

impl Side {
    /// The other copy.
    pub(crate) fn other(self) -> Side {
        match self {
            Side::First => Side::Second,
            Side::Second => Side::First,
        }
    }

    /// 0 for the first copy, 1 for the second.
    pub fn index(self) -> usize {
        match self {
            Side::First => 0,
            Side::Second => 1,
        }
    }
}

/// Why a second copy goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// The first-token deadline passed (failover).
    Failover,
    /// The hedge delay passed and the budget granted a hedge.
    Hedge,
}

/// What the driver must do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Take the decision again without the first backend (and those tried), book and record
    /// it, and send the second copy; then call [`Race::launched`] or [`Race::launch_failed`].
    Launch(Trigger),
    /// This copy's outcome is the request's: a winner, or the only copy left.
    Adopt(Side),
    /// Drop this copy's attempt (close its upstream connection; abort it in its engine).
    Cancel(Side),
    /// This copy's TTFT model observes `waited` as its TTFT: a lower bound (censored sample).
    ObserveCensored {
        /// The late copy.
        side: Side,
        /// How long it had been given.
        waited: Duration,
    },
    /// Undo this copy's prefix record.
    UndoRecord(Side),
    /// Release this copy's booking.
    Release(Side),
    /// This copy failed during the race: count the error, mark its backend tried.
    Tried(Side),
}

/// Where a race stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first copy runs alone; triggers may still race it.
    Alone,
    /// A launch was asked for and not answered yet.
    Launching(Trigger),
    /// Both copies run.
    Racing,
    /// One copy's outcome is the request's; nothing more happens.
    Decided(Side),
}

/// One request's race (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Race {
    triggers: [Option<(Duration, Trigger)>; 2],
    phase: Phase,
    /// Why the second copy went out, and when.
    second: Option<(Trigger, Duration)>,
    /// No trigger may race the first copy any more (a launch found no backend).
    closed: bool,
}

impl Race {
    /// The race of a first attempt under `plan` ([`super::plan`]).
    pub fn of(plan: &super::Plan) -> Race {
        Race::new(plan.hedge, plan.deadline.map(|(d, _)| d))
    }

    /// The race of a first attempt hedged after `hedge` and failed over after `deadline`
    /// (times since its dispatch); with neither, only [`Race::on_trigger`] can race it.
    pub fn new(hedge: Option<Duration>, deadline: Option<Duration>) -> Race {
        let mut triggers = [
            hedge.map(|d| (d, Trigger::Hedge)),
            deadline.map(|d| (d, Trigger::Failover)),
        ];
        triggers.sort_by_key(|t| t.map_or(Duration::MAX, |(d, _)| d));
        Race {
            triggers,
            phase: Phase::Alone,
            second: None,
            closed: false,
        }
    }

    /// The triggers to schedule, in time order (the hedge first on a tie), as times since
    /// the first dispatch.
    pub fn triggers(&self) -> impl Iterator<Item = (Duration, Trigger)> + '_ {
        self.triggers.iter().flatten().copied()
    }

    /// Why the second copy went out, when one did.
    pub fn kind(&self) -> Option<Trigger> {
        self.second.map(|(k, _)| k)
    }

    /// Whether the first copy may still be raced (no second copy, nothing decided).
    pub(crate) fn open(&self) -> bool {
        self.phase == Phase::Alone && !self.closed
    }

    /// Whether both copies run.
    #[cfg(test)]
    pub(crate) fn racing(&self) -> bool {
        self.phase == Phase::Racing
    }

    /// The copy whose outcome is the request's, once decided.
    pub fn decided(&self) -> Option<Side> {
        match self.phase {
            Phase::Decided(s) => Some(s),
            _ => None,
        }
    }

    /// A `kind` trigger is due: [`Action::Launch`] when the first copy may be raced (for a
    /// hedge, `grant` is asked — and spends — the budget), else nothing.
    pub fn on_trigger(&mut self, kind: Trigger, grant: impl FnOnce() -> bool) -> Option<Action> {
        if !self.open() || (kind == Trigger::Hedge && !grant()) {
            return None;
        }
        self.phase = Phase::Launching(kind);
        Some(Action::Launch(kind))
    }

    /// The second copy asked for went out at `now`.
    pub fn launched(&mut self, now: Duration) {
        if let Phase::Launching(kind) = self.phase {
            self.second = Some((kind, now));
            self.phase = Phase::Racing;
        }
    }

    /// No backend could take the second copy: the first is awaited alone from now on.
    pub fn launch_failed(&mut self) {
        if let Phase::Launching(_) = self.phase {
            self.phase = Phase::Alone;
            self.closed = true;
        }
    }

    /// Copy `side` delivered its first token (or, racing on the first answer, its first answer
    /// token) at `now`.
    pub fn on_first_token(&mut self, side: Side, now: Duration) -> Vec<Action> {
        match self.phase {
            Phase::Racing => {
                self.phase = Phase::Decided(side);
                let loser = side.other();
                let mut out = vec![Action::Adopt(side), Action::Cancel(loser)];
                if side == Side::Second && self.kind() == Some(Trigger::Failover) {
                    out.push(Action::ObserveCensored {
                        side: loser,
                        waited: now.saturating_sub(self.launched_at(loser)),
                    });
                }
                out.extend([Action::UndoRecord(loser), Action::Release(loser)]);
                out
            }
            Phase::Alone | Phase::Launching(_) if side == Side::First => {
                self.phase = Phase::Decided(Side::First);
                vec![Action::Adopt(Side::First)]
            }
            _ => Vec::new(),
        }
    }

    /// Copy `side` failed at `now` (connect error, 5xx, timeout; an engine's rejection).
    pub fn on_failed(&mut self, side: Side, _now: Duration) -> Vec<Action> {
        match self.phase {
            Phase::Racing => {
                let survivor = side.other();
                self.phase = Phase::Decided(survivor);
                vec![
                    Action::Adopt(survivor),
                    Action::Tried(side),
                    Action::UndoRecord(side),
                    Action::Release(side),
                ]
            }
            Phase::Alone | Phase::Launching(_) if side == Side::First => {
                self.phase = Phase::Decided(Side::First);
                vec![Action::Adopt(Side::First)]
            }
            _ => Vec::new(),
        }
    }

    /// The first copy ended on its own (a finished stream, before any race): no trigger may
    /// race it any more.
    pub fn on_finished(&mut self, side: Side) {
        if matches!(self.phase, Phase::Alone | Phase::Launching(_)) && side == Side::First {
            self.phase = Phase::Decided(Side::First);
        }
    }

    fn launched_at(&self, side: Side) -> Duration {
        match side {
            Side::First => Duration::ZERO,
            Side::Second => self.second.map_or(Duration::ZERO, |(_, at)| at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DeadlineKind, Plan};
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn plan(hedge: Option<u64>, deadline: Option<u64>) -> Plan {
        Plan {
            hedge: hedge.map(MS),
            deadline: deadline.map(|d| (MS(d), DeadlineKind::Absolute)),
        }
    }

    fn launch(r: &mut Race, kind: Trigger, at: u64) {
        assert_eq!(r.on_trigger(kind, || true), Some(Action::Launch(kind)));
        r.launched(MS(at));
        assert!(r.racing());
    }

    #[test]
    fn triggers_come_in_time_order() {
        let r = Race::of(&plan(Some(300), Some(100)));
        let t: Vec<_> = r.triggers().collect();
        assert_eq!(t, [(MS(100), Trigger::Failover), (MS(300), Trigger::Hedge)]);
        let r = Race::of(&plan(Some(50), None));
        assert_eq!(r.triggers().collect::<Vec<_>>(), [(MS(50), Trigger::Hedge)]);
    }

    #[test]
    fn a_first_copy_that_answers_alone_ends_the_race() {
        let mut r = Race::of(&plan(None, Some(100)));
        assert_eq!(
            r.on_first_token(Side::First, MS(40)),
            [Action::Adopt(Side::First)]
        );
        assert_eq!(r.decided(), Some(Side::First));
        // A trigger due later finds nothing to race.
        assert_eq!(r.on_trigger(Trigger::Failover, || true), None);
        // Alone, a failure is the request's outcome (retries are the caller's).
        let mut r = Race::of(&plan(None, Some(100)));
        assert_eq!(
            r.on_failed(Side::First, MS(5)),
            [Action::Adopt(Side::First)]
        );
        assert_eq!(r.on_trigger(Trigger::Failover, || true), None);
        // A stream that finished (an engine that rejected it alone) cannot be raced either.
        let mut r = Race::of(&plan(None, Some(100)));
        r.on_finished(Side::First);
        assert_eq!(r.on_trigger(Trigger::Failover, || true), None);
    }

    #[test]
    fn a_hedge_needs_the_budget_and_a_failover_does_not() {
        let mut r = Race::of(&plan(Some(50), Some(200)));
        let mut asked = 0;
        assert_eq!(
            r.on_trigger(Trigger::Hedge, || {
                asked += 1;
                false
            }),
            None
        );
        assert_eq!(asked, 1);
        assert!(r.open(), "a refused hedge leaves the deadline to come");
        assert_eq!(
            r.on_trigger(Trigger::Failover, || panic!("not asked")),
            Some(Action::Launch(Trigger::Failover))
        );
        r.launched(MS(200));
        assert_eq!(r.kind(), Some(Trigger::Failover));
        // Racing: no further trigger sends a third copy.
        assert_eq!(r.on_trigger(Trigger::Hedge, || true), None);
        assert_eq!(r.on_trigger(Trigger::Failover, || true), None);
    }

    #[test]
    fn a_launch_with_no_backend_closes_the_race() {
        let mut r = Race::of(&plan(Some(50), Some(200)));
        assert!(r.on_trigger(Trigger::Hedge, || true).is_some());
        r.launch_failed();
        assert!(!r.racing());
        assert_eq!(r.on_trigger(Trigger::Failover, || true), None);
        // The first copy is still the request.
        assert_eq!(
            r.on_first_token(Side::First, MS(500)),
            [Action::Adopt(Side::First)]
        );
    }

    #[test]
    fn a_second_copy_that_wins_a_failover_censors_the_first() {
        let mut r = Race::of(&plan(None, Some(200)));
        launch(&mut r, Trigger::Failover, 200);
        let a = r.on_first_token(Side::Second, MS(350));
        assert_eq!(
            a,
            [
                Action::Adopt(Side::Second),
                Action::Cancel(Side::First),
                Action::ObserveCensored {
                    side: Side::First,
                    waited: MS(350)
                },
                Action::UndoRecord(Side::First),
                Action::Release(Side::First),
            ]
        );
        assert_eq!(r.decided(), Some(Side::Second));
        // A late first token of the loser changes nothing.
        assert!(r.on_first_token(Side::First, MS(400)).is_empty());
        assert!(r.on_failed(Side::First, MS(400)).is_empty());
    }

    #[test]
    fn a_lost_hedge_observes_nothing_and_a_first_copy_win_cancels_the_second() {
        let mut r = Race::of(&plan(Some(100), None));
        launch(&mut r, Trigger::Hedge, 100);
        let a = r.on_first_token(Side::Second, MS(150));
        assert!(
            !a.iter()
                .any(|a| matches!(a, Action::ObserveCensored { .. })),
            "a hedge is no verdict on the first copy: {a:?}"
        );
        assert_eq!(a[0], Action::Adopt(Side::Second));
        let mut r = Race::of(&plan(None, Some(100)));
        launch(&mut r, Trigger::Failover, 100);
        assert_eq!(
            r.on_first_token(Side::First, MS(120)),
            [
                Action::Adopt(Side::First),
                Action::Cancel(Side::Second),
                Action::UndoRecord(Side::Second),
                Action::Release(Side::Second),
            ]
        );
    }

    #[test]
    fn a_copy_that_fails_during_the_race_leaves_the_other_alone() {
        for failed in [Side::First, Side::Second] {
            let mut r = Race::of(&plan(None, Some(100)));
            launch(&mut r, Trigger::Failover, 100);
            assert_eq!(
                r.on_failed(failed, MS(130)),
                [
                    Action::Adopt(failed.other()),
                    Action::Tried(failed),
                    Action::UndoRecord(failed),
                    Action::Release(failed),
                ]
            );
            assert_eq!(r.decided(), Some(failed.other()));
            // The survivor's own first token or failure is the request's, with no more actions.
            assert!(r.on_first_token(failed.other(), MS(200)).is_empty());
        }
    }
}
