//! Fewer writes: a stream wrapper that lets the proxy send what it already has in one write.
//!
//! Pingora's HTTP/1 sessions write each part of a message on its own and flush after it: a
//! response head, every body chunk (with its framing), the chunked terminator; on the upstream
//! side the request head, then the body. On an unbuffered socket each is a `send`. When the
//! proxy already holds the next part — the first chunk read before the head is written, the
//! body of a request, a chunk that is the last — those writes can be one.
//!
//! [`Coalesce`] wraps a connection's stream (client connections in the listener,
//! upstream connections in the proxy's connector). While *held* ([`hold`]) its writes are kept
//! and its flushes swallowed; once released, the kept bytes go out ahead of the next write, in
//! the same vectored write, or at the next flush. The proxy holds a stream only around a write
//! that is followed at once, without waiting for anything, by another write and a flush (see
//! the proxy's relay): so nothing is ever kept waiting for more data, and SSE latency is
//! unchanged. Unheld, the wrapper passes everything through (HTTP/2's codec, which buffers and
//! flushes on its own, never holds it).
//!
//! At most [`MAX_HELD`] bytes are kept: a larger held write goes out as if unheld.
//!
//! A client connection's wrapper also keeps a second descriptor of its socket
//! ([`Coalesce::abortable`]), so that the proxy can close a client that stopped reading
//! abortively ([`abort`]): `SO_LINGER` 0, then the drop of the connection resets it, and the
//! kernel discards what is still queued for the client instead of keeping it (and the socket)
//! until the client reads or its probes time out (nginx's `reset_timedout_connection`).

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::TlsRef;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes kept while held; beyond, writes go straight out.
pub const MAX_HELD: usize = 64 * 1024;
/// A kept buffer that grew beyond this is freed once sent, so an idle connection keeps none.
const KEEP_CAPACITY: usize = 4 * 1024;
/// Most slices of one vectored write (the kept bytes and the caller's).
const MAX_SLICES: usize = 8;

/// A stream whose writes can be held and sent together (see the module docs).
pub struct Coalesce<T = Stream> {
    inner: T,
    /// Bytes accepted while held, not yet sent; `kept[sent..]` is still to go.
    kept: Vec<u8>,
    sent: usize,
    hold: AtomicBool,
    /// Another descriptor of the client socket, for [`abort`]; closed after `inner`.
    abortable: Option<OwnedFd>,
    /// [`abort`] armed the reset: the connection must be dropped, not finished.
    aborted: AtomicBool,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Coalesce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesce")
            .field("inner", &self.inner)
            .field("kept", &(self.kept.len() - self.sent))
            .finish_non_exhaustive()
    }
}

impl<T> Coalesce<T> {
    /// `inner`, unheld.
    pub fn new(inner: T) -> Coalesce<T> {
        Coalesce {
            inner,
            kept: Vec::new(),
            sent: 0,
            hold: AtomicBool::new(false),
            abortable: None,
            aborted: AtomicBool::new(false),
        }
    }

    /// `inner`, unheld, that [`abort`] can reset through `socket` (a duplicate descriptor of
    /// the socket under `inner`). The socket stays open until both are dropped: `inner`
    /// first, then `socket`.
    pub fn abortable(inner: T, socket: OwnedFd) -> Coalesce<T> {
        Coalesce {
            abortable: Some(socket),
            ..Coalesce::new(inner)
        }
    }

    /// Hold (or release) this stream's writes.
    pub fn set_hold(&self, on: bool) {
        self.hold.store(on, Ordering::Relaxed);
    }

    fn held(&self) -> bool {
        self.hold.load(Ordering::Relaxed)
    }

    fn unsent(&self) -> usize {
        self.kept.len() - self.sent
    }

    /// Keep `bufs` (all of them) when held and within [`MAX_HELD`]; returns how many bytes.
    fn keep(&mut self, bufs: &[IoSlice<'_>]) -> Option<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if !self.held() || self.unsent() + total > MAX_HELD {
            return None;
        }
        for b in bufs {
            self.kept.extend_from_slice(b);
        }
        Some(total)
    }

    fn sent_all(&mut self) {
        self.kept.clear();
        self.sent = 0;
        if self.kept.capacity() > KEEP_CAPACITY {
            self.kept = Vec::new();
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesce<T> {
    /// Send the kept bytes, all of them.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.unsent() > 0 {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.kept[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.sent_all();
        Poll::Ready(Ok(()))
    }

    /// Write `bufs` unheld: the kept bytes first, in the same vectored write when the inner
    /// stream takes one. Returns how many of the caller's bytes went out; none of them is
    /// accepted until every kept byte is out (a `Pending` leaves the caller's bytes untaken).
    fn poll_write_through(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.unsent() > 0 && self.inner.is_write_vectored() {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            slices[0] = IoSlice::new(&self.kept[self.sent..]);
            let mut len = 1;
            for b in bufs.iter().take(MAX_SLICES - 1) {
                slices[len] = *b;
                len += 1;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &slices[..len]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let unsent = self.unsent();
            if n < unsent {
                self.sent += n;
            } else {
                self.sent_all();
                if n > unsent {
                    return Poll::Ready(Ok(n - unsent));
                }
            }
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

/// Hold (`on`) or release the writes of `stream` when it is a [`Coalesce`]; returns whether
/// it is one.
pub fn hold(stream: Option<&Stream>, on: bool) -> bool {
    match stream.and_then(|s| (**s).as_any().downcast_ref::<Coalesce>()) {
        Some(c) => {
            c.set_hold(on);
            true
        }
        None => false,
    }
}

/// Make the close of `stream`'s connection abortive: with `SO_LINGER` 0 the drop of the
/// connection sends a reset and the kernel drops whatever is still queued for the peer.
/// Returns whether it could (a client connection, see [`Coalesce::abortable`]); the caller
/// must then drop the connection without another write.
pub fn abort(stream: Option<&Stream>) -> bool {
    let Some(c) = stream.and_then(|s| (**s).as_any().downcast_ref::<Coalesce>()) else {
        return false;
    };
    c.aborted.store(true, Ordering::Relaxed);
    c.abortable.as_ref().is_some_and(|socket| {
        socket2::SockRef::from(socket)
            .set_linger(Some(Duration::ZERO))
            .is_ok()
    })
}

/// Whether [`abort`] was called on `stream`: its connection must be dropped at once, without
/// finishing the response (a write to a client that does not read would wait).
pub fn aborted(stream: Option<&Stream>) -> bool {
    stream
        .and_then(|s| (**s).as_any().downcast_ref::<Coalesce>())
        .is_some_and(|c| c.aborted.load(Ordering::Relaxed))
}

/// Whether `stream`'s writes are held now (for tests and assertions).
pub fn is_held(stream: Option<&Stream>) -> bool {
    stream
        .and_then(|s| (**s).as_any().downcast_ref::<Coalesce>())
        .is_some_and(Coalesce::held)
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesce<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesce<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let bufs = [IoSlice::new(data)];
        if let Some(n) = self.keep(&bufs) {
            return Poll::Ready(Ok(n));
        }
        if self.unsent() == 0 {
            return Pin::new(&mut self.inner).poll_write(cx, data);
        }
        self.poll_write_through(cx, &bufs)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(n) = self.keep(bufs) {
            return Poll::Ready(Ok(n));
        }
        self.poll_write_through(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        // Held writes are always taken whole; unheld ones are the inner stream's.
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.held() {
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for Coalesce {
    async fn shutdown(&mut self) {
        let _ = std::future::poll_fn(|cx| self.poll_drain(cx)).await;
        self.inner.shutdown().await
    }
}

impl UniqueID for Coalesce {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Coalesce {
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

impl GetTimingDigest for Coalesce {
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

impl GetProxyDigest for Coalesce {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for Coalesce {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for Coalesce {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Records each write that reaches it, one entry per call; `room` bytes per call at most.
    #[derive(Default)]
    struct Writes {
        calls: Vec<Vec<u8>>,
        room: Option<usize>,
    }

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = self.room.unwrap_or(usize::MAX).min(data.len());
            self.calls.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            all.truncate(self.room.unwrap_or(usize::MAX));
            let n = all.len();
            self.calls.push(all);
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn unheld_writes_pass_straight_through() {
        rt().block_on(async {
            let mut c = Coalesce::new(Writes::default());
            c.write_all(b"head").await.unwrap();
            c.flush().await.unwrap();
            c.write_all(b"chunk").await.unwrap();
            c.flush().await.unwrap();
            assert_eq!(c.inner.calls, vec![b"head".to_vec(), b"chunk".to_vec()]);
        });
    }

    #[test]
    fn a_held_write_and_its_flush_go_out_with_the_next_write() {
        rt().block_on(async {
            let mut c = Coalesce::new(Writes::default());
            c.set_hold(true);
            c.write_all(b"head|").await.unwrap();
            c.flush().await.unwrap();
            assert!(c.inner.calls.is_empty(), "nothing sent while held");
            c.set_hold(false);
            let (chunk, data) = (b"5\r\n", b"hello\r\n");
            // As pingora writes a chunk: its size line and data in one vectored write.
            let n = c
                .write_vectored(&[IoSlice::new(chunk), IoSlice::new(data)])
                .await
                .unwrap();
            assert_eq!(n, chunk.len() + data.len());
            c.flush().await.unwrap();
            assert_eq!(c.inner.calls, vec![b"head|5\r\nhello\r\n".to_vec()]);
        });
    }

    #[test]
    fn released_bytes_go_out_at_the_next_flush() {
        rt().block_on(async {
            let mut c = Coalesce::new(Writes::default());
            c.set_hold(true);
            c.write_all(b"last chunk").await.unwrap();
            c.set_hold(false);
            assert!(c.inner.calls.is_empty());
            c.flush().await.unwrap();
            assert_eq!(c.inner.calls, vec![b"last chunk".to_vec()]);
            assert_eq!(c.unsent(), 0);
        });
    }

    #[test]
    fn a_partial_vectored_write_loses_and_repeats_nothing() {
        rt().block_on(async {
            let mut c = Coalesce::new(Writes {
                room: Some(3),
                ..Writes::default()
            });
            c.set_hold(true);
            c.write_all(b"abcdefgh").await.unwrap();
            c.set_hold(false);
            c.write_all(b"ijklm").await.unwrap();
            c.flush().await.unwrap();
            let sent: Vec<u8> = c.inner.calls.concat();
            assert_eq!(sent, b"abcdefghijklm");
        });
    }

    #[test]
    fn more_than_max_held_is_not_kept() {
        rt().block_on(async {
            let mut c = Coalesce::new(Writes::default());
            c.set_hold(true);
            c.write_all(b"head").await.unwrap();
            let big = vec![b'x'; MAX_HELD];
            c.write_all(&big).await.unwrap();
            assert_eq!(c.inner.calls.concat().len(), 4 + MAX_HELD);
            assert_eq!(c.unsent(), 0);
        });
    }

    #[test]
    fn shutdown_sends_what_is_kept() {
        rt().block_on(async {
            let mut c = Coalesce::new(Writes::default());
            c.set_hold(true);
            c.write_all(b"tail").await.unwrap();
            AsyncWriteExt::shutdown(&mut c).await.unwrap();
            assert_eq!(c.inner.calls, vec![b"tail".to_vec()]);
        });
    }
}
