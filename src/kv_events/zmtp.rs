//! A minimal ZMTP 3.0 SUB client over a tokio `TcpStream` (NULL security, subscribe to all).
//!
//! A hand-written client rather than a ZMQ library's socket because the subscriber must know
//! exactly when its connection drops (ZMQ sockets reconnect silently, and a silent
//! reconnect loses messages): here end-of-stream is an error the caller sees, and the
//! resync rule (see [`super::index`]) is driven by sequence numbers.
//!
//! Handshake (RFC 23): send our 64-byte greeting (signature `FF 00…00 7F`, version 3.0,
//! mechanism `NULL`, as-server 0), read the peer's; send a `READY` command with
//! `Socket-Type: SUB`, read the peer's `READY`; then send the ZMTP 3.0 subscription message
//! `0x01` + topic (empty: everything). Frames are `flags, size (1 or 8 bytes), body` with flag
//! bits MORE (1), LONG (2), COMMAND (4). Commands after the handshake are skipped.

use std::io;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Largest frame accepted (a batch of events is a few KiB to a few MiB).
pub const MAX_FRAME_BYTES: u64 = 64 << 20;
/// Most frames in one message.
const MAX_FRAMES: usize = 16;

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

/// A connected subscription.
#[derive(Debug)]
pub struct SubConnection {
    io: BufReader<TcpStream>,
}

impl SubConnection {
    /// Connect to `addr` (`host:port`), handshake and subscribe to every topic.
    pub async fn connect(addr: &str) -> io::Result<SubConnection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut io = BufReader::new(stream);
        io.get_mut().write_all(&greeting()).await?;
        let mut peer = [0u8; 64];
        io.read_exact(&mut peer).await?;
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
        let mut conn = SubConnection { io };
        conn.write_frame(COMMAND, &ready).await?;
        let (flags, body) = conn.read_frame().await?;
        if flags & COMMAND == 0 || body.get(1..6) != Some(b"READY") {
            return Err(bad("ZMTP peer did not send READY"));
        }
        conn.write_frame(0, &[1]).await?;
        conn.io.get_mut().flush().await?;
        Ok(conn)
    }

    async fn write_frame(&mut self, flags: u8, body: &[u8]) -> io::Result<()> {
        let mut head = Vec::with_capacity(9);
        if body.len() > 255 {
            head.push(flags | LONG);
            head.extend_from_slice(&(body.len() as u64).to_be_bytes());
        } else {
            head.push(flags);
            head.push(body.len() as u8);
        }
        let w = self.io.get_mut();
        w.write_all(&head).await?;
        w.write_all(body).await
    }

    async fn read_frame(&mut self) -> io::Result<(u8, Bytes)> {
        let flags = self.io.read_u8().await?;
        let len = if flags & LONG != 0 {
            self.io.read_u64().await?
        } else {
            u64::from(self.io.read_u8().await?)
        };
        if len > MAX_FRAME_BYTES {
            return Err(bad("ZMTP frame too large"));
        }
        let mut body = vec![0u8; len as usize];
        self.io.read_exact(&mut body).await?;
        Ok((flags, Bytes::from(body)))
    }

    /// The next message's frames; an error when the connection ends or breaks the protocol.
    pub async fn recv(&mut self) -> io::Result<Vec<Bytes>> {
        let mut frames = Vec::with_capacity(3);
        loop {
            let (flags, body) = self.read_frame().await?;
            if flags & COMMAND != 0 {
                continue;
            }
            if frames.len() == MAX_FRAMES {
                return Err(bad("ZMTP message with too many frames"));
            }
            frames.push(body);
            if flags & MORE == 0 {
                return Ok(frames);
            }
        }
    }
}
