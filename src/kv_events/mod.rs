//! Engine KV-cache events → an exact per-backend prefix index.
//!
//! vLLM and SGLang publish every change of their prefix cache (`BlockStored`, `BlockRemoved`,
//! `AllBlocksCleared`) on a ZMQ PUB socket. A backend configured with
//! `kv_events: {endpoint: tcp://HOST:PORT, block_size: N}` gets
//! - a subscriber task (`services::kv_events`: a minimal ZMTP client, [`zmtp`]) that reconnects with
//!   backoff,
//! - a decoder for both event encodings ([`pronto_core::kv_index::decode_message`]),
//! - a [`pronto_core::kv_index::ExactIndex`] of the blocks the engine holds, expressed as Pronto's own chained
//!   block hashes so a request's `block_hashes` are looked up directly ([`pronto_core::kv_index`], in the
//!   routing core).
//!
//! Routing (the core's view builder) takes a backend's prefix match from its exact index
//! whenever that index is live and trusted, and from the approximate index otherwise. The
//! rules for gaps, reconnects and trust are in [`pronto_core::kv_index`]'s docs.
//!
//! Matching needs the engine's token ids to be the ones Pronto hashes ([`pronto_core::tokens`]):
//! true for the simulator, which publishes the same events, and for a real engine when its
//! pool has the model's `tokenizer:` ([`pronto_tokenizer`]). Otherwise the index never
//! becomes trusted and routing stays approximate.

pub mod zmtp;
