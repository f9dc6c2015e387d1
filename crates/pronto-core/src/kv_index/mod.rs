//! The exact prefix index: an engine's KV-cache events (vLLM's and SGLang's `BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`) decoded ([`decode_message`]) and folded into a
//! per-backend index of the blocks the engine really holds, in Pronto's own chained block
//! hashes ([`ExactIndex`]).
//!
//! Matching needs the engine's token ids to be the ones Pronto hashes: true for the simulator,
//! and for a real engine when its pool has the model's `tokenizer:`; otherwise the index never
//! becomes trusted and routing stays on the approximate index ([`crate::affinity`]). The
//! transport (a ZMQ subscriber that reconnects) lives in the gateway.
//!
//! # Decoding
//!
//! Decoding (and, for the simulator and fixtures, encoding) of engine KV-cache event messages.
//!
//! ## Wire format (vLLM / SGLang ZMQ publisher)
//! One ZMQ multipart message per batch: `[topic, seq, payload]` where `topic` is a (usually
//! empty) frame, `seq` is a big-endian `u64` that grows by one per batch, and `payload` is
//! msgpack of `[ts, [event, …], dp_rank]` (`dp_rank` may be absent or nil). A two-frame
//! `[seq, payload]` message (no topic frame) is accepted too.
//!
//! Each event comes in one of two encodings, both accepted:
//! - a **map** (vLLM's current `msgspec` structs): `{type: "BlockStored", block_hashes: [...],
//!   parent_block_hash, token_ids: [...], block_size, lora_id, medium, ...}`;
//! - a **tagged array** (older versions, SGLang): `["BlockStored", hashes, parent, token_ids,
//!   block_size, lora_id, ...]`, `["BlockRemoved", hashes, ...]`, `["AllBlocksCleared", ...]`.
//!
//! Hashes are integers (signed or unsigned 64-bit; kept as their 64-bit pattern) or byte
//! strings (newer vLLM, SHA-256 based), folded to 64 bits with FNV-1a. Unknown fields and
//! trailing array elements are ignored; unknown event types decode to
//! [`KvEvent::Other`] so a batch with one new event type still applies the rest.
//!
//! # The index
//!
//! The exact per-backend prefix index, fed by one engine's KV-cache events.
//!
//! ## What it holds
//! The engine's block hashes mean nothing to Pronto (another seed, maybe another hash
//! function), so each stored block is mapped onto **Pronto's own chained hashes**
//! ([`crate::tokens::chain_hash`]) of the token ids the event carries: an engine block of
//! `block_size` tokens covers `block_size / BLOCK_TOKENS` Pronto blocks, chained from the Pronto
//! hashes of its parent engine block. The index keeps
//! - `engine hash → its Pronto block hashes` (to resolve parents and removals), and
//! - `Pronto block hash → how many engine blocks hold it` (what a lookup walks),
//!
//! so matching a request is the same walk down `features.block_hashes` as the approximate
//! index, against what the engine really holds. A stored block whose parent is unknown (stored
//! before a resync), whose size is not a multiple of
//! [`BLOCK_TOKENS`](crate::tokens::BLOCK_TOKENS), or whose token ids are missing cannot be
//! mapped and is counted as `unmapped`.
//!
//! ## When it is used (the resync rule)
//! - **Live**: the index is consulted only while *live*: from the first batch applied after a
//!   (re)connect until the connection drops. While disconnected the gateway falls back to the
//!   approximate index (what it knows may be going stale).
//! - **Gap**: every batch carries the publisher's sequence number. A batch whose number is not
//!   the previous one + 1 (messages lost while disconnected or dropped by the publisher's
//!   high-water mark, or a restarted publisher counting from 0) means the index missed
//!   changes: it forgets everything (a *resync*, counted), and rebuilds from the events that
//!   follow. A reconnect after which numbering continues loses nothing and keeps the state.
//! - **Trusted**: engine token ids only match Pronto's hashes when the gateway tokenizes like
//!   the engine: the simulator with the built-in mapping, or any engine when the pool has the
//!   model's `tokenizer:` (the `pronto-tokenizer` crate). The index is trusted
//!   once one lookup found a request's leading block in it; until then it answers `None` and
//!   the approximate index decides, so an engine whose ids never map does no harm.
//! - **Bound**: more than `MAX_ENGINE_BLOCKS` engine blocks (missed removals) forces a resync.
//!
//! Locking: one `RwLock` per backend, written by that backend's subscriber task for the
//! duration of one batch (no await inside), read by routing decisions.

mod decode;
mod index;

pub use decode::{decode_message, encode_message, DecodeError, Encoding, EventBatch, KvEvent};
pub use index::{ExactIndex, IndexCounts, IndexSink};
