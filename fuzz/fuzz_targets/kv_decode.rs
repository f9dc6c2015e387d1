//! Arbitrary multipart frames: the KV event decoder never panics, a decoded batch
//! re-encodes to the same events, and an index counts the message once
//! (`pronto_core::fuzzing::kv_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| pronto_core::fuzzing::kv_decode(data));
