//! Exact prompt tokens with a model's own tokenizer: a local Hugging Face `tokenizer.json`, or
//! one of OpenAI's tiktoken encodings (`tiktoken:<name>`, see [`tiktoken`] for what its
//! ids are per endpoint).
//!
//! Pronto's built-in token mapping (`pronto_core::tokens`) is an estimate: its counts are corrected
//! by the learned byte→token ratio (`pronto_core::request::TokenRatio`) and its block hashes only match
//! Pronto's own index and the simulator. With a pool's `tokenizer:` configured, the gateway
//! computes the **engine's token ids** for each request instead, so
//! - `prompt_tokens` is the count the engine will charge, and
//! - the block hashes (`pronto_core::tokens::block_hashes` over those ids) are the ones the exact
//!   index builds from the token ids in the engine's KV-cache events (`pronto_core::kv_index`):
//!   a real vLLM's events become matchable.
//!
//! ## What "the engine's ids" means, per endpoint (vLLM's OpenAI server)
//! - **Chat completions:** the messages are rendered with the model's chat template
//!   (`add_generation_prompt` true unless the request says otherwise or sets
//!   `continue_final_message`), then encoded **without** added special tokens (the template
//!   writes them). Content given as parts is flattened as vLLM's default "string" content
//!   format does: the text parts joined by `\n`. A tool call's `arguments` string is parsed into
//!   an object, as vLLM does before rendering. The template sees `messages`, `tools`,
//!   `add_generation_prompt`, the special tokens of `tokenizer_config.json` (`bos_token`,
//!   `eos_token`, …), the request's `chat_template_kwargs`, and the functions
//!   `raise_exception` and `strftime_now`. Environment as in `transformers`: `trim_blocks`,
//!   `lstrip_blocks`, loop controls, Python string methods.
//! - **Completions / embeddings:** a text prompt (or each of several, concatenated) is encoded
//!   **with** special tokens (BOS where the tokenizer's post-processor adds one). A prompt of
//!   token ids needs no tokenizer: the parser already hashed the ids themselves.
//!
//! ## Files
//! `tokenizer:` names a `tokenizer.json` or a model directory holding one (or is
//! `tiktoken:<name>`: no files, the pool's `chat_template:` optional). Beside it,
//! `tokenizer_config.json` (optional) gives the special tokens and possibly `chat_template`
//! (a string, or a list of `{name, template}` from which `default` is taken);
//! `chat_template.jinja` (newer `transformers` layout) wins over it, and the pool's
//! `chat_template:` wins over both. A tokenizer without a template still counts completions
//! exactly; chat requests then keep the estimate.
//!
//! ## Failure is not an error for the client
//! A template that raises (e.g. "roles must alternate") or a body the renderer cannot read
//! leaves the estimate in place: the engine, not the gateway, decides what it accepts. The
//! caller counts these ([`TokenizeError`]).
//!
//! ## Cost
//! Rendering and encoding are CPU work proportional to the prompt: with a real byte-level BPE,
//! ~0.24 ms per KiB against ~3.5 µs per KiB for the estimate (`benches/tokenizer.rs`; 42 ms
//! for a 128 KiB prompt, ~2 % of that prompt's prefill on an H100). The gateway runs it on
//! tokio's blocking pool unless the body is tiny ([`INLINE_MAX_BYTES`]), so a proxy thread
//! never stalls on a long document. A tiktoken encoding is ~10x cheaper: ~23 µs per KiB
//! (`o200k_base`, OpenAI's chat format; 3.3 ms for 128 KiB).

#![warn(missing_docs)]
// Reached from every request: no panics (tests may unwrap, clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod tiktoken;

use std::fmt;
use std::path::{Path, PathBuf};

use minijinja::{Environment, ErrorKind, Value};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::tiktoken::{Tiktoken, TIKTOKEN_PREFIX};
use pronto_core::request::Endpoint;
use pronto_core::tokens::TokenId;

/// Bodies up to this size are tokenized on the proxy thread; larger ones on tokio's blocking
/// pool. `benches/tokenizer.rs` with a real byte-level BPE (4k vocabulary): ~0.24 ms per KiB
/// of prompt (the `tokenizers` crate allocates per pre-token), so a 512-byte body costs about
/// what a thread hand-off does and anything larger leaves the proxy thread.
pub const INLINE_MAX_BYTES: usize = 512;

/// The chat template's name inside the environment.
const CHAT: &str = "chat";

/// A model's tokenizer and chat template, loaded once per config.
pub struct ModelTokenizer {
    /// The `tokenizer.json` loaded, or the `tiktoken:<name>` spec.
    path: PathBuf,
    /// Where the chat template came from, if there is one.
    template_source: Option<String>,
    /// The template file named by the config (overriding the ones beside the tokenizer).
    template_file: Option<PathBuf>,
    encoder: Encoder,
    chat: Option<Environment<'static>>,
    /// `bos_token`, `eos_token`, … as the template sees them.
    specials: Vec<(String, String)>,
    /// SHA-256 of every file read, so a reload can tell an unchanged tokenizer.
    digest: Vec<u8>,
}

/// What turns text into ids.
enum Encoder {
    /// A Hugging Face `tokenizer.json`.
    HuggingFace(Box<tokenizers::Tokenizer>),
    /// A tiktoken encoding (embedded in the binary).
    Tiktoken(Tiktoken),
}

impl fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("path", &self.path)
            .field("template", &self.template_source)
            .finish_non_exhaustive()
    }
}

/// Equal when loaded from the same paths with the same file contents; two tiktoken specs are
/// equal when they denote the same encoding (`tiktoken:gpt-4o` = `tiktoken:o200k_base`: the
/// same ids) and the same template.
impl PartialEq for ModelTokenizer {
    fn eq(&self, other: &ModelTokenizer) -> bool {
        let same_encoder = match (&self.encoder, &other.encoder) {
            (Encoder::Tiktoken(a), Encoder::Tiktoken(b)) => a.encoding() == b.encoding(),
            (Encoder::HuggingFace(_), Encoder::HuggingFace(_)) => self.path == other.path,
            _ => false,
        };
        same_encoder && self.template_source == other.template_source && self.digest == other.digest
    }
}

/// Why a request's ids could not be computed (the estimate is kept).
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The body's messages or prompt could not be read for rendering.
    #[error("request body: {0}")]
    Body(String),
    /// The chat template failed (or raised) on these messages.
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed to encode the text.
    #[error("tokenizer: {0}")]
    Encode(String),
}

impl TokenizeError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            TokenizeError::Body(_) => "body",
            TokenizeError::Template(_) => "template",
            TokenizeError::Encode(_) => "encode",
        }
    }
}

/// The parts of `tokenizer_config.json` that matter here.
#[derive(Deserialize, Default)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<serde_json::Value>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

fn read(path: &Path, digest: &mut Vec<u8>) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    digest.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref());
    Ok(bytes)
}

fn read_text(path: &Path, digest: &mut Vec<u8>) -> Result<String, String> {
    String::from_utf8(read(path, digest)?).map_err(|_| format!("{} is not UTF-8", path.display()))
}

/// The chat environment of a template, if there is one; the error names where it came from.
fn chat(
    template: Option<String>,
    source: Option<&str>,
) -> Result<Option<Environment<'static>>, String> {
    template
        .map(|text| {
            chat_environment(text)
                .map_err(|e| format!("{}: {e}", source.unwrap_or("chat template")))
        })
        .transpose()
}

impl ModelTokenizer {
    /// The tokenizer a pool's `tokenizer:` names: `tiktoken:<name>` (an encoding or an OpenAI
    /// model name, see [`tiktoken`]) or the path of a `tokenizer.json` or a directory
    /// holding one; with its chat template (`chat_template` if given, else, for a
    /// `tokenizer.json`, found beside it; see the module docs). The error says which file or
    /// name is wrong and why.
    pub fn from_spec(spec: &str, chat_template: Option<&Path>) -> Result<ModelTokenizer, String> {
        match spec.strip_prefix(TIKTOKEN_PREFIX) {
            Some(name) => ModelTokenizer::tiktoken(name, chat_template),
            None => ModelTokenizer::load(Path::new(spec), chat_template),
        }
    }

    /// The tiktoken encoding `name`, with the template file `chat_template` if given (its
    /// `eos_token` is `<|endoftext|>`, which every encoding has).
    fn tiktoken(name: &str, chat_template: Option<&Path>) -> Result<ModelTokenizer, String> {
        let tiktoken = Tiktoken::new(name)?;
        let mut digest = Vec::new();
        let template = chat_template
            .map(|p| read_text(p, &mut digest))
            .transpose()?;
        let template_source = chat_template.map(|p| p.display().to_string());
        Ok(ModelTokenizer {
            path: PathBuf::from(format!("{TIKTOKEN_PREFIX}{name}")),
            chat: chat(template, template_source.as_deref())?,
            template_source,
            template_file: chat_template.map(Path::to_path_buf),
            encoder: Encoder::Tiktoken(tiktoken),
            specials: vec![("eos_token".into(), "<|endoftext|>".into())],
            digest,
        })
    }

    /// Load the tokenizer at `path` (a `tokenizer.json` or a directory holding one) and its
    /// chat template (`chat_template` if given, else found beside it; see the module docs).
    fn load(path: &Path, chat_template: Option<&Path>) -> Result<ModelTokenizer, String> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut digest = Vec::new();
        let bytes = read(&file, &mut digest)?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| format!("{} is not a tokenizer.json: {e}", file.display()))?;

        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = if config_path.is_file() {
            let bytes = read(&config_path, &mut digest)?;
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", config_path.display()))?
        } else {
            TokenizerConfig::default()
        };
        let specials = config
            .rest
            .iter()
            .filter(|(k, _)| k.ends_with("_token"))
            .filter_map(|(k, v)| {
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    // An AddedToken object: {"content": "<s>", "lstrip": false, ...}.
                    serde_json::Value::Object(o) => o.get("content")?.as_str()?.to_string(),
                    _ => return None,
                };
                Some((k.clone(), text))
            })
            .collect();

        let beside = dir.join("chat_template.jinja");
        let (template, template_source) = if let Some(p) = chat_template {
            (
                Some(read_text(p, &mut digest)?),
                Some(p.display().to_string()),
            )
        } else if beside.is_file() {
            (
                Some(read_text(&beside, &mut digest)?),
                Some(beside.display().to_string()),
            )
        } else {
            let t = match config.chat_template {
                Some(serde_json::Value::String(s)) => Some(s),
                Some(serde_json::Value::Array(list)) => list.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == "default")
                        .then(|| t.get("template")?.as_str().map(str::to_string))?
                }),
                _ => None,
            };
            let source = t
                .as_ref()
                .map(|_| format!("{} (chat_template)", config_path.display()));
            (t, source)
        };
        Ok(ModelTokenizer {
            path: file,
            chat: chat(template, template_source.as_deref())?,
            template_source,
            template_file: chat_template.map(Path::to_path_buf),
            encoder: Encoder::HuggingFace(Box::new(tokenizer)),
            specials,
            digest,
        })
    }

    /// What identifies this tokenizer: its encoder, where it was loaded from, its template's
    /// source and the SHA-256 of every file read. Equal fingerprints, equal token ids.
    pub fn fingerprint(&self) -> String {
        let kind = match &self.encoder {
            Encoder::Tiktoken(t) => t.encoding(),
            Encoder::HuggingFace(_) => "hf",
        };
        let mut s = format!("{kind}:{}", self.path.display());
        if let Some(t) = &self.template_source {
            s.push_str(&format!(" template:{t}"));
        }
        for b in &self.digest {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// The `tokenizer.json` loaded, or the `tiktoken:<name>` spec.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tiktoken encoding (`o200k_base`, …) when this is one, whatever name selected it.
    pub fn tiktoken_encoding(&self) -> Option<&'static str> {
        match &self.encoder {
            Encoder::Tiktoken(t) => Some(t.encoding()),
            Encoder::HuggingFace(_) => None,
        }
    }

    /// The chat template file the config named, if it named one.
    pub fn chat_template_file(&self) -> Option<&Path> {
        self.template_file.as_deref()
    }

    /// Where the chat template was read from (a file, or `tokenizer_config.json`).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.template_source.as_deref()
    }

    /// Whether chat requests are counted exactly: a chat template was found, or this is a
    /// tiktoken encoding (which has OpenAI's chat format built in).
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some() || matches!(self.encoder, Encoder::Tiktoken(_))
    }

    /// The engine's token ids for a request body to `endpoint`; `Ok(None)` when there is
    /// nothing to do (the prompt is already token ids, or a chat request and no template).
    pub fn prompt_ids(
        &self,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<Option<Vec<TokenId>>, TokenizeError> {
        match endpoint {
            Endpoint::ChatCompletions => match (&self.chat, &self.encoder) {
                (Some(env), Encoder::HuggingFace(t)) => {
                    encode(t, &self.render_chat(env, body)?, false).map(Some)
                }
                (Some(env), Encoder::Tiktoken(t)) => Ok(Some(
                    t.encode_with_special_tokens(&self.render_chat(env, body)?),
                )),
                (None, Encoder::Tiktoken(t)) => {
                    let req: ChatBody = serde_json::from_slice(body)
                        .map_err(|e| TokenizeError::Body(e.to_string()))?;
                    Ok(Some(t.chat_ids(&req.messages)))
                }
                (None, Encoder::HuggingFace(_)) => Ok(None),
            },
            Endpoint::Completions | Endpoint::Embeddings => {
                let key = if endpoint == Endpoint::Completions {
                    "prompt"
                } else {
                    "input"
                };
                let Some(texts) = input_texts(body, key)? else {
                    return Ok(None);
                };
                let mut ids = Vec::new();
                for text in &texts {
                    match &self.encoder {
                        Encoder::HuggingFace(t) => ids.extend(encode(t, text, true)?),
                        Encoder::Tiktoken(t) => ids.extend(t.encode_ordinary(text)),
                    }
                }
                Ok(Some(ids))
            }
        }
    }

    fn render_chat(
        &self,
        env: &Environment<'static>,
        body: &[u8],
    ) -> Result<String, TokenizeError> {
        let req: ChatBody =
            serde_json::from_slice(body).map_err(|e| TokenizeError::Body(e.to_string()))?;
        let messages: Vec<serde_json::Value> =
            req.messages.into_iter().map(normalize_message).collect();
        let add_generation_prompt = req
            .add_generation_prompt
            .unwrap_or(!req.continue_final_message.unwrap_or(false));
        let mut ctx: Vec<(String, Value)> = self
            .specials
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (k, v) in req.chat_template_kwargs.into_iter().flatten() {
            ctx.push((k, Value::from_serialize(v)));
        }
        ctx.push(("messages".into(), Value::from_serialize(&messages)));
        ctx.push((
            "tools".into(),
            req.tools
                .map(Value::from_serialize)
                .unwrap_or(Value::from(())),
        ));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let ctx: Value = ctx.into_iter().collect();
        let template = env
            .get_template(CHAT)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        template
            .render(ctx)
            .map_err(|e| TokenizeError::Template(e.to_string()))
    }
}

fn encode(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<TokenId>, TokenizeError> {
    tokenizer
        .encode_fast(text, add_special_tokens)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| TokenizeError::Encode(e.to_string()))
}

/// The chat template environment, configured as `transformers` renders chat templates.
fn chat_environment(template: String) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, _> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |format: String| -> String {
        strftime_now(&format)
    });
    env.add_template_owned(CHAT, template)?;
    Ok(env)
}

/// Today's date for templates that print it (`strftime_now("%d %b %Y")`): the common date
/// directives, in UTC.
fn strftime_now(format: &str) -> String {
    let (year, month, day) = pronto_core::time::civil_date(std::time::SystemTime::now());
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The fields of a chat body the template needs.
#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// One message as vLLM hands it to the template: content parts flattened to their text
/// joined by `\n`, tool-call `arguments` strings parsed into objects.
fn normalize_message(mut m: serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
    use serde_json::Value as J;
    if let Some(parts @ J::Array(_)) = m.get("content") {
        let joined = content_text(parts).unwrap_or_default().into_owned();
        m.insert("content".into(), J::String(joined));
    }
    if let Some(J::Array(calls)) = m.get_mut("tool_calls") {
        for call in calls {
            if let Some(args) = call
                .get_mut("function")
                .and_then(|f| f.get_mut("arguments"))
            {
                if let J::String(s) = args {
                    if let Ok(parsed) = serde_json::from_str::<J>(s) {
                        *args = parsed;
                    }
                }
            }
        }
    }
    J::Object(m)
}

/// A message's `content` as text: a string as it is (borrowed, not copied), parts as their
/// text parts joined by `\n`; `None` for anything else (`null`).
pub(crate) fn content_text(content: &serde_json::Value) -> Option<std::borrow::Cow<'_, str>> {
    use serde_json::Value as J;
    match content {
        J::String(s) => Some(s.as_str().into()),
        J::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(J::as_str).unwrap_or("text") == "text")
                .filter_map(|p| p.get("text").and_then(J::as_str))
                .collect();
            Some(texts.join("\n").into())
        }
        _ => None,
    }
}

/// The text prompts of a completions / embeddings body (`key` = `prompt` or `input`); `None`
/// when the prompt is token ids.
fn input_texts(body: &[u8], key: &str) -> Result<Option<Vec<String>>, TokenizeError> {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        prompt: Option<&'a RawValue>,
        #[serde(default, borrow)]
        input: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Input {
        One(String),
        Many(Vec<String>),
        // Only the shape matters: token ids were hashed by the parser.
        #[allow(dead_code)]
        Ids(Vec<serde_json::Value>),
    }
    let body: Body<'_> =
        serde_json::from_slice(body).map_err(|e| TokenizeError::Body(e.to_string()))?;
    let raw = if key == "prompt" {
        body.prompt
    } else {
        body.input
    }
    .ok_or_else(|| TokenizeError::Body(format!("no `{key}`")))?;
    match serde_json::from_str::<Input>(raw.get()) {
        Ok(Input::One(s)) => Ok(Some(vec![s])),
        Ok(Input::Many(v)) => Ok(Some(v)),
        Ok(Input::Ids(_)) => Ok(None),
        Err(e) => Err(TokenizeError::Body(format!("`{key}`: {e}"))),
    }
}

#[cfg(test)]
#[path = "tokenizer_tests.rs"]
mod tests;

// Under `tokenizer` so that `cargo test tokenizer` runs them too.
#[cfg(test)]
#[path = "tiktoken_tests.rs"]
mod tiktoken_tests;
