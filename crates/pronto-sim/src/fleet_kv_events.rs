//! A simulated backend's KV-cache event publisher: a ZMQ PUB socket, as vLLM's
//! `ZmqEventPublisher`.
//!
//! The engine task hands each step's events ([`crate::engine::Engine::take_kv_events`])
//! to this task over a channel; it numbers the batches from 0 and publishes each as
//! `[topic "", seq (8-byte big-endian), msgpack([ts, [events as maps], nil])]`
//! ([`pronto_core::kv_index::encode_message`]). For tests, `drop_next` makes it number but not send
//! the next messages, so subscribers see a sequence gap.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketSend};

use pronto_core::kv_index::{encode_message, Encoding, KvEvent};

/// A running publisher.
#[derive(Debug)]
pub(crate) struct KvPublisher {
    /// `tcp://HOST:PORT` it listens on.
    pub endpoint: String,
    /// Messages still to be skipped (numbered, never sent).
    pub drop_next: Arc<AtomicU64>,
}

impl KvPublisher {
    /// Bind `tcp://host:port` (0: ephemeral) and start publishing what arrives on the
    /// returned sender.
    pub async fn start(
        host: &str,
        port: u16,
    ) -> io::Result<(
        KvPublisher,
        mpsc::UnboundedSender<Vec<KvEvent>>,
        JoinHandle<()>,
    )> {
        let mut socket = zeromq::PubSocket::new();
        let endpoint = socket
            .bind(&format!("tcp://{host}:{port}"))
            .await
            .map_err(|e| io::Error::other(e.to_string()))?
            .to_string();
        let drop_next = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(publish(socket, rx, Arc::clone(&drop_next)));
        Ok((
            KvPublisher {
                endpoint,
                drop_next,
            },
            tx,
            task,
        ))
    }
}

async fn publish(
    mut socket: zeromq::PubSocket,
    mut rx: mpsc::UnboundedReceiver<Vec<KvEvent>>,
    drop_next: Arc<AtomicU64>,
) {
    let start = std::time::SystemTime::now();
    let mut seq = 0u64;
    while let Some(events) = rx.recv().await {
        let n = seq;
        seq += 1;
        let skip = drop_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| d.checked_sub(1))
            .is_ok();
        if skip {
            continue;
        }
        let ts = start.elapsed().map_or(0.0, |d| d.as_secs_f64());
        let frames = encode_message(b"", n, ts, &events, Encoding::Map);
        let msg = zeromq::ZmqMessage::try_from(frames.to_vec()).expect("three frames");
        if let Err(e) = socket.send(msg).await {
            tracing::debug!(error = %e, "KV event publish failed");
        }
    }
}
