//! The exact prefix index: an engine's KV-cache events (vLLM's and SGLang's `BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`) decoded ([`decode`]) and folded into a per-backend index
//! of the blocks the engine really holds, in Pronto's own chained block hashes ([`index`]).
//!
//! Matching needs the engine's token ids to be the ones Pronto hashes: true for the simulator,
//! and for a real engine when its pool has the model's `tokenizer:`; otherwise the index never
//! becomes trusted and routing stays on the approximate index ([`crate::affinity`]). The
//! transport (a ZMQ subscriber that reconnects) lives in the gateway.

pub mod decode;
pub mod index;

pub use decode::{decode_message, encode_message, DecodeError, Encoding, EventBatch, KvEvent};
pub use index::{ExactIndex, IndexCounts, IndexSink};
