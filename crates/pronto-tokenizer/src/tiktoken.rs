//! OpenAI's tiktoken encodings as a pool's model tokenizer (`tokenizer: tiktoken:<name>`).
//!
//! `<name>` is an encoding (`o200k_base`, `o200k_harmony`, `cl100k_base`, `p50k_base`,
//! `p50k_edit`, `r50k_base`) or an OpenAI model name that `tiktoken-rs` maps to one
//! (`gpt-4o` → `o200k_base`, `gpt-4` → `cl100k_base`, `gpt-oss-20b` → `o200k_harmony`, …). The
//! BPE rank files are compiled into the binary (`tiktoken-rs` embeds them): nothing is
//! downloaded, and each encoding is parsed once per process, on first use (config validation).
//!
//! ## What the ids are, per endpoint
//! - **Completions / embeddings:** each text prompt is encoded as ordinary text
//!   (`encode_ordinary`): special-token text in a prompt is plain text, and no BOS is added
//!   (OpenAI adds none). A prompt of token ids needs no tokenizer (the parser hashed them).
//! - **Chat with the pool's `chat_template:`:** rendered as for a Hugging Face tokenizer, then
//!   encoded with the encoding's special tokens recognised where the rendered text spells them
//!   (`encode_with_special_tokens`): the template writes the frame.
//! - **Chat without a template: OpenAI's chat format**, as the OpenAI cookbook's
//!   `num_tokens_from_messages` counts it. Per message
//!   `START role [":" name] SEP content refusal calls END`, then `START "assistant" SEP` to
//!   prime the reply. Every piece is encoded on its own (`encode_ordinary`, so a client cannot
//!   forge a frame token) and the ids concatenated, so the count is exactly the cookbook's:
//!   3 per message + role + content (+ 1 + name), + 3 for the reply; a tool call (or
//!   `function_call`) is `name ":" arguments` (the `tiktoken-rs` heuristic: + 1 per call), a
//!   `refusal` its tokens. Content given as parts is the text parts joined by `\n`, as for a
//!   template. The request's `tools` definitions are not counted (neither is their format
//!   public, nor does the cookbook count them). The one difference from `tiktoken-rs`'s
//!   `num_tokens_from_messages`: it counts special-token text in a message (`<|endoftext|>`)
//!   as one token, Pronto as the text it is.
//!
//! ## The frame ids (`START`, `SEP`, `END`)
//! The public encodings do not all hold chat tokens, so the frame is a fixed triple per
//! encoding, chosen so that it never collides with a text token:
//!
//! | encoding | START | SEP | END | what they are |
//! | --- | --- | --- | --- | --- |
//! | `o200k_base`, `o200k_harmony` | 200006 | 200008 | 200007 | harmony's `<|start|>`, `<|message|>`, `<|end|>` |
//! | `cl100k_base` | 100264 | 100266 | 100265 | ChatML's `<|im_start|>`, `<|im_sep|>`, `<|im_end|>` |
//! | `p50k_base` | 50281 | 50282 | 50283 | reserved: past the vocabulary |
//! | `p50k_edit` | 50284 | 50285 | 50286 | reserved: past the vocabulary and its FIM tokens |
//! | `r50k_base` | 50257 | 50258 | 50259 | reserved: past the vocabulary |
//!
//! What routing needs is the count and that a shared leading system prompt gives shared
//! leading block hashes; both hold whatever the frame ids are. They equal OpenAI's own ids
//! where those are known (cl100k's ChatML tokens, o200k's harmony tokens).
//! `"assistant"` is one token in `o200k_*` and `cl100k_base`, so the reply priming is 3 there;
//! the older encodings have no chat models and the cookbook does not count them.

use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

use pronto_core::tokens::TokenId;

/// The prefix of a `tokenizer:` value that names a tiktoken encoding (not a path).
pub const TIKTOKEN_PREFIX: &str = "tiktoken:";

/// One encoding: its name, its BPE (parsed once per process) and its chat frame ids.
struct Encoding {
    name: &'static str,
    bpe: fn() -> &'static CoreBPE,
    /// `START`, `SEP`, `END` (see the module docs).
    frame: [TokenId; 3],
}

const HARMONY_FRAME: [TokenId; 3] = [200006, 200008, 200007];

/// The encodings `tiktoken:<name>` accepts by name, in the order the error lists them.
const ENCODINGS: &[Encoding] = &[
    Encoding {
        name: "o200k_base",
        bpe: tiktoken_rs::o200k_base_singleton,
        frame: HARMONY_FRAME,
    },
    Encoding {
        name: "o200k_harmony",
        bpe: tiktoken_rs::o200k_harmony_singleton,
        frame: HARMONY_FRAME,
    },
    Encoding {
        name: "cl100k_base",
        bpe: tiktoken_rs::cl100k_base_singleton,
        frame: [100264, 100266, 100265],
    },
    Encoding {
        name: "p50k_base",
        bpe: tiktoken_rs::p50k_base_singleton,
        frame: [50281, 50282, 50283],
    },
    Encoding {
        name: "p50k_edit",
        bpe: tiktoken_rs::p50k_edit_singleton,
        frame: [50284, 50285, 50286],
    },
    Encoding {
        name: "r50k_base",
        bpe: tiktoken_rs::r50k_base_singleton,
        frame: [50257, 50258, 50259],
    },
];

/// The encoding `name` denotes: an encoding's own name, else an OpenAI model's encoding.
fn lookup(name: &str) -> Option<&'static Encoding> {
    let by_name = |n: &str| ENCODINGS.iter().find(|e| e.name == n);
    by_name(name).or_else(|| {
        by_name(match get_tokenizer(name)? {
            Tokenizer::O200kHarmony => "o200k_harmony",
            Tokenizer::O200kBase => "o200k_base",
            Tokenizer::Cl100kBase => "cl100k_base",
            Tokenizer::P50kBase => "p50k_base",
            Tokenizer::P50kEdit => "p50k_edit",
            Tokenizer::R50kBase | Tokenizer::Gpt2 => "r50k_base",
        })
    })
}

/// A tiktoken encoding, ready to encode (cheap to build once the encoding is parsed).
pub(super) struct Tiktoken {
    encoding: &'static Encoding,
    bpe: &'static CoreBPE,
    /// The ids of `":"` (between a name and what follows it).
    colon: Vec<TokenId>,
    /// The ids of `"assistant"` (the reply priming's role).
    assistant: Vec<TokenId>,
}

impl Tiktoken {
    /// The encoding `name` (an encoding or an OpenAI model name), parsed if it was not yet;
    /// the error lists the valid names.
    pub(super) fn new(name: &str) -> Result<Tiktoken, String> {
        let encoding = lookup(name).ok_or_else(|| {
            let names: Vec<&str> = ENCODINGS.iter().map(|e| e.name).collect();
            format!(
                "unknown tiktoken encoding \"{name}\" (one of: {}; or an OpenAI model name such \
                 as gpt-4o)",
                names.join(", ")
            )
        })?;
        let bpe = (encoding.bpe)();
        Ok(Tiktoken {
            encoding,
            bpe,
            colon: bpe.encode_ordinary(":"),
            assistant: bpe.encode_ordinary("assistant"),
        })
    }

    /// The encoding's name (`o200k_base`, …), whatever name selected it.
    pub(super) fn encoding(&self) -> &'static str {
        self.encoding.name
    }

    /// `text` as ordinary text: special-token text is encoded as the characters it is.
    pub(super) fn encode_ordinary(&self, text: &str) -> Vec<TokenId> {
        self.bpe.encode_ordinary(text)
    }

    /// `text` with the encoding's special tokens recognised (a rendered chat template).
    pub(super) fn encode_with_special_tokens(&self, text: &str) -> Vec<TokenId> {
        self.bpe.encode_with_special_tokens(text)
    }

    /// A chat request's ids in OpenAI's chat format (see the module docs); `messages` as the
    /// body has them.
    pub(super) fn chat_ids(
        &self,
        messages: &[serde_json::Map<String, serde_json::Value>],
    ) -> Vec<TokenId> {
        use serde_json::Value as J;
        let [start, sep, end] = self.encoding.frame;
        let mut ids = Vec::new();
        for m in messages {
            ids.push(start);
            if let Some(role) = m.get("role").and_then(J::as_str) {
                ids.extend(self.encode_ordinary(role));
            }
            if let Some(name) = m.get("name").and_then(J::as_str) {
                ids.extend_from_slice(&self.colon);
                ids.extend(self.encode_ordinary(name));
            }
            ids.push(sep);
            if let Some(text) = m.get("content").and_then(crate::content_text) {
                ids.extend(self.encode_ordinary(&text));
            }
            if let Some(refusal) = m.get("refusal").and_then(J::as_str) {
                ids.extend(self.encode_ordinary(refusal));
            }
            if let Some(call) = m.get("function_call") {
                self.call(call, &mut ids);
            }
            for call in m
                .get("tool_calls")
                .and_then(J::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(f) = call.get("function") {
                    self.call(f, &mut ids);
                }
            }
            ids.push(end);
        }
        ids.push(start);
        ids.extend_from_slice(&self.assistant);
        ids.push(sep);
        ids
    }

    /// A function call `{name, arguments}` as `name ":" arguments` (arguments as the JSON text
    /// the client sent, or the JSON of a non-string value).
    fn call(&self, f: &serde_json::Value, ids: &mut Vec<TokenId>) {
        if let Some(name) = f.get("name").and_then(serde_json::Value::as_str) {
            ids.extend(self.encode_ordinary(name));
        }
        ids.extend_from_slice(&self.colon);
        match f.get("arguments") {
            Some(serde_json::Value::String(s)) => ids.extend(self.encode_ordinary(s)),
            Some(serde_json::Value::Null) | None => {}
            Some(other) => ids.extend(self.encode_ordinary(&other.to_string())),
        }
    }
}
