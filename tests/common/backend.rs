//! An in-process OpenAI-style backend on 127.0.0.1:0 with controllable behaviour, for tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// What the backend does with each request.
#[derive(Debug, Clone)]
pub struct Behavior {
    /// Answer this status (with an error body) for the next `fail_next` requests.
    pub fail_status: u16,
    /// How many upcoming requests fail with `fail_status`.
    pub fail_next: usize,
    /// Delay before the response head.
    pub header_delay: Duration,
    /// Delay after the head before the first token.
    pub first_token_delay: Duration,
    /// Delay between tokens.
    pub token_delay: Duration,
    /// Tokens per response.
    pub tokens: usize,
    /// Drop the connection after this many tokens (a crash mid-stream).
    pub die_after: Option<usize>,
    /// `/health` answers 200 when true, else 503.
    pub healthy: bool,
    /// `usage.prompt_tokens` reported = this × Pronto's own count of the prompt (an engine
    /// whose tokenizer charges more or less than Pronto's).
    pub prompt_token_factor: f64,
    /// What `GET /v1/models` lists; `None`: it answers 503 (an engine still loading).
    pub models: Option<Vec<String>>,
    /// Pad each streamed token's content to at least this many bytes (a fast producer).
    pub token_bytes: usize,
}

impl Default for Behavior {
    fn default() -> Self {
        Behavior {
            fail_status: 503,
            fail_next: 0,
            header_delay: Duration::ZERO,
            first_token_delay: Duration::ZERO,
            token_delay: Duration::ZERO,
            tokens: 4,
            die_after: None,
            healthy: true,
            prompt_token_factor: 1.0,
            models: None,
            token_bytes: 0,
        }
    }
}

/// What the backend saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Completed and failed requests received (inference endpoints).
    pub requests: AtomicUsize,
    /// Body length and FNV-64 hash of each request, in arrival order.
    pub bodies: Mutex<Vec<(usize, u64)>>,
    /// Request header maps, in arrival order.
    pub headers: Mutex<Vec<HeaderMap>>,
    /// Streams dropped before their last token (client or proxy hung up).
    pub cancelled: AtomicUsize,
    /// When the last cancellation was noticed.
    pub cancelled_at: Mutex<Option<Instant>>,
    /// Tokens written so far, over all streams.
    pub tokens_sent: AtomicUsize,
    /// Health checks received.
    pub health_checks: AtomicUsize,
    /// The headers of the latest health check.
    pub last_health_headers: Mutex<Option<HeaderMap>>,
}

/// Shared state of one test backend.
#[derive(Debug, Default)]
pub struct BackendState {
    pub behavior: Mutex<Behavior>,
    pub seen: Seen,
    pub name: String,
}

/// A running test backend.
pub struct TestBackend {
    pub addr: SocketAddr,
    pub state: Arc<BackendState>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl TestBackend {
    /// Start a backend named `name` with `behavior`, on the current tokio runtime.
    pub async fn start(name: &str, behavior: Behavior) -> TestBackend {
        let state = Arc::new(BackendState {
            behavior: Mutex::new(behavior),
            seen: Seen::default(),
            name: name.to_string(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completion))
            .route("/v1/completions", post(completion))
            .route("/v1/embeddings", post(embeddings))
            .route("/health", get(health))
            .route("/v1/models", get(models))
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        TestBackend {
            addr,
            state,
            stop,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, f: impl FnOnce(&mut Behavior)) {
        f(&mut self.state.behavior.lock().unwrap());
    }

    pub fn requests(&self) -> usize {
        self.state.seen.requests.load(Ordering::SeqCst)
    }

    /// Wait until at least `n` streams were dropped before their last token (client or
    /// proxy hung up); panics with `what` after `bound`.
    pub async fn wait_cancelled(&self, n: usize, bound: Duration, what: &str) {
        let deadline = Instant::now() + bound;
        while self.state.seen.cancelled.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stop serving (connections are refused afterwards).
    pub fn kill(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

async fn health(State(s): State<Arc<BackendState>>, headers: HeaderMap) -> StatusCode {
    s.seen.health_checks.fetch_add(1, Ordering::SeqCst);
    *s.seen.last_health_headers.lock().unwrap() = Some(headers);
    if s.behavior.lock().unwrap().healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(s): State<Arc<BackendState>>) -> Response {
    let listed = s.behavior.lock().unwrap().models.clone();
    match listed {
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Some(ids) => {
            let data: Vec<serde_json::Value> = ids
                .iter()
                .map(|id| serde_json::json!({"id": id, "object": "model", "owned_by": "test"}))
                .collect();
            axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
        }
    }
}

async fn embeddings(State(s): State<Arc<BackendState>>, body: Bytes) -> Response {
    s.seen.requests.fetch_add(1, Ordering::SeqCst);
    s.seen
        .bodies
        .lock()
        .unwrap()
        .push((body.len(), fnv64(&body)));
    let v = serde_json::json!({"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],
        "model":"m","usage":{"prompt_tokens":3,"total_tokens":3}});
    ([("content-type", "application/json")], v.to_string()).into_response()
}

struct CancelProbe {
    state: Arc<BackendState>,
    finished: bool,
}

impl Drop for CancelProbe {
    fn drop(&mut self) {
        if !self.finished {
            self.state.seen.cancelled.fetch_add(1, Ordering::SeqCst);
            *self.state.seen.cancelled_at.lock().unwrap() = Some(Instant::now());
        }
    }
}

fn chunk(v: serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn completion(
    State(s): State<Arc<BackendState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.seen.requests.fetch_add(1, Ordering::SeqCst);
    s.seen
        .bodies
        .lock()
        .unwrap()
        .push((body.len(), fnv64(&body)));
    s.seen.headers.lock().unwrap().push(headers);
    let b = {
        let mut b = s.behavior.lock().unwrap();
        let snapshot = b.clone();
        if b.fail_next > 0 {
            b.fail_next -= 1;
        }
        snapshot
    };
    tokio::time::sleep(b.header_delay).await;
    if b.fail_next > 0 {
        let err = serde_json::json!({"error":{"message":"overloaded","type":"server_error","code":b.fail_status}});
        return (
            StatusCode::from_u16(b.fail_status).unwrap(),
            [("content-type", "application/json")],
            err.to_string(),
        )
            .into_response();
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let stream = v["stream"].as_bool().unwrap_or(false);
    let prompt_tokens = pronto_core::request::parse_request(
        pronto_core::request::Endpoint::ChatCompletions,
        &body,
        None,
    )
    .map_or(10, |f| {
        (f64::from(f.prompt_tokens) * b.prompt_token_factor).round() as u32
    });
    let name = s.name.clone();
    if !stream {
        tokio::time::sleep(b.first_token_delay + b.token_delay * b.tokens as u32).await;
        let text = (0..b.tokens).map(|i| format!("t{i} ")).collect::<String>();
        let v = serde_json::json!({"id":"x","object":"chat.completion","model":"m","backend":name,
            "choices":[{"index":0,"message":{"role":"assistant","content":text},"finish_reason":"length"}],
            "usage":{"prompt_tokens":prompt_tokens,"completion_tokens":b.tokens,"total_tokens":prompt_tokens as usize+b.tokens}});
        return ([("content-type", "application/json")], v.to_string()).into_response();
    }
    let state = Arc::clone(&s);
    let out = async_stream(state, b, name, prompt_tokens);
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(out))
        .unwrap()
}

fn async_stream(
    state: Arc<BackendState>,
    b: Behavior,
    name: String,
    prompt_tokens: u32,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        let mut probe = CancelProbe {
            state: Arc::clone(&state),
            finished: false,
        };
        tokio::time::sleep(b.first_token_delay).await;
        let role = serde_json::json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"backend":name});
        if tx.send(Ok(chunk(role))).await.is_err() {
            return;
        }
        for i in 0..b.tokens {
            if b.die_after == Some(i) {
                probe.finished = true;
                let _ = tx.send(Err(std::io::Error::other("backend crashed"))).await;
                return;
            }
            if i > 0 {
                tokio::time::sleep(b.token_delay).await;
            }
            let mut text = format!("t{i} ");
            if text.len() < b.token_bytes {
                text.push_str(&"x".repeat(b.token_bytes - text.len()));
            }
            let c = serde_json::json!({"choices":[{"index":0,"delta":{"content":text}}]});
            if tx.send(Ok(chunk(c))).await.is_err() {
                return;
            }
            state.seen.tokens_sent.fetch_add(1, Ordering::SeqCst);
        }
        let fin = serde_json::json!({"choices":[{"index":0,"delta":{},"finish_reason":"length"}],
            "usage":{"prompt_tokens":prompt_tokens,"completion_tokens":b.tokens,"total_tokens":prompt_tokens as usize+b.tokens}});
        if tx.send(Ok(chunk(fin))).await.is_err() {
            return;
        }
        if tx
            .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
            .await
            .is_err()
        {
            return;
        }
        // Wait until the body has been taken by hyper (channel closed by the receiver drop)
        // so a cancel right at the end is still not counted.
        probe.finished = true;
    });
    ReceiverStream { rx }
}

struct ReceiverStream {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl futures::Stream for ReceiverStream {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}
