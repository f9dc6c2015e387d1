//! Any body, on any endpoint, with or without a session header: `parse_request` returns a
//! result and never panics (`pronto_core::fuzzing::parse_request_body`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| pronto_core::fuzzing::parse_request_body(data));
