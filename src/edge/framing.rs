//! Strict HTTP/1.1 request framing (RFC 9112), checked on the bytes a client sends before
//! pingora parses them.
//!
//! Pingora's HTTP/1 server finds message boundaries leniently: its chunk-size parser
//! (`httparse::parse_chunk_size`) reads an empty size as the last chunk, accepts whitespace
//! after a size with no extension, any octet but CR inside a chunk extension (a bare LF or a
//! NUL included) and extensions up to 8 KiB, and it ends a chunked body at the first
//! `CRLF CRLF` after the last chunk whatever lies between (trailer lines are not parsed). A
//! front proxy that parses the same bytes by the RFC sees other boundaries, and the difference
//! is a request smuggled onto a shared connection.
//!
//! [`Checker`] follows the same byte stream as pingora and finds each message's end itself:
//! it parses each head's fields (`httparse`, as pingora does) to learn the framing, skips a
//! `Content-Length` body, and walks a chunked body by RFC 9112 §7.1's grammar — sizes of 1 to
//! 16 hex digits, extensions of tokens and quoted strings of at most
//! [`MAX_CHUNK_EXT_BYTES`] per chunk, CRLF and only CRLF after sizes, data and trailer
//! fields, trailer fields as field lines, at most [`MAX_TRAILER_BYTES`] of them. The first
//! byte outside the grammar is a [`Violation`]: [`crate::edge::head_deadline`] then hands pingora
//! the bytes before it and fails the next read, so the body read fails, the gateway answers
//! 400 and closes the connection, and no byte after the violation is ever parsed.
//!
//! Heads are pingora's to judge: a head the checker cannot frame (a parse error, an
//! unsupported `Transfer-Encoding`, a malformed `Content-Length`, both framings, `CONNECT`,
//! the HTTP/2 preface) turns the checker off for the connection, and pingora or the gateway's
//! edge checks (`proxy::gate`) answer such a head and close the connection.

/// Longest chunk extension accepted on one chunk line, bytes (RFC 9112 §7.1.1: "a server
/// ought to limit the total length of chunk extensions"). Clients that send none are the
/// rule; pingora's own limit is 8 KiB.
pub const MAX_CHUNK_EXT_BYTES: usize = 1024;
/// Most bytes of trailer fields after the last chunk.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Most hex digits of a chunk size (leading zeros included), as pingora's parser allows.
pub const MAX_CHUNK_SIZE_DIGITS: u32 = 16;
/// A head longer than this is not framed here (the head deadline answers it with a 431).
const MAX_HEAD_BYTES: usize = crate::edge::head_deadline::MAX_HEAD_WIRE_BYTES + 1024;
/// Header fields parsed per head (pingora's own limit; more is its 400).
const MAX_FIELDS: usize = 256;

/// A byte outside RFC 9112's framing: `at` is its offset in the data last fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Violation {
    /// Offset of the offending byte in the slice given to [`Checker::feed`].
    pub at: usize,
    /// What was wrong, for the client's error message.
    pub reason: &'static str,
}

/// Where the checker is in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Chunk size digits: how many, and the value so far.
    Size { digits: u32, value: u64 },
    /// BWS after the size or an extension, before `;` (a CR here is an error).
    BeforeSemi,
    /// After `;`: BWS, then an extension name.
    BeforeName,
    /// In an extension name.
    Name,
    /// BWS after a name: `=` or `;` must follow.
    AfterName,
    /// After `=`: BWS, then a token or a quoted string.
    BeforeValue,
    /// In a token value.
    Token,
    /// In a quoted string; `escaped` after a backslash.
    Quoted { escaped: bool },
    /// After a quoted string's closing quote.
    AfterQuoted,
    /// The CR ending a chunk line was read.
    LineCr,
    /// Chunk data still to come.
    Data { left: u64 },
    /// The CRLF after chunk data: `cr` once its CR was read.
    DataEnd { cr: bool },
    /// At the start of a trailer line (or the final blank line).
    TrailerStart,
    /// The CR of the final blank line was read.
    FinalCr,
    /// In a trailer field name.
    TrailerName,
    /// In a trailer field value.
    TrailerValue,
    /// The CR ending a trailer line was read.
    TrailerCr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between messages: empty lines before a request line are skipped (RFC 9112 §2.2).
    Idle,
    /// Reading a head into the buffer.
    Head,
    /// A `Content-Length` body: bytes left.
    Body { left: u64 },
    /// A chunked body: where in it, the current chunk's size, `ext` bytes of extension on
    /// the current chunk line, `trailer` bytes of trailer fields so far.
    Chunked {
        at: Chunk,
        size: u64,
        ext: usize,
        trailer: usize,
    },
    /// Not checked any more (see the module docs).
    Off,
    /// A violation was found; nothing more is accepted.
    Failed(&'static str),
}

/// Follows one connection's request stream (see the module docs).
#[derive(Debug)]
pub struct Checker {
    state: State,
    head: Vec<u8>,
}

impl Default for Checker {
    fn default() -> Self {
        Checker::new()
    }
}

impl Checker {
    /// A checker at the start of a connection.
    pub fn new() -> Checker {
        Checker {
            state: State::Idle,
            head: Vec::new(),
        }
    }

    /// A checker that checks nothing (an HTTP/2 connection).
    pub fn off() -> Checker {
        Checker {
            state: State::Off,
            head: Vec::new(),
        }
    }

    /// Whether the checker has stopped checking this connection.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// Follow `data`, the next bytes the client sent.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), Violation> {
        let mut i = 0;
        while i < data.len() {
            match self.state {
                State::Off => return Ok(()),
                State::Failed(reason) => return Err(Violation { at: i, reason }),
                State::Idle => {
                    if !matches!(data[i], b'\r' | b'\n') {
                        self.state = State::Head;
                        self.head.clear();
                        continue;
                    }
                    i += 1;
                }
                State::Head => {
                    let b = data[i];
                    i += 1;
                    self.head.push(b);
                    if self.head.len() > MAX_HEAD_BYTES {
                        self.stop();
                    } else if b == b'\n' && head_ended(&self.head) {
                        self.state = self.framing();
                        self.head = Vec::new();
                    }
                }
                State::Body { left } => {
                    let n = (data.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    i += n;
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::Idle
                    } else {
                        State::Body { left }
                    };
                }
                State::Chunked {
                    at: Chunk::Data { left },
                    size,
                    ext,
                    trailer,
                } => {
                    let n = (data.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    i += n;
                    let left = left - n as u64;
                    let at = if left == 0 {
                        Chunk::DataEnd { cr: false }
                    } else {
                        Chunk::Data { left }
                    };
                    self.state = State::Chunked {
                        at,
                        size,
                        ext,
                        trailer,
                    };
                }
                State::Chunked {
                    at,
                    size,
                    ext,
                    trailer,
                } => {
                    match chunked(at, size, ext, trailer, data[i]) {
                        Ok(state) => self.state = state,
                        Err(reason) => {
                            self.state = State::Failed(reason);
                            return Err(Violation { at: i, reason });
                        }
                    }
                    i += 1;
                }
            }
        }
        Ok(())
    }

    fn stop(&mut self) {
        self.state = State::Off;
        self.head = Vec::new();
    }

    /// The framing of the head just read (in `self.head`): what follows it.
    fn framing(&self) -> State {
        let head = &self.head[..];
        let Some(line_end) = head.iter().position(|&b| b == b'\n') else {
            return State::Off;
        };
        let line = head[..line_end]
            .strip_suffix(b"\r")
            .unwrap_or(&head[..line_end]);
        let http11 = line.ends_with(b" HTTP/1.1");
        if !(http11 || line.ends_with(b" HTTP/1.0")) || line.starts_with(b"CONNECT ") {
            // The HTTP/2 preface, HTTP/0.9, a tunnel: not HTTP/1 framing.
            return State::Off;
        }
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let Ok(httparse::Status::Complete((_, fields))) =
            httparse::parse_headers(&head[line_end + 1..], &mut fields)
        else {
            return State::Off;
        };
        let mut te = fields
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case("transfer-encoding"));
        let mut cl = fields
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case("content-length"))
            .map(|f| content_length(f.value));
        match (te.next(), te.next(), cl.next()) {
            (None, _, None) => State::Idle,
            (None, _, Some(Some(n))) if cl.all(|m| m == Some(n)) => {
                if n == 0 {
                    State::Idle
                } else {
                    State::Body { left: n }
                }
            }
            (Some(te), None, None)
                if http11 && te.value.trim_ascii().eq_ignore_ascii_case(b"chunked") =>
            {
                State::Chunked {
                    at: Chunk::Size {
                        digits: 0,
                        value: 0,
                    },
                    size: 0,
                    ext: 0,
                    trailer: 0,
                }
            }
            // Refused by pingora or the edge checks, and the connection closed.
            _ => State::Off,
        }
    }
}

/// One byte of a chunked body outside chunk data.
fn chunked(at: Chunk, size: u64, ext: usize, trailer: usize, b: u8) -> Result<State, &'static str> {
    let is_ws = b == b' ' || b == b'\t';
    let (mut size, mut ext, mut trailer) = (size, ext, trailer);
    let next = match at {
        Chunk::Size { digits, value } => {
            if let Some(d) = hex(b) {
                if digits >= MAX_CHUNK_SIZE_DIGITS {
                    return Err("chunk size has more than 16 hex digits");
                }
                Chunk::Size {
                    digits: digits + 1,
                    value: value * 16 + u64::from(d),
                }
            } else if digits == 0 {
                return Err("chunk size is not a hex number");
            } else {
                // The extension's bytes count from its first (`;` or BWS).
                (size, ext) = (value, usize::from(b != b'\r'));
                match b {
                    b'\r' => Chunk::LineCr,
                    b';' => Chunk::BeforeName,
                    b' ' | b'\t' => Chunk::BeforeSemi,
                    _ => return Err("chunk size is not a hex number"),
                }
            }
        }
        Chunk::LineCr => match (b, size) {
            (b'\n', 0) => Chunk::TrailerStart,
            (b'\n', left) => Chunk::Data { left },
            _ => return Err("chunk line does not end in CRLF"),
        },
        Chunk::DataEnd { cr: false } if b == b'\r' => Chunk::DataEnd { cr: true },
        Chunk::DataEnd { cr: true } if b == b'\n' => Chunk::Size {
            digits: 0,
            value: 0,
        },
        Chunk::DataEnd { .. } => return Err("chunk data is not followed by CRLF"),
        Chunk::Data { .. } => unreachable!("chunk data is skipped in bulk"),
        Chunk::TrailerStart => match b {
            b'\r' => Chunk::FinalCr,
            _ if is_tchar(b) => Chunk::TrailerName,
            _ => return Err("trailer section is not field lines ending in a CRLF"),
        },
        Chunk::FinalCr if b == b'\n' => {
            return Ok(State::Idle);
        }
        Chunk::FinalCr => return Err("chunked body does not end in CRLF"),
        Chunk::TrailerName => match b {
            b':' => Chunk::TrailerValue,
            _ if is_tchar(b) => Chunk::TrailerName,
            _ => return Err("trailer field name is not a token followed by a colon"),
        },
        Chunk::TrailerValue => match b {
            b'\r' => Chunk::TrailerCr,
            _ if is_ws || is_field_vchar(b) => Chunk::TrailerValue,
            _ => return Err("trailer field value has a control character"),
        },
        Chunk::TrailerCr if b == b'\n' => Chunk::TrailerStart,
        Chunk::TrailerCr => return Err("trailer field does not end in CRLF"),
        // The chunk extension (`ext` counts its bytes).
        ext_state => {
            ext += usize::from(b != b'\r');
            if ext > MAX_CHUNK_EXT_BYTES {
                return Err("chunk extension is longer than 1024 bytes");
            }
            chunk_ext(ext_state, b)?
        }
    };
    if matches!(
        next,
        Chunk::TrailerName | Chunk::TrailerValue | Chunk::TrailerCr | Chunk::FinalCr
    ) {
        trailer += 1;
        if trailer > MAX_TRAILER_BYTES {
            return Err("trailer section is longer than 16 KiB");
        }
    }
    Ok(State::Chunked {
        at: next,
        size,
        ext,
        trailer,
    })
}

/// One byte of a chunk extension, by RFC 9112 §7.1.1:
/// `*( BWS ";" BWS chunk-ext-name [ BWS "=" BWS ( token / quoted-string ) ] )`, then CRLF.
fn chunk_ext(at: Chunk, b: u8) -> Result<Chunk, &'static str> {
    const BAD: &str = "chunk extension is not `;name[=value]` with a token or quoted value";
    let ws = b == b' ' || b == b'\t';
    Ok(match (at, b) {
        (Chunk::BeforeSemi, _) if ws => Chunk::BeforeSemi,
        (Chunk::BeforeSemi | Chunk::AfterName, b';') => Chunk::BeforeName,
        (Chunk::BeforeName, _) if ws => Chunk::BeforeName,
        (Chunk::BeforeName | Chunk::Name, _) if is_tchar(b) => Chunk::Name,
        (Chunk::Name | Chunk::AfterName, _) if ws => Chunk::AfterName,
        (Chunk::Name | Chunk::AfterName, b'=') => Chunk::BeforeValue,
        (Chunk::Name | Chunk::Token | Chunk::AfterQuoted, b';') => Chunk::BeforeName,
        (Chunk::Name | Chunk::Token | Chunk::AfterQuoted, b'\r') => Chunk::LineCr,
        (Chunk::BeforeValue, _) if ws => Chunk::BeforeValue,
        (Chunk::BeforeValue | Chunk::Token, _) if is_tchar(b) => Chunk::Token,
        (Chunk::BeforeValue, b'"') => Chunk::Quoted { escaped: false },
        (Chunk::Token | Chunk::AfterQuoted, _) if ws => Chunk::BeforeSemi,
        (Chunk::Quoted { escaped: true }, _) if ws || is_field_vchar(b) => {
            Chunk::Quoted { escaped: false }
        }
        (Chunk::Quoted { escaped: false }, b'"') => Chunk::AfterQuoted,
        (Chunk::Quoted { escaped: false }, b'\\') => Chunk::Quoted { escaped: true },
        (Chunk::Quoted { escaped: false }, _) if ws || is_field_vchar(b) => {
            Chunk::Quoted { escaped: false }
        }
        _ => return Err(BAD),
    })
}

/// Whether the head in `head` (its last byte a LF) has just ended: its last line is empty.
/// The request line is never the blank line: [`State::Idle`] skipped empty lines before it.
fn head_ended(head: &[u8]) -> bool {
    head.ends_with(b"\n\n") || head.ends_with(b"\n\r\n")
}

/// A `Content-Length` value: 1 to 19 digits (`None` otherwise; the edge checks refuse it).
fn content_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 9110 `field-vchar`: VCHAR or obs-text.
fn is_field_vchar(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) || b >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &[u8] = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

    /// Feed `parts` one after another; the violation's offset is in the whole stream.
    fn check(parts: &[&[u8]]) -> Result<(), (usize, &'static str)> {
        let mut c = Checker::new();
        let mut base = 0;
        for p in parts {
            c.feed(p).map_err(|v| (base + v.at, v.reason))?;
            base += p.len();
        }
        Ok(())
    }

    /// `body` after a chunked head, fed whole and byte by byte: the same verdict.
    fn chunked(body: &[u8]) -> Result<(), usize> {
        let whole = [HEAD, body].concat();
        let at_once = check(&[&whole]).map_err(|(at, _)| at - HEAD.len());
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        let one_by_one = check(&bytes).map_err(|(at, _)| at - HEAD.len());
        assert_eq!(at_once, one_by_one, "{}", body.escape_ascii());
        at_once
    }

    #[test]
    fn valid_chunked_bodies_pass_and_the_next_request_is_framed() {
        for body in [
            &b"5\r\nhello\r\n0\r\n\r\n"[..],
            b"5;a=b;c=\"d \\\" e\";f\r\nhello\r\n0;last\r\n\r\n",
            b"5 ;a=b\r\nhello\r\n0\r\n\r\n",
            b"005\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\nY: \r\n\r\n",
        ] {
            assert_eq!(chunked(body), Ok(()), "{}", body.escape_ascii());
        }
        // After a whole body the next head is framed again: its violation is found.
        let two = [HEAD, b"1\r\na\r\n0\r\n\r\n", HEAD, b"1 \r\n"].concat();
        let at = two.len() - 2;
        assert_eq!(check(&[&two]).map_err(|e| e.0), Err(at));
    }

    #[test]
    fn malformed_chunks_are_violations_at_the_first_bad_byte() {
        for (body, at) in [
            (&b"0x5\r\nhello\r\n0\r\n\r\n"[..], 1),
            (b"+5\r\n", 0),
            (b" 5\r\n", 0),
            (b"5 \r\n", 2),
            (b"\r\n\r\n", 0),
            (b";a\r\n", 0),
            (b"10000000000000000\r\n", 16),
            (b"5\nhello", 1),
            (b"5\rhello", 2),
            (b"5\r\nhelloxx\r\n", 8),
            (b"5\r\nhello0\r\n", 8),
            (b"5\r\nhello\n0\r\n", 8),
            (b"0\r\nGET / HTTP/1.1\r\n", 6),
            (b"0\r\n\n", 3),
            (b"0\r\nX: a\r\n b\r\n", 9),
            (b"0\r\nX: a\x00\r\n", 7),
            (b"5;a\nb\r\n", 3),
            (b"5;\r\n", 2),
            (b"5;a=\"b\r\n", 6),
            (b"5;a b\r\n", 4),
            (b"5;a \r\n", 4),
        ] {
            assert_eq!(chunked(body), Err(at), "{}", body.escape_ascii());
        }
        let long = [&b"5;"[..], &[b'a'; MAX_CHUNK_EXT_BYTES]].concat();
        assert_eq!(chunked(&long), Err(MAX_CHUNK_EXT_BYTES + 1));
        let ok = [
            &b"5;"[..],
            &[b'a'; MAX_CHUNK_EXT_BYTES - 1],
            b"\r\nhello\r\n",
        ]
        .concat();
        assert_eq!(chunked(&ok), Ok(()));
    }

    #[test]
    fn a_violation_is_final() {
        let mut c = Checker::new();
        let bad = [HEAD, b"5 \r\n"].concat();
        assert_eq!(c.feed(&bad).unwrap_err().at, bad.len() - 2);
        assert_eq!(c.feed(b"anything").unwrap_err().at, 0);
    }

    #[test]
    fn content_length_bodies_pipelining_and_heads_pingora_judges() {
        // A Content-Length body is skipped whatever it holds; the next head is framed.
        let cl = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n5 \r\n\x00\n\n";
        let stream = [&cl[..], HEAD, b"g\r\n"].concat();
        assert_eq!(check(&[&stream]).map_err(|e| e.0), Err(stream.len() - 3));
        // Bare LF heads and empty lines before a request line.
        let lf = b"\r\n\nPOST / HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n5 \r\n";
        assert!(check(&[lf]).is_err());
        // Heads that pingora or the edge refuses (and closes): not checked further.
        for head in [
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            let mut c = Checker::new();
            assert_eq!(c.feed(&[head, b" 5 \r\n"].concat()), Ok(()));
            assert!(c.is_off(), "{}", head.escape_ascii());
        }
    }
}
