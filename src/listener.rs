//! The gateway's own accept loop: a pingora [`Service`] over a listener Pronto bound itself.
//!
//! Binding before the server starts means a listener on port 0 is known (and kept: no
//! bind-drop-rebind race) before the first request, so tests run the gateway in-process on
//! `127.0.0.1:0`, and a drain can stop accepting before pingora is told to shut down. Each
//! accepted connection gets the TLS handshake when the listener has TLS, then goes to the
//! pingora app (the proxy or the admin server) exactly as pingora's own listening service
//! would hand it over, keep-alive loop included.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
        })
    }
}

/// Bind `addr` (port 0: any free port); returns the listener and the address it got.
pub fn bind(addr: SocketAddr) -> std::io::Result<(std::net::TcpListener, SocketAddr)> {
    let l = std::net::TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    Ok((l, local))
}

async fn serve<A: ServerApp + Send + Sync + 'static>(
    app: Arc<A>,
    tls: Option<Arc<Acceptor>>,
    tcp: tokio::net::TcpStream,
    shutdown: ShutdownWatch,
) {
    let _ = tcp.set_nodelay(true);
    let l4 = L4Stream::from(tcp);
    let stream: Stream = match tls {
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.tls_handshake(l4)).await {
                Ok(Ok(s)) => Box::new(s),
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
        None => Box::new(l4),
    };
    let mut next = app.process_new(stream, &shutdown).await;
    while let Some(s) = next {
        next = app.process_new(s, &shutdown).await;
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
                    Ok((tcp, _)) => {
                        tokio::spawn(serve(Arc::clone(&app), self.tls.clone(), tcp, shutdown.clone()));
                    }
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
