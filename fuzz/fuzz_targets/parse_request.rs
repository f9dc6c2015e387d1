//! Any body, on any endpoint, with or without a session header: `parse_request` returns a
//! result and never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pronto::request::{parse_request, Endpoint};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let endpoint = match selector % 3 {
        0 => Endpoint::ChatCompletions,
        1 => Endpoint::Completions,
        _ => Endpoint::Embeddings,
    };
    let session = (selector & 0x80 != 0).then_some("fuzz-session");
    if let Ok(f) = parse_request(endpoint, body, session) {
        // Derived quantities stay consistent with the input.
        assert!(f.block_hashes.len() <= body.len() + 1);
    }
});
