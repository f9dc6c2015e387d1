//! Stream migration, the pure half: splicing a continuation into a client's SSE stream, and the
//! request body that asks another engine to continue a partial answer.
//!
//! When a backend fails in the middle of a stream (after its first token, before its end), the
//! gateway resends the request to another backend with the text generated so far and splices
//! that backend's stream into the one the client is reading. This module holds everything of
//! that which needs no sockets: a [`Splicer`] the relay passes every upstream chunk through, and
//! [`continuation_body`], the rewritten request.
//!
//! ## The splicer
//! The client's stream must stay well-formed whatever the point of failure, so the splicer
//! forwards **whole events only**: bytes after the last blank line of a chunk are held until
//! the event completes (a failure then drops the half event the client never saw). Every
//! complete event is read (one `serde_json` decode of its data) to keep:
//! - the answer so far: chat `choices[0].delta.content`, completions `choices[0].text`;
//! - the output events so far (≈ tokens; the same rule as [`crate::sse`]: non-empty content,
//!   text, reasoning or a tool call), which reduce `max_tokens` and correct `usage`;
//! - what makes a continuation dishonest: a tool call (`delta.tool_calls`, `function_call`) or
//!   reasoning (`reasoning_content`, `reasoning`) in the answer — an engine continues the
//!   *content* of a final assistant message, nothing else;
//! - the end: a `finish_reason`, `data: [DONE]`; and an error event, which is **withheld** (the
//!   failure is the gateway's to report, or to hide by continuing).
//!
//! On the first upstream ([`Splicer::feed`] before any [`Splicer::begin_continuation`]) events
//! go out byte for byte as the backend sent them. On a continuation each event is rewritten:
//! `id` and `created` become the first stream's, a chat chunk's `delta.role` is removed (the
//! client had its role chunk) and a chunk left with nothing to say is dropped, and `usage` is
//! summed: `completion_tokens` = events relayed before the continuation + the continuation's;
//! `prompt_tokens` = the continuation's − the tokens its prompt has beyond the client's (the
//! text so far, prefilled again as prompt, as the gateway counts it: the client's prompt counts
//! once).
//!
//! ## The continuation request
//! Chat: the partial answer becomes a final `{"role":"assistant","content":…}` message with
//! `continue_final_message: true` and `add_generation_prompt: false` (vLLM's and SGLang's
//! extension; a request that already continued a final assistant message has the text appended
//! to it). Completions: `prompt` + the text so far. `max_tokens` and `max_completion_tokens`
//! are reduced by the output events relayed. Refused ([`NotContinuable`]) when the request
//! cannot be continued honestly: `n` or `best_of` above 1, `logprobs` / `top_logprobs`
//! requested, completions with `echo`, a batch or token-id prompt, or no output budget left.

use serde_json::{Map, Value};

/// Which API a stream belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// Why a stream cannot be continued on another backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotContinuable {
    /// `n` or `best_of` above 1: several answers share one stream.
    SeveralChoices,
    /// Log probabilities were requested: a continuation cannot reproduce the first part's.
    Logprobs,
    /// A tool call was being streamed.
    ToolCall,
    /// The answer so far holds reasoning, which a final assistant message cannot carry.
    Reasoning,
    /// Completions with `echo`, a batch of prompts, or a token-id prompt.
    Prompt,
    /// The request's output budget is spent.
    NoBudget,
    /// The body is not a JSON object of the expected shape.
    Body,
}

impl NotContinuable {
    /// A short label (logs, the explain header).
    pub fn as_str(self) -> &'static str {
        match self {
            NotContinuable::SeveralChoices => "several_choices",
            NotContinuable::Logprobs => "logprobs",
            NotContinuable::ToolCall => "tool_call",
            NotContinuable::Reasoning => "reasoning",
            NotContinuable::Prompt => "prompt",
            NotContinuable::NoBudget => "no_budget",
            NotContinuable::Body => "body",
        }
    }
}

/// What one [`Splicer::feed`] produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Bytes for the client (whole events).
    pub out: Vec<u8>,
    /// The upstream sent an error event (withheld): it has failed.
    pub error: Option<String>,
}

/// Splices one client stream across upstreams; see the module docs.
#[derive(Debug)]
pub struct Splicer {
    api: Api,
    /// Bytes of the event still open.
    carry: Vec<u8>,
    /// Continuations begun.
    continuations: u32,
    /// The first stream's `id` and `created`.
    id: Option<Value>,
    created: Option<Value>,
    /// The answer so far.
    text: String,
    /// Output events so far, all upstreams.
    events: u32,
    /// Output events before the current continuation began.
    events_before: u32,
    /// Prompt tokens the current continuation has beyond the client's prompt.
    extra_prompt: u32,
    tool_call: bool,
    reasoning: bool,
    finished: bool,
    done: bool,
}

/// Longest open event held (a larger one is passed on as it comes: it cannot be spliced).
const MAX_CARRY: usize = 1 << 20;

impl Splicer {
    /// A splicer for a new stream of `api`.
    pub fn new(api: Api) -> Splicer {
        Splicer {
            api,
            carry: Vec::new(),
            continuations: 0,
            id: None,
            created: None,
            text: String::new(),
            events: 0,
            events_before: 0,
            extra_prompt: 0,
            tool_call: false,
            reasoning: false,
            finished: false,
            done: false,
        }
    }

    /// The answer text relayed so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Output events relayed so far (≈ tokens).
    pub fn output_events(&self) -> u32 {
        self.events
    }

    /// `data: [DONE]` went out.
    pub fn done(&self) -> bool {
        self.done
    }

    /// A `finish_reason` went out: the answer is whole even if the stream's end is missing.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Why what was relayed so far cannot be continued, if it cannot.
    pub fn refusal(&self) -> Option<NotContinuable> {
        if self.tool_call {
            Some(NotContinuable::ToolCall)
        } else if self.reasoning {
            Some(NotContinuable::Reasoning)
        } else {
            None
        }
    }

    /// The next upstream has answered: its events are rewritten into the first stream's from
    /// now on. A half event of the failed upstream is dropped. `extra_prompt`: the tokens its
    /// prompt has beyond the client's (taken off its `usage.prompt_tokens`).
    pub fn begin_continuation(&mut self, extra_prompt: u32) {
        self.carry.clear();
        self.continuations += 1;
        self.events_before = self.events;
        self.extra_prompt = extra_prompt;
    }

    /// Feed one upstream chunk; returns the whole events for the client.
    pub fn feed(&mut self, chunk: &[u8]) -> Fed {
        let mut fed = Fed::default();
        let mut rest = chunk;
        // An open event: complete it first.
        if !self.carry.is_empty() {
            let start = self.carry.len().saturating_sub(3);
            self.carry.extend_from_slice(chunk);
            match event_end(&self.carry, start) {
                None => {
                    if self.carry.len() > MAX_CARRY {
                        fed.out = std::mem::take(&mut self.carry);
                    }
                    return fed;
                }
                Some(end) => {
                    let event = std::mem::take(&mut self.carry);
                    let consumed = end - (event.len() - chunk.len());
                    self.event(&event[..end], &mut fed);
                    rest = &chunk[consumed..];
                }
            }
        }
        while fed.error.is_none() {
            match event_end(rest, 0) {
                Some(end) => {
                    self.event(&rest[..end], &mut fed);
                    rest = &rest[end..];
                }
                None => {
                    if rest.len() > MAX_CARRY {
                        fed.out.extend_from_slice(rest);
                    } else {
                        self.carry.extend_from_slice(rest);
                    }
                    break;
                }
            }
        }
        fed
    }

    /// The upstream ended: a last event without its blank line goes out as it is.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.carry);
        if rest.iter().all(u8::is_ascii_whitespace) {
            return Vec::new();
        }
        let mut fed = Fed::default();
        self.event(&rest, &mut fed);
        fed.out
    }

    /// One whole event (its terminating blank line included).
    fn event(&mut self, raw: &[u8], fed: &mut Fed) {
        let data = event_data(raw);
        let Some(data) = data else {
            // A comment or a field-less event: passed on.
            fed.out.extend_from_slice(raw);
            return;
        };
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            fed.out.extend_from_slice(raw);
            return;
        }
        let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&data) else {
            fed.out.extend_from_slice(raw);
            return;
        };
        if is_error(raw, &obj) {
            let msg = obj
                .get("error")
                .and_then(|e| e.get("message").or(Some(e)))
                .and_then(Value::as_str)
                .or_else(|| obj.get("message").and_then(Value::as_str))
                .unwrap_or("error event");
            fed.error = Some(msg.to_string());
            return;
        }
        self.observe(&obj);
        if self.continuations == 0 {
            if self.id.is_none() {
                self.id = obj.get("id").cloned();
                self.created = obj.get("created").cloned();
            }
            fed.out.extend_from_slice(raw);
            return;
        }
        if !self.rewrite(&mut obj) {
            return;
        }
        fed.out.extend_from_slice(b"data: ");
        // A map of JSON values always serializes.
        let _ = serde_json::to_writer(&mut fed.out, &obj);
        fed.out.extend_from_slice(b"\n\n");
    }

    /// Record what a data event carries.
    fn observe(&mut self, obj: &Map<String, Value>) {
        let Some(choice) = obj
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return;
        };
        if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
            self.finished = true;
        }
        let nonempty = |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
        let (answer, body) = match self.api {
            Api::Chat => {
                let Some(delta) = choice.get("delta") else {
                    return;
                };
                (delta.get("content"), delta)
            }
            Api::Completions => (choice.get("text"), choice),
        };
        let reasoning = nonempty(body.get("reasoning_content")) || nonempty(body.get("reasoning"));
        let tool = body
            .get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
            || body.get("function_call").is_some_and(Value::is_object);
        let content = nonempty(answer);
        if let Some(s) = answer.and_then(Value::as_str) {
            self.text.push_str(s);
        }
        self.reasoning |= reasoning;
        self.tool_call |= tool;
        if content || reasoning || tool {
            self.events += 1;
        }
    }

    /// Rewrite a continuation's event into the first stream's; false: drop it.
    fn rewrite(&self, obj: &mut Map<String, Value>) -> bool {
        if let Some(id) = &self.id {
            obj.insert("id".into(), id.clone());
        }
        if let Some(c) = &self.created {
            obj.insert("created".into(), c.clone());
        }
        if let Some(Value::Object(u)) = obj.get_mut("usage") {
            let get = |u: &Map<String, Value>, k: &str| u.get(k).and_then(Value::as_u64);
            let before = u64::from(self.events_before);
            let prompt = get(u, "prompt_tokens")
                .unwrap_or(0)
                .saturating_sub(u64::from(self.extra_prompt));
            let completion = get(u, "completion_tokens").unwrap_or(0) + before;
            u.insert("prompt_tokens".into(), prompt.into());
            u.insert("completion_tokens".into(), completion.into());
            u.insert("total_tokens".into(), (prompt + completion).into());
            if let Some(Value::Object(d)) = u.get_mut("prompt_tokens_details") {
                if let Some(c) = d.get("cached_tokens").and_then(Value::as_u64) {
                    d.insert("cached_tokens".into(), c.min(prompt).into());
                }
            }
        }
        if self.api != Api::Chat {
            return true;
        }
        let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) else {
            return true;
        };
        let Some(Value::Object(choice)) = choices.first_mut() else {
            return true;
        };
        let Some(Value::Object(delta)) = choice.get_mut("delta") else {
            return true;
        };
        if delta.remove("role").is_none() {
            return true;
        }
        // The role chunk of the continuation: dropped when it says nothing else.
        let empty = delta
            .values()
            .all(|v| v.is_null() || v.as_str() == Some(""));
        !(empty && choice.get("finish_reason").is_none_or(Value::is_null))
    }
}

/// Index just past the blank line ending the first event in `buf` (searching from `from`).
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(off) = buf.get(i..)?.iter().position(|&b| b == b'\n') {
        let nl = i + off;
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => {}
        }
        i = nl + 1;
    }
    None
}

/// The data of an event (several `data:` lines joined by `\n`), `None` without any.
fn event_data(raw: &[u8]) -> Option<Vec<u8>> {
    let mut data: Option<Vec<u8>> = None;
    for line in raw.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            match data.as_mut() {
                Some(d) => {
                    d.push(b'\n');
                    d.extend_from_slice(v);
                }
                None => data = Some(v.to_vec()),
            }
        }
    }
    data
}

fn is_error(raw: &[u8], obj: &Map<String, Value>) -> bool {
    let error_field = raw
        .split(|&b| b == b'\n')
        .any(|l| l.strip_suffix(b"\r").unwrap_or(l) == b"event: error");
    error_field
        || obj
            .get("error")
            .is_some_and(|e| e.is_object() || e.is_string())
        || obj.get("object").and_then(Value::as_str) == Some("error")
}

/// The request that asks another engine to continue `text` (`events` output events relayed
/// so far) — see the module docs. The body is the client's, as sent.
pub fn continuation_body(
    api: Api,
    body: &[u8],
    text: &str,
    events: u32,
) -> Result<Vec<u8>, NotContinuable> {
    let Ok(Value::Object(mut req)) = serde_json::from_slice::<Value>(body) else {
        return Err(NotContinuable::Body);
    };
    check_request(api, &req)?;
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(v) = req.get(key).filter(|v| !v.is_null()) {
            let n = v.as_u64().ok_or(NotContinuable::Body)?;
            let left = n.saturating_sub(u64::from(events));
            if left == 0 {
                return Err(NotContinuable::NoBudget);
            }
            req.insert(key.into(), left.into());
        }
    }
    if text.is_empty() {
        // Nothing to continue from: the request as it was.
        return serde_json::to_vec(&req).map_err(|_| NotContinuable::Body);
    }
    match api {
        Api::Chat => {
            let continuing = req.get("continue_final_message") == Some(&Value::Bool(true));
            let Some(Value::Array(messages)) = req.get_mut("messages") else {
                return Err(NotContinuable::Body);
            };
            let last = messages.last_mut().and_then(Value::as_object_mut);
            match last {
                Some(m)
                    if continuing && m.get("role").and_then(Value::as_str) == Some("assistant") =>
                {
                    let before = match m.get("content") {
                        Some(Value::String(s)) => s.clone(),
                        None | Some(Value::Null) => String::new(),
                        Some(_) => return Err(NotContinuable::Body),
                    };
                    m.insert("content".into(), Value::String(before + text));
                }
                _ => messages.push(serde_json::json!({"role": "assistant", "content": text})),
            }
            req.insert("continue_final_message".into(), Value::Bool(true));
            req.insert("add_generation_prompt".into(), Value::Bool(false));
        }
        Api::Completions => {
            let prompt = match req.get("prompt") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                    a[0].as_str().unwrap_or_default().to_string()
                }
                _ => return Err(NotContinuable::Prompt),
            };
            req.insert("prompt".into(), Value::String(prompt + text));
        }
    }
    serde_json::to_vec(&req).map_err(|_| NotContinuable::Body)
}

/// Whether the client's request allows a continuation at all.
pub(crate) fn check_request(api: Api, req: &Map<String, Value>) -> Result<(), NotContinuable> {
    let above_one = |k: &str| req.get(k).and_then(Value::as_u64).is_some_and(|n| n > 1);
    if above_one("n") || above_one("best_of") {
        return Err(NotContinuable::SeveralChoices);
    }
    let set = |k: &str| {
        req.get(k)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
    };
    if set("logprobs") || set("top_logprobs") {
        return Err(NotContinuable::Logprobs);
    }
    if api == Api::Completions && set("echo") {
        return Err(NotContinuable::Prompt);
    }
    Ok(())
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
