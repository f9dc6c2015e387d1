//! The HTTP face of one simulated backend: an OpenAI-compatible server (axum on hyper,
//! HTTP/1.1 and h2c) in front of the backend's engine task.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/chat/completions`, `POST /v1/completions` | generation, streaming (SSE) or not |
//! | `GET /v1/models`, `GET /health`, `GET /metrics`, `GET /version` | vLLM-like |
//! | `GET /get_model_info`, `/model_info`, `/get_server_info`, `/server_info`, `/get_load` | SGLang router probes |
//! | `POST /tokenize`, `POST /v1/chat/completions/render`, `POST /v1/completions/render` | vLLM router probes |
//!
//! A generation request is parsed ([`super::fleet_openai`]), checked (model name → 404,
//! `error_rate` fault → 500, prompt + `max_tokens` over `max_model_len` → 400, as vLLM), turned
//! into token ids and sent to the engine task; a reasoning model's chat request generates its
//! reasoning tokens first ([`crate::reasoning`]). Its response is driven by the [`Progress`]
//! messages the task delivers at the end of each step. Dropping the response (the client hung
//! up) drops an [`AbortGuard`], which aborts the request in the engine at once. A progress
//! channel that closes before the last token (crash, shutdown) makes the response body fail,
//! so hyper closes the connection without a final chunk.
//!
//! `max_model_len` is the KV pool's capacity (`num_kv_blocks × block_size`): a longer request
//! could never be scheduled. While the backend is down after a crash, every route answers 503.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::engine::{EngineStats, SimRequest};
use super::fleet_driver::{Cmd, Progress};
use super::fleet_faults::FaultControl;
use super::fleet_metrics::BackendMetrics;
use super::fleet_openai::{
    parse_generation, parse_render, parse_tokenize, ApiError, ApiKind, Responder, Usage,
};
use super::fleet_timer::Timer;
use pronto_core::tokens::{token_ids, TokenId};
use pronto_tokenizer::ModelTokenizer;

/// Largest request body accepted (a 1M-token prompt is ~4 MiB).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// What a backend's handlers and engine task share.
pub(crate) struct BackendShared {
    /// Backend name.
    pub name: String,
    /// Served model name.
    pub model: String,
    /// Profile name.
    pub profile: String,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub num_kv_blocks: usize,
    /// Running batch cap.
    pub max_num_seqs: usize,
    /// Commands to the engine task.
    pub cmd: mpsc::UnboundedSender<Cmd>,
    /// Next request id.
    pub next_id: AtomicU64,
    /// Metric families.
    pub metrics: BackendMetrics,
    /// Fault knobs.
    pub faults: FaultControl,
    /// Engine stats as last published by the engine task.
    pub stats: Mutex<EngineStats>,
    /// The model tokenizer prompts are tokenized with, if any (else [`token_ids`]).
    pub tokenizer: Option<Arc<ModelTokenizer>>,
    /// Every sleep of this backend's simulated time (right on average).
    pub timer: Timer,
    /// The model's reasoning, if it reasons ([`crate::reasoning`]).
    pub reasoning: Option<crate::reasoning::ReasoningConfig>,
}

impl BackendShared {
    /// The engine's token ids of a request body: the model tokenizer's when there is one and
    /// it applies (a chat template that raises is the client's error, as in vLLM), else the
    /// built-in mapping of the canonical prompt.
    fn prompt_ids(
        &self,
        endpoint: pronto_core::request::Endpoint,
        body: &[u8],
        canonical: &str,
    ) -> Result<Vec<TokenId>, ApiError> {
        if let Some(t) = &self.tokenizer {
            match t.prompt_ids(endpoint, body) {
                Ok(Some(ids)) => return Ok(ids),
                Ok(None) => {}
                Err(e) => return Err(ApiError::bad_request(e.to_string())),
            }
        }
        Ok(token_ids(canonical.as_bytes()))
    }

    /// Longest prompt + output the engine can ever hold, tokens.
    pub fn max_model_len(&self) -> u64 {
        (self.num_kv_blocks * self.block_size) as u64
    }

    fn stats(&self) -> EngineStats {
        *self.stats.lock().expect("stats lock")
    }
}

type Shared = Arc<BackendShared>;

/// The router of one backend.
pub(crate) fn router(shared: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/get_model_info", get(model_info))
        .route("/model_info", get(model_info))
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/get_load", get(load))
        .route("/tokenize", post(tokenize))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/completions/render", post(render_completions))
        .layer(middleware::from_fn_with_state(
            shared.clone(),
            refuse_when_down,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shared)
}

fn error(e: ApiError) -> Response {
    (e.status, Json(e.body())).into_response()
}

async fn refuse_when_down(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if s.faults.is_down() {
        return error(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend is restarting after a crash",
        ));
    }
    next.run(req).await
}

// === generation ===

async fn chat(State(s): State<Shared>, body: Bytes) -> Response {
    generate(s, ApiKind::Chat, &body).await
}

async fn completions(State(s): State<Shared>, body: Bytes) -> Response {
    generate(s, ApiKind::Completion, &body).await
}

/// Aborts its request in the engine when dropped before the request finished (and counts the
/// cancellation).
struct AbortGuard {
    id: u64,
    cmd: mpsc::UnboundedSender<Cmd>,
    cancelled: prometheus::IntCounter,
    armed: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            self.cancelled.inc();
            // The engine task is gone only at shutdown, when there is nothing left to abort.
            let _ = self.cmd.send(Cmd::Abort(self.id));
        }
    }
}

/// One admitted request, as the response side sees it.
struct Flight {
    rx: mpsc::UnboundedReceiver<Progress>,
    guard: AbortGuard,
    responder: Responder,
    shared: Shared,
    start: Instant,
    stall: Option<Duration>,
    usage: Usage,
}

/// Why a flight ended without its last token.
enum Cut {
    /// The engine task dropped the request (crash or shutdown).
    Crashed,
    /// The engine rejected the request as too large.
    Rejected,
}

impl Flight {
    /// Next progress message; first-token bookkeeping (stall, TTFT, usage) is done here.
    async fn next(&mut self) -> Result<Progress, Cut> {
        let Some(p) = self.rx.recv().await else {
            // The engine dropped the request (crash, shutdown): nothing left to cancel.
            self.guard.armed = false;
            return Err(Cut::Crashed);
        };
        if let Some(at) = p.release_at {
            // The profile's output latency (see fleet_driver).
            self.shared.timer.sleep_until(at).await;
        }
        if p.rejected {
            self.guard.armed = false;
            return Err(Cut::Rejected);
        }
        if let Some(f) = p.first {
            if let Some(d) = self.stall {
                self.shared.metrics.stalled.inc();
                tokio::time::sleep(d).await;
            }
            self.shared
                .metrics
                .ttft
                .observe(self.start.elapsed().as_secs_f64());
            self.usage.prompt_tokens = f.prompt_tokens;
            self.usage.cached_tokens = f.cached_tokens;
        }
        if p.finished {
            self.guard.armed = false;
        }
        Ok(p)
    }
}

async fn generate(s: Shared, kind: ApiKind, body: &[u8]) -> Response {
    let start = Instant::now();
    let req = match parse_generation(kind, body) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    if let Some(m) = req.model.as_deref().filter(|m| *m != s.model) {
        return error(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
        ));
    }
    if s.faults.roll_error() {
        s.metrics.injected_errors.inc();
        return error(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected fault (error_rate)",
        ));
    }
    let endpoint = match kind {
        ApiKind::Chat => pronto_core::request::Endpoint::ChatCompletions,
        ApiKind::Completion => pronto_core::request::Endpoint::Completions,
    };
    let prompt = match s.prompt_ids(endpoint, body, &req.prompt) {
        Ok(ids) => ids,
        Err(e) => return error(e),
    };
    if prompt.is_empty() {
        return error(ApiError::bad_request("the prompt must not be empty"));
    }
    // A reasoning model reasons before it answers (chat only; see crate::reasoning).
    // A continued final message goes on with its answer: no reasoning first.
    let reasoning = match (kind, &s.reasoning) {
        (ApiKind::Chat, Some(r)) if !req.continue_final => r.tokens_for(&prompt),
        _ => 0,
    };
    let generated = req.max_tokens.saturating_add(reasoning);
    let wanted = prompt.len() as u64 + u64::from(generated);
    if wanted > s.max_model_len() {
        return error(ApiError::bad_request(format!(
            "This model's maximum context length is {} tokens. However, you requested {} \
             tokens ({} in the messages, {} in the completion).",
            s.max_model_len(),
            wanted,
            prompt.len(),
            generated
        )));
    }
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let sim = SimRequest {
        id,
        prompt,
        max_tokens: generated,
    };
    let add = Cmd::Add {
        req: sim,
        tx,
        arrived: start,
    };
    if s.cmd.send(add).is_err() {
        return error(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend is shutting down",
        ));
    }
    let flight = Flight {
        rx,
        guard: AbortGuard {
            id,
            cmd: s.cmd.clone(),
            cancelled: s.metrics.cancelled.clone(),
            armed: true,
        },
        responder: Responder::new(
            kind,
            id,
            s.model.clone(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            req.seed,
        ),
        stall: s.faults.roll_stall(),
        shared: s,
        start,
        usage: Usage {
            reasoning_tokens: reasoning,
            ..Usage::default()
        },
    };
    if req.stream {
        stream_response(flight, req.include_usage)
    } else {
        full_response(flight).await
    }
}

async fn full_response(mut f: Flight) -> Response {
    loop {
        match f.next().await {
            Ok(p) => {
                f.usage.completion_tokens += p.tokens;
                if p.finished {
                    return Json(f.responder.full(f.usage)).into_response();
                }
            }
            Err(Cut::Crashed) => {
                return error(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "engine crashed while generating",
                ))
            }
            Err(Cut::Rejected) => {
                return error(ApiError::bad_request(
                    "request does not fit in the KV cache",
                ))
            }
        }
    }
}

/// State of a streaming response body.
struct SseState {
    flight: Flight,
    include_usage: bool,
    done: bool,
}

impl SseState {
    /// The next body frame: everything one engine step produced for this request.
    async fn next_frame(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        let p = match self.flight.next().await {
            Ok(p) => p,
            Err(cut) => {
                self.done = true;
                let why = match cut {
                    Cut::Crashed => "backend crashed mid-stream",
                    Cut::Rejected => "request does not fit in the KV cache",
                };
                return Some(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    why,
                )));
            }
        };
        let r = &mut self.flight.responder;
        let mut frame = Vec::new();
        if p.first.is_some() {
            if let Some(role) = r.role_chunk() {
                frame.extend_from_slice(&role);
            }
        }
        let base = self.flight.usage.completion_tokens;
        for i in 0..p.tokens {
            let last = p.finished && i + 1 == p.tokens;
            let reasoning = base + i < self.flight.usage.reasoning_tokens;
            r.push_token_chunk(last, reasoning, &mut frame);
        }
        self.flight.usage.completion_tokens += p.tokens;
        if p.finished {
            if self.include_usage {
                frame.extend_from_slice(&r.usage_chunk(self.flight.usage));
            }
            frame.extend_from_slice(&Responder::done());
            self.done = true;
        }
        Some(Ok(Bytes::from(frame)))
    }
}

fn stream_response(flight: Flight, include_usage: bool) -> Response {
    let state = SseState {
        flight,
        include_usage,
        done: false,
    };
    let body = futures::stream::unfold(state, |mut st| async move {
        st.next_frame().await.map(|item| (item, st))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("static response parts are valid")
}

// === info, metrics, probes ===

async fn models(State(s): State<Shared>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.model, "object": "model", "created": 0, "owned_by": "pronto-sim",
        "root": s.model, "parent": null, "max_model_len": s.max_model_len(),
    }]}))
}

/// The simulator's version (vLLM answers `{"version": "0.32.0"}`).
const VERSION: &str = concat!("pronto-sim ", env!("CARGO_PKG_VERSION"));

async fn version() -> Json<Value> {
    Json(json!({ "version": VERSION }))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn model_info(State(s): State<Shared>) -> Json<Value> {
    Json(json!({
        "model_path": s.model, "tokenizer_path": s.model, "is_generation": true,
        "preferred_sampling_params": null,
    }))
}

async fn server_info(State(s): State<Shared>) -> Json<Value> {
    Json(json!({
        "model_path": s.model, "served_model_name": s.model, "backend": s.name,
        "profile": s.profile, "page_size": s.block_size,
        "max_total_num_tokens": s.max_model_len(), "max_running_requests": s.max_num_seqs,
        "version": VERSION,
    }))
}

async fn load(State(s): State<Shared>) -> Json<Value> {
    let st = s.stats();
    let tokens = (st.kv_usage * s.max_model_len() as f64).round() as u64;
    Json(json!([{
        "dp_rank": 0, "num_reqs": st.running + st.waiting,
        "num_waiting_reqs": st.waiting, "num_tokens": tokens,
    }]))
}

async fn tokenize(State(s): State<Shared>, body: Bytes) -> Response {
    match parse_tokenize(&body) {
        Ok(prompt) => {
            let chat =
                serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.get("messages").is_some());
            let endpoint = if chat {
                pronto_core::request::Endpoint::ChatCompletions
            } else {
                pronto_core::request::Endpoint::Completions
            };
            let ids = match s.prompt_ids(endpoint, &body, &prompt) {
                Ok(ids) => ids,
                Err(e) => return error(e),
            };
            Json(json!({"count": ids.len(), "max_model_len": s.max_model_len(), "tokens": ids}))
                .into_response()
        }
        Err(e) => error(e),
    }
}

async fn render_chat(body: Bytes) -> Response {
    match parse_render(ApiKind::Chat, &body) {
        Ok((prompt, messages)) => {
            let ids = token_ids(prompt.as_bytes());
            Json(json!([messages, [{"prompt": prompt, "prompt_token_ids": ids}]])).into_response()
        }
        Err(e) => error(e),
    }
}

async fn render_completions(body: Bytes) -> Response {
    match parse_render(ApiKind::Completion, &body) {
        Ok((prompt, _)) => {
            let ids = token_ids(prompt.as_bytes());
            Json(json!([{"prompt": prompt, "prompt_token_ids": ids}])).into_response()
        }
        Err(e) => error(e),
    }
}
