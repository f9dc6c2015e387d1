//! One run of the evaluator, driven event by event on the virtual clock ([`Run`]): arrivals,
//! routing and admission, engine steps, first tokens and finishes, crashes, scrapes on the
//! gateway's timer and collision repair, in the order the clock gives them. The entry points
//! and the run's settings are the parent module's; the report is [`super::report`]'s.

use super::*;

/// A routing decision: the backend, the policy's predicted TTFT and reason (none from the
/// oracle), and the view of the backend it was made on.
pub(super) type Choice = (
    usize,
    Option<f64>,
    Option<pronto_core::routing::Reason>,
    BackendView,
);

/// How the gateway parses a request of the run: its features, with the run's objectives.
pub(super) struct Parse<'a> {
    model: &'a str,
    pub(super) slo: SloTargets,
    objective: EvalObjective,
    /// How long the model reasons before answering, learned as the gateway learns it.
    reasoning: ReasoningLengths,
}

impl Parse<'_> {
    /// Request `r` (prompt `ids`) as the gateway parses it, with the run's objectives.
    fn features(&self, ids: &[u32], r: &TraceRequest) -> RequestFeatures {
        let mut f = features_of(self.model, ids, r);
        f.slo = self.slo;
        if self.objective == EvalObjective::Ttfa {
            f.objective = Objective::Ttfa {
                reasoning_tokens: self.reasoning.expected(None),
            };
        }
        f
    }
}

/// One run of [`evaluate_crashing`]: the engines, the routers and what the run tallies,
/// driven event by event on the virtual clock.
pub(super) struct Run<'a> {
    pub(super) fleet: &'a [SimBackend],
    pub(super) reqs: &'a [TraceRequest],
    pub(super) policy: &'a str,
    pub(super) rep: Replication,
    pub(super) parse: Parse<'a>,
    /// SLO admission: what a miss does, and the TTFT objective it is checked against.
    pub(super) admission: Option<(pronto_core::admission::OnMiss, f64)>,
    pub(super) chooser: Chooser,
    /// `+exact`: each engine publishes its KV events, each router's exact index applies them.
    pub(super) exact: bool,
    pub(super) base: Instant,
    pub(super) router: Replicas,
    pub(super) backends: Vec<Backend>,
    /// Each request's booking and prediction inputs, while it is in flight.
    pub(super) dispatched: Vec<Option<Tracked>>,
    /// Arrived, not yet routed (ids), and the head's prompt ids and features.
    pub(super) queue: VecDeque<u64>,
    pub(super) head: Option<(u64, Vec<u32>, RequestFeatures)>,
    /// The time of the event in hand, virtual seconds.
    pub(super) clock: f64,
    /// Per backend, the KV-event publisher's sequence number.
    pub(super) kv_seq: Vec<u64>,
    pub(super) tracks: Vec<Track>,
    pub(super) per_backend: Vec<u64>,
    /// The next request of the trace to arrive.
    pub(super) next: usize,
    pub(super) scrapes: Scrapes,
    pub(super) race: race::Races,
    pub(super) repair: Option<repair::Repair>,
    pub(super) crashes: crash::Crashes,
    /// The oracle's buffer: each backend's reasoning length for the head.
    pub(super) oracle_thinking: Vec<u32>,
    pub(super) tally: report::Tally,
}

/// Everything of `$run` a race, a crash or a repair touches ([`race::World`]), borrowed field
/// by field so that the rest of the run stays free.
macro_rules! world {
    ($run:ident) => {
        race::World {
            router: &mut $run.router,
            backends: &mut $run.backends,
            tracks: &mut $run.tracks,
            dispatched: &mut $run.dispatched,
            per_backend: &mut $run.per_backend,
            fleet: $run.fleet,
            chooser: &$run.chooser,
            base: $run.base,
        }
    };
}

impl<'a> Run<'a> {
    /// A fresh fleet and router for `reqs` under `policy` (see [`evaluate_crashing`]).
    pub(super) fn new(
        fleet: &'a [SimBackend],
        model: &'a str,
        reqs: &'a [TraceRequest],
        policy: &'a str,
        rep: Replication,
        route: &RouteSettings,
        plan: &CrashPlan,
    ) -> anyhow::Result<Run<'a>> {
        let RouteSettings {
            ref slo,
            objective,
            ref races,
            admission,
        } = *route;
        // SLO admission applies with a TTFT objective, as on a route with `ttft_slo`.
        let admission = admission.zip(slo.ttft_s);
        anyhow::ensure!(!fleet.is_empty(), "the fleet has no backends");
        let chooser = Chooser::of(policy)?;
        let names: Vec<&str> = fleet.iter().map(|b| b.name.as_str()).collect();
        let capacities: Vec<Option<u64>> = fleet
            .iter()
            .map(|b| Some((b.config.num_kv_blocks * b.config.block_size) as u64))
            .collect();
        // Each TTFT model starts from its engine's profile prior (see the module docs).
        let priors: Vec<Coefficients> = fleet
            .iter()
            .map(|b| b.config.profile.router_prior().coefficients())
            .collect();
        let base = Instant::now();
        let exact = matches!(chooser, Chooser::Policy(_, true));
        let block_sizes: Vec<usize> = fleet.iter().map(|b| b.config.block_size).collect();
        let mut router = Replicas::new(
            &names,
            &capacities,
            &priors,
            base,
            rep,
            exact.then_some(&block_sizes[..]),
        );
        router.set_stall_rule(races.stall);
        let backends: Vec<Backend> = fleet
            .iter()
            .map(|b| {
                let mut engine = Engine::new(b.config.clone());
                if exact {
                    engine.enable_kv_events();
                }
                Backend {
                    engine,
                    busy_until: None,
                    pending: Vec::new(),
                    wedge: b.wedge,
                }
            })
            .collect();
        let race = race::Races::new(*races, fleet, matches!(chooser, Chooser::Policy(..)));
        let repair = repair::Repair::new(&rep, &chooser, races, fleet)?;
        let mut faults = plan.faults.clone();
        faults.resize(fleet.len(), None);
        let crashes = crash::Crashes::new(faults, plan.migration);
        anyhow::ensure!(
            !crashes.any()
                || (matches!(chooser, Chooser::Policy(..))
                    && *races == RaceConfig::default()
                    && rep.replicas <= 1),
            "{policy}: crash faults are modelled for one router running a gateway policy, without \
             first-token races (not the oracle)"
        );
        if repair.is_some() {
            router.collect_collisions();
        }
        Ok(Run {
            fleet,
            reqs,
            policy,
            rep,
            parse: Parse {
                model,
                slo: *slo,
                objective,
                reasoning: ReasoningLengths::default(),
            },
            admission,
            chooser,
            exact,
            base,
            router,
            backends,
            dispatched: (0..reqs.len()).map(|_| None).collect(),
            queue: VecDeque::new(),
            head: None,
            clock: 0.0,
            kv_seq: vec![0; fleet.len()],
            tracks: Vec::with_capacity(reqs.len()),
            per_backend: vec![0; fleet.len()],
            next: 0,
            scrapes: Scrapes::new(fleet.len()),
            race,
            repair,
            crashes,
            oracle_thinking: Vec::new(),
            tally: report::Tally::new(reqs.len()),
        })
    }

    /// Every event of the run in time order, each followed by the routing of the gateway's
    /// queue, until nothing is left to happen.
    pub(super) fn drive(&mut self) {
        loop {
            let step_end = self.next_step_end();
            let arrival = self.reqs.get(self.next).map(|r| r.arrival_s);
            // A crash due before the next event (and while work remains) happens first.
            let due = self.crashes.next_at().filter(|&(c, _)| {
                let work = step_end.is_some() || arrival.is_some();
                work && step_end.is_none_or(|s| c <= s.0) && arrival.is_none_or(|a| c <= a)
            });
            if let Some((c, b)) = due {
                self.crash(b, c);
                continue;
            }
            match (step_end, arrival) {
                (None, None) => break,
                (Some((t, b, raced)), a) if a.is_none_or(|a| t <= a) => self.step_end(b, t, raced),
                (_, Some(t)) => self.arrive(t),
                (Some(_), None) => unreachable!("handled by the step-end arm"),
            }
            self.route_queue();
        }
    }

    /// The next step end, `(time, backend, raced)`: the earliest engine step to end, or a held
    /// event or a race trigger (`raced`) due before it — after the step ends of its instant.
    fn next_step_end(&self) -> Option<(f64, usize, bool)> {
        let step_end = self
            .backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.busy_until.map(|t| (t, i, false)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        match self.race.next_at() {
            Some((t, b)) if step_end.is_none_or(|s| t < s.0) => Some((t, b, true)),
            _ => step_end,
        }
    }

    /// Backend `b` crashes at `c` ([`crash::Crashes::crash`]).
    fn crash(&mut self, b: usize, c: f64) {
        self.clock = c;
        self.scrapes
            .due(&mut self.router, &self.backends, self.base, c);
        let (reqs, model) = (self.reqs, self.parse.model);
        self.crashes.crash(b, c, reqs, model, &mut world!(self));
    }

    /// Backend `b`'s step ended at `t` (`raced`: a held event or a race trigger is due then):
    /// its events are delivered, and its next step starts.
    fn step_end(&mut self, b: usize, t: f64, raced: bool) {
        self.clock = t;
        self.router.deliver_until(t);
        self.scrapes
            .due(&mut self.router, &self.backends, self.base, t);
        let mut w = world!(self);
        let mut events = match raced {
            true => self.race.fire(t, &mut w),
            false => std::mem::take(&mut w.backends[b].pending),
        };
        self.race.admit(b, t, &mut events, &mut w);
        for ev in events {
            self.on_event(b, t, ev);
        }
        if !raced {
            self.publish_kv_events(b, t);
            start_step(&mut self.backends[b], t);
        }
        // After the step's events: a first token that arrived at `t` is not undone.
        self.repair(t);
    }

    /// One event of backend `b`'s engine, delivered at `t`.
    fn on_event(&mut self, b: usize, t: f64, ev: EngineEvent) {
        match ev {
            EngineEvent::FirstToken { id, .. } if self.crashes.is_continuation(id) => {
                // A migrated stream's continuation: one more token for the client, the end of
                // its booking's prefill for the router.
                let tr = &mut self.tracks[id as usize];
                tr.produced += 1;
                if let Some(d) = self.dispatched[id as usize].as_mut() {
                    self.router.on_first_token(d, b, t - tr.dispatched_s, t);
                }
            }
            EngineEvent::FirstToken {
                id, cached_tokens, ..
            } => {
                let tr = &mut self.tracks[id as usize];
                debug_assert!(tr.first_token_s.is_none(), "request {id}: two first tokens");
                tr.first_token_s = Some(t);
                tr.cached_tokens = cached_tokens;
                self.tally.ttft.push(t - tr.arrival_s);
                tr.produced = 1;
                if tr.reasoning_tokens == 0 {
                    tr.first_answer_s = Some(t);
                    self.tally.ttfa.push(t - tr.arrival_s);
                }
                self.tally.hit_tokens += u64::from(cached_tokens);
                self.tally.prompt_tokens += u64::from(tr.prompt_tokens);
                self.router.on_progress(b, t);
                if let Some(d) = self.dispatched[id as usize].as_mut() {
                    self.router.on_first_token(d, b, t - tr.dispatched_s, t);
                }
            }
            EngineEvent::Token { id } => {
                self.router.on_progress(b, t);
                let tr = &mut self.tracks[id as usize];
                tr.produced += 1;
                // Token number reasoning + 1 is the first of the answer.
                if tr.produced == tr.reasoning_tokens + 1 {
                    tr.first_answer_s = Some(t);
                    self.tally.ttfa.push(t - tr.arrival_s);
                }
            }
            EngineEvent::Finished { id, output_tokens } => self.finished(b, t, id, output_tokens),
        }
    }

    /// Request `id` finished on backend `b` at `t` with `output_tokens` (0: rejected).
    fn finished(&mut self, b: usize, t: f64, id: u64, output_tokens: u32) {
        let tr = &mut self.tracks[id as usize];
        // A continuation's output comes after what was relayed before it.
        let output_tokens = match self.crashes.is_continuation(id) {
            true if output_tokens > 0 => tr.produced,
            _ => output_tokens,
        };
        tr.tpot_s = match tr.first_token_s {
            Some(f) if output_tokens >= 2 => Some((t - f) / f64::from(output_tokens - 1)),
            _ => None,
        };
        tr.completed = output_tokens > 0;
        if tr.completed {
            self.parse.reasoning.observe(None, tr.reasoning_tokens);
        }
        let (tr, tpot) = (*tr, tr.tpot_s);
        if let Some(d) = self.dispatched[id as usize].take() {
            self.router.on_finish(d, b, tpot, t);
        }
        if output_tokens == 0 {
            self.tally.rejected += 1;
        } else {
            self.tally.e2e.push(t - tr.arrival_s);
            self.tally.last_finish = self.tally.last_finish.max(t);
        }
    }

    /// The step of backend `b` that ended at `t` published its KV events (a live engine sends
    /// them when the step ends); with `+exact` the routers' exact indexes apply them now.
    fn publish_kv_events(&mut self, b: usize, t: f64) {
        if !self.exact {
            return;
        }
        let events = self.backends[b].engine.take_kv_events();
        if !events.is_empty() {
            self.kv_seq[b] += 1;
            let batch = pronto_core::kv_index::EventBatch {
                seq: self.kv_seq[b],
                ts: t,
                events,
                dp_rank: None,
            };
            self.router.apply_kv_events(b, &batch);
        }
    }

    /// Collision repair, when on, of what the messages delivered by `t` reveal.
    fn repair(&mut self, t: f64) {
        if let Some(rp) = self.repair.as_mut() {
            let parse = &self.parse;
            let features_for = |ids: &[u32], r: &TraceRequest| parse.features(ids, r);
            rp.run(&mut world!(self), self.reqs, &features_for, t);
        }
    }

    /// The next request of the trace arrives at `t` and joins the gateway's queue.
    fn arrive(&mut self, t: f64) {
        self.clock = t;
        self.router.deliver_until(t);
        self.repair(t);
        self.scrapes
            .due(&mut self.router, &self.backends, self.base, t);
        let r = &self.reqs[self.next];
        self.tracks.push(Track {
            arrival_s: t,
            dispatched_s: t,
            backend: usize::MAX,
            prompt_tokens: r.input_tokens,
            first_token_s: None,
            reasoning_tokens: 0,
            produced: 0,
            first_answer_s: None,
            predicted_ttft_s: None,
            reason: None,
            cached_tokens: 0,
            output_tokens: r.output_tokens,
            tpot_s: None,
            completed: false,
        });
        self.queue.push_back(self.next as u64);
        self.next += 1;
    }

    /// The gateway's queue, head first: every request is routed at once, unless SLO admission
    /// holds the head back (and the rest behind it).
    fn route_queue(&mut self) {
        while let Some(&id) = self.queue.front() {
            let i = id as usize;
            self.parse_head(id);
            let t = self.tracks[i].arrival_s.max(self.clock);
            let replica = self.router.pick(i);
            let chosen = self.choose(id, replica, t);
            let Some(chosen) = self.admit(chosen, i, t) else {
                break;
            };
            self.queue.pop_front();
            self.race.earn();
            let (_, ids, features) = self.head.take().expect("parsed above");
            match chosen {
                Some(c) => self.dispatch(id, replica, c, ids, features, t),
                None => self.tally.shed += 1,
            }
        }
    }

    /// The queue's head `id`, parsed once (a head that waits keeps its parse).
    fn parse_head(&mut self, id: u64) {
        if self.head.as_ref().is_none_or(|h| h.0 != id) {
            let r = &self.reqs[id as usize];
            let mut v = Vec::new();
            r.prompt_ids(id, &mut v);
            let f = self.parse.features(&v, r);
            self.head = Some((id, v, f));
        }
    }

    /// Where the head `id` goes from replica `replica` at `t`, by the policy (the gateway's
    /// decision path) or the oracle; `None`: no backend is eligible.
    fn choose(&mut self, id: u64, replica: usize, t: f64) -> Option<Choice> {
        let r = &self.reqs[id as usize];
        let (_, ids, features) = self.head.as_ref().expect("parsed by parse_head");
        let now = self.base + Duration::from_secs_f64(t);
        let residency = match &self.chooser {
            Chooser::Policy(p, _) => p.limits_prefix_credit_to_residency(),
            Chooser::Oracle => true,
        };
        let down = self.crashes.down_at(t);
        let views = match down.is_empty() {
            true => self.router.router(replica).views(features, now, residency),
            false => self
                .router
                .views_excluding(replica, features, t, residency, &down),
        };
        match &self.chooser {
            Chooser::Oracle => {
                // With the TTFA objective the oracle times the first answer token.
                let thinking = (self.parse.objective == EvalObjective::Ttfa).then(|| {
                    self.oracle_thinking.clear();
                    let per = self
                        .fleet
                        .iter()
                        .map(|f| f.reasoning.map_or(0, |c| c.tokens_for(ids)));
                    self.oracle_thinking.extend(per);
                    &self.oracle_thinking[..]
                });
                let b = oracle_pick(&self.backends, ids, id, r, t, thinking);
                Some((b, None, None, views[b]))
            }
            Chooser::Policy(p, _) => pronto_core::routing::decide(&**p, features, views, now)
                .ok()
                .map(|d| (d.index, d.predicted_ttft_s, Some(d.reason), views[d.index])),
        }
    }

    /// SLO admission of request `i`'s `chosen` at `t`, by the gateway's rules: the queue is
    /// first-come first-served (one class), so nothing waits ahead of its head. `None`: the
    /// head waits; `Some(None)`: it is shed.
    fn admit(&self, chosen: Option<Choice>, i: usize, t: f64) -> Option<Option<Choice>> {
        let Some((on, slo_s)) = self.admission else {
            return Some(chosen);
        };
        let decided = chosen.as_ref().map(|c| c.1);
        let missed = pronto_core::admission::miss(false, decided, slo_s);
        let expired = t >= self.tracks[i].arrival_s + slo_s;
        let eligible = chosen.is_some();
        match pronto_core::admission::on_miss(missed.map(|m| m.0), on, expired, eligible) {
            Verdict::Send => Some(chosen),
            Verdict::Wait => None,
            Verdict::Shed(_) | Verdict::Fallback => Some(None),
        }
    }

    /// Send request `id` (prompt `ids`, `features`) where `choice` says, from replica
    /// `replica` at `t`: booked by the router, planned by the races, fed to the engine.
    fn dispatch(
        &mut self,
        id: u64,
        replica: usize,
        choice: Choice,
        mut ids: Vec<u32>,
        mut features: RequestFeatures,
        t: f64,
    ) {
        let (i, r) = (id as usize, &self.reqs[id as usize]);
        let (b, predicted, reason, view) = choice;
        // The served model's reasoning, drawn from the prompt as the live fleet does.
        let thinking = self.fleet[b].reasoning.map_or(0, |c| c.tokens_for(&ids));
        let generated = r.output_tokens.saturating_add(thinking);
        let tr = &mut self.tracks[i];
        (tr.backend, tr.predicted_ttft_s, tr.reason) = (b, predicted, reason);
        tr.reasoning_tokens = thinking;
        tr.dispatched_s = t;
        self.crashes.dispatched(tr.prompt_tokens);
        self.per_backend[b] += 1;
        let booked = self
            .router
            .on_dispatch(replica, b, predicted, &view, &features, t);
        self.dispatched[i] = Some(booked);
        let expected = self.parse.reasoning.expected(None);
        self.race.on_dispatch(
            i, b, replica, predicted, &view, &features, &ids, thinking, expected, t,
        );
        if let Some(rp) = self.repair.as_mut() {
            rp.dispatched(replica, i, t);
        }
        submit(
            &mut self.backends[b],
            id,
            r,
            &mut features,
            &mut ids,
            generated,
            t,
        );
    }
}

/// The gateway's scrapes of the backends' `/metrics` on the virtual clock: backend `i` every
/// [`SCRAPE_INTERVAL_S`] at its own phase, `frac(i × φ⁻¹)` of the interval (a low-discrepancy
/// spread: the gateway's per-backend timers are not aligned with each other or with arrivals).
pub(super) struct Scrapes {
    /// When each backend is next due.
    next: Vec<f64>,
}

impl Scrapes {
    fn new(backends: usize) -> Scrapes {
        let phase = |i: usize| (i as f64 * 0.618_033_988_749_895).fract() * SCRAPE_INTERVAL_S;
        Scrapes {
            next: (0..backends).map(phase).collect(),
        }
    }

    /// Before the events of `t`: each backend due by `t` is scraped once, at its latest due
    /// time — its engine's state has not changed since the last event, so that sample is what
    /// the scrape would have read then, and the earlier ones are superseded.
    fn due(&mut self, router: &mut Replicas, backends: &[Backend], base: Instant, t: f64) {
        for (i, b) in backends.iter().enumerate() {
            let next = self.next[i];
            if next > t {
                continue;
            }
            let at = next + ((t - next) / SCRAPE_INTERVAL_S).floor() * SCRAPE_INTERVAL_S;
            self.next[i] = at + SCRAPE_INTERVAL_S;
            let st = b.engine.stats();
            let load = ScrapedLoad {
                waiting: st.waiting as f64,
                running: st.running as f64,
                kv_usage: st.kv_usage,
            };
            router.on_scrape(i, load, base + Duration::from_secs_f64(at));
        }
    }
}
