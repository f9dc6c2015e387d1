//! A deadline on request heads, at the socket: a client must send each request head, from
//! its first byte to the blank line that ends it, within `limits.header_timeout`.
//!
//! Pingora times out each read of a head (60 s), not the whole head, so a client trickling one
//! header line every few seconds — or a garbage request line with no end — would keep its
//! connection for minutes. [`HeadDeadline`] wraps the accepted stream and watches the bytes
//! read: once a head has begun, it must end (`\r\n\r\n`) before the deadline, or reads fail
//! with `TimedOut` and pingora closes the connection. After the head, the body's deadlines are
//! the proxy's; the next head on a keep-alive connection starts once the gateway has written
//! its answer to the previous one. The wait for that next head is not timed here but by
//! pingora's keep-alive timeout (`limits.keepalive_timeout`): this wrapper cannot tell a client
//! waiting between requests from one reading a long stream, and a read that failed mid-stream
//! would end the stream as if the client had hung up. An HTTP/2 connection (the client
//! preface `PRI * HTTP/2.0`, or ALPN `h2`) is not watched: h2 frames its own headers, and its
//! idle connections are pingora's `h2_idle_timeout` (set from the same limit).
//!
//! The wrapper also follows the stream with [`crate::edge::framing`]'s strict RFC 9112 checker: at
//! the first byte outside the grammar it hands pingora only the bytes before it and fails
//! every later read, so the request's body read fails (400, connection closed).
//!
//! The wrapper also keeps the edge's answers in one vocabulary. A head that misses its deadline
//! gets a 408 and one longer than [`MAX_HEAD_WIRE_BYTES`] a 431 (OpenAI-style JSON, written
//! here before the read fails). Pingora answers a head it cannot parse with a canned, empty
//! response carrying `Server: Pingora`; such a response is replaced on its way out by the same
//! JSON error ([`GatewayError::to_http1_close`]) — a 431 when the head had more header lines
//! than pingora accepts, a 501 for pingora's refusal of a transfer coding, a 400 otherwise.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::edge::framing::Checker;
use crate::error::GatewayError;
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

/// Longest request head read (request line, header lines and framing): beyond it the
/// connection gets a 431 and is closed, so no connection buffers more than this for its head
/// (pingora would buffer up to 1 MiB). Above `gate::MAX_HEADER_BYTES` so that the gate's
/// finer check, which names the limit, answers the heads it can.
pub const MAX_HEAD_WIRE_BYTES: usize = 128 * 1024;
/// Pingora's limit on header lines in one head (`MAX_HEADERS` in its HTTP/1 code); a head with
/// more gets its canned 400, which is answered here as a 431.
const PINGORA_MAX_HEADERS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the first byte of a head. A fresh connection has `header_timeout` to begin
    /// one; after an answer the wait is pingora's keep-alive timeout (`limits.keepalive_timeout`,
    /// set per request by the proxy), which applies only while pingora reads a head.
    Idle,
    /// A head has begun: `matched` bytes of `\r\n\r\n` seen at its end so far, `bytes` and
    /// `lines` (line feeds) read of it.
    InHead {
        matched: usize,
        bytes: usize,
        lines: usize,
    },
    /// Past a head: body or answer; the next head starts after the gateway writes. No deadline
    /// here: the relay's hang-up probe reads in this state for as long as a stream lasts.
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
    /// Header lines of the last head that did not complete (for the canned-400 rewrite).
    unfinished_lines: usize,
    /// A replacement for a canned pingora response being written, and how much is out.
    reply: Option<(Vec<u8>, usize)>,
    /// Bytes already read (and scanned) by [`Peek::try_peek`], served to the next reads.
    replay: Vec<u8>,
    /// The strict framing checker over everything read ([`crate::edge::framing`]).
    framing: Checker,
    /// The checker's verdict once it found a violation: every later read fails with it.
    malformed: Option<&'static str>,
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
            // A fresh connection must begin its first head within the same deadline.
            timer: (!h2).then(|| Box::pin(tokio::time::sleep(timeout))),
            unfinished_lines: 0,
            reply: None,
            replay: Vec::new(),
            framing: if h2 { Checker::off() } else { Checker::new() },
            malformed: None,
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
                    self.state = State::InHead {
                        matched: 0,
                        bytes: 0,
                        lines: 0,
                    };
                    // From the head's first byte (replacing the idle deadline).
                    self.timer = Some(Box::pin(tokio::time::sleep(self.timeout)));
                }
                State::InHead {
                    matched,
                    bytes,
                    lines,
                } => {
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
                        let lines = lines + usize::from(b == b'\n');
                        self.unfinished_lines = lines;
                        self.state = State::InHead {
                            matched,
                            bytes: bytes + 1,
                            lines,
                        };
                    }
                }
                State::AfterHead { wrote: false } => return,
            }
        }
    }
}

impl<T: IO> HeadDeadline<T> {
    /// Write `e` as the connection's last answer, best effort (a small response into an idle
    /// socket's buffer; a client that does not read just misses it), and stop watching.
    fn answer_and_fail(&mut self, cx: &mut Context<'_>, e: &GatewayError) {
        let bytes = e.to_http1_close();
        let mut inner = Pin::new(&mut self.inner);
        if let Poll::Ready(Ok(_)) = inner.as_mut().poll_write(cx, &bytes) {
            let _ = inner.poll_flush(cx);
        }
        self.state = State::Off;
    }

    /// Write `data`, or, when it is pingora's canned error response, the JSON error in its
    /// place (reporting `data` as written once the replacement is out).
    fn write(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if self.reply.is_none() {
            if let Some(status) = pingora_canned_status(data) {
                let e = match status {
                    400 if self.unfinished_lines > PINGORA_MAX_HEADERS => {
                        GatewayError::HeadersTooLarge(format!(
                            "more than {PINGORA_MAX_HEADERS} header lines"
                        ))
                    }
                    501 => GatewayError::UnsupportedTransferCoding(
                        "with a final coding other than `chunked`".into(),
                    ),
                    405 => GatewayError::MethodNotAllowed {
                        method: "CONNECT".into(),
                        path: "*".into(),
                    },
                    _ => GatewayError::BadRequest("Malformed HTTP request".into()),
                };
                self.reply = Some((e.to_http1_close(), 0));
            }
        }
        let Some((bytes, sent)) = self.reply.as_mut() else {
            return Pin::new(&mut self.inner).poll_write(cx, data);
        };
        while *sent < bytes.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*sent..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.reply = None;
        Poll::Ready(Ok(data.len()))
    }
}

impl<T> HeadDeadline<T> {
    /// `data` went out: past a head, the answer has begun — unless it is a `100 Continue`,
    /// after which the request body is still to come (and must not be read as a head).
    fn wrote(&mut self, data: &[u8]) {
        if self.state == (State::AfterHead { wrote: false }) && !data.starts_with(b"HTTP/1.1 100 ")
        {
            self.state = State::AfterHead { wrote: true };
        }
    }
}

/// The status of `data` when it is one of pingora's canned error responses (an empty
/// `HTTP/1.1 4xx` or `501` with `Server: Pingora`), which only pingora writes: the gateway's own
/// responses carry no `Server` header.
fn pingora_canned_status(data: &[u8]) -> Option<u16> {
    let rest = data.strip_prefix(b"HTTP/1.1 ")?;
    let status: u16 = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    if !(400..500).contains(&status) && status != 501 {
        return None;
    }
    let head_end = data.windows(4).position(|w| w == END)?;
    let head = &data[..head_end];
    head.split(|&b| b == b'\n')
        .any(|line| line.trim_ascii().eq_ignore_ascii_case(b"server: pingora"))
        .then_some(status)
}

/// The read error that carries a framing violation to pingora (and so to the gateway's
/// `GatewayError::Framing` answer).
fn malformed(reason: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

impl<T: IO> AsyncRead for HeadDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(reason) = this.malformed {
            return Poll::Ready(Err(malformed(reason)));
        }
        if !this.replay.is_empty() {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay[..n]);
            this.replay.drain(..n);
            return Poll::Ready(Ok(()));
        }
        if let Some(t) = this.timer.as_mut() {
            if t.as_mut().poll(cx).is_ready() {
                this.timer = None;
                if matches!(this.state, State::InHead { .. }) {
                    this.answer_and_fail(cx, &GatewayError::HeadTimeout);
                } else {
                    // Nothing of a request arrived: close without an answer.
                    this.state = State::Off;
                }
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request head not complete within limits.header_timeout",
                )));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.scan(&buf.filled()[before..]);
            if let Err(v) = this.framing.feed(&buf.filled()[before..]) {
                // Pingora gets the bytes before the violation, and the next read fails: the
                // body read fails, and nothing after the violation is ever parsed.
                this.malformed = Some(v.reason);
                buf.set_filled(before + v.at);
                if v.at == 0 {
                    return Poll::Ready(Err(malformed(v.reason)));
                }
            }
            if matches!(this.state, State::InHead { bytes, .. } if bytes > MAX_HEAD_WIRE_BYTES) {
                this.timer = None;
                let e = GatewayError::HeadersTooLarge(format!(
                    "the request head is longer than {MAX_HEAD_WIRE_BYTES} bytes"
                ));
                this.answer_and_fail(cx, &e);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request head longer than MAX_HEAD_WIRE_BYTES",
                )));
            }
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
        let r = self.write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote(data);
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
        let first = bufs.iter().find(|b| !b.is_empty());
        let r = match first {
            Some(b) if self.reply.is_some() || pingora_canned_status(b).is_some() => {
                self.write(cx, b)
            }
            _ => Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
        };
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            if let Some(b) = bufs.iter().find(|b| !b.is_empty()) {
                self.wrote(b);
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
        // Through this stream's own reads, so the deadlines apply to the peek too (pingora
        // peeks for the h2c preface, 24 bytes, before reading a head: a client sending fewer
        // and stalling would otherwise wait forever), then served again to the next reads.
        use tokio::io::AsyncReadExt;
        self.read_exact(buf).await?;
        let mut replay = buf.to_vec();
        replay.append(&mut self.replay);
        self.replay = replay;
        Ok(true)
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
                unfinished_lines: 0,
                reply: None,
                replay: Vec::new(),
                framing: Checker::new(),
                malformed: None,
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

    #[test]
    fn a_100_continue_is_not_the_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, _b) = tokio::io::duplex(64);
            let mut h = HeadDeadline::new(a, Duration::from_secs(1));
            h.scan(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n");
            h.wrote(b"HTTP/1.1 100 Continue\r\n\r\n");
            // The body that follows is not a head.
            h.scan(b"{\"model\": \"m\"}");
            assert_eq!(h.state, State::AfterHead { wrote: false });
            h.wrote(b"HTTP/1.1 200 OK\r\n");
            assert_eq!(h.state, State::AfterHead { wrote: true });
        });
    }

    #[test]
    fn only_pingoras_canned_responses_are_recognised() {
        let canned = b"HTTP/1.1 400 Bad Request\r\nServer: Pingora\r\nDate: x\r\n\
                       Content-Length: 0\r\nCache-Control: private, no-store\r\n\r\n";
        assert_eq!(pingora_canned_status(canned), Some(400));
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\r\n{}";
        assert_eq!(pingora_canned_status(ours), None);
        let body = b"HTTP/1.1 200 OK\r\nserver: pingora\r\n\r\n";
        assert_eq!(pingora_canned_status(body), None);
        assert_eq!(
            pingora_canned_status(b"data: server: pingora\r\n\r\n"),
            None
        );
    }

    #[test]
    fn a_canned_response_is_replaced_by_the_json_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (a, mut b) = tokio::io::duplex(64 * 1024);
            let mut h = HeadDeadline {
                inner: a,
                timeout: Duration::from_secs(1),
                state: State::Idle,
                timer: None,
                unfinished_lines: 300,
                reply: None,
                replay: Vec::new(),
                framing: Checker::new(),
                malformed: None,
            };
            let canned = b"HTTP/1.1 400 Bad Request\r\nServer: Pingora\r\n\r\n";
            h.write_all(canned).await.unwrap();
            AsyncWriteExt::shutdown(&mut h).await.unwrap();
            drop(h);
            let mut got = String::new();
            b.read_to_string(&mut got).await.unwrap();
            assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
            assert!(
                got.contains("\"code\":\"request_header_fields_too_large\""),
                "{got}"
            );
            assert!(!got.to_ascii_lowercase().contains("pingora"), "{got}");
        });
    }
}
