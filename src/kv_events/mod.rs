//! Engine KV-cache events → an exact per-backend prefix index.
//!
//! vLLM and SGLang publish every change of their prefix cache (`BlockStored`, `BlockRemoved`,
//! `AllBlocksCleared`) on a ZMQ PUB socket. A backend configured with
//! `kv_events: {endpoint: tcp://HOST:PORT, block_size: N}` gets
//! - a subscriber task ([`subscriber`]: a minimal ZMTP client, [`zmtp`]) that reconnects with
//!   backoff,
//! - a decoder for both event encodings ([`decode`]),
//! - an [`ExactIndex`] of the blocks the engine holds, expressed as Pronto's own chained
//!   block hashes so a request's `block_hashes` are looked up directly ([`index`]).
//!
//! Routing ([`crate::gateway::Pool::views`]) takes a backend's prefix match from its exact
//! index whenever that index is live and trusted, and from the approximate index otherwise.
//! The rules for gaps, reconnects and trust are in [`index`]'s docs.
//!
//! Matching needs the engine's token ids to be Pronto's ([`crate::tokens`]): true for the
//! simulator, which publishes the same events ([`crate::sim`]). A real model's tokenizer
//! yields other ids: such an index never becomes trusted and routing stays approximate
//! (loading the model's `tokenizer.json` is not implemented).

pub mod decode;
pub mod index;
pub mod subscriber;
pub mod zmtp;

pub use decode::{decode_message, encode_message, DecodeError, Encoding, EventBatch, KvEvent};
pub use index::{ExactIndex, IndexCounts};
pub use subscriber::{run_subscriber, KvEventsService};
