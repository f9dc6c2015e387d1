//! One supervised subscriber task per backend with `kv_events`, and the background service
//! that starts them.
//!
//! [`run_subscriber`] connects to the engine's publisher ([`crate::kv_events::zmtp`]), feeds every
//! message to the backend's [`ExactIndex`], and on a dropped or failed connection suspends
//! the index (routing falls back to the approximate index) and reconnects with exponential
//! backoff ([`MIN_BACKOFF`] doubling to [`MAX_BACKOFF`]). It holds the index weakly: when a
//! reload removes the backend (its `Arc<Backend>` and so its index are dropped), the task ends
//! at its next wake-up ([`POLL`] at most). Its reads are timed out every [`POLL`] to notice
//! that; the frame reader is cancel-safe, so a timeout loses no byte.
//!
//! Failures are reported, not swallowed: a failed connect counts in
//! `pronto_kv_events_connect_failures_total{backend}`, and the connection's transitions are
//! logged once each ([`KvLink`]: connected, lost, connect failing, resumed, with a
//! rate-limited repeat while it stays down).
//!
//! [`supervise`] runs a subscriber as its own task and restarts it whenever it dies (a panic,
//! or a return while its index lives), after a delay doubling from [`MIN_BACKOFF`] to
//! [`MAX_BACKOFF`] (reset once a run lasted [`HEALTHY_RUN`]); each restart counts in
//! `pronto_kv_events_subscriber_restarts_total{backend}` and is logged (rate-limited).
//!
//! [`KvEventsService`] (a pingora background service, like the metrics scraper) looks at the
//! current gateway state every [`POLL`] and starts the supervised subscriber of every backend
//! whose index has none yet, so a reload's new backends are picked up.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::backend::lifecycle::{Change, Condition, KvChange, KvLink};
use crate::kv_events::zmtp::SubConnection;
use crate::state::StateHandle;
use crate::telemetry::Metrics;
use pronto_core::kv_index::ExactIndex;

/// First reconnect (and restart) delay.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest reconnect (and restart) delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Limit on one connect + handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often idle tasks check that their backend still exists, and the service looks for new
/// backends.
pub const POLL: Duration = Duration::from_millis(500);
/// A subscriber run this long before dying restarts after [`MIN_BACKOFF`] again.
pub const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// `tcp://host:port` → `host:port` (a bare `host:port` is accepted too).
pub fn tcp_address(endpoint: &str) -> &str {
    endpoint.strip_prefix("tcp://").unwrap_or(endpoint)
}

/// One backend's subscription: its index (held weakly), where to connect, where to report.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// The backend's exact index; the subscriber ends once it is dropped.
    pub index: Weak<ExactIndex>,
    /// `tcp://HOST:PORT` of the engine's publisher.
    pub endpoint: String,
    /// The backend's name (the metric label).
    pub backend: Arc<str>,
    /// Where failures are counted.
    pub metrics: Metrics,
    /// The connection's previous state, kept across restarts so the log shows transitions.
    link: Arc<Mutex<KvLink>>,
}

impl Subscription {
    /// A subscription feeding `index` from `endpoint`, reporting as `backend`.
    pub fn new(
        index: &Arc<ExactIndex>,
        endpoint: impl Into<String>,
        backend: impl Into<Arc<str>>,
        metrics: &Metrics,
    ) -> Subscription {
        Subscription {
            index: Arc::downgrade(index),
            endpoint: endpoint.into(),
            backend: backend.into(),
            metrics: metrics.clone(),
            link: Arc::default(),
        }
    }

    /// Apply `f` to the connection state and log the transition it returns.
    fn note(&self, f: impl FnOnce(&mut KvLink) -> Option<KvChange>) {
        let change = f(&mut self.link.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(c) = change {
            c.log(&self.backend, &self.endpoint);
        }
    }
}

/// Subscribe as `sub` says and feed its index until the index is dropped.
pub async fn run_subscriber(sub: Subscription) {
    let addr = tcp_address(&sub.endpoint).to_string();
    let mut backoff = MIN_BACKOFF;
    loop {
        if sub.index.strong_count() == 0 {
            return;
        }
        let connected =
            match tokio::time::timeout(CONNECT_TIMEOUT, SubConnection::connect(&addr)).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no handshake within {CONNECT_TIMEOUT:?}")),
            };
        match connected {
            Ok(mut conn) => {
                sub.note(KvLink::on_connected);
                backoff = MIN_BACKOFF;
                let reason = loop {
                    match tokio::time::timeout(POLL, conn.recv()).await {
                        Ok(Ok(frames)) => match sub.index.upgrade() {
                            Some(ix) => ix.on_message(&frames),
                            None => return,
                        },
                        Ok(Err(e)) => break e.to_string(),
                        Err(_) if sub.index.strong_count() == 0 => return,
                        // Cancel-safe: the partial frame stays in the reader.
                        Err(_) => {}
                    }
                };
                if let Some(ix) = sub.index.upgrade() {
                    ix.suspend();
                }
                sub.note(|l| l.on_lost(reason, Instant::now()));
            }
            Err(reason) => {
                if sub.index.strong_count() == 0 {
                    // Removed while connecting: its series are forgotten; count nothing.
                    return;
                }
                sub.metrics
                    .kv_events_connect_failures_total
                    .with_label_values(&[&sub.backend])
                    .inc();
                sub.note(|l| l.on_connect_failed(reason, Instant::now()));
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Run the subscriber `start(sub)` returns as its own task, and start it again whenever it
/// dies while `sub`'s index lives; ends when the index is dropped (or the runtime stops).
pub async fn supervise<F, Fut>(sub: Subscription, mut start: F)
where
    F: FnMut(Subscription) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut delay = MIN_BACKOFF;
    let mut deaths = Condition::default();
    loop {
        let started = tokio::time::Instant::now();
        let result = tokio::spawn(start(sub.clone())).await;
        if sub.index.strong_count() == 0 {
            return;
        }
        let how = match result {
            Ok(()) => "returned".to_string(),
            Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e.into_panic())),
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        sub.metrics
            .kv_events_subscriber_restarts_total
            .with_label_values(&[&sub.backend])
            .inc();
        // Its connection died with it: whatever arrives next may follow a gap.
        if let Some(ix) = sub.index.upgrade() {
            ix.suspend();
        }
        if started.elapsed() >= HEALTHY_RUN {
            delay = MIN_BACKOFF;
            deaths.ok();
        }
        let backend = &*sub.backend;
        match deaths.fail(Instant::now()) {
            Some(Change::Failing) => tracing::error!(
                backend,
                %how,
                restart_in = ?delay,
                "KV event subscriber died; restarting it"
            ),
            Some(Change::StillFailing {
                failures,
                suppressed,
            }) => tracing::error!(
                backend,
                %how,
                restarts = failures,
                suppressed,
                restart_in = ?delay,
                "KV event subscriber keeps dying; restarting it"
            ),
            _ => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

/// The text of a panic's payload, when it has one.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "(no message)".to_string(),
        },
    }
}

/// Starts a supervised subscriber for every backend of the current state that has an exact
/// index.
#[derive(Debug)]
pub struct KvEventsService {
    state: StateHandle,
}

impl KvEventsService {
    /// A service over whatever state is current.
    pub fn new(state: StateHandle) -> KvEventsService {
        KvEventsService { state }
    }

    /// Spawn the subscribers not yet running (on the current tokio runtime).
    pub fn spawn_missing(&self) -> usize {
        let state = self.state.load();
        let mut n = 0;
        for b in &state.backends {
            let (Some(ix), Some(cfg)) = (b.kv_events(), &b.config.kv_events) else {
                continue;
            };
            if ix.claim_subscriber() {
                n += 1;
                let sub =
                    Subscription::new(ix, cfg.endpoint.clone(), b.config.name.clone(), b.metrics());
                tokio::spawn(supervise(sub, run_subscriber));
            }
        }
        n
    }
}

#[async_trait::async_trait]
impl BackgroundService for KvEventsService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = tokio::time::interval(POLL);
        loop {
            tokio::select! {
                _ = ticks.tick() => { self.spawn_missing(); }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::backend::log_capture;
    use pronto_core::kv_index::{encode_message, Encoding, KvEvent};
    use pronto_core::tokens::{block_hashes, BLOCK_TOKENS};
    use zeromq::{Socket, SocketSend};

    async fn bind_pub() -> (zeromq::PubSocket, String) {
        let mut s = zeromq::PubSocket::new();
        let ep = s.bind("tcp://127.0.0.1:0").await.unwrap();
        (s, ep.to_string())
    }

    fn msg(seq: u64, ev: KvEvent) -> zeromq::ZmqMessage {
        let frames = encode_message(b"", seq, 0.0, &[ev], Encoding::Map);
        zeromq::ZmqMessage::try_from(frames.to_vec()).unwrap()
    }

    fn value(metrics: &Metrics, series: &str) -> f64 {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Publish `seq` until the index has decoded `want` messages (a new subscriber misses
    /// what was sent before its subscription arrived).
    async fn publish_until(s: &mut zeromq::PubSocket, ix: &ExactIndex, ev: &KvEvent, seq: u64) {
        for i in 0..400 {
            s.send(msg(seq + i, ev.clone())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            if ix.counts().decoded > 0 && ix.is_live() {
                return;
            }
        }
        panic!("subscriber never received");
    }

    /// The real subscriber, supervised, whose first run panics: restarted, it subscribes to
    /// a ZMQ publisher, and reconnects after the publisher restarts; the log holds one line
    /// per transition.
    #[tokio::test]
    async fn a_supervised_subscriber_survives_a_panic_and_a_publisher_restart() {
        let (log, _guard) = log_capture::capture();
        let (mut publisher, ep) = bind_pub().await;
        let ix = Arc::new(ExactIndex::new(16));
        let metrics = Metrics::new();
        let sub = Subscription::new(&ix, ep.clone(), "b", &metrics);
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        tokio::spawn(supervise(sub, move |sub| {
            let first = r.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                assert!(!first, "a subscriber bug");
                run_subscriber(sub).await
            }
        }));
        let ids: Vec<u32> = (0..32).collect();
        let stored = KvEvent::BlockStored {
            block_hashes: vec![1, 2],
            parent: None,
            token_ids: ids.clone(),
            block_size: Some(16),
        };
        publish_until(&mut publisher, &ix, &stored, 5).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "restarted once");
        let restarts = "pronto_kv_events_subscriber_restarts_total{backend=\"b\"}";
        assert_eq!(value(&metrics, restarts), 1.0);
        let want = block_hashes(&ids, BLOCK_TOKENS);
        assert_eq!(ix.match_blocks(&want), Some(2));
        // The publisher restarts on the same port, numbering afresh: the connection drop
        // suspends the index, the first new batch is a gap and resyncs it. (Numbered from
        // far away: the first batch to reach the new subscription is whichever it is, and
        // one numbered exactly the index's next seq would not be a gap.)
        drop(publisher);
        for _ in 0..400 {
            if !ix.is_live() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!ix.is_live(), "a dropped connection suspends the index");
        assert_eq!(ix.match_blocks(&want), None);
        let mut publisher = zeromq::PubSocket::new();
        publisher.bind(&ep).await.unwrap();
        let cleared = KvEvent::BlockRemoved {
            block_hashes: vec![99],
        };
        let before = ix.counts().decoded;
        for i in 0..600 {
            publisher
                .send(msg(1_000_000 + i, cleared.clone()))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            if ix.counts().decoded > before {
                break;
            }
        }
        assert!(ix.counts().resyncs >= 1);
        assert_eq!(
            ix.match_blocks(&want),
            Some(0),
            "the resync forgot the blocks"
        );
        assert_eq!(
            log.count(&["KV event subscriber died", "a subscriber bug"]),
            1
        );
        assert_eq!(log.count(&["KV events connected"]), 1, "{}", log.text());
        assert_eq!(log.count(&["KV events lost"]), 1);
        assert_eq!(log.count(&["KV events resumed"]), 1);
        assert_eq!(value(&metrics, restarts), 1.0, "no restart for a lost link");
    }

    /// The supervisor on paused time: a subscriber that panics, then one that returns, are
    /// each restarted; the supervisor ends once the index is gone.
    #[tokio::test(start_paused = true)]
    async fn dead_subscribers_are_restarted_until_the_index_is_dropped() {
        let ix = Arc::new(ExactIndex::new(16));
        let metrics = Metrics::new();
        let sub = Subscription::new(&ix, "tcp://127.0.0.1:9", "b", &metrics);
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        let supervisor = tokio::spawn(supervise(sub, move |sub| {
            let n = r.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => panic!("first run dies"),
                    1 => {} // returns while its index lives: also a death
                    _ => {
                        while sub.index.strong_count() > 0 {
                            tokio::time::sleep(POLL).await;
                        }
                    }
                }
            }
        }));
        while runs.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let restarts = "pronto_kv_events_subscriber_restarts_total{backend=\"b\"}";
        assert_eq!(value(&metrics, restarts), 2.0);
        drop(ix);
        supervisor.await.unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "not restarted once the index is gone"
        );
    }

    #[tokio::test]
    async fn connect_failures_are_counted_and_logged_once() {
        let (log, _guard) = log_capture::capture();
        // Nothing listens on a port whose listener was dropped (never rebound here).
        let port = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ix = Arc::new(ExactIndex::new(16));
        let metrics = Metrics::new();
        let sub = Subscription::new(&ix, format!("tcp://127.0.0.1:{port}"), "b", &metrics);
        let task = tokio::spawn(run_subscriber(sub));
        let failures = "pronto_kv_events_connect_failures_total{backend=\"b\"}";
        for _ in 0..2000 {
            if value(&metrics, failures) >= 3.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(value(&metrics, failures) >= 3.0);
        assert!(!ix.is_live());
        drop(ix);
        task.await.unwrap();
        assert_eq!(
            log.count(&["KV events connect failing", "backend=\"b\""]),
            1,
            "{}",
            log.text()
        );
        assert_eq!(log.count(&["KV events connected"]), 0);
    }
}
