//! The replay client: one streaming chat completion per trace request, timed.
//!
//! Each request is `POST {target}/v1/chat/completions` with one user message holding the
//! request's synthetic prompt ([`TraceRequest::prompt_text`]), `stream: true`,
//! `stream_options.include_usage: true` and `max_tokens` = the trace's output length (plus
//! `ignore_eos: true` when asked, so real vLLM/SGLang engines generate the full length). The
//! body is built before the clock starts; TTFT runs from handing the request to the HTTP
//! client to the first SSE event that carries output, as judged by [`SseScanner`] (the role-only
//! chunk does not count); TTFA to the first event carrying an answer (content or a tool call,
//! after any reasoning).
//!
//! A request **fails** when it cannot be sent or its body breaks off (transport error), the
//! status is not 2xx, the stream carries an error event, ends without `data: [DONE]`, carries no
//! output although `max_tokens > 0`, or the whole exchange outlives the timeout. Failures are
//! recorded with their reason, never raised.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;

use super::report::RequestRecord;
use pronto_core::sse::SseScanner;
use pronto_sim::workload::TraceRequest;

/// Most bytes of an error response body kept in [`RequestRecord::error`].
const ERROR_BODY_BYTES: usize = 300;

/// Sends replayed requests to one target.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    /// One URL per target; request `i` goes to `urls[i % len]`.
    urls: Vec<String>,
    model: String,
    timeout: Duration,
    ignore_eos: bool,
}

/// `target` without a trailing slash.
fn base(target: &str) -> &str {
    target.trim_end_matches('/')
}

/// An HTTP/1.1 client whose idle pool keeps up to `pool` connections to the target, so an
/// open-loop burst reuses connections instead of reconnecting.
pub fn http_client(pool: usize) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(pool)
        .tcp_nodelay(true)
        .http1_only()
        .build()
        .context("building the HTTP client")
}

/// The first model that `GET {target}/v1/models` lists.
pub async fn discover_model(client: &reqwest::Client, target: &str) -> anyhow::Result<String> {
    let url = format!("{}/v1/models", base(target));
    let resp = client
        .get(&url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {}", error_chain(&e)))?;
    let status = resp.status();
    anyhow::ensure!(status.is_success(), "GET {url}: status {status}");
    let body: serde_json::Value = resp
        .json()
        .await
        .with_context(|| format!("GET {url}: not a JSON model list"))?;
    body["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("GET {url}: no model listed (pass --model)"))
}

/// `e` and its sources, joined by `: ` (reqwest's own message omits the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let msg = c.to_string();
        if !s.contains(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        cur = c.source();
    }
    s
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Sender {
    /// A sender of streaming chat completions for `model` to `target`: a base URL, or several
    /// separated by commas (several replicas of one router behind no load balancer: request
    /// `i` of the trace goes to the `i mod n`-th).
    pub fn new(
        client: reqwest::Client,
        target: &str,
        model: String,
        timeout: Duration,
        ignore_eos: bool,
    ) -> Sender {
        Sender {
            client,
            urls: target
                .split(',')
                .map(|t| format!("{}/v1/chat/completions", base(t.trim())))
                .collect(),
            model,
            timeout,
            ignore_eos,
        }
    }

    /// The JSON body for `req` (the `index`-th request of its trace).
    pub fn body(&self, req: &TraceRequest, index: u64) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Message<'a> {
            role: &'static str,
            content: &'a str,
        }
        #[derive(serde::Serialize)]
        struct StreamOptions {
            include_usage: bool,
        }
        #[derive(serde::Serialize)]
        struct Body<'a> {
            model: &'a str,
            messages: [Message<'a>; 1],
            max_tokens: u32,
            stream: bool,
            stream_options: StreamOptions,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            ignore_eos: bool,
        }
        let mut prompt = String::new();
        req.prompt_text(index, &mut prompt);
        let body = Body {
            model: &self.model,
            messages: [Message {
                role: "user",
                content: &prompt,
            }],
            max_tokens: req.output_tokens,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            ignore_eos: self.ignore_eos,
        };
        serde_json::to_vec(&body).expect("the body serialises")
    }

    /// Send `req` now and record what happened; `epoch` is the replay's start and
    /// `scheduled_s` the request's planned send time after it.
    pub async fn send(
        &self,
        req: &TraceRequest,
        index: u64,
        scheduled_s: f64,
        epoch: Instant,
    ) -> RequestRecord {
        let body = self.body(req, index);
        let sent = Instant::now();
        let sent_s = sent.duration_since(epoch).as_secs_f64();
        let mut rec = RequestRecord {
            index,
            scheduled_s,
            sent_s,
            send_lag_ms: (sent_s - scheduled_s) * 1e3,
            input_tokens: req.input_tokens,
            max_tokens: req.output_tokens,
            ..RequestRecord::default()
        };
        let outcome = tokio::time::timeout(self.timeout, self.exchange(body, sent, &mut rec)).await;
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("timed out after {:?}", self.timeout)),
        };
        if error.is_some() {
            // A failed request ends when its error arrives; no latency is kept for it.
            rec.e2e_ms = Some(ms(sent.elapsed()));
            rec.ttft_ms = None;
            rec.ttfa_ms = None;
            rec.tpot_ms = None;
            rec.error = error;
        }
        rec
    }

    async fn exchange(
        &self,
        body: Vec<u8>,
        sent: Instant,
        rec: &mut RequestRecord,
    ) -> Result<(), String> {
        let resp = self
            .client
            .post(&self.urls[rec.index as usize % self.urls.len()])
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "text/event-stream")
            .body(body)
            .send()
            .await
            .map_err(|e| error_chain(&e))?;
        let status = resp.status();
        rec.status = Some(status.as_u16());
        rec.backend = header(&resp, "x-pronto-backend").map(str::to_string);
        rec.predicted_ttft_ms =
            header(&resp, "x-pronto-predicted-ttft-ms").and_then(|v| v.parse().ok());
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            let cut = text
                .char_indices()
                .nth(ERROR_BODY_BYTES)
                .map_or(text.len(), |(i, _)| i);
            return Err(format!("status {}: {}", status.as_u16(), &text[..cut]));
        }
        let mut scanner = SseScanner::new();
        let (mut first, mut answer) = (None, None);
        let mut stream = resp.bytes_stream();
        let mut seen = |up: pronto_core::sse::ScanUpdate| {
            if up.first_token {
                first = Some(sent.elapsed());
            }
            if up.first_answer {
                answer = Some(sent.elapsed());
            }
        };
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("body: {}", error_chain(&e)))?;
            seen(scanner.feed(&chunk));
        }
        seen(scanner.finish());
        let e2e = sent.elapsed();
        rec.e2e_ms = Some(ms(e2e));
        rec.output_events = scanner.output_events();
        rec.reasoning_events = scanner.reasoning_events();
        if let Some(u) = scanner.usage() {
            rec.completion_tokens = Some(u.completion_tokens);
            rec.prompt_tokens = Some(u.prompt_tokens);
            rec.cached_tokens = u.cached_tokens;
        }
        if let Some(e) = scanner.error() {
            return Err(format!("stream error: {e}"));
        }
        if !scanner.done() {
            return Err("stream ended without [DONE]".into());
        }
        let Some(ttft) = first else {
            if rec.max_tokens == 0 {
                return Ok(());
            }
            return Err("stream carried no output".into());
        };
        rec.ttft_ms = Some(ms(ttft));
        rec.ttfa_ms = answer.map(ms);
        let tokens = rec.output_tokens();
        if tokens > 1 {
            rec.tpot_ms = Some(ms(e2e - ttft) / f64::from(tokens - 1));
        }
        Ok(())
    }
}
