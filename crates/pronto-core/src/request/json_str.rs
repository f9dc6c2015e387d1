//! Borrowed JSON string literals, decoded straight into their final destination.
//!
//! The request parser must not copy prompt text more than once. `serde_json` hands a visitor
//! either a borrowed `&str` (no escapes) or a `&str` into its private scratch buffer (escaped
//! text, which is almost every real prompt: newlines and quotes are escaped in JSON). Keeping the
//! second kind means copying it out of the scratch buffer *and* later into the canonical prompt.
//!
//! [`JsonStr`] sidesteps that: it deserializes as a [`RawValue`] — a slice of the request body
//! that `serde_json` has already validated — and checks that it is a string literal. Nothing is
//! copied at parse time. When the canonical prompt is assembled, [`JsonStr::unescape_into`]
//! decodes the literal directly into the destination `String`, so each prompt byte is written
//! exactly once. Decoding is a `memchr`-style search for `\` and bulk `push_str` of the runs in
//! between, so unescaped text costs one `memcpy`.
//!
//! A decoded string is never longer than its literal minus the two quotes (every escape shrinks
//! or keeps its length), so [`JsonStr::max_decoded_len`] is an exact upper bound for pre-sizing.
//!
//! Lone UTF-16 surrogates (`"\ud800"`), which `serde_json` lets through inside raw values and
//! Python's `json` module accepts, decode to U+FFFD.

use std::borrow::Cow;

use serde::de::{self, Deserialize, Deserializer, Unexpected};
use serde_json::value::RawValue;

/// A JSON string literal (quotes and escapes included) borrowed from the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JsonStr<'a>(&'a str);

impl<'a> JsonStr<'a> {
    /// Wraps the text of a raw JSON value already known to be a string literal (it starts
    /// with `"`), such as [`RawValue::get`] of a string.
    pub(crate) fn from_raw_str(raw: &'a str) -> JsonStr<'a> {
        debug_assert!(raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"'));
        JsonStr(raw)
    }

    /// The raw literal as it appears in the body, quotes included.
    #[cfg(test)]
    pub(crate) fn raw(self) -> &'a str {
        self.0
    }

    /// Where this literal (quotes included) lies in `base`, the text it was borrowed from;
    /// `None` if it was not borrowed from `base`.
    pub(crate) fn span_in(self, base: &str) -> Option<std::ops::Range<usize>> {
        let start = (self.0.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
        let span = start..start + self.0.len();
        (base.get(span.clone())?.as_ptr() == self.0.as_ptr()).then_some(span)
    }

    /// The literal between its quotes, still escaped.
    fn inner(self) -> &'a str {
        // A validated literal starts and ends with an ASCII quote.
        self.0.get(1..self.0.len().saturating_sub(1)).unwrap_or("")
    }

    /// Upper bound on the decoded length in bytes.
    pub(crate) fn max_decoded_len(self) -> usize {
        self.inner().len()
    }

    /// Whether the decoded string is empty.
    pub(crate) fn is_empty(self) -> bool {
        self.inner().is_empty()
    }

    /// Appends the decoded string to `out`.
    pub(crate) fn unescape_into(self, out: &mut String) {
        unescape_into(self.inner(), out);
    }

    /// The decoded string: borrowed when the literal has no escapes.
    pub(crate) fn decode(self) -> Cow<'a, str> {
        let inner = self.inner();
        if inner.contains('\\') {
            let mut s = String::with_capacity(inner.len());
            unescape_into(inner, &mut s);
            Cow::Owned(s)
        } else {
            Cow::Borrowed(inner)
        }
    }
}

/// What a raw JSON value is, for "invalid type" messages.
pub(crate) fn unexpected(raw: &str) -> Unexpected<'_> {
    match raw.as_bytes().first() {
        Some(b'n') => Unexpected::Other("null"),
        Some(b't') => Unexpected::Bool(true),
        Some(b'f') => Unexpected::Bool(false),
        Some(b'[') => Unexpected::Seq,
        Some(b'{') => Unexpected::Map,
        Some(b'"') => Unexpected::Other("string"),
        _ => Unexpected::Other("number"),
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for JsonStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'a RawValue>::deserialize(deserializer)?;
        let s = raw.get();
        if s.len() >= 2 && s.starts_with('"') {
            Ok(JsonStr(s))
        } else {
            Err(de::Error::invalid_type(unexpected(s), &"a string"))
        }
    }
}

const REPLACEMENT: char = '\u{fffd}';

fn hex4(s: &str) -> Option<u32> {
    let h = s.get(..4)?;
    if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(h, 16).ok()
}

/// Decodes the escaped body of a JSON string literal into `out`.
///
/// Runs between escapes are copied with one `push_str` each; the byte loop finding the next
/// `\` has no per-call setup, which matters for prose with an escape every few dozen bytes.
/// Never panics: malformed escapes (impossible after `serde_json` validation) decode to U+FFFD.
fn unescape_into(s: &str, out: &mut String) {
    let bytes = s.as_bytes();
    let (mut run, mut i) = (0, 0);
    while let Some(off) = bytes[i..].iter().position(|&b| b == b'\\') {
        let bs = i + off;
        out.push_str(&s[run..bs]);
        i = (bs + 2).min(bytes.len());
        let c = match bytes.get(bs + 1).copied() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => match hex4(&s[i..]) {
                Some(hi) => {
                    let mut rest = &s[i + 4..];
                    let c = decode_utf16_escape(hi, &mut rest);
                    i = s.len() - rest.len();
                    c
                }
                None => REPLACEMENT,
            },
            Some(b) if !b.is_ascii() => {
                i = bs + 1; // keep the multi-byte char for the next run
                REPLACEMENT
            }
            _ => REPLACEMENT,
        };
        out.push(c);
        run = i;
    }
    out.push_str(&s[run..]);
}

/// The char for `\uXXXX` with value `hi`, consuming a following low-surrogate escape from `rest`
/// when `hi` is a high surrogate.
fn decode_utf16_escape(hi: u32, rest: &mut &str) -> char {
    if (0xd800..0xdc00).contains(&hi) {
        if let Some(lo) = rest.strip_prefix("\\u").and_then(hex4) {
            if (0xdc00..0xe000).contains(&lo) {
                *rest = &rest[6..];
                let c = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                return char::from_u32(c).unwrap_or(REPLACEMENT);
            }
        }
        REPLACEMENT
    } else {
        char::from_u32(hi).unwrap_or(REPLACEMENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(json: &str) -> JsonStr<'_> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn decodes_like_serde_json() {
        for json in [
            r#""""#,
            r#""plain text""#,
            r#""line\nbreak \"quoted\" back\\slash \/ \b\f\r\t""#,
            r#""caf\u00e9 \u4e2d\u6587 \ud83d\ude00 emoji""#,
            r#""\\n is not a newline""#,
            "\"raw unicode: é 中文 😀\"",
        ] {
            let expected: String = serde_json::from_str(json).unwrap();
            let s = lit(json);
            let mut out = String::new();
            s.unescape_into(&mut out);
            assert_eq!(out, expected, "{json}");
            assert_eq!(s.decode(), expected);
            assert!(out.len() <= s.max_decoded_len());
            assert_eq!(s.is_empty(), expected.is_empty());
        }
    }

    #[test]
    fn unescaped_literals_decode_borrowed() {
        assert!(matches!(lit(r#""no escapes""#).decode(), Cow::Borrowed(_)));
        assert!(matches!(lit(r#""a\nb""#).decode(), Cow::Owned(_)));
    }

    #[test]
    fn lone_surrogates_become_replacement_chars() {
        let mut out = String::new();
        lit(r#""a\ud800b\udc00c\ud800\u0041""#).unescape_into(&mut out);
        assert_eq!(out, "a\u{fffd}b\u{fffd}c\u{fffd}A");
    }

    #[test]
    fn malformed_escapes_never_panic() {
        let mut out = String::new();
        for s in ["\\", "\\u12", "\\uzzzz", "\\q", "x\\ud800\\u", "é\\", "\\é"] {
            out.clear();
            unescape_into(s, &mut out);
            assert!(out.contains('\u{fffd}'), "{s:?} -> {out:?}");
        }
    }

    #[test]
    fn non_strings_are_rejected_with_their_type() {
        for (json, what) in [
            ("1", "number"),
            ("null", "null"),
            ("[]", "sequence"),
            ("{}", "map"),
            ("true", "boolean"),
        ] {
            let err = serde_json::from_str::<JsonStr<'_>>(json).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(what) && msg.contains("expected a string"),
                "{msg}"
            );
        }
    }
}
