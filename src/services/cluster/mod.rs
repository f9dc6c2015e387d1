//! The NATS side: one publisher task and one folding task, as a pingora background service.

mod connect;
mod fold;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use futures::StreamExt;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pronto_core::cluster::{wire, ObserveLimit, Outbox, Remote, ReplicaId, SyncEvent};
use tokio::sync::{mpsc, watch};

use crate::backend::lifecycle::REPEAT_EVERY;
use crate::cluster::Link;
use crate::config::cluster::Cluster;
use crate::state::StateHandle;
use crate::telemetry::{ClusterMetrics, Metrics, SyncDirection, SyncDrop};
use connect::{Refusals, TlsRefusal};
use fold::{Target, Targets};

/// A message is published once it holds this many bytes (or the queue is empty).
const MAX_MESSAGE_BYTES: usize = 64 << 10;
/// A publish that has not been handed to the connection by then is abandoned.
const PUBLISH_TIMEOUT: Duration = Duration::from_millis(250);
/// Longest wait between two reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);
/// Messages the client buffers for our subscription before it drops (a slow consumer; the
/// next snapshot repairs what was lost). Typically a few KiB each, 64 KiB at most.
const SUBSCRIPTION_CAPACITY: usize = 8_192;

/// The replica-sync service (see [`crate::cluster`]).
#[derive(Debug)]
pub struct ClusterService {
    state: StateHandle,
    config: Cluster,
    link: Arc<Link>,
    rx: Mutex<Option<mpsc::Receiver<SyncEvent>>>,
    metrics: Metrics,
    incarnation: u64,
}

impl ClusterService {
    /// The service for `config`, publishing what `link`'s proxy side hands over on `rx`.
    pub fn new(
        state: StateHandle,
        config: Cluster,
        link: Arc<Link>,
        rx: mpsc::Receiver<SyncEvent>,
        metrics: Metrics,
    ) -> ClusterService {
        // Another incarnation each start, so peers drop what this replica held before.
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 48;
        ClusterService {
            state,
            config,
            link,
            rx: Mutex::new(Some(rx)),
            metrics,
            incarnation,
        }
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

#[async_trait::async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(rx) = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let cfg = &self.config;
        let m = self.metrics.cluster.clone();
        let (conn_tx, conn_rx) = watch::channel(false);
        let tls_seen = Arc::new(TlsRefusal::default());
        let refusals = Arc::new(Refusals::new(
            &cfg.replica,
            m.clone(),
            Arc::clone(&tls_seen),
        ));
        let events = {
            let m = m.clone();
            let replica = cfg.replica.clone();
            let log = Arc::new(Mutex::new(DownLog::default()));
            move |ev: async_nats::Event| {
                let (m, tx, log, replica, refusals) = (
                    m.clone(),
                    conn_tx.clone(),
                    log.clone(),
                    replica.clone(),
                    refusals.clone(),
                );
                async move {
                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                    match ev {
                        async_nats::Event::ClientError(e) => refusals.client_error(&e, now()),
                        async_nats::Event::ServerError(e) => refusals.server_error(&e, now()),
                        async_nats::Event::Connected => {
                            m.connected.set(1);
                            let _ = tx.send(true);
                            log.up(&replica);
                        }
                        async_nats::Event::Disconnected => {
                            m.connected.set(0);
                            m.disconnects_total.inc();
                            let _ = tx.send(false);
                            log.down(&replica, now());
                        }
                        _ => {}
                    }
                }
            }
        };
        let options = async_nats::ConnectOptions::new()
            .name(format!("pronto-{}", cfg.replica))
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(1))
            .ping_interval(cfg.heartbeat.max(Duration::from_secs(1)))
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(50 << attempts.min(6)).min(MAX_RECONNECT_DELAY)
            })
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .event_callback(events);
        let options = match connect::secure(options, cfg, &tls_seen) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(nats = %cfg.nats, error = %e, "cluster sync cannot start; routing on this replica's own state");
                return;
            }
        };
        let client = match options.connect(cfg.nats.as_str()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(nats = %cfg.nats, error = %e, "cluster sync cannot start; routing on this replica's own state");
                return;
            }
        };
        tracing::info!(
            replica = %cfg.replica,
            nats = %cfg.nats,
            subject = %cfg.own_subject(),
            auth = cfg.auth.as_ref().map_or("none", |a| a.kind()),
            tls = cfg.requires_tls(),
            "cluster sync starting"
        );
        let sub = match client.subscribe(cfg.all_subjects()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cluster sync cannot subscribe; routing on this replica's own state");
                return;
            }
        };
        let publisher = Publisher {
            client: client.clone(),
            subject: cfg.own_subject(),
            incarnation: self.incarnation,
            outbox: Outbox::new(ObserveLimit::DEFAULT),
            link: Arc::clone(&self.link),
            metrics: m.clone(),
            buf: Vec::new(),
            pending: 0,
        };
        let folder = Folder {
            state: self.state.clone(),
            own: cfg.own_subject(),
            link: Arc::clone(&self.link),
            incarnation: self.incarnation,
            twin_logged: false,
            prefix_len: cfg.subject.len() + 1,
            remote: Remote::new(cfg.peer_timeout),
            metrics: m.clone(),
        };
        let heartbeat = cfg.heartbeat;
        let publishing = tokio::spawn(publisher.run(rx, conn_rx, heartbeat, shutdown.clone()));
        let folding = tokio::spawn(folder.run(sub, heartbeat, shutdown.clone()));
        let _ = shutdown.changed().await;
        let _ = tokio::join!(publishing, folding);
        let _ = client.drain().await;
        m.connected.set(0);
    }
}

/// Transitions of the NATS connection in the log: every recovery, and a loss at most once per
/// [`REPEAT_EVERY`] (with how many were not logged).
#[derive(Debug, Default)]
struct DownLog {
    last_logged: Option<Instant>,
    suppressed: u64,
    down: bool,
}

impl DownLog {
    fn down(&mut self, replica: &str, now: Instant) {
        self.down = true;
        if self
            .last_logged
            .is_some_and(|t| now.saturating_duration_since(t) < REPEAT_EVERY)
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(replica, not_logged = self.suppressed, "cluster sync lost: NATS disconnected; routing on this replica's own state until it returns");
        self.last_logged = Some(now);
        self.suppressed = 0;
    }

    fn up(&mut self, replica: &str) {
        if std::mem::take(&mut self.down) {
            tracing::info!(replica, "cluster sync resumed: NATS reconnected; resyncing");
        } else {
            tracing::info!(replica, "cluster sync connected");
        }
    }
}

// === Publisher ===

struct Publisher {
    client: async_nats::Client,
    subject: String,
    incarnation: u64,
    outbox: Outbox,
    link: Arc<Link>,
    metrics: ClusterMetrics,
    buf: Vec<u8>,
    /// Events in `buf`.
    pending: usize,
}

impl Publisher {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<SyncEvent>,
        mut conn: watch::Receiver<bool>,
        heartbeat: Duration,
        mut shutdown: ShutdownWatch,
    ) {
        let mut ticks = tokio::time::interval(heartbeat);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        wire::begin(&mut self.buf, self.incarnation);
        loop {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { return };
                    let started = Instant::now();
                    self.add(ev);
                    // Whatever else is queued goes in the same message.
                    while self.buf.len() < MAX_MESSAGE_BYTES {
                        match rx.try_recv() {
                            Ok(ev) => self.add(ev),
                            Err(_) => break,
                        }
                    }
                    self.flush(started).await;
                }
                _ = ticks.tick() => self.snapshot().await,
                r = conn.changed() => {
                    if r.is_err() { return }
                    // Reconnected: tell the others at once what this replica holds.
                    if *conn.borrow_and_update() { self.snapshot().await }
                }
                _ = shutdown.changed() => return,
            }
        }
    }

    fn add(&mut self, ev: SyncEvent) {
        let ev = self.outbox.note(ev, now());
        wire::push(&mut self.buf, &ev);
        self.pending += 1;
    }

    async fn snapshot(&mut self) {
        let started = Instant::now();
        for ev in self.link.take_lost() {
            self.outbox.note(ev, now());
        }
        let snap = self.outbox.snapshot();
        wire::push(&mut self.buf, &snap);
        self.pending += 1;
        self.flush(started).await;
    }

    async fn flush(&mut self, started: Instant) {
        let events = std::mem::take(&mut self.pending);
        if events == 0 {
            return;
        }
        let bytes = bytes::Bytes::copy_from_slice(&self.buf);
        wire::begin(&mut self.buf, self.incarnation);
        if self.client.connection_state() != State::Connected {
            self.metrics.dropped(SyncDrop::Disconnected, events as u64);
            return;
        }
        let len = bytes.len();
        // Before the publication: its echo may come back before `publish` returns.
        self.link.published(&bytes, Instant::now());
        let sent = tokio::time::timeout(
            PUBLISH_TIMEOUT,
            self.client.publish(self.subject.clone(), bytes),
        )
        .await;
        match sent {
            Ok(Ok(())) => self
                .metrics
                .message(SyncDirection::Sent, len, events, started.elapsed()),
            _ => self.metrics.dropped(SyncDrop::PublishError, events as u64),
        }
    }
}

// === Folder ===

struct Folder {
    state: StateHandle,
    own: String,
    /// Where the publisher notes what it published (to time the echoes).
    link: Arc<Link>,
    incarnation: u64,
    /// Whether another process publishing under this replica's name was reported.
    twin_logged: bool,
    prefix_len: usize,
    remote: Remote<Target>,
    metrics: ClusterMetrics,
}

impl Folder {
    async fn run(
        mut self,
        mut sub: async_nats::Subscriber,
        heartbeat: Duration,
        mut shutdown: ShutdownWatch,
    ) {
        let mut targets = Targets::of(self.state.load());
        // Expiry is checked four times per heartbeat.
        let mut ticks = tokio::time::interval(heartbeat / 4);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let current = self.state.load();
            if !targets.is_of(&current) {
                targets = Targets::of(current);
            }
            tokio::select! {
                msg = sub.next() => {
                    let Some(msg) = msg else { break };
                    self.fold(&targets, &msg);
                }
                _ = ticks.tick() => {
                    let expired = self.remote.expire(&targets, now());
                    if expired > 0 {
                        self.metrics.peer_expiries_total.inc_by(expired as u64);
                        tracing::warn!(expired, peers = self.remote.peers(), "cluster sync: replicas silent past peer_timeout expired; their bookings released");
                    }
                    self.publish_gauges();
                }
                _ = shutdown.changed() => break,
            }
        }
        self.remote.clear(&targets);
        self.publish_gauges();
    }

    fn fold(&mut self, targets: &Targets, msg: &async_nats::Message) {
        let subject = msg.subject.as_str();
        if subject == self.own {
            // Our own echo; or another process configured with our name, whose events we
            // cannot tell from ours (said once).
            let twin = wire::incarnation(&msg.payload).is_some_and(|i| i != self.incarnation);
            if twin && !std::mem::replace(&mut self.twin_logged, true) {
                tracing::error!(subject, "cluster sync: another replica publishes under this replica's name; give each replica its own `cluster.replica`");
            }
            if !twin {
                if let Some(delay) = self.link.echoed(&msg.payload, Instant::now()) {
                    self.remote.on_echo(delay);
                }
            }
            return;
        }
        let started = Instant::now();
        let Some(name) = subject.get(self.prefix_len..) else {
            return;
        };
        match wire::decode(&msg.payload) {
            Ok((incarnation, events)) => {
                let at = now();
                let f = self
                    .remote
                    .apply(targets, ReplicaId::of(name), incarnation, &events, at);
                // Collision repair: the message left its sender about one sync delay ago (what
                // this replica's own messages take to come back). No echo timed yet: no
                // estimate, and nothing is woken.
                let sent_at = self.remote.unseen().delay().and_then(|d| at.checked_sub(d));
                if let Some(sent_at) = sent_at.filter(|_| self.link.repair_margin().is_some()) {
                    targets.heard_dispatches(&events, sent_at);
                }
                self.metrics
                    .dropped(SyncDrop::UnknownBackend, u64::from(f.unknown_backend));
                self.metrics
                    .dropped(SyncDrop::UnknownBooking, u64::from(f.unknown_booking));
                self.metrics.message(
                    SyncDirection::Received,
                    msg.payload.len(),
                    events.len(),
                    started.elapsed(),
                );
            }
            Err(_) => self.metrics.dropped(SyncDrop::DecodeError, 1),
        }
    }

    fn publish_gauges(&self) {
        let unseen = self.remote.unseen();
        self.metrics
            .sync_delay_seconds
            .set(unseen.delay().map_or(0.0, |d| d.as_secs_f64()));
        self.metrics.unseen_dispatches.set(unseen.expected(now()));
        self.metrics.peers.set(self.remote.peers() as i64);
        self.metrics
            .remote_bookings
            .set(self.remote.bookings() as i64);
    }
}
