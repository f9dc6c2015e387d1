//! Incremental scanner for OpenAI-style server-sent-event streams: first token, usage, end.
//!
//! The proxy feeds [`SseScanner::feed`] every response body chunk as it passes through, and
//! takes the moment a call returns [`ScanUpdate::first_token`] as the first-token time
//! (DESIGN §3.2). The stream itself is never copied.
//!
//! ## Algorithm
//! Lines end in `\n` or `\r\n`. Complete lines are processed in place, as slices of the chunk.
//! Only a line split across chunks is carried over, and only up to `MAX_LINE_BYTES`; the rest
//! of an absurdly long line is dropped (the line is processed truncated — every path truncates
//! the same way, so results do not depend on chunking). A blank line dispatches the event. Fields:
//! `data:` (with or without the space; several `data:` lines join with `\n`), `event:` (only
//! `error` matters); `:` comments (keep-alives) and other fields are ignored. The single `data:`
//! line of the usual event stays borrowed; an event still open at the end of a chunk, or one with
//! several data lines, is collected in a small reused buffer bounded like the carry-over.
//!
//! Each dispatched data event is classified in one pass that lexes its JSON strings (honouring
//! escapes) and looks at the value after every string followed by `:` — an object key — without
//! decoding the JSON:
//! - **output** — it has a key `"content"`, `"reasoning_content"`, `"reasoning"` or `"text"`
//!   whose value is a non-empty string, a `"tool_calls"` array that is not empty, or a
//!   `"function_call"` object. A role-only first chunk (`"content":""`), `"content":null`, a
//!   comment or `data: [DONE]` are not output. Generated text that *mentions* `"content":`
//!   is inside a string, so it never looks like a key;
//! - **done** — the data is `[DONE]`;
//! - **usage** — a `"usage"` key with an object value: only then is the event decoded with
//!   `serde_json` to read `usage` ([`Usage`]);
//! - **error** — an `event: error` field, an `"error"` key, or `"object":"error"` (vLLM): then
//!   the event is decoded to read the message.
//!
//! The first output event sets `first_token` exactly once; every output event counts towards
//! [`SseScanner::output_events`] (roughly one token each on vLLM/SGLang).
//!
//! ## Reasoning and answer
//! Output is split by kind: **reasoning** is a non-empty `"reasoning_content"` or
//! `"reasoning"` string (vLLM's and SGLang's reasoning parsers, DeepSeek's API); **answer** is
//! everything else that counts as output — a non-empty `"content"` or `"text"`, `"tool_calls"`,
//! `"function_call"`. The first answer event sets `first_answer` exactly once: its time is the
//! time to first answer (TTFA), which for a reasoning model is what the user waits for;
//! the first output of either kind is the TTFT. Events carrying only reasoning count towards
//! [`SseScanner::reasoning_events`] (≈ reasoning tokens). For a model without reasoning the
//! first answer is the first token.

use serde::Deserialize;

/// Longest line (and longest event data) kept across chunks; longer ones are truncated.
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;

/// Token accounting reported by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u32,
    /// `usage.completion_tokens` (0 when absent, as for embeddings).
    pub completion_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens`, when the server reports it.
    pub cached_tokens: Option<u32>,
}

impl<'de> Deserialize<'de> for Usage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Usage, D::Error> {
        #[derive(Deserialize)]
        struct Details {
            #[serde(default)]
            cached_tokens: Option<u32>,
        }
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            prompt_tokens: u32,
            #[serde(default)]
            completion_tokens: u32,
            #[serde(default)]
            prompt_tokens_details: Option<Details>,
        }
        let raw = Raw::deserialize(deserializer)?;
        Ok(Usage {
            prompt_tokens: raw.prompt_tokens,
            completion_tokens: raw.completion_tokens,
            cached_tokens: raw.prompt_tokens_details.and_then(|d| d.cached_tokens),
        })
    }
}

#[derive(Deserialize)]
struct UsageEnvelope {
    #[serde(default)]
    usage: Option<Usage>,
}

/// The `usage` of a complete (non-streaming) JSON response body, if it has one.
pub fn usage_from_body(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<UsageEnvelope>(body).ok()?.usage
}

/// What one [`SseScanner::feed`] call saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanUpdate {
    /// The first output-carrying event completed in this chunk (true in exactly one call).
    pub first_token: bool,
    /// The first answer event (content or tool call, not reasoning) completed in this chunk
    /// (true in at most one call).
    pub first_answer: bool,
    /// Output-carrying events completed in this chunk.
    pub output_events: u32,
    /// Of those, events that carried reasoning only.
    pub reasoning_events: u32,
    /// The last `usage` object completed in this chunk.
    pub usage: Option<Usage>,
    /// `data: [DONE]` was completed in this chunk.
    pub done: bool,
    /// The message of an error event completed in this chunk.
    pub error: Option<String>,
}

/// Incremental SSE scanner; one per response. See the module docs.
#[derive(Debug, Default)]
pub struct SseScanner {
    /// The start of a line split across chunks (at most [`MAX_LINE_BYTES`]).
    carry: Vec<u8>,
    /// The carried line reached the bound; drop its bytes until the newline.
    carry_full: bool,
    /// Data of the open event when it cannot stay borrowed (at most [`MAX_LINE_BYTES`]).
    data: Vec<u8>,
    /// The open event has data in `data`.
    has_data: bool,
    /// The open event has `event: error`.
    error_event: bool,
    events: u32,
    first_token_event: Option<u32>,
    first_answer_event: Option<u32>,
    output_events: u32,
    reasoning_events: u32,
    usage: Option<Usage>,
    done: bool,
    error: Option<String>,
    truncated_lines: u32,
}

/// What one data event carried.
#[derive(Default)]
struct Event {
    output: bool,
    /// Output other than reasoning (content, text, a tool call).
    answer: bool,
    done: bool,
    usage: Option<Usage>,
    error: Option<String>,
}

impl SseScanner {
    /// A scanner for a new response stream.
    pub fn new() -> SseScanner {
        SseScanner::default()
    }

    /// Scans the next body chunk.
    pub fn feed(&mut self, chunk: &[u8]) -> ScanUpdate {
        let mut up = ScanUpdate::default();
        let mut rest = chunk;
        if !self.carry.is_empty() || self.carry_full {
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                self.extend_carry(rest);
                return up;
            };
            self.extend_carry(&rest[..nl]);
            rest = &rest[nl + 1..];
            let line = std::mem::take(&mut self.carry);
            let mut pending = None;
            self.line(strip_cr(&line), &mut pending, &mut up);
            self.keep(pending);
            self.carry = line;
            self.carry.clear();
            self.carry_full = false;
        }
        let mut pending = None;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let raw = &rest[..nl];
            if raw.len() > MAX_LINE_BYTES {
                self.truncated_lines += 1;
            }
            self.line(
                strip_cr(&raw[..raw.len().min(MAX_LINE_BYTES)]),
                &mut pending,
                &mut up,
            );
            rest = &rest[nl + 1..];
        }
        self.keep(pending);
        self.extend_carry(rest);
        up
    }

    /// Ends the stream: processes a last line without its newline and dispatches an event the
    /// server left open (lenient: the SSE spec would drop it).
    pub fn finish(&mut self) -> ScanUpdate {
        let mut up = ScanUpdate::default();
        let line = std::mem::take(&mut self.carry);
        let mut pending = None;
        if !line.is_empty() {
            self.line(strip_cr(&line), &mut pending, &mut up);
        }
        self.dispatch(pending, &mut up);
        self.carry_full = false;
        up
    }

    /// Index (0-based, among data events) of the first output event, if any yet.
    #[cfg(test)]
    pub(crate) fn first_token_event(&self) -> Option<u32> {
        self.first_token_event
    }

    /// Index (0-based, among data events) of the first answer event, if any yet.
    #[cfg(test)]
    pub(crate) fn first_answer_event(&self) -> Option<u32> {
        self.first_answer_event
    }

    /// Output-carrying events so far (≈ output tokens on engines that stream one per event).
    pub fn output_events(&self) -> u32 {
        self.output_events
    }

    /// Output events that carried reasoning only (≈ reasoning tokens).
    pub fn reasoning_events(&self) -> u32 {
        self.reasoning_events
    }

    /// Data events dispatched so far.
    pub fn events(&self) -> u32 {
        self.events
    }

    /// The last `usage` seen.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether `data: [DONE]` was seen.
    pub fn done(&self) -> bool {
        self.done
    }

    /// The message of the last error event, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Lines longer than `MAX_LINE_BYTES` that were truncated.
    #[cfg(test)]
    pub(crate) fn truncated_lines(&self) -> u32 {
        self.truncated_lines
    }

    /// Bytes held between chunks (carry-over plus open event data); never above
    /// 2 × `MAX_LINE_BYTES`.
    #[cfg(test)]
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.carry.len() + self.data.len()
    }

    fn extend_carry(&mut self, bytes: &[u8]) {
        if self.carry_full {
            return;
        }
        let room = MAX_LINE_BYTES - self.carry.len();
        if bytes.len() > room {
            self.carry.extend_from_slice(&bytes[..room]);
            self.carry_full = true;
            self.truncated_lines += 1;
        } else {
            self.carry.extend_from_slice(bytes);
        }
    }

    /// Moves a still-borrowed data line of the open event into the owned buffer.
    fn keep(&mut self, pending: Option<&[u8]>) {
        if let Some(p) = pending {
            self.append_data(p);
        }
    }

    fn append_data(&mut self, bytes: &[u8]) {
        self.has_data = true;
        let room = MAX_LINE_BYTES.saturating_sub(self.data.len());
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn line<'c>(&mut self, line: &'c [u8], pending: &mut Option<&'c [u8]>, up: &mut ScanUpdate) {
        if line.is_empty() {
            self.dispatch(pending.take(), up);
            return;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return, // comment / keep-alive
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if !self.has_data && pending.is_none() {
                    *pending = Some(value);
                } else {
                    self.keep(pending.take());
                    self.append_data(b"\n");
                    self.append_data(value);
                }
            }
            b"event" => self.error_event = value == b"error",
            _ => {}
        }
    }

    fn dispatch(&mut self, pending: Option<&[u8]>, up: &mut ScanUpdate) {
        let error_event = std::mem::take(&mut self.error_event);
        if pending.is_none() && !self.has_data {
            return;
        }
        let buf = std::mem::take(&mut self.data);
        let ev = classify(pending.unwrap_or(&buf), error_event);
        self.data = buf;
        self.data.clear();
        self.has_data = false;

        let index = self.events;
        self.events += 1;
        if ev.output {
            self.output_events += 1;
            up.output_events += 1;
            if self.first_token_event.is_none() {
                self.first_token_event = Some(index);
                up.first_token = true;
            }
            if !ev.answer {
                self.reasoning_events += 1;
                up.reasoning_events += 1;
            } else if self.first_answer_event.is_none() {
                self.first_answer_event = Some(index);
                up.first_answer = true;
            }
        }
        if ev.done {
            self.done = true;
            up.done = true;
        }
        if ev.usage.is_some() {
            self.usage = ev.usage;
            up.usage = ev.usage;
        }
        if let Some(e) = ev.error {
            self.error = Some(e.clone());
            up.error = Some(e);
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &s[n..]
}

/// Index of the quote closing the JSON string whose text starts at `i`.
fn string_end(data: &[u8], mut i: usize) -> Option<usize> {
    loop {
        i += data
            .get(i..)?
            .iter()
            .position(|&b| b == b'"' || b == b'\\')?;
        if data[i] == b'"' {
            return Some(i);
        }
        i += 2; // an escape: skip the backslash and the escaped byte
    }
}

/// Calls `f(key, value)` for every object key in the JSON text `data`, in one pass: each string
/// is lexed (escapes honoured), and a string followed by `:` is a key; `value` is the rest of
/// the text from the key's value on.
fn for_each_key<'d>(data: &'d [u8], mut f: impl FnMut(&'d [u8], &'d [u8])) {
    let mut i = 0;
    while let Some(off) = data[i..].iter().position(|&b| b == b'"') {
        let start = i + off + 1;
        let Some(end) = string_end(data, start) else {
            return;
        };
        if let Some(value) = skip_ws(&data[end + 1..]).strip_prefix(b":") {
            f(&data[start..end], skip_ws(value));
        }
        i = end + 1;
    }
}

fn nonempty_string(v: &[u8]) -> bool {
    v.len() >= 2 && v[0] == b'"' && v[1] != b'"'
}

fn nonempty_array(v: &[u8]) -> bool {
    v.first() == Some(&b'[') && skip_ws(&v[1..]).first().is_some_and(|&b| b != b']')
}

fn classify(data: &[u8], error_event: bool) -> Event {
    if data.trim_ascii() == b"[DONE]" {
        return Event {
            done: true,
            ..Event::default()
        };
    }
    let (mut reasoning, mut answer, mut usage, mut error) = (false, false, false, error_event);
    for_each_key(data, |key, v| match key {
        b"content" | b"text" => answer |= nonempty_string(v),
        b"reasoning_content" | b"reasoning" => reasoning |= nonempty_string(v),
        b"tool_calls" => answer |= nonempty_array(v),
        b"function_call" => answer |= v.first() == Some(&b'{'),
        b"usage" => usage |= v.first() == Some(&b'{'),
        b"error" => error |= matches!(v.first(), Some(b'{' | b'"')),
        b"object" => error |= v.starts_with(b"\"error\""),
        _ => {}
    });
    Event {
        output: reasoning || answer,
        answer,
        done: false,
        usage: if usage { usage_from_body(data) } else { None },
        error: if error {
            error_message(data, error_event)
        } else {
            None
        },
    }
}

/// The message of an error event: `{"error": {"message": ..}}` (OpenAI), `{"error": ".."}`,
/// or `{"object": "error", "message": ..}` (vLLM). `None` when the data is no error after all.
fn error_message(data: &[u8], error_event: bool) -> Option<String> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ErrorField {
        Text(String),
        Object {
            #[serde(default)]
            message: Option<String>,
        },
    }
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(default)]
        error: Option<ErrorField>,
        #[serde(default)]
        object: Option<String>,
        #[serde(default)]
        message: Option<String>,
    }
    let env = serde_json::from_slice::<Envelope>(data).ok();
    let fallback = || String::from_utf8_lossy(data).into_owned();
    match env {
        Some(Envelope {
            error: Some(ErrorField::Text(msg)),
            ..
        }) => Some(msg),
        Some(Envelope {
            error: Some(ErrorField::Object { message }),
            ..
        }) => Some(message.unwrap_or_else(fallback)),
        Some(Envelope {
            object: Some(o),
            message,
            ..
        }) if o == "error" => Some(message.unwrap_or_else(fallback)),
        _ if error_event => Some(fallback()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
