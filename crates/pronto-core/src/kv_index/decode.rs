//! Decoding (and, for the simulator and fixtures, encoding) of engine KV-cache event messages.
//!
//! The wire format: the module docs of [`super`] (`pronto_core::kv_index`).

use bytes::Bytes;
use rmpv::Value;

/// An engine's identifier of one KV block (its block hash folded to 64 bits).
pub(crate) type EngineHash = u64;

/// One cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks entered the prefix cache, in chain order.
    BlockStored {
        /// One hash per stored block.
        block_hashes: Vec<EngineHash>,
        /// Hash of the block before the first one (`None`: the first block of a prompt).
        parent: Option<EngineHash>,
        /// Token ids of every stored block, concatenated (`block_size` per block).
        token_ids: Vec<u32>,
        /// Tokens per block, when the event says (`None`: use the configured size).
        block_size: Option<usize>,
    },
    /// Blocks left the cache.
    BlockRemoved {
        /// Hashes of the removed blocks.
        block_hashes: Vec<EngineHash>,
    },
    /// The whole cache was cleared.
    AllBlocksCleared,
    /// An event type this decoder does not know (ignored).
    Other(String),
}

/// One published batch.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Publisher sequence number.
    pub seq: u64,
    /// Publisher timestamp (seconds).
    pub ts: f64,
    /// Events in order.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank, when given.
    pub dp_rank: Option<i64>,
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not 2 or 3 frames.
    #[error("expected [topic, seq, payload] frames, got {0} frames")]
    Frames(usize),
    /// The sequence frame is not 8 bytes.
    #[error("sequence frame is {0} bytes, expected 8")]
    Seq(usize),
    /// The payload is not msgpack.
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    /// The payload or an event has the wrong shape.
    #[error("malformed {0}")]
    Shape(&'static str),
}

/// Decode one multipart message.
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<EventBatch, DecodeError> {
    let (seq, payload) = match frames {
        [_topic, seq, payload] => (seq.as_ref(), payload.as_ref()),
        [seq, payload] => (seq.as_ref(), payload.as_ref()),
        _ => return Err(DecodeError::Frames(frames.len())),
    };
    let seq: [u8; 8] = seq.try_into().map_err(|_| DecodeError::Seq(seq.len()))?;
    let mut rd = payload;
    let v = rmpv::decode::read_value(&mut rd).map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    let Value::Array(parts) = v else {
        return Err(DecodeError::Shape("batch: not an array"));
    };
    let ts = parts.first().and_then(as_f64).unwrap_or(0.0);
    let events = match parts.get(1) {
        Some(Value::Array(evs)) => evs.iter().map(decode_event).collect::<Result<_, _>>()?,
        _ => return Err(DecodeError::Shape("batch: no event list")),
    };
    let dp_rank = parts.get(2).and_then(Value::as_i64);
    Ok(EventBatch {
        seq: u64::from_be_bytes(seq),
        ts,
        events,
        dp_rank,
    })
}

fn as_f64(v: &Value) -> Option<f64> {
    v.as_f64()
        .or_else(|| v.as_i64().map(|x| x as f64))
        .or_else(|| v.as_u64().map(|x| x as f64))
}

/// A hash as 64 bits: integers keep their bit pattern, byte strings are folded (FNV-1a 64).
fn as_hash(v: &Value) -> Option<EngineHash> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => Some(fold_bytes(b)),
        Value::String(s) => Some(fold_bytes(s.as_bytes())),
        _ => None,
    }
}

fn fold_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn hashes(v: Option<&Value>) -> Result<Vec<EngineHash>, DecodeError> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .map(|h| as_hash(h).ok_or(DecodeError::Shape("block hash")))
            .collect(),
        _ => Err(DecodeError::Shape("block_hashes")),
    }
}

fn token_ids(v: Option<&Value>) -> Result<Vec<u32>, DecodeError> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or(DecodeError::Shape("token id"))
            })
            .collect(),
        None | Some(Value::Nil) => Ok(Vec::new()),
        _ => Err(DecodeError::Shape("token_ids")),
    }
}

/// An event's fields, by name (map encoding) or by position (tagged arrays).
enum Fields<'a> {
    Map(&'a [(Value, Value)]),
    Array(&'a [Value]),
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str, pos: usize) -> Option<&'a Value> {
        match self {
            Fields::Map(m) => m
                .iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v),
            Fields::Array(a) => a.get(pos),
        }
    }
}

fn decode_event(v: &Value) -> Result<KvEvent, DecodeError> {
    let fields = match v {
        Value::Map(m) => Fields::Map(m),
        Value::Array(a) => Fields::Array(a),
        _ => return Err(DecodeError::Shape("event: neither map nor array")),
    };
    let kind = fields
        .get("type", 0)
        .and_then(Value::as_str)
        .ok_or(DecodeError::Shape("event: no type"))?;
    let get = |name: &str, pos: usize| fields.get(name, pos);
    Ok(match kind {
        "BlockStored" => KvEvent::BlockStored {
            block_hashes: hashes(get("block_hashes", 1))?,
            parent: get("parent_block_hash", 2).and_then(as_hash),
            token_ids: token_ids(get("token_ids", 3))?,
            block_size: get("block_size", 4)
                .and_then(Value::as_u64)
                .and_then(|x| usize::try_from(x).ok())
                .filter(|&x| x > 0),
        },
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes(get("block_hashes", 1))?,
        },
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        other => KvEvent::Other(other.to_string()),
    })
}

/// How [`encode_message`] writes events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Maps with a `type` key (vLLM's current publisher).
    Map,
    /// Tagged arrays (older vLLM, SGLang).
    Array,
}

/// Encode one batch as `[topic, seq, payload]` frames (the simulator's publisher and the
/// fixtures use it). Integer hashes; `medium: "GPU"` and `lora_id: nil` as vLLM writes them.
#[allow(clippy::expect_used)] // publishers only, never a request; a Vec write cannot fail
pub fn encode_message(
    topic: &[u8],
    seq: u64,
    ts: f64,
    events: &[KvEvent],
    encoding: Encoding,
) -> [Bytes; 3] {
    let evs = events.iter().map(|e| encode_event(e, encoding)).collect();
    let payload = Value::Array(vec![Value::F64(ts), Value::Array(evs), Value::Nil]);
    let mut buf = Vec::with_capacity(64);
    rmpv::encode::write_value(&mut buf, &payload).expect("writing to a Vec cannot fail");
    [
        Bytes::copy_from_slice(topic),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        Bytes::from(buf),
    ]
}

fn encode_event(e: &KvEvent, encoding: Encoding) -> Value {
    let hash_list = |hs: &[EngineHash]| Value::Array(hs.iter().map(|&h| Value::from(h)).collect());
    let (kind, fields): (&str, Vec<(&str, Value)>) = match e {
        KvEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
        } => (
            "BlockStored",
            vec![
                ("block_hashes", hash_list(block_hashes)),
                ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
                (
                    "token_ids",
                    Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                ),
                (
                    "block_size",
                    block_size.map_or(Value::Nil, |b| Value::from(b as u64)),
                ),
                ("lora_id", Value::Nil),
                ("medium", Value::from("GPU")),
            ],
        ),
        KvEvent::BlockRemoved { block_hashes } => (
            "BlockRemoved",
            vec![
                ("block_hashes", hash_list(block_hashes)),
                ("medium", Value::from("GPU")),
            ],
        ),
        KvEvent::AllBlocksCleared => ("AllBlocksCleared", Vec::new()),
        KvEvent::Other(name) => (name.as_str(), Vec::new()),
    };
    match encoding {
        Encoding::Map => {
            let mut m = vec![(Value::from("type"), Value::from(kind))];
            m.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
            Value::Map(m)
        }
        Encoding::Array => {
            let mut a = vec![Value::from(kind)];
            a.extend(fields.into_iter().map(|(_, v)| v));
            Value::Array(a)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![1, u64::MAX],
            parent: Some(7),
            token_ids: (0..32).collect(),
            block_size: Some(16),
        }
    }

    #[test]
    fn both_encodings_round_trip() {
        let evs = vec![
            stored(),
            KvEvent::BlockRemoved {
                block_hashes: vec![3],
            },
            KvEvent::AllBlocksCleared,
        ];
        for enc in [Encoding::Map, Encoding::Array] {
            let frames = encode_message(b"", 42, 1.5, &evs, enc);
            let b = decode_message(&frames).unwrap();
            assert_eq!(b.seq, 42);
            assert_eq!(b.ts, 1.5);
            assert_eq!(b.events, evs, "{enc:?}");
            assert_eq!(b.dp_rank, None);
            // Without the topic frame.
            assert_eq!(decode_message(&frames[1..]).unwrap().events, evs);
        }
    }

    #[test]
    fn byte_hashes_negative_ints_unknown_types_and_trailing_fields() {
        let ev = Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(vec![Value::Binary(vec![1, 2, 3]), Value::from(-1i64)]),
            Value::Nil,
            Value::Array(vec![Value::from(5u32); 2]),
            Value::from(1u64),
            Value::Nil,
            Value::from("GPU"),
            Value::from("some future field"),
        ]);
        let unknown = Value::Map(vec![
            (Value::from("type"), Value::from("BlockMoved")),
            (Value::from("x"), Value::from(1)),
        ]);
        let payload = Value::Array(vec![
            Value::from(3i64),
            Value::Array(vec![ev, unknown]),
            Value::from(2i64),
        ]);
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &payload).unwrap();
        let b = decode_message(&[&b"kv"[..], &9u64.to_be_bytes(), &buf]).unwrap();
        assert_eq!(b.dp_rank, Some(2));
        assert_eq!(b.ts, 3.0);
        assert_eq!(
            b.events,
            [
                KvEvent::BlockStored {
                    block_hashes: vec![fold_bytes(&[1, 2, 3]), u64::MAX],
                    parent: None,
                    token_ids: vec![5, 5],
                    block_size: Some(1),
                },
                KvEvent::Other("BlockMoved".into()),
            ]
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        let ok = encode_message(b"", 1, 0.0, &[stored()], Encoding::Map);
        assert_eq!(
            decode_message(&ok[..1]).unwrap_err(),
            DecodeError::Frames(1)
        );
        assert_eq!(
            decode_message(&[&ok[0][..], &[0u8; 4], &ok[2][..]]).unwrap_err(),
            DecodeError::Seq(4)
        );
        assert!(matches!(
            decode_message(&[&ok[0][..], &ok[1][..], &[0x92u8][..]]).unwrap_err(),
            DecodeError::Msgpack(_)
        ));
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &Value::from(3)).unwrap();
        assert!(matches!(
            decode_message(&[&ok[0][..], &ok[1][..], &buf[..]]).unwrap_err(),
            DecodeError::Shape(_)
        ));
    }
}
