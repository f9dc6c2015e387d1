//! Collision repair: the rule for a request routed before a booking it could not see.
//!
//! Replicas hear of each other's dispatches a sync delay late ([`super::Unseen`]). Two
//! requests routed by different replicas within that delay can both pick the backend that
//! looked best, and the second then queues behind the first while another backend idles —
//! the one loss of a replicated router a single router does not have. When the late booking
//! arrives, the replica that routed the second request can take its decision again:
//! [`relocation`] says whether the request, still waiting for its first token, should go
//! elsewhere.
//!
//! The rule: the views are built without the request's own prefix record (as if it had not
//! been sent) and with the late booking; its own booking is taken out of the view of the
//! backend it is on (`unbook`); the policy decides over them; the request moves when the
//! decision is another backend and the policy's prediction for staying exceeds that
//! decision's by more than `margin` (a fraction: 0.2 is 20 %). The margin pays for what a
//! move costs and a prediction cannot see: the prefill already done where it is, and the
//! error of two predictions.
//!
//! Pure and synchronous. [`reconsider`] is the whole sequence — take the prefix record back,
//! build the views, apply the rule, record again if the request stays — and both drivers call
//! it: the gateway for a request waiting for its first token when its replica hears of
//! another's dispatch, sent before that request, to the same backend
//! (`cluster.collision_repair`, `src/proxy/repair.rs` in the `pronto` crate); the offline
//! evaluator for R simulated replicas (`pronto evaluate --collision-repair`). What follows a
//! move (dropping the attempt, releasing its booking, routing or dispatching it again) is each
//! driver's own: a socket closed in one, an engine abort in the other.

use std::time::Instant;

use crate::ids::BackendId;
use crate::load::RequestLoad;
use crate::predict::TtftInputs;
use crate::request::RequestFeatures;
use crate::routing::views::{self, PoolRouting, RoutingBackend, Scratch};
use crate::routing::{decide, BackendView, Decision, Policy};

/// The margin both apply unless told otherwise: a move must promise a first token 20 %
/// sooner.
pub const DEFAULT_MARGIN: f64 = 0.2;

/// Moves a request makes at most: each follows a collision heard within a sync delay of its
/// dispatch, so a few cover what a burst of late bookings can do, and no request bounces on.
pub const MAX_MOVES: u32 = 3;

/// `view` without one booking of `load` still in prefill: what the ledger would show had
/// it not been booked (its KV allocation rate keeps it: a rate cannot be taken back).
pub(crate) fn unbook(view: &mut BackendView, load: RequestLoad) {
    view.inflight = view.inflight.saturating_sub(1);
    view.outstanding_prefill_tokens = view
        .outstanding_prefill_tokens
        .saturating_sub(u64::from(load.prefill_tokens));
    view.outstanding_prefill_sq = (view.outstanding_prefill_sq - load.prefill_sq()).max(0.0);
    view.kv_reserved_tokens = view.kv_reserved_tokens.saturating_sub(load.kv_tokens);
}

/// What [`relocation`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Relocation {
    /// Move: the policy's decision over the views, another backend.
    Move(Decision),
    /// Stay; the request's TTFT model observation should now use these inputs: its backend's
    /// load with the late booking, which its dispatch could not see. The first token it
    /// waits for is the late booking's prefill plus its own, and a model taught that on the
    /// dispatch's inputs would learn a queue cost too high.
    Stay(TtftInputs),
}

/// Where a request booked on `views[stay]` with `own` (still in prefill) should go (see the
/// module docs). `views` hold its booking but not its prefix record.
pub fn relocation(
    policy: &dyn Policy,
    features: &RequestFeatures,
    views: &[BackendView],
    stay: usize,
    own: RequestLoad,
    now: Instant,
    margin: f64,
) -> Relocation {
    // Rare (a late booking on the request's backend): a copy, so the caller's views stay
    // what the ledger says.
    let mut views = views.to_vec();
    unbook(&mut views[stay], own);
    let staying = Relocation::Stay(views[stay].ttft_inputs(features));
    let Some(moved) = decide(policy, features, &views, now)
        .ok()
        .filter(|d| d.index != stay)
    else {
        return staying;
    };
    let Some(there) = moved.predicted_ttft_s else {
        return staying;
    };
    // The policy's own prediction for `stay`: its decision with no other backend to choose.
    let here = decide(policy, features, std::slice::from_ref(&views[stay]), now)
        .ok()
        .and_then(|d| d.predicted_ttft_s);
    match here {
        Some(here) if here > there * (1.0 + margin) => Relocation::Move(moved),
        _ => staying,
    }
}

/// A request being reconsidered: where it is booked and what its dispatch recorded.
#[derive(Debug, Clone, Copy)]
pub struct Booked<'a> {
    /// Its features (prompt blocks, lengths).
    pub features: &'a RequestFeatures,
    /// Its backend's position in the pool.
    pub backend: usize,
    /// Its booking's load, still in prefill.
    pub own: RequestLoad,
    /// Leading blocks its backend held in the index before its dispatch
    /// ([`views::Dispatched::held_blocks`]): the record past them is its own.
    pub held_blocks: u32,
    /// Backends the request may not go to (already tried, or not routable).
    pub tried: &'a [BackendId],
}

/// Take the decision for `r` again at `now` (see the module docs): its prefix record taken
/// back, views built into `scratch` without it (its booking still in them: [`relocation`]
/// takes it out), the rule applied with `margin`. A request that stays has its record put
/// back; one that moves has not (the caller releases its booking and sends it on).
pub fn reconsider<B: RoutingBackend>(
    pool: &PoolRouting<'_, B>,
    scratch: &mut Scratch,
    policy: &dyn Policy,
    r: Booked<'_>,
    now: Instant,
    margin: f64,
) -> Relocation {
    views::undo_record(pool, r.backend, r.features, r.held_blocks);
    let residency = policy.limits_prefix_credit_to_residency();
    let built = views::build(pool, r.features, now, residency, r.tried, scratch);
    let out = relocation(policy, r.features, built, r.backend, r.own, now, margin);
    if matches!(out, Relocation::Stay(_)) {
        views::redo_record(pool, r.backend, r.features, now);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::{Coefficients, Quality};
    use crate::routing::{PolicyKind, TtftModelView};

    /// A backend with `queued` prefill tokens booked ahead, 0.1 ms per token, a trusted model.
    fn view(name: &str, queued: u64) -> BackendView {
        let mut v = BackendView::idle(name);
        v.outstanding_prefill_tokens = queued;
        v.inflight = u32::from(queued > 0);
        v.ttft_model = Some(TtftModelView {
            coefficients: Coefficients {
                base_s: 0.02,
                s_per_token: 1e-4,
                s_per_token_sq: 0.0,
                s_per_decode: 0.0,
                s_per_waiting: 0.0,
            },
            quality: Quality {
                samples: 100,
                rel_error: 0.05,
            },
            since_last_observation_s: 1.0,
        });
        v
    }

    #[test]
    fn a_request_behind_a_late_booking_moves_only_past_the_margin() {
        let policy = PolicyKind::parse("predicted_ttft").unwrap().build();
        let now = Instant::now();
        let mut f = RequestFeatures::synthetic("m", String::new(), Some(16));
        f.prompt_tokens = 2_000;
        // The request's own booking: its 2,000 prompt tokens in prefill.
        let own = RequestLoad {
            prefill_tokens: 2_000,
            kv_tokens: 2_016,
        };
        let mine = |v: BackendView| {
            let mut v = v;
            v.inflight += 1;
            v.outstanding_prefill_tokens += 2_000;
            v.outstanding_prefill_sq += 4.0;
            v.kv_reserved_tokens += 2_016;
            v
        };
        // Backend a got a 30k-token prefill the request could not see; b is idle.
        let behind = [mine(view("a", 30_000)), view("b", 0)];
        let Relocation::Move(d) = relocation(&*policy, &f, &behind, 0, own, now, 0.2) else {
            panic!("moves");
        };
        assert_eq!(d.index, 1);
        assert!(d.predicted_ttft_s.is_some());
        // Already where the decision goes: it stays.
        let at_b = [view("a", 30_000), mine(view("b", 0))];
        let Relocation::Stay(inputs) = relocation(&*policy, &f, &at_b, 1, own, now, 0.2) else {
            panic!("stays");
        };
        // What it waits behind now: nothing but its own prompt, not counted as queued.
        assert_eq!(inputs, view("b", 0).ttft_inputs(&f));
        // 500 tokens ahead: staying predicts 0.27 s against 0.22 s, 23 % more. A 20 % margin
        // moves it, a 30 % margin does not. Its own booking is not counted against staying:
        // with it, staying would look 2,000 tokens worse.
        let close = [mine(view("a", 500)), view("b", 0)];
        let moves = |views: &[BackendView], margin| {
            matches!(
                relocation(&*policy, &f, views, 0, own, now, margin),
                Relocation::Move(_)
            )
        };
        assert!(moves(&close, 0.2));
        assert!(!moves(&close, 0.3));
        // Staying, it learns it waited behind the 500 tokens heard late.
        let Relocation::Stay(inputs) = relocation(&*policy, &f, &close, 0, own, now, 0.3) else {
            panic!("stays");
        };
        assert_eq!(inputs.queued_prefill_tokens, 500.0);
        let level = [mine(view("a", 0)), view("b", 0)];
        assert!(!moves(&level, 0.0));
    }

    /// The sequence through the view builder: the request's prefix record is taken back
    /// while it is reconsidered, put back when it stays and left out when it moves.
    #[test]
    fn reconsidering_restores_the_record_only_when_the_request_stays() {
        use crate::affinity::{IndexConfig, PrefixIndex};
        use crate::ids::BackendId;
        use crate::routing::views::test_support::backend_with;
        use crate::routing::views::{PoolRouting, Scratch};

        let t0 = Instant::now();
        let coefficients = view("x", 0).ttft_model.map(|m| m.coefficients).unwrap();
        let backends = [0, 1].map(|i| backend_with(i, t0, coefficients));
        let index = PrefixIndex::new(IndexConfig {
            max_backends: 2,
            ..IndexConfig::default()
        });
        let slots = [0, 1];
        let pool = PoolRouting {
            backends: &backends,
            slots: &slots,
            index: &index,
            token_ratio: 1.0,
            stall: None,
        };
        let policy = PolicyKind::parse("predicted_ttft").unwrap().build();
        let f = RequestFeatures::synthetic("m", "x".repeat(8_000), Some(16));
        let own = RequestLoad {
            prefill_tokens: f.prompt_tokens,
            kv_tokens: u64::from(f.prompt_tokens) + 16,
        };
        let held = |b: usize| {
            let mut m = [0; 2];
            index.match_lengths(&f.block_hashes, t0, &mut m);
            m[b]
        };
        // Dispatched to backend 0 (booked, recorded), then a 30k-token prefill heard late.
        let mut mine = backends[0].0.ledger.book(own, t0, true, None);
        index.record(0, &f.block_hashes, t0);
        let late = RequestLoad {
            prefill_tokens: 30_000,
            kv_tokens: 30_000,
        };
        let mut other = backends[0].0.ledger.book(late, t0, true, None);
        let blocks = f.block_hashes.len() as u32;
        assert!(blocks > 0 && held(0) == blocks);
        let booked = Booked {
            features: &f,
            backend: 0,
            own,
            held_blocks: 0,
            tried: &[],
        };
        let mut scratch = Scratch::default();
        // With backend 1 excluded there is nowhere to go: it stays, its record put back.
        let only = Booked {
            tried: &[BackendId(1)],
            ..booked
        };
        let out = reconsider(&pool, &mut scratch, &*policy, only, t0, DEFAULT_MARGIN);
        assert!(matches!(out, Relocation::Stay(_)), "{out:?}");
        assert_eq!(held(0), blocks);
        // With backend 1 idle it moves there, and backend 0 no longer claims its prefix.
        let out = reconsider(&pool, &mut scratch, &*policy, booked, t0, DEFAULT_MARGIN);
        assert!(
            matches!(out, Relocation::Move(d) if d.index == 1),
            "{out:?}"
        );
        assert_eq!(held(0), 0);
        backends[0].0.ledger.release(&mut mine);
        backends[0].0.ledger.release(&mut other);
    }

    #[test]
    fn unbooking_takes_back_what_the_ledger_booked() {
        use crate::load::{Ledger, Plain};
        let t0 = Instant::now();
        let ledger = Ledger::<Plain>::new(t0);
        let other = RequestLoad {
            prefill_tokens: 1_234,
            kv_tokens: 1_500,
        };
        let own = RequestLoad {
            prefill_tokens: 2_345,
            kv_tokens: 2_600,
        };
        let mut a = ledger.book(other, t0, true, None);
        let before = ledger.view(t0);
        let mut b = ledger.book(own, t0, true, None);
        let mut v = BackendView::idle("x");
        let with = ledger.view(t0);
        (v.inflight, v.outstanding_prefill_tokens) =
            (with.inflight, with.outstanding_prefill_tokens);
        (v.outstanding_prefill_sq, v.kv_reserved_tokens) =
            (with.outstanding_prefill_sq, with.kv_reserved_tokens);
        unbook(&mut v, own);
        assert_eq!(v.inflight, before.inflight);
        assert_eq!(
            v.outstanding_prefill_tokens,
            before.outstanding_prefill_tokens
        );
        assert!((v.outstanding_prefill_sq - before.outstanding_prefill_sq).abs() < 1e-12);
        assert_eq!(v.kv_reserved_tokens, before.kv_reserved_tokens);
        ledger.release(&mut a);
        ledger.release(&mut b);
    }
}
