//! Racing two backends before the first byte: failover on a missed first-token deadline, and
//! bounded hedging (the route's `first_token_deadline` and `hedge`, [`crate::config::race`]).
//!
//! ```text
//! A: dispatch ── attempt ───────────── first chunk? ── win: relay A, cancel B
//!          trigger (hedge delay / deadline)
//! B:              └─ route again without A ── dispatch ── attempt ── first chunk? ── win
//! ```
//!
//! Streams only: an attempt commits at its first body chunk (the first token), and until one
//! commits nothing has reached the client, so either copy may still be dropped. The first
//! attempt runs alone until its trigger: the hedge delay (when the route hedges, the budget
//! grants one and the best prediction is under `max_predicted_ttft`), else the first-token
//! deadline. Then the decision is taken again without the first backend — booked, recorded
//! and counted as any decision — and both attempts race. The first to commit wins; the other
//! future is dropped, which closes its upstream connection (the engine aborts the request),
//! undoes its prefix record and releases its booking. A first attempt that loses a failover
//! was late: its TTFT model observes the time it was given (the deadline or more), a lower
//! bound of its real TTFT. An attempt that *fails* during the race (connect error, 5xx,
//! timeout) is counted and marked tried, and the other is awaited alone; its outcome is the
//! race's. Everything here runs in the request's task: no spawn, no lock across an await.
//!
//! These rules are [`pronto_core::race::Race`]'s, a clock-free state machine the offline
//! evaluator drives as well; this module waits on tokio time and carries out its actions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_http::RequestHeader;

use super::upstream::{attempt, client_key_is_ours, upstream_request_head, Attempt, Deadlines};
use super::Proxy;
use crate::config::Route;
use crate::state::{Attempted, GatewayState, Pool, Routed};
use crate::telemetry::{FailoverReason, RaceKind};
use pronto_core::ids::BackendId;
use pronto_core::race::RaceOn;
use pronto_core::race::{Action, DeadlineKind, HedgeBucket, Race as CoreRace, Side, Trigger};
use pronto_core::request::RequestFeatures;
use pronto_core::routing::Policy;

/// One dispatched attempt's state: its decision, its booking, when it was dispatched.
pub(super) struct Entrant {
    pub routed: Routed,
    pub attempted: Attempted,
    pub at: Instant,
}

/// When a first attempt gets company, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Plan {
    /// The hedge delay, when the route hedges and the fleet is not saturated.
    pub hedge: Option<Duration>,
    /// The first-token deadline, when the route has one.
    pub deadline: Option<(Duration, FailoverReason)>,
}

impl Plan {
    /// The race plan of a streamed request on `route` whose first decision is `routed`;
    /// `None` when there is nothing to race ([`pronto_core::race::plan`]).
    ///
    /// With `race_on: ttfa` the delays measure the first answer: a relative deadline or a
    /// quantile hedge scales the predicted TTFA — the decision's TTFT plus the pool's expected
    /// `reasoning_tokens` at the chosen backend's predicted TPOT (no prediction, so the
    /// deadline's floor, while that backend's TPOT is not predicted yet and reasoning is
    /// expected).
    pub fn of(
        route: Option<&Route>,
        routed: &Routed,
        stream: bool,
        reasoning_tokens: f64,
    ) -> Option<Plan> {
        let route = route.filter(|_| stream)?;
        let rel_error = routed.chosen.ttft_model.map(|m| m.quality.rel_error);
        let predicted = route.race_on.prediction(
            routed.decision.predicted_ttft_s,
            routed.chosen.predicted_tpot_s(),
            reasoning_tokens,
        );
        let p = pronto_core::race::plan(
            route.first_token_deadline.as_ref(),
            route.hedge.as_ref(),
            predicted,
            rel_error,
        )?;
        Some(Plan {
            hedge: p.hedge,
            deadline: p.deadline.map(|(d, kind)| {
                let reason = match kind {
                    DeadlineKind::Absolute => FailoverReason::AbsoluteDeadline,
                    DeadlineKind::Relative => FailoverReason::RelativeDeadline,
                };
                (d, reason)
            }),
        })
    }
}

/// What a race produced: the entrant whose outcome is final and that outcome.
pub(super) struct Finish {
    pub entrant: Entrant,
    pub outcome: Attempt,
    /// The race that happened, for the explain headers and the access log.
    pub raced: Option<Raced>,
}

/// A race that took place.
#[derive(Debug, Clone)]
pub(super) struct Raced {
    pub kind: RaceKind,
    /// The first backend (the late one, for a failover).
    pub first: Arc<str>,
    /// The second backend answered first.
    pub second_won: bool,
}

/// Hedge credit per route, outliving reloads: a [`HedgeBucket`] per route (each request on a
/// hedging route earns `budget` hedges, at most
/// [`HEDGE_BURST`](pronto_core::race::HEDGE_BURST) banked; a hedge spends one).
#[derive(Debug, Default)]
pub(super) struct HedgeBudgets {
    credit: Mutex<HashMap<Arc<str>, HedgeBucket>>,
}

impl HedgeBudgets {
    /// A request arrived on `route`, which hedges with `budget`.
    pub fn earn(&self, route: &Arc<str>, budget: f64) {
        self.credit()
            .entry(Arc::clone(route))
            .or_default()
            .earn(budget);
    }

    /// Spend one hedge of `route`, if it has one.
    pub fn take(&self, route: &str) -> bool {
        self.credit().get_mut(route).is_some_and(HedgeBucket::take)
    }

    /// The credit map. A thread that panicked while holding the lock cannot have left a
    /// bucket worse than a count off by one hedge: the map is used as it is, rather than
    /// every later hedging request panicking on the poison.
    fn credit(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, HedgeBucket>> {
        self.credit.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Everything a race needs besides the first entrant.
pub(super) struct Race<'a> {
    pub proxy: &'a Proxy,
    pub state: &'a GatewayState,
    pub pool: &'a Pool,
    pub route: &'a Route,
    pub policy: &'a dyn Policy,
    pub features: &'a RequestFeatures,
    pub body: &'a Bytes,
    pub client_head: &'a RequestHeader,
    pub request_id: &'a str,
    pub deadlines: Deadlines,
    pub may_retry: bool,
}

impl Race<'_> {
    /// Run the first attempt, `a` (whose request head is `head`), and race it as `plan` says:
    /// the sequencing is [`pronto_core::race::Race`]'s, carried out here on tokio time.
    /// `tried` gains every backend that failed during the race.
    pub async fn run(
        &self,
        mut a: Entrant,
        head: RequestHeader,
        plan: Plan,
        tried: &mut Vec<BackendId>,
    ) -> Finish {
        let p = self.proxy;
        let first = a.routed.decision.index;
        let backend_a = Arc::clone(&self.pool.backends[first]);
        let body_a = self.pool.body_for(first, self.body, self.features);
        let mut m = CoreRace::new(plan.hedge, plan.deadline.map(|(d, _)| d));
        let triggers: Vec<_> = m.triggers().collect();
        let mut fut_a = Box::pin(attempt(
            &p.connectors,
            &backend_a,
            head,
            &body_a,
            true,
            self.route.race_on == RaceOn::Ttfa,
            self.deadlines,
            self.may_retry,
            &mut a.attempted.guard,
        ));
        let mut launch = None;
        for (delay, k) in triggers {
            let at = tokio::time::Instant::from_std(a.at + delay);
            tokio::select! {
                out = &mut fut_a => {
                    drop(fut_a);
                    return Finish { entrant: a, outcome: out, raced: None };
                }
                _ = tokio::time::sleep_until(at) => {}
            }
            if let Some(Action::Launch(k)) = m.on_trigger(k, || p.hedges.take(&self.route.name)) {
                launch = Some(k);
                break;
            }
        }
        let second = launch.and_then(|k| Some((k, self.second(first, tried)?)));
        let Some((trigger, (mut b, head_b, body_b))) = second else {
            m.launch_failed();
            let out = fut_a.await;
            return Finish {
                entrant: a,
                outcome: out,
                raced: None,
            };
        };
        m.launched(b.at.saturating_duration_since(a.at));
        let kind = kind_of(trigger);
        let route = &*self.route.name;
        let race = &p.metrics.race;
        match kind {
            RaceKind::Failover => {
                let reason = plan
                    .deadline
                    .map_or(FailoverReason::AbsoluteDeadline, |d| d.1);
                race.failovers_total
                    .with_label_values(&[route, reason.label()])
                    .inc();
            }
            RaceKind::Hedge => race.hedges_sent_total.with_label_values(&[route]).inc(),
        }
        tracing::info!(
            request_id = self.request_id, kind = kind.label(), first = %backend_a.name(),
            first_reason = a.routed.decision.reason.as_str(),
            first_predicted_s = a.routed.decision.predicted_ttft_s,
            second = %self.pool.backends[b.routed.decision.index].name(),
            "first token late: racing a second backend"
        );
        let backend_b = Arc::clone(&self.pool.backends[b.routed.decision.index]);
        let mut fut_b = Box::pin(attempt(
            &p.connectors,
            &backend_b,
            head_b,
            &body_b,
            true,
            self.route.race_on == RaceOn::Ttfa,
            self.deadlines,
            self.may_retry,
            &mut b.attempted.guard,
        ));
        let (side, out) = tokio::select! {
            out = &mut fut_a => (Side::First, out),
            out = &mut fut_b => (Side::Second, out),
        };
        let elapsed = Instant::now().saturating_duration_since(a.at);
        let actions = match out {
            Attempt::Committed { .. } => m.on_first_token(side, elapsed),
            _ => m.on_failed(side, elapsed),
        };
        let mut raced = Raced {
            kind,
            first: backend_a.config.name.clone(),
            second_won: false,
        };
        // The copy the machine adopted: the winner (the other is settled at once), or the
        // survivor of a failure (the failed one is settled, the survivor awaited alone).
        let (entrant, outcome) = match (m.decided(), side) {
            (Some(Side::First), Side::First) => {
                drop((fut_a, fut_b));
                self.settle(b, Side::Second, &actions, kind, &out, tried);
                (a, out)
            }
            (Some(Side::Second), Side::Second) => {
                drop((fut_a, fut_b));
                self.settle(a, Side::First, &actions, kind, &out, tried);
                raced.second_won = true;
                (b, out)
            }
            (_, Side::First) => {
                drop(fut_a);
                self.settle(a, Side::First, &actions, kind, &out, tried);
                let out = fut_b.await;
                raced.second_won = matches!(out, Attempt::Committed { .. });
                (b, out)
            }
            (_, Side::Second) => {
                drop(fut_b);
                self.settle(b, Side::Second, &actions, kind, &out, tried);
                let out = fut_a.await;
                (a, out)
            }
        };
        if raced.second_won {
            match kind {
                RaceKind::Failover => race.failovers_won_total.with_label_values(&[route]).inc(),
                RaceKind::Hedge => race.hedges_won_total.with_label_values(&[route]).inc(),
            }
        }
        Finish {
            entrant,
            outcome,
            raced: Some(raced),
        }
    }

    /// The second entrant: the decision taken again without the first backend (and those
    /// tried), booked and recorded, with its request head and body; `None` when no other
    /// backend is eligible.
    fn second(&self, first: usize, tried: &[BackendId]) -> Option<(Entrant, RequestHeader, Bytes)> {
        let first = self.pool.backends[first].id();
        let mut excluded = Vec::with_capacity(tried.len() + 1);
        excluded.extend_from_slice(tried);
        excluded.push(first);
        let now = Instant::now();
        let explain = self.state.config.explain_headers;
        let routed = self
            .pool
            .route(self.policy, self.features, now, &excluded, explain)
            .ok()?;
        let backend = &self.pool.backends[routed.decision.index];
        let body = self
            .pool
            .body_for(routed.decision.index, self.body, self.features);
        let head = upstream_request_head(
            self.client_head,
            backend,
            body.len(),
            client_key_is_ours(self.state.config.auth.is_some(), Some(self.route)),
            self.request_id,
        )
        .ok()?;
        self.proxy.record_decision(
            self.pool,
            self.policy.name(),
            &routed,
            self.features.prompt_tokens,
        );
        let attempted = self.pool.dispatch(&routed, self.features, true, now);
        Some((
            Entrant {
                routed,
                attempted,
                at: now,
            },
            head,
            body,
        ))
    }

    /// Carry out the machine's `actions` on copy `side`, `e`, which is not adopted (its
    /// attempt already dropped): a loser's prefill counted as wasted, a late first copy's
    /// censored observation, a failed one's error counted and backend marked tried (its
    /// outcome `out`), its prefix record undone — and its booking released with `e`.
    fn settle(
        &self,
        mut e: Entrant,
        side: Side,
        actions: &[Action],
        kind: RaceKind,
        out: &Attempt,
        tried: &mut Vec<BackendId>,
    ) {
        let now = Instant::now();
        let i = e.routed.decision.index;
        for a in actions {
            match *a {
                Action::Cancel(s) if s == side => {
                    let uncached = self
                        .features
                        .prompt_tokens
                        .saturating_sub(e.routed.chosen.cached_tokens);
                    self.proxy
                        .metrics
                        .race
                        .wasted_prompt_tokens_total
                        .with_label_values(&[&self.route.name, kind.label()])
                        .inc_by(u64::from(uncached));
                }
                Action::ObserveCensored { side: s, waited } if s == side => {
                    let waited = waited.as_secs_f64();
                    e.attempted
                        .guard
                        .first_token(&e.attempted.inputs, waited, now);
                }
                Action::Tried(s) if s == side => self.failed(i, out, tried),
                Action::UndoRecord(s) if s == side => {
                    self.pool
                        .undo_record(i, self.features, e.attempted.held_blocks);
                }
                // Released when `e` (its in-flight guard) is dropped below.
                Action::Release(_) | Action::Adopt(_) | Action::Launch(_) => {}
                _ => {}
            }
        }
        drop(e);
    }

    /// Backend `i`'s attempt failed during the race with `out`: counted, and its backend
    /// marked tried.
    fn failed(&self, i: usize, out: &Attempt, tried: &mut Vec<BackendId>) {
        let backend = &self.pool.backends[i];
        let (kind, fault) = match out {
            Attempt::Failed {
                reason,
                backend_fault,
                detail,
            } => {
                tracing::info!(request_id = self.request_id, backend = %backend.name(), %detail, "raced attempt failed");
                (reason.as_str(), *backend_fault)
            }
            Attempt::FirstTokenTimeout => ("first_token_timeout", false),
            Attempt::Committed { .. } => return,
        };
        self.proxy
            .metrics
            .upstream_errors_total
            .with_label_values(&[backend.name(), kind])
            .inc();
        if fault {
            self.proxy
                .record_failure(self.pool, i, &self.state.config.health);
        }
        if !tried.contains(&backend.id()) {
            tried.push(backend.id());
        }
    }
}

/// The telemetry label of a race's trigger.
fn kind_of(t: Trigger) -> RaceKind {
    match t {
        Trigger::Failover => RaceKind::Failover,
        Trigger::Hedge => RaceKind::Hedge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pronto_core::race::HEDGE_BURST;
    use pronto_core::routing::{BackendView, Decision, Reason};

    fn routed(predicted: Option<f64>) -> Routed {
        Routed {
            decision: Decision {
                index: 0,
                predicted_ttft_s: predicted,
                reason: Reason::PredictedBest,
            },
            chosen: BackendView::idle("b"),
            held_blocks: 0,
            others_left: true,
            runner_up: None,
        }
    }

    fn route(extra: &str) -> Route {
        let yaml = format!(
            "routes:\n  - {{name: r, pool: p{extra}}}\npools:\n  p: {{backends: [{{name: a, url: 'http://h:1'}}]}}\n"
        );
        crate::config::Config::from_yaml_str(&yaml, "t.yaml")
            .unwrap()
            .routes[0]
            .clone()
    }

    #[test]
    fn a_poisoned_hedge_budget_still_hedges() {
        let budgets = std::sync::Arc::new(HedgeBudgets::default());
        let r: Arc<str> = Arc::from("r");
        // A new bucket holds one hedge; spend it, then earn one.
        budgets.earn(&r, 0.0);
        assert!(budgets.take("r"));
        budgets.earn(&r, 1.0);
        let poisoner = std::sync::Arc::clone(&budgets);
        let panicked = std::thread::spawn(move || {
            let _held = poisoner.credit.lock();
            panic!("poison the hedge budget lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(budgets.credit.is_poisoned());
        // Neither call panics, and the credit banked before is still there.
        assert!(budgets.take("r"));
        assert!(!budgets.take("r"));
        budgets.earn(&r, 1.0);
        assert!(budgets.take("r"));
    }

    #[test]
    fn a_plan_needs_a_stream_and_a_racing_route() {
        let r = route(", first_token_deadline: {factor: 3, floor: 100ms}");
        assert_eq!(
            Plan::of(Some(&r), &routed(Some(0.2)), false, 0.0),
            None,
            "streams only"
        );
        assert_eq!(Plan::of(None, &routed(Some(0.2)), true, 0.0), None);
        assert_eq!(
            Plan::of(Some(&route("")), &routed(Some(0.2)), true, 0.0),
            None
        );
        let p = Plan::of(Some(&r), &routed(Some(0.2)), true, 0.0).unwrap();
        assert_eq!(p.hedge, None);
        let (d, reason) = p.deadline.unwrap();
        assert!((d.as_secs_f64() - 0.6).abs() < 1e-9, "{d:?}");
        assert_eq!(reason, FailoverReason::RelativeDeadline);
        // Without a prediction, the floor.
        let p = Plan::of(Some(&r), &routed(None), true, 0.0).unwrap();
        assert_eq!(p.deadline.unwrap().0, Duration::from_millis(100));
        // A saturated fleet gets no hedge (and a route with only a hedge, no plan).
        let h = route(", hedge: {after: 50ms, max_predicted_ttft: 1s}");
        let p = Plan::of(Some(&h), &routed(Some(0.2)), true, 0.0).unwrap();
        assert_eq!(p.hedge, Some(Duration::from_millis(50)));
        assert_eq!(p.deadline, None);
        assert_eq!(Plan::of(Some(&h), &routed(Some(1.5)), true, 0.0), None);
        let abs = route(", first_token_deadline: {after: 2s}");
        let p = Plan::of(Some(&abs), &routed(Some(0.2)), true, 0.0).unwrap();
        assert_eq!(
            p.deadline,
            Some((Duration::from_secs(2), FailoverReason::AbsoluteDeadline))
        );
    }

    #[test]
    fn racing_on_ttfa_scales_the_deadline_by_the_predicted_answer() {
        let r = route(", race_on: ttfa, first_token_deadline: {factor: 2, floor: 100ms}");
        assert_eq!(r.race_on, RaceOn::Ttfa);
        let mut at = routed(Some(0.2));
        at.chosen.tpot_model = Some(pronto_core::predict::TpotCoefficients {
            base_s: 0.01,
            s_per_seq: 0.0,
            samples: 10,
            ..Default::default()
        });
        // 0.2 s + 400 × 10 ms = 4.2 s predicted to the answer, × 2.
        let d = Plan::of(Some(&r), &at, true, 400.0)
            .unwrap()
            .deadline
            .unwrap()
            .0;
        assert!((d.as_secs_f64() - 8.4).abs() < 1e-9, "{d:?}");
        // Nothing expected before the answer: the TTFT's.
        let d = Plan::of(Some(&r), &at, true, 0.0)
            .unwrap()
            .deadline
            .unwrap()
            .0;
        assert!((d.as_secs_f64() - 0.4).abs() < 1e-9, "{d:?}");
        // Reasoning expected but no TPOT predicted: the floor, not a TTFT-sized deadline.
        let d = Plan::of(Some(&r), &routed(Some(0.2)), true, 400.0)
            .unwrap()
            .deadline
            .unwrap()
            .0;
        assert_eq!(d, Duration::from_millis(100));
        // race_on: ttft ignores the reasoning.
        let t = route(", first_token_deadline: {factor: 2, floor: 100ms}");
        let d = Plan::of(Some(&t), &at, true, 400.0)
            .unwrap()
            .deadline
            .unwrap()
            .0;
        assert!((d.as_secs_f64() - 0.4).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn the_hedge_budget_is_a_token_bucket() {
        let b = HedgeBudgets::default();
        let r: Arc<str> = Arc::from("chat");
        assert!(!b.take("chat"), "no credit before a request");
        // The first request starts the bucket with one hedge.
        b.earn(&r, 0.1);
        assert!(b.take("chat"));
        assert!(!b.take("chat"));
        // Ten requests at 10 % earn one more.
        for _ in 0..10 {
            b.earn(&r, 0.1);
        }
        assert!(b.take("chat"));
        assert!(!b.take("chat"));
        // Credit is capped: a quiet route cannot bank a burst beyond HEDGE_BURST.
        for _ in 0..1000 {
            b.earn(&r, 1.0);
        }
        let burst = (0..100).filter(|_| b.take("chat")).count();
        assert_eq!(burst, HEDGE_BURST as usize);
        assert!(!b.take("other"));
    }
}
