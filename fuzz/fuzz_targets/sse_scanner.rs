//! Any byte stream, split into chunks at fuzzer-chosen points: the SSE scanner never panics
//! and reports the first token at most once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pronto::sse::SseScanner;

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut scanner = SseScanner::new();
    let mut firsts = 0;
    for chunk in stream.chunks(step) {
        firsts += usize::from(scanner.feed(chunk).first_token);
    }
    assert!(firsts <= 1, "first token reported {firsts} times");
    let _ = scanner.usage();
});
