//! The gateway's own accept loop: a pingora [`Service`] over a listener Pronto bound itself.
//!
//! Binding before the server starts means a listener on port 0 is known (and kept: no
//! bind-drop-rebind race) before the first request, so tests run the gateway in-process on
//! `127.0.0.1:0`, and a drain can stop accepting before pingora is told to shut down. Each
//! accepted connection gets the TLS handshake when the listener has TLS, then goes to the
//! pingora app (the proxy or the admin server) exactly as pingora's own listening service
//! would hand it over, keep-alive loop included.
//!
//! The client listener also enforces the edge's connection limits (read from the current
//! config at each accept): at most `limits.max_connections` open at once — one more is
//! answered a 503 JSON error with `Retry-After` and closed — and each request head must
//! arrive within `limits.header_timeout` ([`crate::edge::head_deadline`]).

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use async_trait::async_trait;
use pingora_core::apps::ServerApp;
use pingora_core::listeners::tls::Acceptor;
use pingora_core::protocols::l4::stream::Stream as L4Stream;
use pingora_core::protocols::Stream;
#[cfg(unix)]
use pingora_core::server::ListenFds;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::Service;
use tokio::sync::watch;

use crate::coalesce::Coalesce;
use crate::edge::head_deadline::HeadDeadline;
use crate::error::GatewayError;
use crate::state::StateHandle;
use crate::telemetry::Metrics;

/// Longest TLS handshake a client is given.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener bound by Pronto, served by a pingora app.
pub struct Listening<A> {
    name: String,
    listener: Option<std::net::TcpListener>,
    tls: Option<Arc<Acceptor>>,
    app: Option<A>,
    threads: Option<usize>,
    /// Turns `true` when the listener must stop accepting (a drain began).
    stop: watch::Receiver<bool>,
    /// The client listener's edge limits, from the current config.
    edge: Option<Edge>,
}

/// What the client listener enforces per connection.
#[derive(Clone)]
pub struct Edge {
    /// The live state (its config's `limits`).
    pub state: StateHandle,
    /// Where open connections and refusals are counted.
    pub metrics: Metrics,
    /// Connections open now.
    pub open: Arc<AtomicU64>,
}

impl<A> Listening<A> {
    /// `app` serving the connections of `listener` (already bound, set non-blocking here),
    /// through `tls` when given, until `stop` turns true or pingora shuts down.
    pub fn new(
        name: &str,
        listener: std::net::TcpListener,
        tls: Option<Acceptor>,
        app: A,
        threads: Option<usize>,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<Listening<A>> {
        listener.set_nonblocking(true)?;
        Ok(Listening {
            name: name.to_string(),
            listener: Some(listener),
            tls: tls.map(Arc::new),
            app: Some(app),
            threads,
            stop,
            edge: None,
        })
    }

    /// Enforce the edge's connection cap and head deadline on this listener.
    pub fn with_edge(mut self, edge: Edge) -> Listening<A> {
        self.edge = Some(edge);
        self
    }
}

/// One open client connection, counted until dropped.
struct Open(Edge);

impl Drop for Open {
    fn drop(&mut self) {
        let n = self.0.open.fetch_sub(1, Ordering::Relaxed) - 1;
        self.0.metrics.open_connections.set(n as i64);
    }
}

/// Answer a connection over the cap: a 503 JSON error, `Connection: close` (plain HTTP only:
/// on a TLS listener the connection is just closed).
async fn refuse(mut tcp: tokio::net::TcpStream, tls: bool) {
    if !tls {
        let bytes = GatewayError::Busy("connections").to_http1_close();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            // Answer the request, once it has begun, rather than before it: a client that
            // gets a response before it has written its request may discard it as unsolicited.
            let mut first = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut first)).await;
            tcp.write_all(&bytes).await?;
            tcp.shutdown().await
        })
        .await;
    }
}

/// Bind `addr` (port 0: any free port); returns the listener and the address it got.
pub fn bind(addr: SocketAddr) -> std::io::Result<(std::net::TcpListener, SocketAddr)> {
    let l = std::net::TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    Ok((l, local))
}

/// Serve one connection until the app lets it go. `head_timeout`: the client listener's head
/// deadline; `None` on the admin listener, whose connections need no abortive close either.
async fn serve<A: ServerApp + Send + Sync + 'static>(
    app: Arc<A>,
    tls: Option<Arc<Acceptor>>,
    tcp: tokio::net::TcpStream,
    shutdown: ShutdownWatch,
    head_timeout: Option<Duration>,
) {
    let _ = tcp.set_nodelay(true);
    // A client connection keeps a second descriptor of its socket, so that the proxy can
    // reset a client that stopped reading (`coalesce::abort`).
    let abortable = match head_timeout {
        Some(_) => std::os::fd::AsFd::as_fd(&tcp).try_clone_to_owned().ok(),
        None => None,
    };
    let l4 = L4Stream::from(tcp);
    let stream: Stream = match tls {
        Some(acceptor) => {
            // Boxed: the handshake's future is large, and inline it would size every
            // connection's task (plaintext ones too) for as long as the connection lives.
            let handshake = Box::pin(acceptor.tls_handshake(l4));
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(s)) => match head_timeout {
                    Some(t) => Box::new(HeadDeadline::new(s, t)),
                    None => Box::new(s),
                },
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake timed out");
                    return;
                }
            }
        }
        None => match head_timeout {
            Some(t) => Box::new(HeadDeadline::new(l4, t)),
            None => Box::new(l4),
        },
    };
    // Lets the proxy send a response head with its first chunk, and the last chunk with the
    // end of the body, in one write.
    let stream: Stream = match abortable {
        Some(socket) => Box::new(Coalesce::abortable(stream, socket)),
        None => Box::new(Coalesce::new(stream)),
    };
    let mut next = app.process_new(stream, &shutdown).await;
    while let Some(s) = next {
        next = app.process_new(s, &shutdown).await;
    }
}

impl<A: ServerApp + Send + Sync + 'static> Listening<A> {
    /// Serve (or, over the cap, refuse) one accepted connection on a task of its own.
    fn accepted(&self, app: &Arc<A>, tcp: tokio::net::TcpStream, shutdown: &ShutdownWatch) {
        let (app, tls, shutdown) = (Arc::clone(app), self.tls.clone(), shutdown.clone());
        let Some(edge) = self.edge.clone() else {
            tokio::spawn(serve(app, tls, tcp, shutdown, None));
            return;
        };
        let limits = edge.state.load().config.limits;
        let n = edge.open.fetch_add(1, Ordering::Relaxed) + 1;
        let open = Open(edge);
        open.0.metrics.open_connections.set(n as i64);
        if n > limits.max_connections {
            open.0
                .metrics
                .capacity_rejections_total
                .with_label_values(&["connections"])
                .inc();
            tokio::spawn(async move {
                refuse(tcp, tls.is_some()).await;
                drop(open);
            });
            return;
        }
        tokio::spawn(async move {
            serve(app, tls, tcp, shutdown, Some(limits.header_timeout)).await;
            drop(open);
        });
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> Service for Listening<A> {
    async fn start_service(
        &mut self,
        #[cfg(unix)] _fds: Option<ListenFds>,
        mut shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let (Some(listener), Some(app)) = (self.listener.take(), self.app.take()) else {
            return;
        };
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(service = %self.name, error = %e, "cannot listen");
                return;
            }
        };
        let app = Arc::new(app);
        let mut stop = self.stop.clone();
        loop {
            if *stop.borrow() || *shutdown.borrow() {
                break;
            }
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => self.accepted(&app, tcp, &shutdown),
                    Err(e) => {
                        tracing::warn!(service = %self.name, error = %e, "accept failed");
                        // Out of descriptors: accept would fail again at once.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                r = stop.changed() => if r.is_err() { break },
                r = shutdown.changed() => if r.is_err() { break },
            }
        }
        // Dropping the listener closes the socket: new connections are refused.
        drop(listener);
        tracing::info!(service = %self.name, "stopped listening");
        app.cleanup().await;
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn threads(&self) -> Option<usize> {
        self.threads
    }
}
