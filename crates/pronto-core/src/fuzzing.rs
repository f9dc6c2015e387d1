//! The bodies of the cargo-fuzz targets in `fuzz/`, kept here so that the same properties
//! also run on stable, in ordinary tests (`tests/fuzz_smoke.rs`: seeded random and mutated
//! inputs). Each takes the fuzzer's raw bytes and panics only when its property fails.

// Panicking is how a property fails here (never on a request path).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kv_index::{decode_message, encode_message, Encoding, ExactIndex};
use crate::request::{parse_request, Endpoint};
use crate::sse::SseScanner;

/// `parse_request` on any body, any endpoint, with or without a session header: a result,
/// never a panic; derived quantities stay consistent with the input.
///
/// Input: a selector byte (endpoint = `% 3`, session header when bit 7 is set), then the body.
pub fn parse_request_body(data: &[u8]) {
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
        assert!(f.block_hashes.len() <= body.len() + 1);
    }
}

/// The SSE scanner over any byte stream split into chunks of a chosen size: never panics
/// and reports the first token at most once.
///
/// Input: a chunk-size byte (at least 1), then the stream.
pub fn sse_scanner(data: &[u8]) {
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
}

/// `frames` cut from `data`: a count byte (`% 5` frames), then for every frame but the last
/// a length byte and that many bytes (fewer at the end of the input); the last frame takes
/// the rest.
pub fn split_frames(data: &[u8]) -> Vec<&[u8]> {
    let Some((&count, mut rest)) = data.split_first() else {
        return Vec::new();
    };
    let count = usize::from(count % 5);
    let mut frames = Vec::with_capacity(count);
    for i in 0..count {
        if i + 1 == count {
            frames.push(rest);
            break;
        }
        let Some((&len, tail)) = rest.split_first() else {
            frames.push(&[][..]);
            continue;
        };
        let (frame, tail) = tail.split_at(usize::from(len).min(tail.len()));
        frames.push(frame);
        rest = tail;
    }
    frames
}

/// The KV event decoder over arbitrary multipart frames ([`split_frames`]): never panics; a
/// decoded batch re-encodes (either encoding) to the same events; an index fed the message
/// counts it exactly once, as decoded or as an error, and goes live only on a decoded one.
pub fn kv_decode(data: &[u8]) {
    let frames = split_frames(data);
    let decoded = decode_message(&frames);
    if let Ok(batch) = &decoded {
        for encoding in [Encoding::Map, Encoding::Array] {
            let again = encode_message(b"", batch.seq, batch.ts, &batch.events, encoding);
            let round = decode_message(&again).expect("a re-encoded batch decodes");
            assert_eq!(round.seq, batch.seq);
            assert_eq!(round.events, batch.events, "{encoding:?}");
        }
    }
    let ix = ExactIndex::new(16);
    ix.on_message(&frames);
    let c = ix.counts();
    assert_eq!(c.received, 1);
    assert_eq!(
        (c.decoded, c.errors),
        if decoded.is_ok() { (1, 0) } else { (0, 1) }
    );
    assert_eq!(ix.is_live(), decoded.is_ok());
}

/// Bytes that steer parsers (JSON, YAML, SSE, msgpack type markers).
const INTERESTING: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b":",
    b": ",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"'",
    b",",
    b"-",
    b"#",
    b"&a",
    b"*a",
    b"!",
    b"|",
    b">",
    b"\\",
    b"\0",
    b"\xff",
    b"\xc0",
    b"data: ",
    b"\n\n",
    b"[DONE]",
    b"null",
    b"true",
    b"1e999",
    b"-1",
    b"18446744073709551616",
    b"\x90",
    b"\x80",
    b"\xdc\xff\xff",
    b"\xdd\xff\xff\xff\xff",
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\xc4\x10",
];

/// One mutation of `input` (a bit flip, a byte set, an insertion of random or
/// parser-significant bytes, a deletion, a duplicated run, a splice with another of
/// `corpus`, or a truncation), libFuzzer-style, drawn from `rng`.
pub fn mutate(rng: &mut impl rand::Rng, input: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.gen_range(1..=4) {
        let len = out.len();
        match rng.gen_range(0..8) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                out[i] = rng.gen();
            }
            2 => {
                let i = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                out.splice(i..i, bytes);
            }
            3 => {
                let i = rng.gen_range(0..=len);
                let b = INTERESTING[rng.gen_range(0..INTERESTING.len())];
                out.splice(i..i, b.iter().copied());
            }
            4 if len > 0 => {
                let i = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - i).min(64));
                out.drain(i..i + n);
            }
            5 if len > 0 => {
                let i = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - i).min(64));
                let run = out[i..i + n].to_vec();
                let j = rng.gen_range(0..=len);
                out.splice(j..j, run);
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.gen_range(0..corpus.len())];
                let cut = rng.gen_range(0..=len);
                let from = rng.gen_range(0..=other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {
                let keep = rng.gen_range(0..=len);
                out.truncate(keep);
            }
        }
    }
    out
}

/// Run `body` on `iterations` inputs drawn with seed `seed`: one in four random bytes, the
/// rest mutations of `seeds` (the seeds themselves first). A panic is re-raised with the
/// input that caused it, so a failure reproduces as a unit test.
pub fn smoke(seed: u64, seeds: &[Vec<u8>], iterations: usize, body: fn(&[u8])) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let inputs = seeds.iter().cloned().chain((0..iterations).map(|i| {
        if i % 4 == 0 || seeds.is_empty() {
            let n = rng.gen_range(0..256);
            (0..n).map(|_| rng.gen()).collect()
        } else {
            let base = &seeds[rng.gen_range(0..seeds.len())];
            mutate(&mut rng, base, seeds)
        }
    }));
    for input in inputs {
        if let Err(panic) = std::panic::catch_unwind(|| body(&input)) {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            panic!(
                "property failed: {what}\ninput ({} bytes): {:?}",
                input.len(),
                String::from_utf8_lossy(&input)
            );
        }
    }
}
