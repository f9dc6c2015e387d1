//! Backends crashing mid-stream, and the gateway's stream migration, on the virtual clock.
//!
//! ## The crash fault
//! A fleet file backend's `faults: {crash_after: A, crash_every: E, restart_after: R}` crashes
//! it at virtual time `A`, then every `E`: as in the live fleet (`fleet_faults`), every request
//! in its engine is cut off (the step in flight delivers nothing), its prefix cache is cleared,
//! and it takes no request for `R` (the gateway routes around a backend that answers 503 and
//! fails its health checks; here the router simply does not see it while it is down).
//!
//! ## What the gateway does with the cut requests
//! - Before its first token, a request is retried on another backend (nothing reached the
//!   client): its whole prompt is prefilled again (`retries`).
//! - After its first token, with migration (`--migration N`, the gateway's
//!   `migration.max_attempts`, default 1), it is continued on another backend: a new request
//!   whose prompt is the original prompt followed by the tokens generated so far, generating
//!   the rest — it pays a new prefill of prompt + generated on that backend (less whatever of
//!   it the backend has cached), routed by the policy with the crashed backend excluded, its
//!   prefix blocks those of the original prompt. Its first token is not a first token (the
//!   client's TTFT is the original's) but ends the continuation's booking prefill as the
//!   gateway's does. A model that reasons is not continued (the gateway refuses to continue a
//!   stream that relayed reasoning), nor a request whose continuations are spent.
//! - Otherwise its stream ends with an error event (`errors`): it does not complete.
//!
//! Counted ([`CrashCounts`]): crashes, requests cut, retries, continuations, client-visible
//! errors, and the prefill paid again — the continuations' prompt tokens (`reprefill_tokens`:
//! prompt + generated) and the retries' — against the prompt tokens of the trace's requests.
//! The oracle and first-token races are not combined with crashes (the run is refused).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::chooser::Chooser;
use super::feed::start_step;
use super::race::World;
use crate::engine::SimRequest;
use crate::fleet_config::FaultConfig;
use crate::workload::TraceRequest;
use pronto_core::ids::BackendId;
use pronto_core::request::RequestFeatures;
use pronto_core::tokens::{block_hashes, mix64, BLOCK_TOKENS};

/// A backend's crash schedule (its fleet file `faults:`), virtual seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrashFault {
    /// The first crash.
    pub first_s: f64,
    /// Then one every this long.
    pub every_s: Option<f64>,
    /// Down for this long after each.
    pub restart_s: f64,
}

impl CrashFault {
    /// The schedule in `faults`; `None` when the backend never crashes.
    pub fn of(faults: &FaultConfig) -> Option<CrashFault> {
        Some(CrashFault {
            first_s: faults.crash_after?.as_secs_f64(),
            every_s: faults.crash_every.map(|d| d.as_secs_f64()),
            restart_s: faults.restart_after.as_secs_f64(),
        })
    }
}

/// Which backends crash when (the fleet file's crash faults, one per backend, `None`: never)
/// and the continuations a stream may be sent (`--migration`; 0: off).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CrashPlan {
    /// Per backend, in fleet order.
    pub faults: Vec<Option<CrashFault>>,
    /// The gateway's `migration.max_attempts`.
    pub migration: u32,
}

impl CrashPlan {
    /// The crash faults of a fleet file, with `migration` continuations per stream.
    pub fn of(fleet: &crate::fleet_config::FleetConfig, migration: u32) -> CrashPlan {
        CrashPlan {
            faults: fleet
                .backends
                .iter()
                .map(|b| CrashFault::of(&b.faults))
                .collect(),
            migration,
        }
    }
}

/// What the crashes of a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CrashCounts {
    /// Backend crashes.
    pub crashes: u64,
    /// Requests in flight on a backend when it crashed.
    pub cut: u64,
    /// Of those, requests retried before their first token.
    pub retries: u64,
    /// Continuations sent (stream migrations).
    pub migrations: u64,
    /// Streams that ended with an error event.
    pub errors: u64,
    /// Prompt tokens of the continuations (the prompt and the tokens generated so far).
    pub reprefill_tokens: u64,
    /// Prompt tokens of the retries.
    pub retry_prompt_tokens: u64,
    /// Prompt tokens of the trace's requests that were dispatched.
    pub prompt_tokens: u64,
}

/// The crashes of one run (see the module docs).
pub(super) struct Crashes {
    faults: Vec<Option<CrashFault>>,
    next: Vec<Option<f64>>,
    down_until: Vec<f64>,
    max_attempts: u32,
    attempts: HashMap<usize, u32>,
    /// Requests whose engine copy is a continuation (its first token is not the request's).
    continued: HashSet<u64>,
    pub counts: CrashCounts,
}

impl Crashes {
    /// The crash schedules of `fleet`'s backends; continuations per request: `max_attempts`.
    pub fn new(faults: Vec<Option<CrashFault>>, max_attempts: u32) -> Crashes {
        let next = faults.iter().map(|f| f.map(|f| f.first_s)).collect();
        Crashes {
            down_until: vec![f64::NEG_INFINITY; faults.len()],
            faults,
            next,
            max_attempts,
            attempts: HashMap::new(),
            continued: HashSet::new(),
            counts: CrashCounts::default(),
        }
    }

    /// Whether any backend crashes.
    pub fn any(&self) -> bool {
        self.faults.iter().any(Option::is_some)
    }

    /// The next crash: its time and backend.
    pub fn next_at(&self) -> Option<(f64, usize)> {
        self.next
            .iter()
            .enumerate()
            .filter_map(|(b, t)| t.map(|t| (t, b)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
    }

    /// The backends down at `t` (not routed to).
    pub fn down_at(&self, t: f64) -> Vec<BackendId> {
        self.down_until
            .iter()
            .enumerate()
            .filter(|&(_, &u)| t < u)
            .map(|(b, _)| BackendId(b as u64))
            .collect()
    }

    /// A request's engine copy is a continuation: its first token is one more token.
    pub fn is_continuation(&self, id: u64) -> bool {
        self.continued.contains(&id)
    }

    /// A request of `prompt_tokens` was dispatched for the first time.
    pub fn dispatched(&mut self, prompt_tokens: u32) {
        self.counts.prompt_tokens += u64::from(prompt_tokens);
    }

    /// Backend `b` crashes at `t`: its requests are cut and retried, continued or lost.
    pub fn crash(
        &mut self,
        b: usize,
        t: f64,
        reqs: &[TraceRequest],
        model: &str,
        w: &mut World<'_>,
    ) {
        let fault = self.faults[b].expect("a crash schedule");
        self.next[b] = fault.every_s.map(|e| t + e);
        self.down_until[b] = t + fault.restart_s;
        self.counts.crashes += 1;
        let cut: Vec<usize> = (0..w.tracks.len())
            .filter(|&i| w.tracks[i].backend == b && w.dispatched[i].is_some())
            .collect();
        for &i in &cut {
            w.backends[b].engine.abort(i as u64);
            if let Some(d) = w.dispatched[i].take() {
                w.router.on_finish(d, b, None, t);
            }
        }
        // The step in flight delivers nothing; the engine restarts cold.
        let backend = &mut w.backends[b];
        backend.busy_until = None;
        backend.pending.clear();
        backend.engine.clear_cache();
        let mut excluded = self.down_at(t);
        if !excluded.contains(&BackendId(b as u64)) {
            excluded.push(BackendId(b as u64));
        }
        for i in cut {
            self.counts.cut += 1;
            let tr = w.tracks[i];
            let started = tr.first_token_s.is_some();
            let spent = self.attempts.get(&i).copied().unwrap_or(0);
            let continuable = tr.reasoning_tokens == 0 && spent < self.max_attempts;
            if started && !continuable {
                self.counts.errors += 1;
                self.continued.remove(&(i as u64));
                continue;
            }
            let produced = if started { tr.produced } else { 0 };
            if started {
                self.attempts.insert(i, spent + 1);
                self.counts.migrations += 1;
                self.counts.reprefill_tokens += u64::from(tr.prompt_tokens + produced);
            } else {
                self.counts.retries += 1;
                self.counts.retry_prompt_tokens += u64::from(tr.prompt_tokens);
            }
            if !self.resend(i, &reqs[i], model, produced, &excluded, t, w) {
                self.counts.errors += u64::from(started);
                self.continued.remove(&(i as u64));
            }
        }
    }

    /// Send request `i` again, `produced` tokens in (0: the request as it was), avoiding
    /// `excluded`; false when no backend takes it.
    #[allow(clippy::too_many_arguments)]
    fn resend(
        &mut self,
        i: usize,
        r: &TraceRequest,
        model: &str,
        produced: u32,
        excluded: &[BackendId],
        t: f64,
        w: &mut World<'_>,
    ) -> bool {
        let Chooser::Policy(policy, _) = w.chooser else {
            return false;
        };
        let mut ids = Vec::new();
        r.prompt_ids(i as u64, &mut ids);
        // The generated tokens, as ids the continuation's prompt carries after the original.
        ids.extend((0..produced).map(|k| (mix64((i as u64) << 20 | u64::from(k)) % 30_000) as u32));
        let remaining = r.output_tokens.saturating_sub(produced);
        let mut features = RequestFeatures::synthetic(model, String::new(), Some(remaining));
        features.prompt_tokens = r.input_tokens + produced;
        features.block_hashes = block_hashes(&ids, BLOCK_TOKENS);
        features.session_key = r.session.map(|s| s.to_string());
        let now = w.base + Duration::from_secs_f64(t);
        let residency = policy.limits_prefix_credit_to_residency();
        let replica = w.router.pick(i);
        let views = w
            .router
            .views_excluding(replica, &features, t, residency, excluded)
            .to_vec();
        let Ok(d) = pronto_core::routing::decide(&**policy, &features, &views, now) else {
            return false;
        };
        let nb = d.index;
        w.per_backend[nb] += 1;
        w.dispatched[i] =
            Some(
                w.router
                    .on_dispatch(replica, nb, d.predicted_ttft_s, &views[nb], &features, t),
            );
        let tr = &mut w.tracks[i];
        (tr.backend, tr.dispatched_s) = (nb, t);
        if produced > 0 {
            self.continued.insert(i as u64);
        }
        let id = i as u64;
        let engine = &mut w.backends[nb].engine;
        if engine.config().block_size == BLOCK_TOKENS {
            let hashes = std::mem::take(&mut features.block_hashes).into();
            engine.add_hashed(id, features.prompt_tokens, hashes, remaining.max(1));
        } else {
            engine.add_request(SimRequest {
                id,
                prompt: ids,
                max_tokens: remaining.max(1),
            });
        }
        if w.backends[nb].busy_until.is_none() {
            start_step(&mut w.backends[nb], t);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::engine::EngineConfig;
    use crate::profile::Profile;
    use crate::workload::{spread_ties, SyntheticWorkload};

    fn fleet() -> Vec<SimBackend> {
        let cfg = EngineConfig::from_profile(Profile::builtin("h100-llama3-8b").unwrap());
        (0..3)
            .map(|i| SimBackend::new(format!("b{i}"), cfg.clone()))
            .collect()
    }

    fn run(migration: u32) -> crate::eval_report::RunReport {
        let fleet = fleet();
        let mut reqs = SyntheticWorkload {
            seed: 3,
            conversations: 40,
            ..SyntheticWorkload::default()
        }
        .generate();
        spread_ties(&mut reqs);
        apply_load(&fleet, &mut reqs, 0.6);
        let crash = CrashFault {
            first_s: 2.0,
            every_s: Some(3.0),
            restart_s: 1.0,
        };
        let plan = CrashPlan {
            faults: vec![Some(crash), None, None],
            migration,
        };
        let rep = crate::eval_replicas::Replication::default();
        evaluate_crashing(
            &fleet,
            "m",
            &reqs,
            "least_inflight",
            rep,
            &Default::default(),
            &plan,
        )
        .unwrap()
    }

    #[test]
    fn migration_loses_no_stream_and_pays_a_new_prefill() {
        let on = run(1);
        let c = on.crashes;
        assert!(c.crashes >= 2 && c.cut > 0, "{c:?}");
        assert!(c.migrations > 0, "{c:?}");
        assert_eq!(c.errors, 0, "{c:?}");
        assert_eq!(on.completed, on.requests, "every stream completes");
        // Each continuation prefills its prompt and the tokens generated so far.
        assert!(
            c.reprefill_tokens > 0 && c.prompt_tokens >= c.reprefill_tokens / 10,
            "{c:?}"
        );
        let off = run(0);
        let c0 = off.crashes;
        assert_eq!(c0.migrations, 0);
        assert!(c0.errors > 0, "{c0:?}");
        assert_eq!(off.completed, off.requests - c0.errors);
        // Deterministic.
        assert_eq!(run(1).crashes, c);
    }
}
