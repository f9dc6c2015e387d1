//! One subscriber task per backend with `kv_events`, and the background service that starts
//! them.
//!
//! [`run_subscriber`] connects to the engine's publisher ([`super::zmtp`]), feeds every
//! message to the backend's [`ExactIndex`], and on a dropped or failed connection suspends
//! the index (routing falls back to the approximate index) and reconnects with exponential
//! backoff ([`MIN_BACKOFF`] doubling to [`MAX_BACKOFF`]). It holds the index weakly: when a
//! reload removes the backend (its `Arc<Backend>` and so its index are dropped), the task ends
//! at its next wake-up ([`POLL`] at most).
//!
//! [`KvEventsService`] (a pingora background service, like the metrics scraper) looks at the
//! current gateway state every [`POLL`] and starts the subscriber of every backend whose
//! index has none yet, so a reload's new backends are picked up.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use super::index::ExactIndex;
use super::zmtp::SubConnection;
use crate::gateway::GatewayState;

/// First reconnect delay.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest reconnect delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Limit on one connect + handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often idle tasks check that their backend still exists, and the service looks for new
/// backends.
pub const POLL: Duration = Duration::from_millis(500);

/// `tcp://host:port` → `host:port` (a bare `host:port` is accepted too).
pub fn tcp_address(endpoint: &str) -> &str {
    endpoint.strip_prefix("tcp://").unwrap_or(endpoint)
}

/// Subscribe to `endpoint` and feed `index` until the index is dropped.
pub async fn run_subscriber(index: Weak<ExactIndex>, endpoint: String, backend: Arc<str>) {
    let addr = tcp_address(&endpoint).to_string();
    let mut backoff = MIN_BACKOFF;
    loop {
        if index.strong_count() == 0 {
            return;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, SubConnection::connect(&addr)).await {
            Ok(Ok(mut conn)) => {
                tracing::info!(backend = %backend, %endpoint, "KV events connected");
                backoff = MIN_BACKOFF;
                let reason = loop {
                    match tokio::time::timeout(POLL, conn.recv()).await {
                        Ok(Ok(frames)) => match index.upgrade() {
                            Some(ix) => ix.on_message(&frames),
                            None => return,
                        },
                        Ok(Err(e)) => break e.to_string(),
                        Err(_) if index.strong_count() == 0 => return,
                        Err(_) => {}
                    }
                };
                if let Some(ix) = index.upgrade() {
                    ix.suspend();
                }
                tracing::warn!(backend = %backend, %endpoint, %reason, "KV events disconnected");
            }
            Ok(Err(e)) => {
                tracing::debug!(backend = %backend, %endpoint, error = %e, "KV events connect failed")
            }
            Err(_) => tracing::debug!(backend = %backend, %endpoint, "KV events connect timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Starts a subscriber for every backend of the current state that has an exact index.
#[derive(Debug)]
pub struct KvEventsService {
    state: Arc<ArcSwap<GatewayState>>,
}

impl KvEventsService {
    /// A service over whatever state is current.
    pub fn new(state: Arc<ArcSwap<GatewayState>>) -> KvEventsService {
        KvEventsService { state }
    }

    /// Spawn the subscribers not yet running (on the current tokio runtime).
    pub fn spawn_missing(&self) -> usize {
        let state = self.state.load_full();
        let mut n = 0;
        for b in &state.backends {
            let (Some(ix), Some(cfg)) = (b.kv_events(), &b.config.kv_events) else {
                continue;
            };
            if ix.claim_subscriber() {
                n += 1;
                tokio::spawn(run_subscriber(
                    Arc::downgrade(ix),
                    cfg.endpoint.clone(),
                    b.config.name.clone(),
                ));
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
    use super::*;
    use crate::kv_events::decode::{encode_message, Encoding, KvEvent};
    use crate::tokens::{block_hashes, BLOCK_TOKENS};
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

    #[tokio::test]
    async fn subscribes_to_a_zmq_publisher_and_reconnects_after_a_restart() {
        let (mut publisher, ep) = bind_pub().await;
        let ix = Arc::new(ExactIndex::new(16));
        tokio::spawn(run_subscriber(Arc::downgrade(&ix), ep.clone(), "b".into()));
        let ids: Vec<u32> = (0..32).collect();
        let stored = KvEvent::BlockStored {
            block_hashes: vec![1, 2],
            parent: None,
            token_ids: ids.clone(),
            block_size: Some(16),
        };
        publish_until(&mut publisher, &ix, &stored, 5).await;
        let want = block_hashes(&ids, BLOCK_TOKENS);
        assert_eq!(ix.match_blocks(&want), Some(2));
        // The publisher restarts on the same port, numbering from 0: the connection drop
        // suspends the index, the first new batch is a gap and resyncs it.
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
            publisher.send(msg(i, cleared.clone())).await.unwrap();
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
    }
}
