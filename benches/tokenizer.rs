//! The cost of exact tokens: a pool's model tokenizer on a chat request (parse the body, render
//! the chat template, encode, hash the blocks) against the built-in estimate
//! (`parse_request` alone), at ~1 KiB, ~16 KiB and ~128 KiB of prompt.
//!
//! `exact/…` is the Hugging Face tokenizer `PRONTO_BENCH_TOKENIZER` (a `tokenizer.json` or a
//! model directory with its chat template) when set — use a real model's, e.g.
//! `$PEERS/tiny-llama` (a trained BPE) — else the repository's toy example
//! (`config/examples/tokenizer`: bytes, no merges), which under-states a real BPE's cost.
//! `tiktoken/…` is `tiktoken:o200k_base` (built in: OpenAI's chat format, no template).
//!
//! Run: `PRONTO_BENCH_TOKENIZER=~/.cache/pronto-peers/tiny-llama cargo bench --bench tokenizer
//! -- --warm-up-time 1 --measurement-time 3`.

use std::path::PathBuf;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use pronto_core::request::{parse_request, Endpoint};
use pronto_core::tokens::{block_hashes, BLOCK_TOKENS};
use pronto_tokenizer::ModelTokenizer;

const WORDS: &[&str] = &[
    "the", "model", "cache", "prefix", "token", "request", "latency", "GPU", "replica", "queue",
    "schedule", "returns", "a", "of", "to", "and", "with", "policy", "first", "time",
];

fn text(rng: &mut SmallRng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        s.push(if rng.gen_bool(0.1) { '.' } else { ' ' });
    }
    s
}

fn chat_body(bytes: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(7);
    serde_json::to_vec(&serde_json::json!({
        "messages": [
            {"role": "system", "content": text(&mut rng, bytes * 3 / 4)},
            {"role": "user", "content": text(&mut rng, bytes / 4)},
        ],
        "model": "m",
        "stream": true,
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let path = std::env::var_os("PRONTO_BENCH_TOKENIZER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/examples/tokenizer")
        });
    let tok = ModelTokenizer::from_spec(path.to_str().expect("UTF-8 path"), None)
        .expect("tokenizer loads");
    assert!(
        tok.has_chat_template(),
        "{} has no chat template",
        path.display()
    );
    let tiktoken = ModelTokenizer::from_spec("tiktoken:o200k_base", None).expect("built in");
    let mut g = c.benchmark_group("tokenizer");
    for (label, bytes) in [
        ("1KiB", 1 << 10),
        ("16KiB", 16 << 10),
        ("128KiB", 128 << 10),
    ] {
        let body = chat_body(bytes);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("estimate/{label}"), |b| {
            b.iter(|| parse_request(Endpoint::ChatCompletions, black_box(&body), None).unwrap())
        });
        g.bench_function(format!("exact/{label}"), |b| {
            b.iter(|| {
                let ids = tok
                    .prompt_ids(Endpoint::ChatCompletions, black_box(&body))
                    .unwrap()
                    .unwrap();
                block_hashes(&ids, BLOCK_TOKENS)
            })
        });
        g.bench_function(format!("tiktoken/{label}"), |b| {
            b.iter(|| {
                let ids = tiktoken
                    .prompt_ids(Endpoint::ChatCompletions, black_box(&body))
                    .unwrap()
                    .unwrap();
                block_hashes(&ids, BLOCK_TOKENS)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
