//! A minimal ZMTP 3.0 SUB client over a tokio `TcpStream` (NULL security, subscribe to all).
//!
//! A hand-written client rather than a ZMQ library's socket because the subscriber must know
//! exactly when its connection drops (ZMQ sockets reconnect silently, and a silent
//! reconnect loses messages): here end-of-stream is an error the caller sees, and the
//! resync rule (see [`pronto_core::kv_index`]) is driven by sequence numbers.
//!
//! Handshake (RFC 23): send our 64-byte greeting (signature `FF 00…00 7F`, version 3.0,
//! mechanism `NULL`, as-server 0), read the peer's; send a `READY` command with
//! `Socket-Type: SUB`, read the peer's `READY`; then send the ZMTP 3.0 subscription message
//! `0x01` + topic (empty: everything). Frames are `flags, size (1 or 8 bytes), body` with flag
//! bits MORE (1), LONG (2), COMMAND (4). Commands after the handshake are skipped.
//!
//! ## Cancel safety
//! The subscriber polls with a timeout (to notice that its backend is gone), so a read may be
//! cancelled at any byte. [`FrameReader`] owns the stream and a buffer of what has arrived
//! but is not yet a whole frame, and the frames of a message not yet complete: its only await
//! is a single `read_buf` into that buffer, which either appends bytes or reads nothing. A
//! cancelled [`FrameReader::next_message`] therefore loses nothing, and the next call resumes
//! where it stopped.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest frame accepted (a batch of events is a few KiB to a few MiB).
pub const MAX_FRAME_BYTES: u64 = 64 << 20;
/// Most frames in one message.
const MAX_FRAMES: usize = 16;
/// Bytes asked of the socket per read at least.
const READ_CHUNK: usize = 16 << 10;

const MORE: u8 = 1;
const LONG: u8 = 2;
const COMMAND: u8 = 4;

fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// One frame's header, when `buf` holds all of it: (flags, header length, body length).
fn frame_header(buf: &[u8]) -> io::Result<Option<(u8, usize, u64)>> {
    let Some(&flags) = buf.first() else {
        return Ok(None);
    };
    let (head, len) = if flags & LONG != 0 {
        let Some(size) = buf.get(1..9) else {
            return Ok(None);
        };
        (9, u64::from_be_bytes(size.try_into().expect("8 bytes")))
    } else {
        let Some(&size) = buf.get(1) else {
            return Ok(None);
        };
        (2, u64::from(size))
    };
    if len > MAX_FRAME_BYTES {
        return Err(bad("ZMTP frame too large"));
    }
    Ok(Some((flags, head, len)))
}

/// Frames (and the greeting) read from a byte stream, cancel-safe (see the module docs).
#[derive(Debug)]
pub struct FrameReader<R> {
    io: R,
    /// Bytes received and not yet returned.
    buf: BytesMut,
    /// Frames of the message being received.
    partial: Vec<Bytes>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader over `io`, nothing received yet.
    pub fn new(io: R) -> FrameReader<R> {
        FrameReader {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
            partial: Vec::new(),
        }
    }

    /// The stream (to write to it).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.io
    }

    /// Bytes received that are not yet part of a returned frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Read more into the buffer, wanting `want` bytes in it; end of stream is an error.
    /// Cancel-safe: `read_buf` either appends what it read or reads nothing.
    async fn fill(&mut self, want: usize) -> io::Result<()> {
        self.buf
            .reserve(want.saturating_sub(self.buf.len()).max(READ_CHUNK));
        if self.io.read_buf(&mut self.buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by the publisher",
            ));
        }
        Ok(())
    }

    /// The peer's 64-byte greeting. Cancel-safe.
    pub async fn greeting(&mut self) -> io::Result<[u8; 64]> {
        while self.buf.len() < 64 {
            self.fill(64).await?;
        }
        let mut g = [0u8; 64];
        self.buf.copy_to_slice(&mut g);
        Ok(g)
    }

    /// The next whole frame: its flags and body. Cancel-safe.
    pub async fn next_frame(&mut self) -> io::Result<(u8, Bytes)> {
        loop {
            if let Some((flags, head, len)) = frame_header(&self.buf)? {
                let total = head + len as usize;
                if self.buf.len() >= total {
                    self.buf.advance(head);
                    return Ok((flags, self.buf.split_to(len as usize).freeze()));
                }
                self.fill(total).await?;
            } else {
                self.fill(9).await?;
            }
        }
    }

    /// The next message's frames, commands skipped; an error when the connection ends or
    /// breaks the protocol. Cancel-safe: the frames of a message cut short by a
    /// cancellation are kept for the next call.
    pub async fn next_message(&mut self) -> io::Result<Vec<Bytes>> {
        loop {
            let (flags, body) = self.next_frame().await?;
            if flags & COMMAND != 0 {
                continue;
            }
            if self.partial.len() == MAX_FRAMES {
                return Err(bad("ZMTP message with too many frames"));
            }
            self.partial.push(body);
            if flags & MORE == 0 {
                return Ok(std::mem::take(&mut self.partial));
            }
        }
    }
}

/// A connected subscription.
#[derive(Debug)]
pub struct SubConnection {
    reader: FrameReader<TcpStream>,
}

impl SubConnection {
    /// Connect to `addr` (`host:port`), handshake and subscribe to every topic.
    pub async fn connect(addr: &str) -> io::Result<SubConnection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut conn = SubConnection {
            reader: FrameReader::new(stream),
        };
        conn.reader.get_mut().write_all(&greeting()).await?;
        let peer = conn.reader.greeting().await?;
        if peer[0] != 0xff || peer[9] != 0x7f {
            return Err(bad("not a ZMTP peer"));
        }
        if peer[10] < 3 {
            return Err(bad("ZMTP peer older than 3.0"));
        }
        if &peer[12..16] != b"NULL" {
            return Err(bad("ZMTP peer requires a security mechanism"));
        }
        let mut ready = Vec::with_capacity(32);
        ready.push(5);
        ready.extend_from_slice(b"READY");
        ready.push(11);
        ready.extend_from_slice(b"Socket-Type");
        ready.extend_from_slice(&3u32.to_be_bytes());
        ready.extend_from_slice(b"SUB");
        conn.write_frame(COMMAND, &ready).await?;
        let (flags, body) = conn.reader.next_frame().await?;
        if flags & COMMAND == 0 || body.get(1..6) != Some(b"READY") {
            return Err(bad("ZMTP peer did not send READY"));
        }
        conn.write_frame(0, &[1]).await?;
        conn.reader.get_mut().flush().await?;
        Ok(conn)
    }

    async fn write_frame(&mut self, flags: u8, body: &[u8]) -> io::Result<()> {
        let w = self.reader.get_mut();
        w.write_all(&encode_frame_head(flags, body.len())).await?;
        w.write_all(body).await
    }

    /// The next message's frames; an error when the connection ends or breaks the protocol.
    /// Cancel-safe ([`FrameReader::next_message`]): a timeout around it loses nothing.
    pub async fn recv(&mut self) -> io::Result<Vec<Bytes>> {
        self.reader.next_message().await
    }
}

/// A frame's header for a body of `len` bytes (short form up to 255 bytes).
pub fn encode_frame_head(flags: u8, len: usize) -> Vec<u8> {
    let mut head = Vec::with_capacity(9);
    if len > 255 {
        head.push(flags | LONG);
        head.extend_from_slice(&(len as u64).to_be_bytes());
    } else {
        head.push(flags);
        head.push(len as u8);
    }
    head
}

/// `frames` as one ZMTP message on the wire (what a publisher sends).
pub fn encode_message<F: AsRef<[u8]>>(frames: &[F]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let body = f.as_ref();
        let more = if i + 1 < frames.len() { MORE } else { 0 };
        out.extend_from_slice(&encode_frame_head(more, body.len()));
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
#[path = "zmtp_tests.rs"]
mod tests;
