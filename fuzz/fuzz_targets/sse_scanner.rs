//! Any byte stream, split into chunks at a fuzzer-chosen size: the SSE scanner never panics
//! and reports the first token at most once (`pronto_core::fuzzing::sse_scanner`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| pronto_core::fuzzing::sse_scanner(data));
