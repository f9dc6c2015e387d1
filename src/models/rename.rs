//! Model names that differ between the client and a backend (`served_model_name`).
//!
//! A pool serves the names it is configured with; a backend may call the same model something
//! else (a stock vLLM calls it by its path, `/models/Llama-3.1-8B`). The backend's name for it
//! comes from the config ([`ServedName::Named`]) or from what the backend lists at
//! `GET /v1/models` ([`ServedName::Discover`], see [`upstream_name`]).
//!
//! ## Upstream: one splice
//! The request parser already knows where the body's `model` string literal lies
//! ([`pronto_core::request::RequestFeatures::model_span`]). The body sent to such a backend is the
//! client's with that literal replaced by the backend's name ([`splice`]): one copy of the
//! body, nothing parsed or serialized again. Every other byte is the client's.
//!
//! ## Downstream: every `"model": "<backend name>"` back to the client's
//! The answer says which model produced it: a JSON body's `model`, and every SSE chunk's
//! (`data: {"id":…,"model":…}`). [`Unrename`] rewrites, as the chunks pass, each
//! `"model"` key whose value is the backend's name (as a JSON writer writes it: the same
//! literal [`serde_json`] writes, whitespace around the colon allowed) to the literal the client
//! sent. A quote inside a JSON string is escaped, so text in a completion can never match.
//! A chunk that ends inside a possible match keeps that tail (a few bytes: SSE events end
//! with a blank line, so this happens only mid-event) until the next chunk or the end. A
//! chunk without a match goes out as it came, uncopied. The answer's length changes, so
//! a `Content-Length` is replaced by chunked framing.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::served::Listed;
use crate::config::{Backend, ServedName};

/// What a backend is sent as `model`, when it is not the client's.
///
/// - no `served_model_name`: `Ok(None)`, the body goes as the client wrote it;
/// - a name: `Ok(Some(name))`;
/// - `discover`: the one model the backend lists; when it lists several, the pool's own
///   name if it is among them; `Err(())` when the list is not known yet or names neither
///   (the backend is then not routed to: nothing says what to send it).
#[allow(clippy::result_unit_err)]
pub fn upstream_name(
    backend: &Backend,
    pool_model: &Arc<str>,
    listed: Option<&Listed>,
) -> Result<Option<Arc<str>>, ()> {
    match &backend.served_model_name {
        None => Ok(None),
        Some(ServedName::Named(n)) => Ok(Some(Arc::clone(n))),
        Some(ServedName::Discover) => {
            let models = listed.and_then(|l| l.get(&backend.name)).ok_or(())?;
            match models.as_slice() {
                [one] => Ok(Some(Arc::clone(one))),
                many if many.contains(pool_model) => Ok(Some(Arc::clone(pool_model))),
                _ => Err(()),
            }
        }
    }
}

/// `name` as a JSON string literal, quotes included.
pub fn literal(name: &str) -> Bytes {
    // Serializing a `&str` cannot fail.
    Bytes::from(serde_json::to_vec(name).unwrap_or_default())
}

/// `body` with the bytes at `span` (the `model` literal) replaced by `literal`.
pub fn splice(body: &Bytes, span: Range<usize>, literal: &[u8]) -> Bytes {
    let (Some(head), Some(tail)) = (body.get(..span.start), body.get(span.end..)) else {
        return body.clone();
    };
    let mut out = BytesMut::with_capacity(head.len() + literal.len() + tail.len());
    out.extend_from_slice(head);
    out.extend_from_slice(literal);
    out.extend_from_slice(tail);
    out.freeze()
}

/// The `model` literal's span when a backend that serves the model as `upstream` (see
/// [`upstream_name`]) must be sent another name than the client's `model`.
fn renamed<'a>(
    span: Option<&'a Range<usize>>,
    client_model: &str,
    upstream: Option<&'a str>,
) -> Option<(&'a str, &'a Range<usize>)> {
    match (upstream, span) {
        (Some(up), Some(span)) if up != client_model => Some((up, span)),
        _ => None,
    }
}

/// The body for a backend that serves the model as `upstream`: `body` with its `model`
/// literal (at `span`) spliced when that differs from the client's `model`; the client's
/// body, untouched, otherwise.
pub fn body_for(
    body: &Bytes,
    span: Option<&Range<usize>>,
    client_model: &str,
    upstream: Option<&str>,
) -> Bytes {
    match renamed(span, client_model, upstream) {
        Some((up, span)) => splice(body, span.clone(), &literal(up)),
        None => body.clone(),
    }
}

/// The rewriter of the answer of a backend that was sent [`body_for`] the same arguments;
/// `None` when it was sent the client's name.
pub fn answer_for(
    body: &Bytes,
    span: Option<&Range<usize>>,
    client_model: &str,
    upstream: Option<&str>,
) -> Option<Unrename> {
    let (up, span) = renamed(span, client_model, upstream)?;
    Some(Unrename::new(up, body.slice(span.clone())))
}

/// Most bytes held back waiting to see whether a `"model"` key is followed by the backend's
/// name (whitespace around the colon included); past it, the bytes go out unchanged.
const MAX_HELD: usize = 4096;

const KEY: &[u8] = b"\"model\"";

/// Rewrites the backend's model name back to the client's in an answer, chunk by chunk (see
/// the module docs).
#[derive(Debug)]
pub struct Unrename {
    /// The backend's name as a JSON literal.
    from: Bytes,
    /// The client's, as it sent it.
    to: Bytes,
    /// The tail of the last chunk that may begin a match.
    held: BytesMut,
}

impl Unrename {
    /// A rewriter of `upstream`'s literal into `client_literal` (a JSON string literal,
    /// quotes included, as the client sent it).
    pub fn new(upstream: &str, client_literal: Bytes) -> Unrename {
        Unrename {
            from: literal(upstream),
            to: client_literal,
            held: BytesMut::new(),
        }
    }

    /// The next chunk, rewritten; possibly empty (all of it held).
    pub fn feed(&mut self, chunk: Bytes) -> Bytes {
        let joined;
        let buf: &[u8] = if self.held.is_empty() {
            &chunk
        } else {
            self.held.extend_from_slice(&chunk);
            joined = std::mem::take(&mut self.held).freeze();
            &joined
        };
        let (hits, keep_from) = scan(buf, &self.from);
        if hits.is_empty() && keep_from == buf.len() && buf.len() == chunk.len() {
            return chunk;
        }
        let mut out = BytesMut::with_capacity(buf.len() + hits.len() * self.to.len());
        let mut at = 0;
        for hit in hits {
            out.extend_from_slice(&buf[at..hit.start]);
            out.extend_from_slice(&self.to);
            at = hit.end;
        }
        out.extend_from_slice(&buf[at..keep_from]);
        self.held.extend_from_slice(&buf[keep_from..]);
        out.freeze()
    }

    /// What is still held, at the end of the answer.
    pub fn finish(&mut self) -> Bytes {
        std::mem::take(&mut self.held).freeze()
    }
}

/// The ranges of `buf` holding `from` as the value of a `"model"` key, and where an
/// undecided match begins (`buf.len()`: none).
fn scan(buf: &[u8], from: &[u8]) -> (Vec<Range<usize>>, usize) {
    let mut hits = Vec::new();
    let mut i = 0;
    while let Some(off) = buf[i..].iter().position(|&b| b == b'"') {
        let p = i + off;
        let rest = &buf[p..];
        if rest.len() < KEY.len() {
            // A possible start of the key at the very end.
            if KEY.starts_with(rest) {
                return (hits, p);
            }
            i = p + 1;
            continue;
        }
        if !rest.starts_with(KEY) {
            i = p + 1;
            continue;
        }
        match value_at(buf, p + KEY.len(), from) {
            Value::Matches(r) => {
                i = r.end;
                hits.push(r);
            }
            Value::Other => i = p + KEY.len(),
            Value::Undecided if buf.len() - p <= MAX_HELD => return (hits, p),
            Value::Undecided => i = p + KEY.len(),
        }
    }
    (hits, buf.len())
}

enum Value {
    Matches(Range<usize>),
    Other,
    Undecided,
}

/// What follows a `"model"` key ending at `q`: `: "<from>"` (its literal's range), something
/// else, or not enough bytes to tell.
fn value_at(buf: &[u8], mut q: usize, from: &[u8]) -> Value {
    let ws = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    while q < buf.len() && ws(buf[q]) {
        q += 1;
    }
    match buf.get(q) {
        None => return Value::Undecided,
        Some(b':') => q += 1,
        Some(_) => return Value::Other,
    }
    while q < buf.len() && ws(buf[q]) {
        q += 1;
    }
    let rest = &buf[q..];
    if rest.len() < from.len() {
        return if from.starts_with(rest) {
            Value::Undecided
        } else {
            Value::Other
        };
    }
    if rest.starts_with(from) {
        Value::Matches(q..q + from.len())
    } else {
        Value::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unrename(up: &str, client: &str) -> Unrename {
        Unrename::new(up, literal(client))
    }

    fn run(u: &mut Unrename, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&u.feed(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&u.finish());
        out
    }

    #[test]
    fn the_request_body_is_spliced_at_its_model_literal_only() {
        let body = Bytes::from_static(
            br#"{"messages":[{"role":"user","content":"\"model\":\"default\""}],"model":"default","stream":true}"#,
        );
        let at = body
            .windows(17)
            .rposition(|w| w == br#""model":"default""#)
            .unwrap()
            + 8;
        let span = at..at + 9;
        assert_eq!(&body[span.clone()], br#""default""#);
        let up = Some("/models/tiny \"q\"");
        let sent = body_for(&body, Some(&span), "default", up);
        assert_eq!(
            &sent[..],
            &br#"{"messages":[{"role":"user","content":"\"model\":\"default\""}],"model":"/models/tiny \"q\"","stream":true}"#[..]
        );
        assert!(answer_for(&body, Some(&span), "default", up).is_some());
        // The same name, or no name to send: the client's bytes, untouched.
        for up in [Some("default"), None] {
            let same = body_for(&body, Some(&span), "default", up);
            assert_eq!(same.as_ptr(), body.as_ptr());
            assert!(answer_for(&body, Some(&span), "default", up).is_none());
        }
    }

    #[test]
    fn every_model_key_with_the_backends_name_is_rewritten_and_nothing_else() {
        let mut u = unrename("/models/tiny", "default");
        let answer = concat!(
            r#"data: {"id":"c1","model":"/models/tiny","choices":[{"delta":{"content":"say \"model\":\"/models/tiny\""}}]}"#,
            "\n\n",
            r#"data: {"id":"c1","model" : "/models/tiny-2","x":{"model":  "/models/tiny"}}"#,
            "\n\ndata: [DONE]\n\n"
        );
        let out = run(&mut u, &[answer.as_bytes()]);
        let want = concat!(
            r#"data: {"id":"c1","model":"default","choices":[{"delta":{"content":"say \"model\":\"/models/tiny\""}}]}"#,
            "\n\n",
            r#"data: {"id":"c1","model" : "/models/tiny-2","x":{"model":  "default"}}"#,
            "\n\ndata: [DONE]\n\n"
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn a_chunk_without_the_key_passes_uncopied() {
        let mut u = unrename("m-long", "m");
        let chunk = Bytes::from_static(b"data: {\"id\":\"x\",\"choices\":[]}\n\n");
        let out = u.feed(chunk.clone());
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        assert!(u.finish().is_empty());
    }

    #[test]
    fn matches_split_across_chunks_at_every_byte_are_found() {
        let body = br#"{"object":"chat.completion.chunk","model": "served/name","choices":[],"m":"model"}"#;
        let want =
            br#"{"object":"chat.completion.chunk","model": "client","choices":[],"m":"model"}"#;
        for cut in 0..=body.len() {
            let mut u = unrename("served/name", "client");
            let out = run(&mut u, &[&body[..cut], &body[cut..]]);
            assert_eq!(out, want, "cut at {cut}");
            for cut2 in cut..=body.len() {
                let mut u = unrename("served/name", "client");
                let out = run(&mut u, &[&body[..cut], &body[cut..cut2], &body[cut2..]]);
                assert_eq!(out, want, "cuts at {cut}, {cut2}");
            }
        }
    }

    #[test]
    fn a_held_tail_is_given_back_at_the_end() {
        let mut u = unrename("served", "client");
        assert_eq!(&u.feed(Bytes::from_static(b"abc\"mod"))[..], b"abc");
        assert_eq!(&u.finish()[..], b"\"mod");
        // An endless run of whitespace after the key is not held beyond the bound.
        let mut u = unrename("served", "client");
        let mut chunk = b"\"model\"".to_vec();
        chunk.extend(std::iter::repeat_n(b' ', MAX_HELD + 10));
        assert_eq!(u.feed(Bytes::from(chunk.clone())).len(), chunk.len());
    }

    #[test]
    fn names_come_from_the_config_or_the_backends_list() {
        let pool: Arc<str> = Arc::from("chat");
        let mut b = crate::config::Config::from_backend_urls(
            &["http://127.0.0.1:1".to_string()],
            "chat",
            pronto_core::routing::PolicyKind::RoundRobin,
        )
        .unwrap()
        .pools[0]
            .backends[0]
            .clone();
        assert_eq!(upstream_name(&b, &pool, None), Ok(None));
        b.served_model_name = Some(ServedName::Named(Arc::from("llama")));
        assert_eq!(upstream_name(&b, &pool, None), Ok(Some(Arc::from("llama"))));
        b.served_model_name = Some(ServedName::Discover);
        assert_eq!(upstream_name(&b, &pool, None), Err(()), "not asked yet");
        let list = |ms: &[&str]| -> Listed {
            [(b.name.clone(), ms.iter().map(|m| Arc::from(*m)).collect())].into()
        };
        assert_eq!(
            upstream_name(&b, &pool, Some(&list(&["/models/x"]))),
            Ok(Some(Arc::from("/models/x")))
        );
        assert_eq!(
            upstream_name(&b, &pool, Some(&list(&["chat", "chat-lora"]))),
            Ok(Some(Arc::from("chat")))
        );
        assert_eq!(upstream_name(&b, &pool, Some(&list(&["a", "b"]))), Err(()));
        assert_eq!(upstream_name(&b, &pool, Some(&list(&[]))), Err(()));
    }
}
