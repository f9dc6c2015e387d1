//! The engine task of one live backend: owns its [`Engine`] and runs it in (scaled) real time.
//!
//! HTTP handlers talk to the task over an unbounded channel of [`Cmd`]s (add a request, abort
//! one, crash); the task never shares the engine and holds no lock across an await. Its loop:
//!
//! 1. Idle (no work): wait for a command; the step clock restarts at the current instant.
//! 2. Apply every queued command, run [`Engine::step`], publish the engine's stats.
//! 3. Advance the step deadline by `duration_s × time_scale × slowdown` and sleep until it
//!    (`sleep_until` on an accumulated deadline, so timer granularity does not make the
//!    simulation drift slower than its time scale; aimed early by the timer's learnt mean
//!    lateness, so a step does not end late on average either: [`super::fleet_timer`]). Commands that arrive meanwhile are applied
//!    at once — an abort frees the request's blocks immediately — and join the next step.
//!    If the task is more than [`LAG_TOLERANCE`] behind its deadline it does not sleep: the
//!    shortfall is added to `sim_lag_seconds_total` and the clock restarts from now.
//! 4. Deliver the step's events: per request, one [`Progress`] message with the tokens this
//!    step produced (first-token details on the first one, `finished` on the last).
//!
//! 5. With KV events on, send the step's cache events to the publisher task.
//!
//! While the `wedged` fault holds ([`super::fleet_faults`]) no step runs: commands are still
//! applied (requests queue, aborts free their blocks), nothing is produced.
//!
//! ## The front end (the profile's `frontend:`, see [`crate::profile::FrontEnd`])
//! With a per-request front-end cost, an added request first queues in a FIFO front end:
//! it reaches the engine at `max(arrival, previous hand-over) + (request_ms +
//! ms_per_prompt_token · n) × scale`, where `arrival` is when the HTTP request came in (the
//! handler's own parsing and tokenising count as front-end time; a hand-over already past is
//! served at once). A hand-over that falls inside a step joins the next one; an idle engine
//! waits for the next hand-over and starts its step at that (virtual) instant, so the
//! timeline is the one `pronto calibrate`'s replay computes. With an output latency every
//! [`Progress`] carries its release instant (the step's end + `latency_ms × scale`); the
//! response side holds it until then. With no front end (every GPU profile) nothing of
//! this runs: requests reach the engine at once and progress is released at once.
//!
//! A request whose [`Progress`] channel closes without `finished` was cut off (crash or fleet
//! shutdown); the response side turns that into a broken connection.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::engine::{Engine, EngineEvent, SimRequest};
use super::fleet_http::BackendShared;
use super::fleet_metrics::Published;
use super::profile::FrontEnd;
use pronto_core::kv_index::KvEvent;

/// Lateness tolerated before it counts as lag (absorbs timer granularity and scheduling jitter).
pub const LAG_TOLERANCE: Duration = Duration::from_millis(5);

/// A command to a backend's engine task.
#[derive(Debug)]
pub(crate) enum Cmd {
    /// Queue a request; its progress goes to `tx`.
    Add {
        /// The request.
        req: SimRequest,
        /// Where its progress is delivered.
        tx: mpsc::UnboundedSender<Progress>,
        /// When the HTTP request arrived: the front end's turn starts there at the earliest, so
        /// the handler's own parsing and tokenising happen inside the simulated front-end time.
        arrived: Instant,
    },
    /// The client went away: drop the request and free its blocks.
    Abort(u64),
    /// Cut every open request off and clear the prefix cache.
    Crash,
}

/// First-token details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FirstInfo {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
}

/// What one step produced for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Set on the step that produced the first token.
    pub first: Option<FirstInfo>,
    /// Output tokens produced by this step.
    pub tokens: u32,
    /// The request finished with this step (its last token is among `tokens`).
    pub finished: bool,
    /// The engine rejected the request (it can never fit in the KV pool).
    pub rejected: bool,
    /// Not to be shown before this instant (the profile's output latency); `None`: at once.
    pub release_at: Option<Instant>,
}

struct Open {
    tx: mpsc::UnboundedSender<Progress>,
    sent: u32,
}

/// The engine task's state.
pub(crate) struct Driver {
    engine: Engine,
    open: HashMap<u64, Open>,
    shared: Arc<BackendShared>,
    published: Published,
    time_scale: f64,
    scratch: HashMap<u64, Progress>,
    kv_events: Option<mpsc::UnboundedSender<Vec<KvEvent>>>,
    frontend: FrontEnd,
    /// Requests in the front end, in hand-over order, with their hand-over instants.
    front: VecDeque<(Instant, SimRequest)>,
    /// When the front end is free for the next request.
    front_free: Instant,
}

impl Driver {
    /// A driver for `engine`, publishing to `shared`'s metrics.
    pub fn new(engine: Engine, shared: Arc<BackendShared>, time_scale: f64) -> Driver {
        let frontend = engine.config().profile.frontend;
        Driver {
            engine,
            frontend,
            front: VecDeque::new(),
            front_free: Instant::now(),
            open: HashMap::new(),
            shared,
            published: Published::default(),
            time_scale,
            scratch: HashMap::new(),
            kv_events: None,
        }
    }

    /// Log the engine's KV-cache events and send them to `tx` after every step.
    pub fn publish_kv_events(&mut self, tx: mpsc::UnboundedSender<Vec<KvEvent>>) {
        self.engine.enable_kv_events();
        self.kv_events = Some(tx);
    }

    fn flush_kv_events(&mut self) {
        if let Some(tx) = &self.kv_events {
            let events = self.engine.take_kv_events();
            if !events.is_empty() {
                let _ = tx.send(events);
            }
        }
    }

    /// Simulated seconds → real time: the time scale and the slowdown fault.
    fn scale(&self) -> f64 {
        self.time_scale * self.shared.faults.slowdown()
    }

    fn apply(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add { req, tx, arrived } => {
                self.open.insert(req.id, Open { tx, sent: 0 });
                let cost = self.frontend.request_seconds(req.prompt.len());
                if cost > 0.0 {
                    let start = self.front_free.max(arrived);
                    let at = start + Duration::from_secs_f64(cost * self.scale());
                    self.front_free = at;
                    self.front.push_back((at, req));
                } else {
                    self.engine.add_request(req);
                }
            }
            Cmd::Abort(id) => {
                if self.open.remove(&id).is_some() {
                    self.front.retain(|(_, r)| r.id != id);
                    self.engine.abort(id);
                    // The engine's stats first: a scrape that sees the abort counted sees the
                    // request gone from the batch too.
                    self.publish();
                    self.shared.metrics.aborted.inc();
                }
            }
            Cmd::Crash => {
                self.front.clear();
                for (id, _) in self.open.drain() {
                    self.engine.abort(id);
                }
                self.engine.clear_cache();
                self.shared.metrics.crashes.inc();
                self.flush_kv_events();
            }
        }
    }

    fn publish(&mut self) {
        let stats = self.engine.stats();
        self.shared.metrics.publish(&stats, &mut self.published);
        *self.shared.stats.lock().expect("stats lock") = stats;
    }

    /// Hand every request whose front-end turn ended by `now` (virtual) to the engine.
    fn admit(&mut self, now: Instant) {
        while self.front.front().is_some_and(|(at, _)| *at <= now) {
            let (_, req) = self.front.pop_front().expect("non-empty");
            self.engine.add_request(req);
        }
    }

    /// Deliver the events of the step that ended at (virtual) `end`.
    fn deliver(&mut self, events: &[EngineEvent], end: Instant) {
        let latency = self.frontend.latency_seconds() * self.scale();
        let release_at = (latency > 0.0).then(|| end + Duration::from_secs_f64(latency));
        let mut batch = std::mem::take(&mut self.scratch);
        for ev in events {
            match *ev {
                EngineEvent::FirstToken {
                    id,
                    cached_tokens,
                    prompt_tokens,
                } => {
                    let p = batch.entry(id).or_default();
                    p.first = Some(FirstInfo {
                        cached_tokens,
                        prompt_tokens,
                    });
                    p.tokens += 1;
                }
                EngineEvent::Token { id } => batch.entry(id).or_default().tokens += 1,
                EngineEvent::Finished { id, output_tokens } => {
                    let p = batch.entry(id).or_default();
                    p.finished = true;
                    p.rejected = output_tokens == 0;
                    let sent = self.open.get(&id).map_or(0, |o| o.sent);
                    // Top up if the engine reports more tokens than it emitted events for.
                    p.tokens = p.tokens.max(output_tokens.saturating_sub(sent));
                }
            }
        }
        for (id, mut p) in batch.drain() {
            p.release_at = release_at;
            let Some(open) = self.open.get_mut(&id) else {
                continue; // aborted or cut off meanwhile
            };
            open.sent += p.tokens;
            // A closed receiver means the client left; its Abort is on the way.
            let _ = open.tx.send(p);
            if p.finished {
                self.open.remove(&id);
            }
        }
        self.scratch = batch;
    }

    /// Run until every command sender is gone.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut deadline = Instant::now();
        loop {
            if !self.engine.has_work() {
                self.publish();
                match self.front.front().map(|(at, _)| *at) {
                    None => {
                        match rx.recv().await {
                            Some(cmd) => self.apply(cmd),
                            None => return,
                        }
                        deadline = Instant::now();
                    }
                    Some(at) => {
                        // Idle until the front end hands the next request over.
                        let sleep = tokio::time::sleep_until(self.shared.timer.aim(at));
                        tokio::pin!(sleep);
                        loop {
                            tokio::select! {
                                _ = &mut sleep => {
                                    self.shared.timer.woke(at, Instant::now());
                                    break;
                                }
                                cmd = rx.recv() => match cmd {
                                    Some(cmd) => self.apply(cmd),
                                    None => return,
                                },
                            }
                        }
                        // A hand-over during the last step waits for its end.
                        deadline = deadline.max(at);
                    }
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => self.apply(cmd),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            if self.shared.faults.is_wedged() {
                // Wedged: no step until it is let go; commands are still applied.
                let mut wedge = self.shared.faults.wedge_changes();
                while self.shared.faults.is_wedged() {
                    tokio::select! {
                        _ = wedge.changed() => {}
                        cmd = rx.recv() => match cmd {
                            Some(cmd) => self.apply(cmd),
                            None => return,
                        },
                    }
                }
                deadline = Instant::now();
                continue;
            }
            self.admit(deadline);
            let Some(step) = self.engine.step() else {
                continue;
            };
            self.publish();
            deadline += Duration::from_secs_f64((step.duration_s * self.scale()).max(0.0));
            let now = Instant::now();
            if now > deadline + LAG_TOLERANCE {
                self.shared
                    .metrics
                    .lag
                    .inc_by((now - deadline).as_secs_f64());
                deadline = now;
                // Behind schedule nothing below awaits: let the HTTP tasks run.
                tokio::task::yield_now().await;
            } else {
                let sleep = tokio::time::sleep_until(self.shared.timer.aim(deadline));
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => {
                            self.shared.timer.woke(deadline, Instant::now());
                            break;
                        }
                        cmd = rx.recv() => match cmd {
                            Some(cmd) => self.apply(cmd),
                            None => return,
                        },
                    }
                }
            }
            self.deliver(&step.events, deadline);
            self.flush_kv_events();
        }
    }
}
