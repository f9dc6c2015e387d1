//! OpenAI request bodies → [`RequestFeatures`].
//!
//! ## What is read
//! | endpoint | fields |
//! | --- | --- |
//! | `/v1/chat/completions` | `model`, `messages`, `tools`, `stream`, `stream_options.include_usage`, `max_completion_tokens` else `max_tokens`, `user`, `reasoning_effort` |
//! | `/v1/completions` | `model`, `prompt`, `stream`, `stream_options.include_usage`, `max_tokens`, `user` |
//! | `/v1/embeddings` | `model`, `input`, `user` |
//!
//! Every other field is skipped without being decoded (clients send many). Fields may come in
//! any order — the OpenAI Python SDK sends `messages` before `model`. `null` counts as absent for
//! optional fields. `model` is required everywhere; `messages` (non-empty), `prompt` and `input`
//! are required on their endpoints.
//!
//! ## The canonical prompt
//! Chat: if `tools` is a non-empty array, first `tools: <its raw JSON text, as sent>\n`; then for
//! each message in order `<role>: <text>\n`, where text is the `content` string, nothing for a
//! `null`/absent content, or the concatenated `text` of every `{"type": "text"}` part (image,
//! audio and other parts contribute nothing); an assistant message's `tool_calls[].function` (and
//! legacy `function_call`) append their `name` then `arguments` right after the text, so agent
//! turns extend the chain of the turn before. Completions / embeddings: the string, or the strings
//! of an array joined by `\n`. Token-id prompts (an array of ids or of id arrays) have an empty
//! canonical prompt; `prompt_tokens` is the number of ids and the block hashes are chained over
//! the ids themselves (all sequences of a batch, concatenated), so repeated id prompts still
//! share prefixes.
//!
//! ## Copy discipline (performance contract)
//! A 400 KiB chat body copies its prompt text exactly once:
//! 1. the body is checked to be UTF-8 once, then parsed by `serde_json` from the `&str`;
//! 2. every text field (roles, contents, text parts, tool names and arguments) is kept as a
//!    [`JsonStr`]: a slice of the body holding the still-escaped literal — no allocation, no copy;
//!    the `tools` array is kept as a borrowed `RawValue`;
//! 3. once all fields are known (so field order does not matter), the exact upper bound of the
//!    prompt length is summed, ONE `String` of that capacity is allocated, and each literal is
//!    decoded straight into it (`JsonStr::unescape_into`). The string never grows.
//!
//! The unit test `chat_text_is_borrowed_then_written_once` checks both halves structurally.
//!
//! ## Errors
//! [`RequestError`] says what is wrong in words fit for the OpenAI error body of a 400 answer.
//! Bodies that are not UTF-8 are refused before parsing; nesting deeper than `serde_json`'s
//! recursion limit (128) is an error, never a stack overflow, and skipped fields are skipped
//! iteratively.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::features::{Endpoint, RequestFeatures};
use super::json_str::{unexpected, JsonStr};
use crate::tokens::{self, TokenId, BLOCK_TOKENS};

/// Why a request body could not be read. The `Display` text is meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The body is not UTF-8; `offset` is the first byte that is not.
    #[error("request body is not valid UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// The body is not well-formed JSON (or nests deeper than 128 levels).
    #[error("request body is not valid JSON: {msg} (line {line}, column {column})")]
    InvalidJson {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// What the JSON parser objected to.
        msg: String,
    },
    /// The body is JSON but not an object.
    #[error("request body must be a JSON object")]
    NotAnObject,
    /// A required field is absent.
    #[error("missing required field `{0}`")]
    MissingField(&'static str),
    /// A field has the wrong JSON type or an out-of-range value.
    #[error("field `{field}` must be {expected}")]
    WrongType {
        /// The field's name.
        field: &'static str,
        /// What it must be, in words.
        expected: &'static str,
    },
    /// One chat message is malformed.
    #[error("invalid message `messages[{index}]`: {msg}")]
    InvalidMessage {
        /// Position of the message in `messages`.
        index: usize,
        /// What is wrong with it.
        msg: String,
    },
}

impl RequestError {
    /// The request field at fault, for the `param` member of an OpenAI error object.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            RequestError::MissingField(field) | RequestError::WrongType { field, .. } => {
                Some(field)
            }
            RequestError::InvalidMessage { .. } => Some("messages"),
            _ => None,
        }
    }
}

/// Parses an OpenAI request body for `endpoint` into the features routing needs.
///
/// `session_header` is the caller's `x-session-id` value; it wins over the body's `user` as the
/// session key. Allocates the canonical prompt once and copies the prompt text into it once (see
/// the module docs).
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    session_header: Option<&str>,
) -> Result<RequestFeatures, RequestError> {
    parse(endpoint, body, session_header, false)
}

/// [`parse_request`], keeping the canonical prompt in [`RequestFeatures::prompt`] (the
/// simulator reads it; the gateway does not, and holds no copy of the prompt beside the body).
pub fn parse_request_with_prompt(
    endpoint: Endpoint,
    body: &[u8],
    session_header: Option<&str>,
) -> Result<RequestFeatures, RequestError> {
    parse(endpoint, body, session_header, true)
}

fn parse(
    endpoint: Endpoint,
    body: &[u8],
    session_header: Option<&str>,
    keep_prompt: bool,
) -> Result<RequestFeatures, RequestError> {
    let text = std::str::from_utf8(body).map_err(|e| RequestError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let fields = parse_fields(endpoint, text)?;
    let model_span = fields.model.and_then(|m| m.span_in(text));
    let mut features = build(endpoint, fields, session_header, keep_prompt)?;
    features.model_span = model_span;
    Ok(features)
}

// === the JSON shapes, borrowed from the body ===

/// The fields of a body that matter, still borrowed.
#[derive(Default)]
struct Fields<'a> {
    model: Option<JsonStr<'a>>,
    messages: Option<Vec<Message<'a>>>,
    stream: Option<bool>,
    include_usage: Option<bool>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    user: Option<JsonStr<'a>>,
    reasoning_effort: Option<JsonStr<'a>>,
    tools: Option<&'a RawValue>,
    /// `prompt` (completions) or `input` (embeddings).
    input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(expecting = "a message object")]
struct Message<'a> {
    #[serde(borrow)]
    role: JsonStr<'a>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
    #[serde(borrow, default)]
    function_call: Option<Function<'a>>,
}

#[derive(Deserialize)]
#[serde(expecting = "a tool call object")]
struct ToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
#[serde(expecting = "a function call object")]
struct Function<'a> {
    #[serde(borrow, default)]
    name: Option<JsonStr<'a>>,
    /// A JSON-encoded string per the API; some clients send an object, kept verbatim.
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(expecting = "a content part object")]
struct Part<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<JsonStr<'a>>,
    #[serde(borrow, default)]
    text: Option<JsonStr<'a>>,
}

#[derive(Deserialize)]
#[serde(expecting = "an object such as {\"include_usage\": true}")]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// The top-level keys we read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    Model,
    Messages,
    Stream,
    StreamOptions,
    MaxTokens,
    MaxCompletionTokens,
    User,
    ReasoningEffort,
    Tools,
    Prompt,
    Input,
    Other,
}

impl Key {
    /// This key if `endpoint` reads it, else [`Key::Other`].
    fn on(self, endpoint: Endpoint) -> Key {
        use Endpoint::*;
        match (self, endpoint) {
            (Key::Model | Key::User, _)
            | (
                Key::Messages | Key::Tools | Key::MaxCompletionTokens | Key::ReasoningEffort,
                ChatCompletions,
            )
            | (Key::Stream | Key::StreamOptions | Key::MaxTokens, ChatCompletions | Completions)
            | (Key::Prompt, Completions)
            | (Key::Input, Embeddings) => self,
            _ => Key::Other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Key::Model => "model",
            Key::Messages => "messages",
            Key::Stream => "stream",
            Key::StreamOptions => "stream_options",
            Key::MaxTokens => "max_tokens",
            Key::MaxCompletionTokens => "max_completion_tokens",
            Key::User => "user",
            Key::ReasoningEffort => "reasoning_effort",
            Key::Tools => "tools",
            Key::Prompt => "prompt",
            Key::Input => "input",
            Key::Other => "",
        }
    }

    /// What a value of this field must be, for [`RequestError::WrongType`].
    fn expected(self) -> &'static str {
        match self {
            Key::Model | Key::User | Key::ReasoningEffort => "a string",
            Key::Messages => "a non-empty array of message objects",
            Key::Stream => "a boolean",
            Key::StreamOptions => "an object such as {\"include_usage\": true}",
            Key::MaxTokens | Key::MaxCompletionTokens => "a non-negative integer below 2^32",
            Key::Tools => "an array of tool definitions",
            Key::Prompt | Key::Input => {
                "a string, an array of strings, an array of token ids, or an array of token-id arrays"
            }
            Key::Other => "a valid value",
        }
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "model" => Key::Model,
                    "messages" => Key::Messages,
                    "stream" => Key::Stream,
                    "stream_options" => Key::StreamOptions,
                    "max_tokens" => Key::MaxTokens,
                    "max_completion_tokens" => Key::MaxCompletionTokens,
                    "user" => Key::User,
                    "reasoning_effort" => Key::ReasoningEffort,
                    "tools" => Key::Tools,
                    "prompt" => Key::Prompt,
                    "input" => Key::Input,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

// === one pass over the body ===

/// Where a data (type) error happened, recorded before each value is decoded so the generic
/// `serde_json::Error` can be turned into a [`RequestError`] naming the field.
#[derive(Default)]
struct Failure {
    key: Option<Key>,
    message_index: Option<usize>,
}

struct BodySeed<'f, 'a> {
    endpoint: Endpoint,
    fields: &'f mut Fields<'a>,
    failure: &'f mut Failure,
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let f = self.fields;
        while let Some(key) = map.next_key::<Key>()? {
            let key = key.on(self.endpoint);
            self.failure.key = Some(key);
            match key {
                Key::Model => f.model = Some(map.next_value()?),
                Key::Messages => {
                    let seed = MessagesSeed {
                        index: &mut self.failure.message_index,
                    };
                    f.messages = Some(map.next_value_seed(seed)?);
                }
                Key::Stream => f.stream = map.next_value()?,
                Key::StreamOptions => {
                    let opts: Option<StreamOptions> = map.next_value()?;
                    f.include_usage = opts.and_then(|o| o.include_usage);
                }
                Key::MaxTokens => f.max_tokens = map.next_value()?,
                Key::MaxCompletionTokens => f.max_completion_tokens = map.next_value()?,
                Key::User => f.user = map.next_value()?,
                Key::ReasoningEffort => f.reasoning_effort = map.next_value()?,
                Key::Tools => f.tools = map.next_value()?,
                Key::Prompt | Key::Input => f.input = Some(map.next_value()?),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            self.failure.key = None;
        }
        Ok(())
    }
}

/// `messages`, recording the index of the message being decoded.
struct MessagesSeed<'f> {
    index: &'f mut Option<usize>,
}

impl<'de> DeserializeSeed<'de> for MessagesSeed<'_> {
    type Value = Vec<Message<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed<'_> {
    type Value = Vec<Message<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of message objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        loop {
            *self.index = Some(out.len());
            match seq.next_element()? {
                Some(m) => out.push(m),
                None => break,
            }
        }
        *self.index = None;
        Ok(out)
    }
}

/// The parser's message without its " at line L column C" suffix.
fn message_of(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match full.strip_suffix(&suffix) {
        Some(msg) => msg.to_string(),
        None => full,
    }
}

fn parse_fields(endpoint: Endpoint, text: &str) -> Result<Fields<'_>, RequestError> {
    let mut fields = Fields::default();
    let mut failure = Failure::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = BodySeed {
        endpoint,
        fields: &mut fields,
        failure: &mut failure,
    };
    let result = seed.deserialize(&mut de).and_then(|()| de.end());
    match result {
        Ok(()) => Ok(fields),
        Err(e) if e.classify() == serde_json::error::Category::Data => Err(match failure {
            Failure { key: None, .. } => RequestError::NotAnObject,
            Failure {
                key: Some(Key::Messages),
                message_index: Some(index),
            } => RequestError::InvalidMessage {
                index,
                msg: message_of(&e),
            },
            Failure { key: Some(key), .. } => RequestError::WrongType {
                field: key.name(),
                expected: key.expected(),
            },
        }),
        Err(e) => Err(RequestError::InvalidJson {
            line: e.line(),
            column: e.column(),
            msg: message_of(&e),
        }),
    }
}

// === assembling the features ===

fn build(
    endpoint: Endpoint,
    f: Fields<'_>,
    session_header: Option<&str>,
    keep_prompt: bool,
) -> Result<RequestFeatures, RequestError> {
    let model = f.model.ok_or(RequestError::MissingField("model"))?;
    let (prompt, ids) = match endpoint {
        Endpoint::ChatCompletions => {
            let messages = f.messages.ok_or(RequestError::MissingField("messages"))?;
            if messages.is_empty() {
                return Err(wrong(Key::Messages));
            }
            (chat_prompt(tools_text(f.tools)?, &messages)?, None)
        }
        Endpoint::Completions => input_prompt(Key::Prompt, f.input)?,
        Endpoint::Embeddings => input_prompt(Key::Input, f.input)?,
    };
    let (n_tokens, block_hashes) = match ids {
        None => tokens::text_block_hashes(prompt.as_bytes(), BLOCK_TOKENS),
        Some(ids) => (ids.len(), tokens::block_hashes(&ids, BLOCK_TOKENS)),
    };
    let session_key = match session_header.filter(|h| !h.is_empty()) {
        Some(h) => Some(h.to_owned()),
        None => f
            .user
            .filter(|u| !u.is_empty())
            .map(|u| u.decode().into_owned()),
    };
    Ok(RequestFeatures {
        endpoint,
        model: model.decode().into_owned(),
        model_span: None,
        stream: f.stream.unwrap_or(false),
        include_usage: f.include_usage.unwrap_or(false),
        prompt: if keep_prompt { prompt } else { String::new() },
        prompt_tokens: u32::try_from(n_tokens).unwrap_or(u32::MAX),
        max_tokens: f.max_completion_tokens.or(f.max_tokens),
        session_key,
        block_hashes,
        slo: crate::slo::SloTargets::default(),
        reasoning_effort: f
            .reasoning_effort
            .and_then(|e| crate::predict::ReasoningEffort::parse(&e.decode())),
        objective: crate::slo::Objective::Ttft,
    })
}

fn wrong(key: Key) -> RequestError {
    RequestError::WrongType {
        field: key.name(),
        expected: key.expected(),
    }
}

/// The raw text of a non-empty `tools` array.
fn tools_text(tools: Option<&RawValue>) -> Result<Option<&str>, RequestError> {
    let Some(raw) = tools.map(RawValue::get) else {
        return Ok(None);
    };
    match raw.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        Some(inner) if inner.trim().is_empty() => Ok(None),
        Some(_) => Ok(Some(raw)),
        None => Err(wrong(Key::Tools)),
    }
}

const TOOLS_PREFIX: &str = "tools: ";
const ROLE_SEP: &str = ": ";

/// The text a message's `content` contributes.
enum Content<'a> {
    Empty,
    Text(JsonStr<'a>),
    Parts(Vec<JsonStr<'a>>),
}

impl<'a> Content<'a> {
    fn of(raw: Option<&'a RawValue>) -> Result<Content<'a>, String> {
        let Some(raw) = raw else {
            return Ok(Content::Empty);
        };
        let s = raw.get();
        match s.as_bytes().first() {
            Some(b'"') => Ok(Content::Text(JsonStr::from_raw_str(s))),
            Some(b'[') => {
                let parts: Vec<Part<'a>> = serde_json::from_str(s)
                    .map_err(|e| format!("invalid `content` array: {}", message_of(&e)))?;
                let texts = parts
                    .into_iter()
                    .filter(|p| p.kind.is_some_and(|k| k.decode() == "text"))
                    .filter_map(|p| p.text)
                    .collect();
                Ok(Content::Parts(texts))
            }
            _ => Err(format!(
                "`content` must be a string, null, or an array of content parts, not {}",
                unexpected(s)
            )),
        }
    }

    fn max_len(&self) -> usize {
        match self {
            Content::Empty => 0,
            Content::Text(s) => s.max_decoded_len(),
            Content::Parts(parts) => parts.iter().map(|p| p.max_decoded_len()).sum(),
        }
    }

    fn write(&self, out: &mut String) {
        match self {
            Content::Empty => {}
            Content::Text(s) => s.unescape_into(out),
            Content::Parts(parts) => parts.iter().for_each(|p| p.unescape_into(out)),
        }
    }
}

impl<'a> Message<'a> {
    fn functions(&self) -> impl Iterator<Item = &Function<'a>> {
        let calls = self.tool_calls.iter().flatten();
        calls
            .filter_map(|c| c.function.as_ref())
            .chain(&self.function_call)
    }
}

impl Function<'_> {
    fn max_len(&self) -> usize {
        let name = self.name.map_or(0, |n| n.max_decoded_len());
        name + self.arguments.map_or(0, |a| a.get().len())
    }

    fn write(&self, out: &mut String) {
        if let Some(name) = self.name {
            name.unescape_into(out);
        }
        if let Some(args) = self.arguments.map(RawValue::get) {
            if args.starts_with('"') {
                JsonStr::from_raw_str(args).unescape_into(out);
            } else if args != "null" {
                out.push_str(args);
            }
        }
    }
}

/// The canonical chat prompt: allocated once at its exact upper bound, written once.
fn chat_prompt(tools: Option<&str>, messages: &[Message<'_>]) -> Result<String, RequestError> {
    let contents = messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            Content::of(m.content).map_err(|msg| RequestError::InvalidMessage { index, msg })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut prompt = String::with_capacity(chat_prompt_bound(tools, messages, &contents));
    write_chat_prompt(tools, messages, &contents, &mut prompt);
    Ok(prompt)
}

fn chat_prompt_bound(
    tools: Option<&str>,
    messages: &[Message<'_>],
    contents: &[Content<'_>],
) -> usize {
    let mut bound = tools.map_or(0, |t| TOOLS_PREFIX.len() + t.len() + 1);
    for (m, c) in messages.iter().zip(contents) {
        bound += m.role.max_decoded_len() + ROLE_SEP.len() + c.max_len() + 1;
        bound += m.functions().map(Function::max_len).sum::<usize>();
    }
    bound
}

fn write_chat_prompt(
    tools: Option<&str>,
    messages: &[Message<'_>],
    contents: &[Content<'_>],
    out: &mut String,
) {
    if let Some(t) = tools {
        out.push_str(TOOLS_PREFIX);
        out.push_str(t);
        out.push('\n');
    }
    for (m, c) in messages.iter().zip(contents) {
        m.role.unescape_into(out);
        out.push_str(ROLE_SEP);
        c.write(out);
        m.functions().for_each(|f| f.write(out));
        out.push('\n');
    }
}

/// The canonical prompt of a completions `prompt` / embeddings `input`, and the token ids when
/// the input is ids rather than text.
fn input_prompt(
    key: Key,
    raw: Option<&RawValue>,
) -> Result<(String, Option<Vec<TokenId>>), RequestError> {
    let raw = raw.ok_or(RequestError::MissingField(key.name()))?.get();
    let texts: Vec<JsonStr<'_>> = match raw.as_bytes().first() {
        Some(b'"') => vec![JsonStr::from_raw_str(raw)],
        Some(b'[') => match raw[1..].trim_start().as_bytes().first() {
            Some(b'"') => serde_json::from_str(raw).map_err(|_| wrong(key))?,
            Some(b'[') => {
                let batch: Vec<Vec<TokenId>> = serde_json::from_str(raw).map_err(|_| wrong(key))?;
                return Ok((String::new(), Some(batch.concat())));
            }
            Some(b']') => Vec::new(),
            _ => {
                let ids: Vec<TokenId> = serde_json::from_str(raw).map_err(|_| wrong(key))?;
                return Ok((String::new(), Some(ids)));
            }
        },
        _ => return Err(wrong(key)),
    };
    let bound = texts.iter().map(|t| t.max_decoded_len() + 1).sum();
    let mut prompt = String::with_capacity(bound);
    for (i, t) in texts.iter().enumerate() {
        if i > 0 {
            prompt.push('\n');
        }
        t.unescape_into(&mut prompt);
    }
    Ok((prompt, None))
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
