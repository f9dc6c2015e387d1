//! The OpenAI wire format of a simulated backend: request parsing and response bodies.
//!
//! ## Requests
//! A request body is parsed with `serde_json` into what the engine needs: the canonical prompt
//! (chat: every message in order as `role: text\n`, the text parts of multi-part content
//! concatenated, `null` content as empty text; completions: the `prompt` string, or an array of
//! strings joined by `\n`), `stream`, `stream_options.include_usage`, and the output length
//! (`max_completion_tokens`, else `max_tokens`, else [`DEFAULT_MAX_TOKENS`]). The prompt's token
//! ids come from [`pronto_core::tokens::token_ids`], exactly as the gateway's parser computes them, so
//! the two agree on prefix blocks.
//!
//! ## Responses
//! Chunks follow vLLM's shapes. Chat: a role chunk (`delta: {"role":"assistant","content":""}`)
//! sent together with the first token (vLLM emits it when the first output arrives), one chunk
//! per token whose `delta.content` is a short deterministic word (a reasoning model's reasoning
//! tokens come first, as `delta.reasoning_content`; non-streamed: `message.reasoning_content`), the last token's chunk carrying
//! `finish_reason: "length"`, an optional usage chunk (`choices: []`), then `data: [DONE]`.
//! Completions: one chunk per token with `choices[0].text`. Errors use the OpenAI envelope
//! `{"error":{"message","type","param","code"}}`.

use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::{json, Value};

use pronto_core::tokens::mix64;

/// Output length when the request names none (OpenAI's documented default for completions).
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Which generation endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApiKind {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completion,
}

/// An OpenAI-style error answer.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    /// A 400 with `message`.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// An error with any status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// The OpenAI error envelope for this error.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": null,
            "code": self.status.as_u16(),
        }})
    }
}

/// What a generation request asks for, in the engine's terms.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GenRequest {
    /// The `model` field, when present.
    pub model: Option<String>,
    /// The `stream` field.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Output tokens to generate.
    pub max_tokens: u32,
    /// The canonical prompt.
    pub prompt: String,
    /// `continue_final_message`: the last (assistant) message is continued, not answered.
    pub continue_final: bool,
    /// The hash of the text the answer continues ([`context_seed`]): its words follow from it.
    pub seed: u64,
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    Ok(v)
}

/// The canonical prompt of a parsed body, computed by the gateway's own parser so the peer
/// routers' `/tokenize` and `/render` probes see exactly what the engine and the gateway's
/// prefix index see. Those probe bodies may omit `model`, which the parser requires, so one is
/// filled in; the prompt does not depend on it.
fn canonical_prompt(
    v: &Value,
    endpoint: pronto_core::request::Endpoint,
) -> Result<String, ApiError> {
    let body = if v.get("model").is_some() {
        serde_json::to_vec(v)
    } else {
        let mut v = v.clone();
        v["model"] = Value::from("");
        serde_json::to_vec(&v)
    }
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    pronto_core::request::parse_request_with_prompt(endpoint, &body, None)
        .map(|f| f.prompt)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Canonical prompt of a body that has either `messages` or `prompt` (for `/tokenize`).
fn any_prompt(v: &Value) -> Result<String, ApiError> {
    if v.get("messages").is_some() {
        canonical_prompt(v, pronto_core::request::Endpoint::ChatCompletions)
    } else if v.get("prompt").is_some() {
        canonical_prompt(v, pronto_core::request::Endpoint::Completions)
    } else {
        Err(ApiError::bad_request("body needs `messages` or `prompt`"))
    }
}

/// Parse a generation request body with the gateway's own parser
/// ([`pronto_core::request::parse_request`]), so the engine sees exactly the canonical prompt — and
/// so the token blocks — the gateway's prefix index sees.
pub(crate) fn parse_generation(kind: ApiKind, body: &[u8]) -> Result<GenRequest, ApiError> {
    let endpoint = match kind {
        ApiKind::Chat => pronto_core::request::Endpoint::ChatCompletions,
        ApiKind::Completion => pronto_core::request::Endpoint::Completions,
    };
    let f = pronto_core::request::parse_request_with_prompt(endpoint, body, None)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let max_tokens = match f.max_tokens {
        None => DEFAULT_MAX_TOKENS,
        Some(0) => return Err(ApiError::bad_request("max_tokens must be an integer >= 1")),
        Some(n) => n,
    };
    #[derive(serde::Deserialize)]
    struct Flags {
        #[serde(default)]
        continue_final_message: Option<bool>,
    }
    let continue_final = kind == ApiKind::Chat
        && serde_json::from_slice::<Flags>(body)
            .ok()
            .and_then(|f| f.continue_final_message)
            .unwrap_or(false);
    let seed = match kind {
        // The generation prompt, as a chat template adds it; a continued final message is
        // the text so far itself (its canonical line's newline is no part of it).
        ApiKind::Chat if continue_final => context_seed(0, f.prompt.trim_end_matches('\n')),
        ApiKind::Chat => context_seed(context_seed(0, &f.prompt), "assistant:"),
        ApiKind::Completion => context_seed(0, &f.prompt),
    };
    Ok(GenRequest {
        model: Some(f.model),
        stream: f.stream,
        include_usage: f.include_usage,
        max_tokens,
        prompt: f.prompt,
        continue_final,
        seed,
    })
}

/// Parse a `/tokenize` body (`prompt` or `messages`) into its canonical prompt.
pub(crate) fn parse_tokenize(body: &[u8]) -> Result<String, ApiError> {
    any_prompt(&parse_json(body)?)
}

/// Parse a `/render` body into its canonical prompt and (for chat) the messages as sent.
pub(crate) fn parse_render(kind: ApiKind, body: &[u8]) -> Result<(String, Value), ApiError> {
    let v = parse_json(body)?;
    match kind {
        ApiKind::Chat => {
            let m = v
                .get("messages")
                .ok_or_else(|| ApiError::bad_request("missing `messages`"))?;
            let prompt = canonical_prompt(&v, pronto_core::request::Endpoint::ChatCompletions)?;
            Ok((prompt, m.clone()))
        }
        ApiKind::Completion => {
            if v.get("prompt").is_none() {
                return Err(ApiError::bad_request("missing `prompt`"));
            }
            let prompt = canonical_prompt(&v, pronto_core::request::Endpoint::Completions)?;
            Ok((prompt, Value::Null))
        }
    }
}

const WORDS: [&str; 32] = [
    "lorem", "ipsum", "dolor", "sit", "amet", "elit", "sed", "do", "tempor", "ut", "labore", "et",
    "magna", "aliqua", "enim", "ad", "minim", "quis", "nostrud", "ex", "ea", "duis", "aute",
    "irure", "in", "velit", "esse", "cillum", "fugiat", "nulla", "sunt", "culpa",
];

/// The hash of `text` continuing a context hashed `seed`: folded over its whitespace-separated
/// words, so `context_seed(context_seed(s, a), b) == context_seed(s, a + b)` whenever `b`
/// starts with whitespace — as every generated word does. A continuation request (the prompt
/// plus the text so far) therefore reaches exactly the state the uninterrupted generation was
/// in, and goes on with exactly the words it would have produced.
pub(crate) fn context_seed(seed: u64, text: &str) -> u64 {
    text.split_whitespace().fold(seed, |h, w| {
        let fnv = w.bytes().fold(0xcbf2_9ce4_8422_2325u64, |a, b| {
            (a ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        mix64(h ^ fnv)
    })
}

/// The next output word after a context hashed `seed` (with a leading space, like a BPE
/// token), and the context's hash once it is appended: a deterministic language model.
pub(crate) fn next_word(seed: u64) -> (&'static str, u64) {
    let w = WORDS[(mix64(seed) % WORDS.len() as u64) as usize];
    (w, context_seed(seed, w))
}

/// The words a context hashed `seed` generates next, `n` of them, concatenated.
pub(crate) fn words(mut seed: u64, n: u32) -> String {
    let mut out = String::new();
    for _ in 0..n {
        let (w, next) = next_word(seed);
        out.push(' ');
        out.push_str(w);
        seed = next;
    }
    out
}

/// Token usage of one finished (or in-progress) request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: u32,
    /// Every generated token, reasoning included.
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    /// The first `reasoning_tokens` generated tokens are reasoning.
    pub reasoning_tokens: u32,
}

impl Usage {
    fn json(self) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        });
        if self.reasoning_tokens > 0 {
            v["completion_tokens_details"] = json!({"reasoning_tokens": self.reasoning_tokens});
        }
        v
    }
}

/// Builds the response bodies of one request.
#[derive(Debug, Clone)]
pub(crate) struct Responder {
    kind: ApiKind,
    id: u64,
    model: String,
    created: u64,
    /// The hash of the context so far: the prompt, then every word sent ([`next_word`]).
    seed: u64,
    /// `data: {"id":…,"object":…,"created":…,"model":…,"choices":[{"index":0,` — the
    /// per-request head of every token chunk, rendered once (token chunks are the hot path).
    head: String,
}

impl Responder {
    /// A responder for request `id` of `model`, its answer following a context hashed `seed`.
    pub fn new(kind: ApiKind, id: u64, model: String, created: u64, seed: u64) -> Responder {
        let mut r = Responder {
            kind,
            id,
            model,
            created,
            seed,
            head: String::new(),
        };
        let obj = json!({"id": r.id_str(), "object": r.object(true), "created": created,
                         "model": r.model})
        .to_string();
        // `{...}` → `data: {..., "choices":[{"index":0,`
        r.head = format!(
            "data: {},\"choices\":[{{\"index\":0,",
            &obj[..obj.len() - 1]
        );
        r
    }

    fn id_str(&self) -> String {
        match self.kind {
            ApiKind::Chat => format!("chatcmpl-sim-{}", self.id),
            ApiKind::Completion => format!("cmpl-sim-{}", self.id),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (ApiKind::Chat, true) => "chat.completion.chunk",
            (ApiKind::Chat, false) => "chat.completion",
            (ApiKind::Completion, _) => "text_completion",
        }
    }

    fn sse(v: &Value) -> Bytes {
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The chat role chunk (`None` for completions, which have none).
    pub fn role_chunk(&self) -> Option<Bytes> {
        (self.kind == ApiKind::Chat).then(|| {
            Self::sse(&json!({
                "id": self.id_str(), "object": self.object(true), "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": null, "finish_reason": null}],
            }))
        })
    }

    /// The chunk of the next output token; `last` puts `finish_reason: "length"` on it.
    #[cfg(test)]
    pub fn token_chunk(&mut self, last: bool) -> Bytes {
        let mut out = Vec::new();
        self.push_token_chunk(last, false, &mut out);
        Bytes::from(out)
    }

    /// Append the chunk of the next output token to `out` (words need no JSON escaping);
    /// `reasoning`: it is a reasoning token (chat: `delta.reasoning_content`).
    pub fn push_token_chunk(&mut self, last: bool, reasoning: bool, out: &mut Vec<u8>) {
        let finish = if last { "\"length\"" } else { "null" };
        out.extend_from_slice(self.head.as_bytes());
        let (w, next) = next_word(self.seed);
        self.seed = next;
        let w = format!(" {w}");
        let field = if reasoning {
            "reasoning_content"
        } else {
            "content"
        };
        let tail = match self.kind {
            ApiKind::Chat => format!(
                "\"delta\":{{\"{field}\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
            ),
            ApiKind::Completion => format!(
                "\"text\":\"{w}\",\"logprobs\":null,\"finish_reason\":{finish},\"stop_reason\":null}}]}}\n\n"
            ),
        };
        out.extend_from_slice(tail.as_bytes());
    }

    /// The final usage chunk (`choices: []`).
    pub fn usage_chunk(&self, usage: Usage) -> Bytes {
        Self::sse(&json!({
            "id": self.id_str(), "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [], "usage": usage.json(),
        }))
    }

    /// The SSE terminator.
    pub fn done() -> Bytes {
        Bytes::from_static(b"data: [DONE]\n\n")
    }

    /// The whole non-streaming answer.
    pub fn full(&self, usage: Usage) -> Value {
        let thought = usage.reasoning_tokens.min(usage.completion_tokens);
        let all = words(self.seed, usage.completion_tokens);
        // Every word is one space and its letters: the reasoning is the first `thought`.
        let split = all
            .match_indices(' ')
            .nth(thought as usize)
            .map_or(all.len(), |(i, _)| i);
        let (reasoning, text) = all.split_at(split);
        let choice = match self.kind {
            ApiKind::Chat if thought > 0 => json!({"index": 0,
                "message": {"role": "assistant", "content": text,
                            "reasoning_content": reasoning},
                "logprobs": null, "finish_reason": "length"}),
            ApiKind::Chat => json!({"index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null, "finish_reason": "length"}),
            ApiKind::Completion => json!({"index": 0, "text": text, "logprobs": null,
                "finish_reason": "length", "stop_reason": null}),
        };
        json!({
            "id": self.id_str(), "object": self.object(false), "created": self.created,
            "model": self.model, "choices": [choice], "usage": usage.json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_is_canonical() {
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi "},{"type":"image_url"},
                                      {"type":"text","text":"there"}]},
            {"role":"assistant","content":null}],
            "max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#;
        let r = parse_generation(ApiKind::Chat, body).unwrap();
        assert_eq!(r.prompt, "system: be brief\nuser: hi there\nassistant: \n");
        assert_eq!(r.max_tokens, 3);
        assert!(r.stream && r.include_usage);
        assert_eq!(r.model.as_deref(), Some("m"));
    }

    #[test]
    fn completion_prompt_joins_strings_and_reads_max_tokens() {
        let body = br#"{"model":"m","prompt":["a","b"],"max_tokens":9,"max_completion_tokens":2}"#;
        let r = parse_generation(ApiKind::Completion, body).unwrap();
        assert_eq!(r.prompt, "a\nb");
        // The completions API has only `max_tokens` (the shared parser ignores
        // `max_completion_tokens` there).
        assert_eq!(r.max_tokens, 9);
        assert!(!r.stream);
        assert_eq!(r.model.as_deref(), Some("m"));
        let r = parse_generation(ApiKind::Completion, br#"{"model":"m","prompt":"x"}"#).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn bad_bodies_are_400() {
        for body in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"messages":[]}"#,
            br#"{"messages":[{"content":"x"}]}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
            b"\xff\xfe",
        ] {
            let e = parse_generation(ApiKind::Chat, body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.body()["error"]["message"].is_string());
        }
        assert!(parse_generation(ApiKind::Completion, br#"{"prompt":[1,2]}"#).is_err());
    }

    #[test]
    fn tokenize_accepts_prompt_or_messages() {
        assert_eq!(parse_tokenize(br#"{"prompt":"abc"}"#).unwrap(), "abc");
        assert_eq!(
            parse_tokenize(br#"{"messages":[{"role":"user","content":"q"}]}"#).unwrap(),
            "user: q\n"
        );
        assert!(parse_tokenize(br#"{"x":1}"#).is_err());
        // Tools come first, as the gateway canonicalises them.
        let with_tools =
            br#"{"tools":[{"type":"function"}],"messages":[{"role":"user","content":"q"}]}"#;
        assert_eq!(
            parse_tokenize(with_tools).unwrap(),
            "tools: [{\"type\":\"function\"}]\nuser: q\n"
        );
    }

    #[test]
    fn chunks_have_vllm_shape() {
        let mut r = Responder::new(ApiKind::Chat, 7, "m \"q\"".into(), 1, 42);
        let role = r.role_chunk().unwrap();
        let v: Value = serde_json::from_slice(&role[6..role.len() - 2]).unwrap();
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        let last = r.token_chunk(true);
        let v: Value = serde_json::from_slice(&last[6..last.len() - 2]).unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["delta"]["content"], words(42, 1).as_str());
        let full = r.full(Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 2,
            reasoning_tokens: 0,
        });
        assert_eq!(full["usage"]["total_tokens"], 8);
        assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        let text = full["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(text.split(' ').filter(|w| !w.is_empty()).count(), 3);
        assert_eq!(v["model"], "m \"q\"");
        assert_eq!(v["id"], "chatcmpl-sim-7");
        let mid: Value = serde_json::from_slice(&r.token_chunk(false)[6..]).unwrap();
        assert!(mid["choices"][0]["finish_reason"].is_null());
        assert_eq!(mid["object"], "chat.completion.chunk");
        let mut c = Responder::new(ApiKind::Completion, 7, "m".into(), 1, 0);
        assert!(c.role_chunk().is_none());
        let v: Value = serde_json::from_slice(&c.token_chunk(false)[6..]).unwrap();
        assert!(v["choices"][0]["text"].is_string());
    }

    #[test]
    fn a_continuation_generates_what_the_uninterrupted_answer_would() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"why?"}],"max_tokens":9}"#;
        let whole = parse_generation(ApiKind::Chat, chat).unwrap();
        let answer = words(whole.seed, 9);
        for cut in [1, 4, 8] {
            // Whole words only: `so_far` ends before the space that starts the next word.
            let so_far = &answer[..answer
                .match_indices(' ')
                .nth(cut)
                .map_or(answer.len(), |m| m.0)];
            let body = serde_json::to_vec(&json!({"model": "m", "max_tokens": 9 - cut,
                "messages": [{"role": "user", "content": "why?"},
                             {"role": "assistant", "content": so_far}],
                "continue_final_message": true, "add_generation_prompt": false}))
            .unwrap();
            let cont = parse_generation(ApiKind::Chat, &body).unwrap();
            assert!(cont.continue_final);
            assert_eq!(
                format!("{so_far}{}", words(cont.seed, 9 - cut as u32)),
                answer
            );
            let comp =
                parse_generation(ApiKind::Completion, br#"{"model":"m","prompt":"p q"}"#).unwrap();
            let text = words(comp.seed, 6);
            let body = serde_json::to_vec(&json!({"model": "m", "prompt": format!("p q{}",
                &text[..text.match_indices(' ').nth(2).unwrap().0])}))
            .unwrap();
            let cont = parse_generation(ApiKind::Completion, &body).unwrap();
            assert_eq!(
                words(cont.seed, 4),
                text[text.match_indices(' ').nth(2).unwrap().0..]
            );
        }
    }

    #[test]
    fn reasoning_tokens_come_first_as_reasoning_content() {
        let r = Responder::new(ApiKind::Chat, 9, "m".into(), 1, 5);
        let mut out = Vec::new();
        r.clone().push_token_chunk(false, true, &mut out);
        let v: Value = serde_json::from_slice(&out[6..]).unwrap();
        assert_eq!(
            v["choices"][0]["delta"]["reasoning_content"],
            words(5, 1).as_str()
        );
        assert!(v["choices"][0]["delta"].get("content").is_none());
        let full = r.full(Usage {
            prompt_tokens: 5,
            completion_tokens: 7,
            cached_tokens: 0,
            reasoning_tokens: 4,
        });
        let msg = &full["choices"][0]["message"];
        let count = |s: &Value| s.as_str().unwrap().split_whitespace().count();
        assert_eq!(
            (count(&msg["reasoning_content"]), count(&msg["content"])),
            (4, 3)
        );
        assert_eq!(full["usage"]["completion_tokens"], 7);
        assert_eq!(
            full["usage"]["completion_tokens_details"]["reasoning_tokens"],
            4
        );
    }
}
