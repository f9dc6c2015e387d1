//! The wire format of one sync message: a batch of [`SyncEvent`]s from one replica.
//!
//! Compact and hand-rolled (integers as LEB128 varints, hashes and backend references as
//! 8 little-endian bytes, TTFT inputs as `f32`):
//!
//! ```text
//! message    := version:u8 (= 1)  incarnation:u64  event*
//! event      := 1 dispatch | 2 first_token | 3 first_token_observed | 4 release | 5 snapshot
//! dispatch   := seq:var  backend:u64  prefill_tokens:var  kv_tokens:var  n:var  hash:u64 × n
//! first_token := seq:var
//! first_token_observed := seq:var  queued:f32 queued_sq:f32 uncached:f32 decodes:f32
//!                         waiting:f32 ttft_s:f32
//! release    := seq:var
//! snapshot   := n:var  (seq:var backend:u64 prefill_tokens:var kv_tokens:var decoding:u8) × n
//! ```
//!
//! A request costs one dispatch (≈ 14 bytes + 8 per prompt block of 16 tokens: the prefix
//! record is the bulk), one first token (≈ 3 bytes, or 27 with an observation) and one
//! release (≈ 3 bytes); batches share the 9-byte header. Decoding never panics and never
//! allocates more than the message's length justifies.

use super::{LiveBooking, Observation, SyncEvent};
use crate::load::RequestLoad;
use crate::predict::TtftInputs;
use crate::tokens::BlockHash;

/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the first event.
pub const HEADER_BYTES: usize = 9;

const DISPATCH: u8 = 1;
const FIRST_TOKEN: u8 = 2;
const FIRST_TOKEN_OBSERVED: u8 = 3;
const RELEASE: u8 = 4;
const SNAPSHOT: u8 = 5;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Another format version.
    #[error("unknown sync format version {0}")]
    Version(u8),
    /// Ended in the middle of a field.
    #[error("truncated sync message")]
    Truncated,
    /// An event tag this version does not know.
    #[error("unknown sync event tag {0}")]
    Tag(u8),
    /// A varint longer than 64 bits.
    #[error("malformed varint")]
    Varint,
}

/// Start a message from incarnation `incarnation` in `out` (cleared first).
pub fn begin(out: &mut Vec<u8>, incarnation: u64) {
    out.clear();
    out.push(VERSION);
    out.extend_from_slice(&incarnation.to_le_bytes());
}

/// Append `ev` to a message begun with [`begin`].
pub fn push(out: &mut Vec<u8>, ev: &SyncEvent) {
    match ev {
        SyncEvent::Dispatch {
            seq,
            backend,
            load,
            hashes,
        } => {
            out.push(DISPATCH);
            var(out, *seq);
            out.extend_from_slice(&backend.0.to_le_bytes());
            var(out, u64::from(load.prefill_tokens));
            var(out, load.kv_tokens);
            var(out, hashes.len() as u64);
            for h in hashes {
                out.extend_from_slice(&h.0.to_le_bytes());
            }
        }
        SyncEvent::FirstToken {
            seq,
            observed: None,
        } => {
            out.push(FIRST_TOKEN);
            var(out, *seq);
        }
        SyncEvent::FirstToken {
            seq,
            observed: Some(o),
        } => {
            out.push(FIRST_TOKEN_OBSERVED);
            var(out, *seq);
            let x = &o.inputs;
            for f in [
                x.queued_prefill_tokens,
                x.queued_prefill_sq,
                x.uncached_tokens,
                x.running_decodes,
                x.engine_waiting,
                o.ttft_s,
            ] {
                out.extend_from_slice(&(f as f32).to_le_bytes());
            }
        }
        SyncEvent::Release { seq } => {
            out.push(RELEASE);
            var(out, *seq);
        }
        SyncEvent::Snapshot { live } => {
            out.push(SNAPSHOT);
            var(out, live.len() as u64);
            for l in live {
                var(out, l.seq);
                out.extend_from_slice(&l.backend.0.to_le_bytes());
                var(out, u64::from(l.load.prefill_tokens));
                var(out, l.load.kv_tokens);
                out.push(u8::from(l.decoding));
            }
        }
    }
}

/// One message holding `events` (what [`decode`] reads back).
pub fn encode(incarnation: u64, events: &[SyncEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    begin(&mut out, incarnation);
    for ev in events {
        push(&mut out, ev);
    }
    out
}

/// The bytes `ev` adds to a message.
pub fn event_len(ev: &SyncEvent) -> usize {
    let mut out = Vec::new();
    push(&mut out, ev);
    out.len()
}

/// The sender's incarnation, read from the header alone.
pub fn incarnation(bytes: &[u8]) -> Option<u64> {
    match bytes.split_first_chunk::<HEADER_BYTES>() {
        Some((h, _)) if h[0] == VERSION => Some(u64::from_le_bytes(h[1..].try_into().ok()?)),
        _ => None,
    }
}

/// Read a message: its sender's incarnation and its events.
pub fn decode(bytes: &[u8]) -> Result<(u64, Vec<SyncEvent>), WireError> {
    let mut r = Reader { b: bytes };
    let v = r.u8()?;
    if v != VERSION {
        return Err(WireError::Version(v));
    }
    let incarnation = r.u64()?;
    let mut events = Vec::new();
    while !r.b.is_empty() {
        let ev = match r.u8()? {
            DISPATCH => {
                let seq = r.var()?;
                let backend = super::BackendRef(r.u64()?);
                let load = r.load()?;
                let n = r.count(8)?;
                let hashes = (0..n)
                    .map(|_| r.u64().map(BlockHash))
                    .collect::<Result<_, _>>()?;
                SyncEvent::Dispatch {
                    seq,
                    backend,
                    load,
                    hashes,
                }
            }
            FIRST_TOKEN => SyncEvent::FirstToken {
                seq: r.var()?,
                observed: None,
            },
            FIRST_TOKEN_OBSERVED => {
                let seq = r.var()?;
                let mut f = [0.0f64; 6];
                for x in &mut f {
                    *x = f64::from(r.f32()?);
                }
                SyncEvent::FirstToken {
                    seq,
                    observed: Some(Observation {
                        inputs: TtftInputs {
                            queued_prefill_tokens: f[0],
                            queued_prefill_sq: f[1],
                            uncached_tokens: f[2],
                            running_decodes: f[3],
                            engine_waiting: f[4],
                        },
                        ttft_s: f[5],
                    }),
                }
            }
            RELEASE => SyncEvent::Release { seq: r.var()? },
            SNAPSHOT => {
                // Each entry takes at least 1 + 8 + 1 + 1 + 1 bytes.
                let n = r.count(12)?;
                let mut live = Vec::with_capacity(n);
                for _ in 0..n {
                    let seq = r.var()?;
                    let backend = super::BackendRef(r.u64()?);
                    let load = r.load()?;
                    let decoding = r.u8()? != 0;
                    live.push(LiveBooking {
                        seq,
                        backend,
                        load,
                        decoding,
                    });
                }
                SyncEvent::Snapshot { live }
            }
            t => return Err(WireError::Tag(t)),
        };
        events.push(ev);
    }
    Ok((incarnation, events))
}

fn var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .b
            .split_first_chunk::<N>()
            .ok_or(WireError::Truncated)?;
        self.b = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn f32(&mut self) -> Result<f32, WireError> {
        Ok(f32::from_le_bytes(self.take()?))
    }

    fn var(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Varint)
    }

    /// A count of items of at least `min_bytes` each: never more than the rest can hold.
    fn count(&mut self, min_bytes: usize) -> Result<usize, WireError> {
        let n = self.var()?;
        if n > (self.b.len() / min_bytes) as u64 {
            return Err(WireError::Truncated);
        }
        Ok(n as usize)
    }

    fn load(&mut self) -> Result<RequestLoad, WireError> {
        Ok(RequestLoad {
            prefill_tokens: u32::try_from(self.var()?).unwrap_or(u32::MAX),
            kv_tokens: self.var()?,
        })
    }
}
