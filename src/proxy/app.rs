//! The proxy listener's pingora application: each request head pingora's HTTP layer reads
//! (HTTP/1.1 keep-alive loop, h2c and ALPN `h2` streams) goes to [`Proxy::handle`].
//!
//! Pronto answers every request itself, so it implements pingora-core's [`HttpServerApp`]
//! directly instead of pingora-proxy's `ProxyHttp`, whose per-request session (cache, module
//! and compression contexts, its phase machine) it never used but every open stream paid for
//! in memory (`docs/benchmarks/idle-stream-heap.md`). What pingora-proxy did around its
//! filters is kept:
//! - a head pingora cannot parse gets pingora's 400 (which [`crate::edge::head_deadline`] turns into
//!   the gateway's JSON error on its way out) — a 501 when it refused the head for an
//!   unsupported `Transfer-Encoding` — and the connection is closed; a connection that
//!   breaks or times out before a head is closed without an answer;
//! - `CONNECT` gets a 405 the same way and the connection is closed: its framing (a tunnel
//!   after the head) is not HTTP's;
//! - a connection the proxy aborted (a client that stopped reading, see [`super::relay`])
//!   is dropped without finishing its answer, which resets it; finishing any other answer is
//!   bounded by the write deadline;
//! - once the service shuts down ([`HttpServerApp::http_cleanup`], called when the listener
//!   stops accepting: a drain or pingora's shutdown), keep-alive connections waiting for their
//!   next head are closed, and an answer in progress is the connection's last.

use std::sync::Arc;

use async_trait::async_trait;
use http::Method;
use pingora_core::apps::{
    HttpPersistentSettings, HttpServerApp, HttpServerOptions, ReusedHttpStream,
};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::ShutdownWatch;
use pingora_core::ErrorType;
use tokio::sync::watch;

use super::Proxy;

/// The proxy listener's app (see the module docs).
pub struct App {
    proxy: Proxy,
    options: HttpServerOptions,
    /// Turns `true` when the service shuts down. A watch channel's wake-ups are sharded, so
    /// the connections waiting for a head do not all queue on one lock.
    closing: watch::Sender<bool>,
}

impl App {
    /// `proxy` behind pingora's HTTP layer with `options` (h2c, the h2 idle timeout).
    pub fn new(proxy: Proxy, options: HttpServerOptions) -> App {
        App {
            proxy,
            options,
            closing: watch::Sender::new(false),
        }
    }
}

#[async_trait]
impl HttpServerApp for App {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        let mut closing = self.closing.subscribe();
        let read = tokio::select! {
            // A head already buffered is served, not dropped, when shutdown comes.
            biased;
            read = session.read_request() => read,
            _ = closing.wait_for(|&closed| closed) => return None,
        };
        match read {
            Ok(true) => {}
            // The client closed the connection between requests.
            Ok(false) => return None,
            Err(e) => {
                if e.etype == ErrorType::InvalidHTTPHeader {
                    // Pingora refuses a final coding other than `chunked` itself: that is a
                    // 501, as the edge checks answer the codings pingora accepts.
                    let status = if unsupported_coding(&e) { 501 } else { 400 };
                    let _ = session.respond_error(status).await;
                } else {
                    tracing::debug!(error = %e, "no request head read");
                }
                session.shutdown().await;
                return None;
            }
        }
        if session.req_header().method == Method::CONNECT {
            let _ = session.respond_error(405).await;
            session.shutdown().await;
            return None;
        }
        if *shutdown.borrow() || *self.closing.borrow() {
            session.set_keepalive(None);
        }
        self.proxy.handle(&mut session).await;
        if crate::coalesce::aborted(session.stream()) {
            // A client that stopped reading: dropped now, which resets its connection.
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&session);
        // Ending a chunked body writes (its terminator); pingora does not bound that write.
        let finish = match session.get_write_timeout() {
            Some(t) => tokio::time::timeout(t, session.finish()).await.ok()?,
            None => session.finish().await,
        };
        let reusable = finish.ok().flatten()?;
        Some(ReusedHttpStream::from_reusable_stream(reusable, settings))
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        Some(&self.options)
    }

    async fn http_cleanup(&self) {
        self.closing.send_replace(true);
    }
}

/// Whether pingora refused the head for its `Transfer-Encoding` (a final coding other than
/// `chunked`). Pingora says so only in its error's context; `tests/framing.rs` pins the
/// answer, so a change of wording shows there.
fn unsupported_coding(e: &pingora_core::Error) -> bool {
    e.context
        .as_ref()
        .is_some_and(|c| c.as_str() == "non-chunked final Transfer-Encoding")
}
