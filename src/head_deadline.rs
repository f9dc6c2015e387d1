//! A deadline on request heads, at the socket: a client must send each request head, from
//! its first byte to the blank line that ends it, within `limits.header_timeout`.
//!
//! Pingora times out each read of a head (60 s), not the whole head, so a client trickling one
//! header line every few seconds — or a garbage request line with no end — would keep its
//! connection for minutes. [`HeadDeadline`] wraps the accepted stream and watches the bytes
//! read: once a head has begun, it must end (`\r\n\r\n`) before the deadline, or reads fail
//! with `TimedOut` and pingora closes the connection. After the head, the body's deadlines are
//! the proxy's; the next head on a keep-alive connection starts once the gateway has written
//! its answer to the previous one. An HTTP/2 connection (the client preface `PRI * HTTP/2.0`,
//! or ALPN `h2`) is not watched: h2 frames its own headers.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::TlsRef;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, SocketDigest, TimingDigest,
};
use pingora_core::protocols::{Peek, Shutdown, Ssl, UniqueID, UniqueIDType, ALPN, IO};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const END: &[u8] = b"\r\n\r\n";
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the first byte of a head (no deadline: idle keep-alive is pingora's).
    Idle,
    /// A head has begun: `matched` bytes of `\r\n\r\n` seen at its end so far.
    InHead { matched: usize },
    /// Past a head: body or answer; the next head starts after the gateway writes.
    AfterHead { wrote: bool },
    /// Not watched (HTTP/2).
    Off,
}

/// A stream whose request heads must complete within a deadline (see the module docs).
pub struct HeadDeadline<T> {
    inner: T,
    timeout: Duration,
    state: State,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for HeadDeadline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadDeadline")
            .field("inner", &self.inner)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<T: IO> HeadDeadline<T> {
    /// Watch `inner`'s request heads; `timeout` per head.
    pub fn new(inner: T, timeout: Duration) -> HeadDeadline<T> {
        let h2 = matches!(inner.selected_alpn_proto(), Some(ALPN::H2));
        HeadDeadline {
            inner,
            timeout,
            state: if h2 { State::Off } else { State::Idle },
            timer: None,
        }
    }
}

impl<T> HeadDeadline<T> {
    /// Advance the state machine over `data`, just read.
    fn scan(&mut self, data: &[u8]) {
        let mut i = 0;
        while i < data.len() {
            match self.state {
                State::Off => return,
                State::Idle | State::AfterHead { wrote: true } => {
                    if data[i..].starts_with(H2_PREFACE) {
                        self.state = State::Off;
                        self.timer = None;
                        return;
                    }
                    self.state = State::InHead { matched: 0 };
                    self.timer = Some(Box::pin(tokio::time::sleep(self.timeout)));
                }
                State::InHead { matched } => {
                    let b = data[i];
                    let matched = if b == END[matched] {
                        matched + 1
                    } else if b == END[0] {
                        1
                    } else {
                        0
                    };
                    i += 1;
                    if matched == END.len() {
                        self.state = State::AfterHead { wrote: false };
                        self.timer = None;
                    } else {
                        self.state = State::InHead { matched };
                    }
                }
                State::AfterHead { wrote: false } => return,
            }
        }
    }
}

impl<T: IO> AsyncRead for HeadDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(t) = this.timer.as_mut() {
            if t.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request head not complete within limits.header_timeout",
                )));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let filled = buf.filled()[before..].to_vec();
            this.scan(&filled);
        }
        r
    }
}

impl<T: IO> AsyncWrite for HeadDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            if let State::AfterHead { wrote: false } = self.state {
                self.state = State::AfterHead { wrote: true };
            }
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            if let State::AfterHead { wrote: false } = self.state {
                self.state = State::AfterHead { wrote: true };
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl<T: IO> Shutdown for HeadDeadline<T> {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl<T: IO> UniqueID for HeadDeadline<T> {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl<T: IO> Ssl for HeadDeadline<T> {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }
    fn get_ssl_digest(&self) -> Option<Arc<pingora_core::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }
    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl<T: IO> GetTimingDigest for HeadDeadline<T> {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }
    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl<T: IO> GetProxyDigest for HeadDeadline<T> {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl<T: IO> GetSocketDigest for HeadDeadline<T> {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl<T: IO> Peek for HeadDeadline<T> {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(chunks: &[&[u8]]) -> State {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, _b) = tokio::io::duplex(64);
            let mut h = HeadDeadline {
                inner: a,
                timeout: Duration::from_secs(1),
                state: State::Idle,
                timer: None,
            };
            for c in chunks {
                h.scan(c);
            }
            h.state
        })
    }

    #[test]
    fn a_head_ends_at_the_blank_line_however_it_is_split() {
        assert_eq!(
            scanned(&[b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"]),
            State::AfterHead { wrote: false }
        );
        assert_eq!(
            scanned(&[b"GET / HTTP/1.1\r\nHost: x\r", b"\n\r", b"\n"]),
            State::AfterHead { wrote: false }
        );
        assert!(matches!(
            scanned(&[b"GET / HTTP/1.1\r\nHost: x\r\n"]),
            State::InHead { .. }
        ));
        assert!(matches!(scanned(&[b"\r\r\n\r\r\n"]), State::InHead { .. }));
        assert_eq!(scanned(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]), State::Off);
    }
}
