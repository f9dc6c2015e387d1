//! Request parsing and SSE scanning on realistic inputs.
//!
//! - chat bodies as the OpenAI Python SDK serialises them (`messages` first, then `model`,
//!   `stream`, `stream_options`, `max_completion_tokens`, `tools`), with a long shared system
//!   prompt and a multi-turn history of escaped, English-like text: ~1 KiB and ~400 KiB;
//!   `serde_json::Value` parsing of the same body is the baseline, and tokenizing + block-hashing
//!   the canonical prompt alone shows how much of the parse is hashing;
//! - the SSE scanner over a 500-event vLLM-like stream, fed one event per chunk and re-cut into
//!   1460-byte TCP-sized chunks.
//!
//! Run: `cargo bench --bench parse -- --warm-up-time 1 --measurement-time 3`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use pronto_core::request::{parse_request, Endpoint};
use pronto_core::sse::SseScanner;
use pronto_core::tokens;

const WORDS: &[&str] = &[
    "the",
    "model",
    "cache",
    "prefix",
    "token",
    "request",
    "latency",
    "\"quoted\"",
    "GPU",
    "replica",
    "queue",
    "schedule",
    "returns",
    "a",
    "of",
    "to",
    "and",
    "with",
    "policy",
    "route",
];

/// Seeded English-like text of about `bytes` bytes, with newlines and quotes to escape.
fn text(rng: &mut SmallRng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        s.push(if rng.gen_ratio(1, 12) { '\n' } else { ' ' });
    }
    s
}

/// A chat body: a system prompt of `system` bytes and `turns` user/assistant messages of
/// `turn` bytes each, in the SDK's field order.
fn chat_body(seed: u64, system: usize, turns: usize, turn: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": text(&mut rng, system)})];
    for i in 0..turns {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": text(&mut rng, turn)}));
    }
    let messages = serde_json::to_string(&messages).unwrap();
    format!(
        r#"{{"messages":{messages},"model":"meta-llama/Llama-3.1-8B-Instruct","max_completion_tokens":256,"stream":true,"stream_options":{{"include_usage":true}},"temperature":0.7,"tools":[{{"type":"function","function":{{"name":"search","description":"Search the docs","parameters":{{"type":"object","properties":{{"q":{{"type":"string"}}}}}}}}}}]}}"#
    )
    .into_bytes()
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_chat");
    for (name, body) in [
        ("1KiB", chat_body(1, 500, 2, 150)),
        ("400KiB", chat_body(2, 100 * 1024, 40, 7 * 1024 + 700)),
    ] {
        eprintln!("{name}: body {} bytes", body.len());
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("pronto/{name}"), |b| {
            b.iter(|| parse_request(Endpoint::ChatCompletions, black_box(&body), None).unwrap())
        });
        // The share of `pronto/*` spent tokenizing and hashing the canonical prompt.
        let prompt =
            pronto_core::request::parse_request_with_prompt(Endpoint::ChatCompletions, &body, None)
                .unwrap()
                .prompt;
        g.bench_function(format!("block_hashes_only/{name}"), |b| {
            b.iter(|| tokens::text_block_hashes(black_box(prompt.as_bytes()), tokens::BLOCK_TOKENS))
        });
        g.bench_function(format!("serde_json_value/{name}"), |b| {
            b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap())
        });
    }
    g.finish();
}

/// 500 events: role-only, 497 content tokens, usage, [DONE].
fn sse_stream() -> Vec<Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(3);
    let chunk = |delta: String| {
        format!(
            "data: {{\"id\":\"chatcmpl-7\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )
        .into_bytes()
    };
    let mut events = vec![chunk(r#"{"role":"assistant","content":""}"#.to_string())];
    for _ in 0..497 {
        let word =
            serde_json::to_string(&format!(" {}", WORDS[rng.gen_range(0..WORDS.len())])).unwrap();
        events.push(chunk(format!(r#"{{"content":{word}}}"#)));
    }
    events.push(
        b"data: {\"id\":\"chatcmpl-7\",\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":497,\"total_tokens\":1497}}\n\n".to_vec(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

fn bench_sse(c: &mut Criterion) {
    let events = sse_stream();
    let whole: Vec<u8> = events.concat();
    let tcp: Vec<&[u8]> = whole.chunks(1460).collect();
    let mut g = c.benchmark_group("sse_500_events");
    g.throughput(Throughput::Bytes(whole.len() as u64));
    let run = |chunks: &[&[u8]]| {
        let mut s = SseScanner::new();
        for chunk in chunks {
            black_box(s.feed(chunk));
        }
        assert_eq!((s.output_events(), s.done()), (497, true));
        s.usage()
    };
    let per_event: Vec<&[u8]> = events.iter().map(Vec::as_slice).collect();
    g.bench_function("chunk_per_event", |b| b.iter(|| run(black_box(&per_event))));
    g.bench_function("tcp_1460B_chunks", |b| b.iter(|| run(black_box(&tcp))));
    g.finish();
}

criterion_group!(benches, bench_parse, bench_sse);
criterion_main!(benches);
