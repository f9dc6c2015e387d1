//! The cargo-fuzz targets' bodies (`pronto_core::fuzzing`, run by `fuzz/` under libFuzzer on
//! nightly) on stable: a few thousand seeded random and mutated inputs each, from realistic
//! seeds, so every property is exercised in CI.

use pronto_core::fuzzing::{self, split_frames};
use pronto_core::kv_index::{encode_message, Encoding, KvEvent};

const ITERATIONS: usize = 3000;

fn with_prefix(prefix: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![prefix];
    v.extend_from_slice(body);
    v
}

#[test]
fn parse_request_never_panics() {
    let bodies: [&[u8]; 6] = [
        br#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}],"stream":true,"max_tokens":16}"#,
        br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"user":"u1"}"#,
        br#"{"model":"m","prompt":"Once upon a time","max_tokens":8,"stream_options":{"include_usage":true}}"#,
        br#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}"#,
        br#"{"model":"m","input":["a","b"]}"#,
        br#"{"model":"m","prompt":[[1,2],[3]],"n":2}"#,
    ];
    let seeds: Vec<Vec<u8>> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| with_prefix(i as u8 | if i % 2 == 0 { 0x80 } else { 0 }, b))
        .collect();
    fuzzing::smoke(1, &seeds, ITERATIONS, fuzzing::parse_request_body);
}

#[test]
fn the_sse_scanner_never_panics_and_reports_one_first_token() {
    let streams: [&[u8]; 3] = [
        b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
        b"data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n: keep-alive\r\n\r\ndata: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n",
        b"event: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n",
    ];
    let seeds: Vec<Vec<u8>> = streams
        .iter()
        .flat_map(|s| [1u8, 3, 17, 255].map(|step| with_prefix(step, s)))
        .collect();
    fuzzing::smoke(2, &seeds, ITERATIONS, fuzzing::sse_scanner);
}

/// `frames` in [`split_frames`]' input layout.
fn join_frames<F: AsRef<[u8]>>(frames: &[F]) -> Vec<u8> {
    let mut v = vec![frames.len() as u8];
    for (i, f) in frames.iter().enumerate() {
        let f = f.as_ref();
        if i + 1 < frames.len() {
            assert!(f.len() < 256, "a leading frame fits a length byte");
            v.push(f.len() as u8);
        }
        v.extend_from_slice(f);
    }
    v
}

#[test]
fn split_frames_inverts_join_frames() {
    let frames: [&[u8]; 3] = [b"topic", &[0, 0, 0, 0, 0, 0, 0, 9], b"payload bytes"];
    assert_eq!(split_frames(&join_frames(&frames)), frames);
    assert_eq!(split_frames(&[]), Vec::<&[u8]>::new());
    assert_eq!(split_frames(&[2, 200, 1]), vec![&[1u8][..], &[][..]]);
}

#[test]
fn the_kv_event_decoder_never_panics() {
    let events = [
        KvEvent::BlockStored {
            block_hashes: vec![1, 2],
            parent: None,
            token_ids: (0..32).collect(),
            block_size: Some(16),
        },
        KvEvent::BlockStored {
            block_hashes: vec![u64::MAX],
            parent: Some(2),
            token_ids: (100..116).collect(),
            block_size: None,
        },
        KvEvent::BlockRemoved {
            block_hashes: vec![1, 7, 9],
        },
        KvEvent::AllBlocksCleared,
    ];
    let mut seeds = Vec::new();
    for (seq, enc) in [(0, Encoding::Map), (41, Encoding::Array)] {
        let all = encode_message(b"", seq, 1.5, &events, enc);
        seeds.push(join_frames(&all));
        seeds.push(join_frames(&all[1..]));
        for e in &events {
            seeds.push(join_frames(&encode_message(
                b"kv",
                seq,
                0.0,
                std::slice::from_ref(e),
                enc,
            )));
        }
    }
    fuzzing::smoke(3, &seeds, ITERATIONS, fuzzing::kv_decode);
}
