//! The gateway's edge end to end (the `pronto` binary against in-process backends): API keys,
//! the admin token, rate limits, and hostile input on a raw TCP socket (request smuggling,
//! oversized heads, slow bodies, deeply nested and non-UTF-8 JSON).

mod common;

use std::time::Duration;

use common::{
    chat_body, client, config_yaml, pool, post, post_head, Behavior, Gateway, TestBackend,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY_A: &str = "sk-team-a-0123456789";
const KEY_B: &str = "sk-team-b-0123456789";

fn body(model: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4
    }))
    .unwrap()
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Reply {
    fn code(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

async fn send(gw: &Gateway, model: &str, key: Option<&str>) -> Reply {
    let mut req = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .body(body(model));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.unwrap();
    Reply {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        body: r.text().await.unwrap(),
    }
}

fn auth_yaml(extra: &str) -> String {
    format!(
        "auth:\n  keys:\n    - {{name: a, key: {KEY_A}, models: ['m']}}\n    - {{name: b, key: {KEY_B}}}\n\
         admin: {{token: admin-secret-1}}\n{extra}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_401_403_and_admin_token() {
    let b = TestBackend::start("b0", Behavior::default()).await;
    let pools = format!(
        "{}{}",
        pool("m", "round_robin", &[b.url()]),
        pool("other", "round_robin", &[b.url()])
    );
    let gw = Gateway::start(&config_yaml(&pools, &auth_yaml("")));

    let none = send(&gw, "m", None).await;
    assert_eq!(
        (none.status, none.code().as_str()),
        (401, "invalid_api_key"),
        "{none:?}"
    );
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    let wrong = send(&gw, "m", Some("sk-team-a-0123456788")).await;
    assert_eq!(
        (wrong.status, wrong.code().as_str()),
        (401, "invalid_api_key")
    );
    let ok = send(&gw, "m", Some(KEY_A)).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let forbidden = send(&gw, "other", Some(KEY_A)).await;
    assert_eq!(
        (forbidden.status, forbidden.code().as_str()),
        (403, "model_not_allowed")
    );
    assert_eq!(send(&gw, "other", Some(KEY_B)).await.status, 200);
    // A model that does not exist: the restricted key learns nothing more than for a model
    // that exists outside its globs (403); an unrestricted key gets the 404.
    let unknown = send(&gw, "no-such-model", Some(KEY_A)).await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (403, "model_not_allowed"),
        "{unknown:?}"
    );
    let unknown = send(&gw, "no-such-model", Some(KEY_B)).await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (404, "model_not_found")
    );
    // Rejected requests never reached the backend.
    assert_eq!(b.requests(), 2);

    let models = reqwest::get(gw.url("/v1/models")).await.unwrap();
    assert_eq!(models.status(), 401);

    let http = reqwest::Client::new();
    let metrics = |token: Option<&'static str>| {
        let mut r = http.get(gw.admin_url("/metrics"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    assert_eq!(metrics(None).await.unwrap().status(), 401);
    assert_eq!(metrics(Some("admin-secret-2")).await.unwrap().status(), 401);
    let m = metrics(Some("admin-secret-1")).await.unwrap();
    assert_eq!(m.status(), 200);
    let text = m.text().await.unwrap();
    assert!(text.contains("code=\"401\""), "401s are counted");
    let health = reqwest::get(gw.admin_url("/healthz")).await.unwrap();
    assert_eq!(health.status(), 200, "probes need no token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_requests_per_minute_with_openai_headers() {
    let b = TestBackend::start("b0", Behavior::default()).await;
    let extra = "rate_limits:\n  per_key: {requests_per_minute: 2}\n";
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[b.url()]),
        &auth_yaml(extra),
    ));
    let first = send(&gw, "m", Some(KEY_A)).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-limit-requests"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining-requests"), Some("1"));
    assert_eq!(first.header("x-ratelimit-reset-requests"), Some("30s"));
    assert_eq!(send(&gw, "m", Some(KEY_A)).await.status, 200);
    let third = send(&gw, "m", Some(KEY_A)).await;
    assert_eq!(
        (third.status, third.code().as_str()),
        (429, "rate_limit_exceeded"),
        "{third:?}"
    );
    let retry: u32 = third.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry), "retry-after {retry}");
    assert_eq!(third.header("x-ratelimit-remaining-requests"), Some("0"));
    // Another key has its own bucket.
    assert_eq!(send(&gw, "m", Some(KEY_B)).await.status, 200);
    assert_eq!(b.requests(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_and_route_concurrency() {
    let slow = Behavior {
        first_token_delay: Duration::from_millis(800),
        ..Behavior::default()
    };
    let b = TestBackend::start("b0", slow).await;
    // Each request is ~20 prompt tokens + 4 completion tokens; the key may use 30 a minute.
    let extra = "routes:\n  - {name: chat, pool: m}\n\
                 rate_limits:\n  keys: {b: {tokens_per_minute: 30}}\n  routes: {chat: {max_concurrent: 1}}\n";
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[b.url()]),
        &auth_yaml(extra),
    ));
    // Concurrency: while one request of the route is in flight, a second one is refused.
    let gw_ref = &gw;
    let (r1, r2) = tokio::join!(send(gw_ref, "m", Some(KEY_A)), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        send(gw_ref, "m", Some(KEY_A)).await
    });
    assert_eq!(r1.status, 200, "{r1:?}");
    assert_eq!(r2.status, 429, "{r2:?}");
    assert!(r2.body.contains("concurrent"), "{}", r2.body);
    // Tokens: the first request fits; usage (prompt + completion) is charged; then refused.
    let t1 = send(&gw, "m", Some(KEY_B)).await;
    assert_eq!(t1.status, 200, "{t1:?}");
    assert_eq!(t1.header("x-ratelimit-limit-tokens"), Some("30"));
    let mut refused = None;
    for _ in 0..5 {
        let r = send(&gw, "m", Some(KEY_B)).await;
        if r.status == 429 {
            refused = Some(r);
            break;
        }
    }
    let r = refused.expect("the token bucket runs out within 6 requests");
    assert!(r.body.contains("tokens per minute"), "{}", r.body);
    assert!(r.header("x-ratelimit-remaining-tokens").is_some());
}

// === hostile input on a raw socket ===

/// Send `raw` on a fresh connection and read until the server closes it (or 5 s): the
/// response text.
async fn raw(gw: &Gateway, raw: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_oversized_heads_and_hostile_json() {
    let b = TestBackend::start("b0", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(&pool("m", "round_robin", &[b.url()]), ""));
    let json = body("m");
    let cl_te = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        json.len(),
        json.len(),
        String::from_utf8_lossy(&json)
    );
    let r = raw(&gw, cl_te.as_bytes()).await;
    assert_eq!(status_of(&r), 400, "CL + TE: {r}");
    let two_cl = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
         Content-Length: 3\r\n\r\n{}",
        json.len(),
        String::from_utf8_lossy(&json)
    );
    let r = raw(&gw, two_cl.as_bytes()).await;
    assert!(matches!(status_of(&r), 400), "two Content-Lengths: {r}");
    // A smuggled second request must not reach the backend.
    assert_eq!(b.requests(), 0);

    let mut many = String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
    for i in 0..150 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("Content-Length: 0\r\n\r\n");
    let r = raw(&gw, many.as_bytes()).await;
    assert!(matches!(status_of(&r), 431 | 400), "150 headers: {r}");

    let http = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        http.post(gw.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let mut deep = b"{\"model\":\"m\",\"messages\":".to_vec();
    deep.extend(std::iter::repeat_n(b'[', 100_000));
    deep.extend(std::iter::repeat_n(b']', 100_000));
    deep.push(b'}');
    let r = post(deep).await.unwrap();
    assert_eq!(r.status(), 400, "100k-deep JSON");
    let mut bad_utf8 = body("m");
    let at = bad_utf8.windows(5).position(|w| w == b"hello").unwrap();
    bad_utf8[at] = 0xff;
    bad_utf8[at + 1] = 0xfe;
    assert_eq!(post(bad_utf8).await.unwrap().status(), 400, "non-UTF-8");
    // The gateway survived all of it.
    assert_eq!(post(body("m")).await.unwrap().status(), 200);
    assert_eq!(b.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_body_is_cut_off_by_the_idle_timeout() {
    let b = TestBackend::start("b0", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[b.url()]),
        "limits: {idle_timeout: 500ms, first_token_timeout: 400ms}\n",
    ));
    let json = body("m");
    let head = post_head(json.len());
    let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&json[..10]).await.unwrap();
    // Then nothing more: the gateway answers 408 and closes instead of waiting forever.
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the connection was not closed");
    let text = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&text), 408, "{text}");
    assert_eq!(b.requests(), 0);
}

/// Read one HTTP/1.1 response from `s` (a `Content-Length` or chunked body), up to 20 s.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let complete = |b: &[u8]| {
        let text = String::from_utf8_lossy(b);
        let Some(head_end) = text.find("\r\n\r\n") else {
            return false;
        };
        let head = text[..head_end].to_ascii_lowercase();
        let body = &b[head_end + 4..];
        match head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
        {
            Some(n) => body.len() >= n,
            None => body.ends_with(b"0\r\n\r\n"),
        }
    };
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut chunk = [0u8; 4096];
        while !complete(&buf) {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "closed mid-response: {}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no complete response: {}",
        String::from_utf8_lossy(&buf)
    );
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_timeout_closes_idle_connections_but_never_cuts_a_stream() {
    // A stream of about 3 s through a gateway whose keep-alive timeout is 1 s: the wait for the
    // next request starts when the answer is complete, so the stream ends with [DONE] and the
    // connection then serves another request before it is closed for idleness.
    let b = TestBackend::start(
        "b0",
        Behavior {
            tokens: 6,
            token_delay: Duration::from_millis(500),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[b.url()]),
        "limits: {keepalive_timeout: 1s}\n",
    ));
    let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    s.write_all(&post(&chat_body(100, true))).await.unwrap();
    let streamed = read_response(&mut s).await;
    assert_eq!(status_of(&streamed), 200, "{streamed}");
    assert!(streamed.contains("data: [DONE]"), "{streamed}");
    assert!(!streamed.contains("\"error\""), "{streamed}");

    // Well within the timeout, the connection is still there for the next request.
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.set(|b| b.token_delay = Duration::ZERO);
    s.write_all(&post(&chat_body(100, false))).await.unwrap();
    let second = read_response(&mut s).await;
    assert_eq!(status_of(&second), 200, "{second}");
    assert_eq!(b.requests(), 2);

    // Then nothing: the gateway closes the idle connection, without an answer.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the idle keep-alive connection was not closed"
    );
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));

    // An HTTP/2 connection that opens no stream is closed after the timeout too (pingora
    // would keep it forever): the h2c preface and an empty SETTINGS frame, then nothing.
    let mut h2 = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut frames = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), h2.read_to_end(&mut frames)).await;
    assert!(closed.is_ok(), "the idle HTTP/2 connection was not closed");
    assert!(!frames.is_empty(), "the gateway answered the preface");

    // Over HTTP/2 (h2c) too: a stream longer than the timeout is not cut.
    b.set(|b| b.token_delay = Duration::from_millis(500));
    let r = client(true)
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body(100, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_mid_stream_never_sees_it_complete() {
    // A FIN from the client mid-stream reads as a hang-up: the gateway cancels the upstream
    // request and closes the connection. It must not end the chunked body cleanly, or a client
    // still reading would take the cut stream for a complete one.
    let b = TestBackend::start(
        "b0",
        Behavior {
            tokens: 100_000,
            token_delay: Duration::from_millis(5),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(&pool("m", "round_robin", &[b.url()]), ""));
    let mut s = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
    s.write_all(&post(&chat_body(100, true))).await.unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("the stream started")
            .unwrap();
        assert!(n > 0, "closed before the first event");
        seen.extend_from_slice(&chunk[..n]);
    }
    s.shutdown().await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut seen)).await;
    assert!(read.is_ok(), "the gateway kept the connection open");
    let text = String::from_utf8_lossy(&seen);
    assert_eq!(status_of(&text), 200, "{text}");
    assert!(!text.ends_with("0\r\n\r\n"), "the cut stream ended cleanly");
    assert!(!text.contains("[DONE]"), "{text}");
    b.wait_cancelled(
        1,
        Duration::from_secs(10),
        "the upstream request was not cancelled",
    )
    .await;
}

// === bounded in-process fuzzing (seeded; the cargo-fuzz targets in fuzz/ go further) ===

/// Mutations of valid request bodies and SSE streams: byte flips, truncations, splices and
/// random bytes. Nothing may panic; the scanner reports a first token at most once.
#[test]
fn mutated_requests_and_streams_never_panic() {
    use pronto_core::request::{parse_request, Endpoint};
    use pronto_core::sse::SseScanner;
    use rand::{Rng, SeedableRng};

    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
    let seeds: Vec<Vec<u8>> = vec![
        body("m"),
        br#"{"model":"m","prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}"#.to_vec(),
        br#"{"model":"m","input":"x","user":"u","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#.to_vec(),
        b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n".to_vec(),
    ];
    let mut parsed = 0;
    for i in 0..20_000 {
        let mut input = seeds[i % seeds.len()].clone();
        for _ in 0..rng.gen_range(1..6) {
            match rng.gen_range(0..5) {
                0 if !input.is_empty() => {
                    let at = rng.gen_range(0..input.len());
                    input[at] = rng.gen();
                }
                1 if !input.is_empty() => input.truncate(rng.gen_range(0..input.len())),
                2 => {
                    let at = rng.gen_range(0..=input.len());
                    let junk = [b'[', b'{', b'"', b'\\', 0xff, b'\n', b':', b'}'];
                    input.insert(at, junk[rng.gen_range(0..junk.len())]);
                }
                3 => {
                    let at = rng.gen_range(0..=input.len());
                    let copy = input[..at].to_vec();
                    input.extend_from_slice(&copy);
                }
                _ => input.push(rng.gen()),
            }
        }
        for ep in [
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Embeddings,
        ] {
            parsed += usize::from(parse_request(ep, &input, Some("s")).is_ok());
        }
        let mut scanner = SseScanner::new();
        let step = rng.gen_range(1..64);
        let firsts: usize = input
            .chunks(step)
            .map(|c| usize::from(scanner.feed(c).first_token))
            .sum();
        assert!(
            firsts <= 1,
            "first token reported {firsts} times for {input:?}"
        );
    }
    // The mutations keep some inputs valid: the parser was exercised past its first check.
    assert!(parsed > 100, "only {parsed} mutated bodies parsed");
}
