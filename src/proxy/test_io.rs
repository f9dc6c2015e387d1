//! A connection for tests of what the proxy writes: reads come from a duplex pipe, and each
//! write call that reaches it is recorded (one entry per call).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::Notify;

/// A client connection: reads come from a duplex pipe, each write call is recorded.
#[derive(Debug)]
pub struct Recorder {
    /// Where reads come from.
    pub reads: DuplexStream,
    /// Each write call, in order.
    pub writes: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Notified at each write.
    pub wrote: Arc<Notify>,
}

impl AsyncRead for Recorder {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reads).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.writes.lock().unwrap().push(data.to_vec());
        self.wrote.notify_one();
        Poll::Ready(Ok(data.len()))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        let n = all.len();
        self.writes.lock().unwrap().push(all);
        self.wrote.notify_one();
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

#[async_trait]
impl Shutdown for Recorder {
    async fn shutdown(&mut self) {}
}
impl UniqueID for Recorder {
    fn id(&self) -> UniqueIDType {
        0
    }
}
impl Ssl for Recorder {}
impl GetTimingDigest for Recorder {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        vec![]
    }
}
impl GetProxyDigest for Recorder {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        None
    }
}
impl GetSocketDigest for Recorder {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        None
    }
}
impl Peek for Recorder {}
