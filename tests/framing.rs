//! Strict HTTP/1.1 framing end to end, on raw sockets (issue 42, item 1).
//!
//! - `framing_suite`: every case of `tests/fixtures/framing/cases.json` (the same list
//!   `scripts/framing-vs-nginx.sh` runs against nginx) on a fresh connection, followed by a
//!   probe request: the first answer's status, how many answers came (one: nothing after a
//!   framing error was parsed), that the server closed the connection (with
//!   `Connection: close` on an error), and how many requests reached the backend.
//! - `random_framings_close_where_a_reference_parser_rejects`: random chunked bodies and
//!   heads, mutated, against the gateway and a reference parser (`httparse` for the head, the
//!   RFC 9112 chunked grammar written out below); wherever the reference rejects, the
//!   gateway must answer at most once and close, never answering the probe behind the body.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{config_yaml, pool, Behavior, Gateway, TestBackend};
use proptest::prelude::*;

const CASES: &str = include_str!("fixtures/framing/cases.json");
/// The probe request that follows every case.
const PROBE: &str = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
const HEAD: &str =
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

fn body() -> String {
    serde_json::to_string(&serde_json::json!({
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}]
    }))
    .unwrap()
}

/// A case's `raw` with its templates filled in (as `scripts/framing_cases.py` does).
fn expand(raw: &str) -> Vec<u8> {
    let b = body();
    let (b1, b2) = b.split_at(10);
    let mut out = raw.to_string();
    while let Some(at) = out.find("{A*") {
        let end = at + out[at..].find('}').unwrap();
        let n: usize = out[at + 3..end].parse().unwrap();
        out.replace_range(at..=end, &"a".repeat(n));
    }
    let subs = [
        ("{H}", HEAD.to_string()),
        ("{N}", PROBE.to_string()),
        ("{BL}", b.len().to_string()),
        ("{BXU}", format!("{:X}", b.len())),
        ("{BX}", format!("{:x}", b.len())),
        ("{B1X}", format!("{:x}", b1.len())),
        ("{B2X}", format!("{:x}", b2.len())),
        ("{B1}", b1.to_string()),
        ("{B2}", b2.to_string()),
        ("{B}", b.clone()),
    ];
    for (k, v) in subs {
        out = out.replace(k, &v);
    }
    // Latin-1: each char is one byte.
    out.chars().map(|c| u8::try_from(c).unwrap()).collect()
}

/// What a server did with one connection.
#[derive(Debug)]
struct Seen {
    /// Status and head of each answer, in order.
    answers: Vec<(u16, String)>,
    /// Whether it closed the connection within the bound.
    closed: bool,
}

/// Send `raw` at once and read until the server closes the connection (or `bound` passes).
fn exchange(addr: SocketAddr, raw: &[u8], bound: Duration) -> Seen {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(raw).unwrap();
    let deadline = Instant::now() + bound;
    let mut data = Vec::new();
    let mut closed = false;
    let mut buf = [0u8; 65536];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => data.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(_) => break,
        }
    }
    Seen {
        answers: answers(&data),
        closed,
    }
}

/// The HTTP/1.1 answers in `data`: status and lower-cased head of each.
fn answers(mut data: &[u8]) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    while data.starts_with(b"HTTP/1.") {
        let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut rest = &data[end + 4..];
        let field = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        if let Some(n) = field("content-length:").and_then(|n| n.parse::<usize>().ok()) {
            rest = &rest[n.min(rest.len())..];
        } else if field("transfer-encoding:").as_deref() == Some("chunked") {
            loop {
                let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                    rest = &[];
                    break;
                };
                let size_text = String::from_utf8_lossy(&rest[..eol]).to_string();
                let size =
                    usize::from_str_radix(size_text.split(';').next().unwrap(), 16).unwrap_or(0);
                rest = &rest[(eol + 2 + size + 2).min(rest.len())..];
                if size == 0 {
                    break;
                }
            }
        }
        out.push((status, head));
        data = rest;
    }
    out
}

fn start(extra: &str) -> (tokio::runtime::Runtime, TestBackend, Gateway) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let b = rt.block_on(TestBackend::start("b0", Behavior::default()));
    let gw = Gateway::start(&config_yaml(&pool("m", "round_robin", &[b.url()]), extra));
    (rt, b, gw)
}

#[test]
fn framing_suite() {
    let (_rt, b, gw) = start("");
    let cases: serde_json::Value = serde_json::from_str(CASES).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 40, "tens of cases");
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let want = |k: &str| case[k].as_u64().unwrap() as usize;
        let before = b.requests();
        let seen = exchange(
            gw.listen,
            &expand(case["raw"].as_str().unwrap()),
            Duration::from_secs(5),
        );
        let reached = b.requests() - before;
        let status = seen.answers.first().map_or(0, |a| a.0 as usize);
        let mut wrong = Vec::new();
        if status != want("status") {
            wrong.push(format!("status {status}, want {}", want("status")));
        }
        if seen.answers.len() != want("responses") {
            wrong.push(format!(
                "{} answers, want {}",
                seen.answers.len(),
                want("responses")
            ));
        }
        if !seen.closed {
            wrong.push("the connection was left open".to_string());
        }
        if reached != want("backend") {
            wrong.push(format!("{reached} requests reached the backend"));
        }
        if status >= 400 && !seen.answers[0].1.contains("connection: close") {
            wrong.push("the error did not say `Connection: close`".to_string());
        }
        if !wrong.is_empty() {
            failures.push(format!("{name}: {} ({:?})", wrong.join(", "), seen.answers));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// === the reference parser ===

/// RFC 9112 §7.1 `chunked-body` at the start of `b`, with extensions of at most
/// `MAX_EXT` bytes per chunk and sizes of at most 16 digits: its length, or `None` when `b`
/// is not one (or ends before it does).
fn reference_chunked(b: &[u8]) -> Option<usize> {
    const MAX_EXT: usize = 1024;
    let tchar = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    let vchar = |c: u8| (0x21..=0x7e).contains(&c) || c >= 0x80;
    let ws = |c: u8| c == b' ' || c == b'\t';
    let get = |i: usize| b.get(i).copied();
    let skip_ws = |mut i: usize| {
        while get(i).is_some_and(ws) {
            i += 1;
        }
        i
    };
    let token = |mut i: usize| {
        let start = i;
        while get(i).is_some_and(tchar) {
            i += 1;
        }
        (i > start).then_some(i)
    };
    let crlf = |i: usize| (get(i)? == b'\r' && get(i + 1)? == b'\n').then_some(i + 2);
    let mut i = 0;
    loop {
        let start = i;
        while get(i).is_some_and(|c| c.is_ascii_hexdigit()) {
            i += 1;
        }
        if i == start || i - start > 16 {
            return None;
        }
        let size = u64::from_str_radix(std::str::from_utf8(&b[start..i]).ok()?, 16).ok()?;
        let ext_start = i;
        // *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )
        loop {
            let j = skip_ws(i);
            if get(j) != Some(b';') {
                break;
            }
            i = token(skip_ws(j + 1))?;
            let k = skip_ws(i);
            if get(k) == Some(b'=') {
                let v = skip_ws(k + 1);
                i = if get(v) == Some(b'"') {
                    let mut q = v + 1;
                    loop {
                        match get(q)? {
                            b'"' => break q + 1,
                            b'\\' if get(q + 1).is_some_and(|c| ws(c) || vchar(c)) => q += 2,
                            c if ws(c) || (vchar(c) && c != b'\\') => q += 1,
                            _ => return None,
                        }
                    }
                } else {
                    token(v)?
                };
            }
        }
        if i - ext_start > MAX_EXT {
            return None;
        }
        i = crlf(i)?;
        if size == 0 {
            // trailer-section CRLF
            loop {
                if let Some(end) = crlf(i) {
                    return Some(end);
                }
                i = token(i)?;
                if get(i)? != b':' {
                    return None;
                }
                i += 1;
                while get(i).is_some_and(|c| ws(c) || vchar(c)) {
                    i += 1;
                }
                i = crlf(i)?;
            }
        }
        let size = usize::try_from(size).ok()?;
        i = i.checked_add(size).filter(|&e| e <= b.len())?;
        i = crlf(i)?;
    }
}

/// The reference's framing of one request at the start of `b`: its length, or `None` when
/// it is not a valid request (or `b` ends before it does). The head by `httparse`; framed by
/// RFC 9112 §6: one `Transfer-Encoding: chunked` (HTTP/1.1, no `Content-Length`), else
/// `Content-Length` (identical valid values), else no body; one `Host` in HTTP/1.1.
fn reference_request(b: &[u8]) -> Option<usize> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut fields);
    let httparse::Status::Complete(head_len) = req.parse(b).ok()? else {
        return None;
    };
    let values = |name: &str| -> Vec<&[u8]> {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.trim_ascii())
            .collect()
    };
    let http11 = req.version == Some(1);
    if http11 && values("host").len() != 1 {
        return None;
    }
    let (te, cl) = (values("transfer-encoding"), values("content-length"));
    let body = match (&te[..], &cl[..]) {
        ([], []) => 0,
        ([], [first, ..]) => {
            let digits = !first.is_empty() && first.iter().all(u8::is_ascii_digit);
            if !digits || cl.iter().any(|v| v != first) {
                return None;
            }
            std::str::from_utf8(first).ok()?.parse().ok()?
        }
        ([coding], []) if http11 && coding.eq_ignore_ascii_case(b"chunked") => {
            reference_chunked(&b[head_len..])?
        }
        _ => return None,
    };
    let end = head_len.checked_add(body)?;
    (end <= b.len()).then_some(end)
}

/// The reference's reading of a connection's bytes: how many requests it frames one after
/// another, and whether it then meets bytes that are not a request.
fn reference(mut stream: &[u8]) -> (usize, bool) {
    let mut framed = 0;
    while !stream.is_empty() {
        match reference_request(stream) {
            Some(len) => {
                framed += 1;
                stream = &stream[len..];
            }
            None => return (framed, true),
        }
    }
    (framed, false)
}

#[test]
fn the_reference_parser_knows_the_grammar() {
    for ok in [
        &b"5\r\nhello\r\n0\r\n\r\n"[..],
        b"5 ; a = \"b\\\"c\" ;d\r\nhello\r\n0\r\nX: y\r\n\r\n",
    ] {
        assert_eq!(
            reference_chunked(ok),
            Some(ok.len()),
            "{}",
            ok.escape_ascii()
        );
    }
    for bad in [
        &b"5 \r\nhello\r\n0\r\n\r\n"[..],
        b"\r\n\r\n",
        b"5\r\nhello0\r\n\r\n",
        b"5;\r\nhello\r\n0\r\n\r\n",
        b"0\r\nGET / HTTP/1.1\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
    ] {
        assert_eq!(reference_chunked(bad), None, "{}", bad.escape_ascii());
    }
}

/// A chunked request: the JSON body cut in chunks with extensions, maybe a trailer.
fn chunked_request(cuts: &[usize], exts: &[u8], trailer: bool) -> Vec<u8> {
    let b = body();
    let mut out = format!("{HEAD}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
    let mut at = 0;
    for (n, &cut) in cuts.iter().enumerate() {
        let end = (at + cut).min(b.len());
        if end == at {
            continue;
        }
        let ext = match exts.get(n).copied().unwrap_or(0) % 4 {
            0 => "",
            1 => ";a",
            2 => ";a=b",
            _ => " ;q=\"x y\"",
        };
        out.extend_from_slice(format!("{:x}{ext}\r\n", end - at).as_bytes());
        out.extend_from_slice(&b.as_bytes()[at..end]);
        out.extend_from_slice(b"\r\n");
        at = end;
    }
    if at < b.len() {
        out.extend_from_slice(format!("{:x}\r\n{}\r\n", b.len() - at, &b[at..]).as_bytes());
    }
    out.extend_from_slice(if trailer {
        b"0\r\nX-T: 1\r\n\r\n"
    } else {
        b"0\r\n\r\n"
    });
    out
}

/// Bytes a mutation inserts or writes: the framing's own and its near misses.
const NASTY: &[u8] = b" \t\r\n\0;=\"0fx+-:a\x0b";

#[derive(Debug, Clone)]
enum Mutation {
    Insert(usize, u8),
    Replace(usize, u8),
    Delete(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop::sample::select(NASTY);
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Mutation::Replace(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
    ]
}

fn apply(request: &mut Vec<u8>, m: &Mutation) {
    let len = request.len();
    match *m {
        Mutation::Insert(i, b) => request.insert(i % (len + 1), b),
        Mutation::Replace(i, b) => request[i % len] = b,
        Mutation::Delete(i) => {
            request.remove(i % len);
        }
    }
}

#[test]
fn random_framings_close_where_a_reference_parser_rejects() {
    // A body or head cut short by a mutation waits for bytes that never come: short
    // deadlines.
    let (_rt, _b, gw) =
        start("limits:\n  body_timeout: 1s\n  idle_timeout: 1s\n  header_timeout: 1s\n");
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        cuts in prop::collection::vec(1usize..40, 0..5),
        exts in prop::collection::vec(any::<u8>(), 0..5),
        trailer in any::<bool>(),
        mutations in prop::collection::vec(mutation(), 0..3),
    )| {
        let mut request = chunked_request(&cuts, &exts, trailer);
        for m in &mutations {
            apply(&mut request, m);
        }
        let stream = [&request[..], PROBE.as_bytes()].concat();
        let (framed, rejected) = reference(&stream);
        let seen = exchange(gw.listen, &stream, Duration::from_secs(4));
        let shown = stream.escape_ascii().to_string();
        // Wherever the reference stops (bytes that are not a request) or the gateway refuses
        // a request, the connection ends there: the gateway never answers a request the
        // reference did not frame, beyond one error answer for the bytes it refused.
        prop_assert!(seen.closed, "left open: {shown} {seen:?}");
        prop_assert!(
            seen.answers.len() <= framed + usize::from(rejected),
            "the reference frames {framed} requests{}, the gateway answered {}: {shown} {seen:?}",
            if rejected { " then rejects" } else { "" },
            seen.answers.len()
        );
        prop_assert!(!seen.answers.is_empty(), "no answer: {shown}");
        // Where both frame every request, the probe is the last answer.
        if !rejected && seen.answers.len() == framed {
            prop_assert_eq!(seen.answers[framed - 1].0, 200, "{} {:?}", shown, seen);
        }
    });
}

/// The GOAWAY error code in an HTTP/2 server's frames, if it sent one.
fn goaway_code(mut frames: &[u8]) -> Option<u32> {
    while frames.len() >= 9 {
        let len =
            usize::from(frames[0]) << 16 | usize::from(frames[1]) << 8 | usize::from(frames[2]);
        let payload = frames.get(9..9 + len)?;
        if frames[3] == 0x7 && payload.len() >= 8 {
            return Some(u32::from_be_bytes(payload[4..8].try_into().ok()?));
        }
        frames = &frames[9 + len..];
    }
    None
}

/// h2c: pingora's HTTP/2 is the `h2` crate's, which enforces RFC 9113's framing. A malformed
/// frame ends the connection with a GOAWAY naming the error, and nothing after it is read.
#[test]
fn h2c_malformed_frames_end_the_connection() {
    let (_rt, b, gw) = start("");
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    for (name, frame, code) in [
        // DATA on stream 0: PROTOCOL_ERROR (RFC 9113 §6.1).
        (
            "DATA on stream 0",
            &b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x"[..],
            0x1,
        ),
        // A SETTINGS frame whose length is not a multiple of 6: RFC 9113 §6.5 names
        // FRAME_SIZE_ERROR; the h2 crate answers PROTOCOL_ERROR. The connection ends either way.
        (
            "SETTINGS of 5 bytes",
            b"\x00\x00\x05\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00",
            0x1,
        ),
        // A HEADERS frame on an even (server-initiated) stream: PROTOCOL_ERROR (§5.1.1).
        (
            "HEADERS on stream 2",
            b"\x00\x00\x01\x01\x05\x00\x00\x00\x02\x82",
            0x1,
        ),
    ] {
        let seen = {
            let mut s = TcpStream::connect(gw.listen).unwrap();
            s.write_all(&[PREFACE, frame].concat()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = Vec::new();
            let closed = s.read_to_end(&mut out).is_ok();
            (out, closed)
        };
        assert!(seen.1, "{name}: the connection was left open");
        assert_eq!(goaway_code(&seen.0), Some(code), "{name}: {:?}", seen.0);
    }
    assert_eq!(b.requests(), 0);
}
