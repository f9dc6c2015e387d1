//! Shared test harness: in-process backends and the gateway binary.
#![allow(dead_code, unused_imports)]

pub mod backend;
pub mod gateway;

pub use backend::{fnv64, Behavior, TestBackend};
pub use gateway::{
    admin_backends, config_yaml, metric_value, metrics, metrics_when, pool, post_reload, Gateway,
};

/// A chat body whose prompt is about `bytes` long, serialised as the OpenAI SDK does
/// (messages before model and stream).
pub fn chat_body(bytes: usize, stream: bool) -> Vec<u8> {
    let filler = "lorem ipsum dolor sit amet ".repeat(bytes / 27 + 1);
    let content = &filler[..bytes.min(filler.len())];
    serde_json::to_vec(&serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "model": "m",
        "stream": stream,
        "max_tokens": 4
    }))
    .unwrap()
}

/// The head of an HTTP/1.1 `POST /v1/chat/completions` with a `len`-byte JSON body (for tests
/// that write raw bytes to the gateway).
pub fn post_head(len: usize) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         Content-Length: {len}\r\n\r\n"
    )
}

/// A whole raw `POST /v1/chat/completions` carrying `body`.
pub fn post(body: &[u8]) -> Vec<u8> {
    [post_head(body.len()).as_bytes(), body].concat()
}

/// An HTTP client; `h2c` uses HTTP/2 with prior knowledge.
pub fn client(h2c: bool) -> reqwest::Client {
    let b = reqwest::Client::builder().timeout(std::time::Duration::from_secs(60));
    if h2c {
        b.http2_prior_knowledge().build().unwrap()
    } else {
        b.http1_only().build().unwrap()
    }
}
