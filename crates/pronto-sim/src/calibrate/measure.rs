//! Measuring the shapes against a live OpenAI-compatible engine (the async shell).
//!
//! Prompts are sized with the engine's own `POST /tokenize` (text length / 4 when it has
//! none) and start with a unique nonce: seeded, mixed with a per-measurement salt (the CLI
//! draws it from the wall clock), so a second calibration against the same engine with the
//! same seed sends the same words and lengths but still finds nothing in the prefix cache — an
//! engine keeps the first run's prompts (vLLM's 1 GiB CPU cache holds all 1.5 M prompt tokens
//! of the default plan), and the second run's "cold" shapes would be hits. Each request is a streaming `/v1/completions`
//! with `ignore_eos`; TTFT is from sending it to the first chunk with a choice, the ITL of a
//! request `(last chunk − first) / (completion_tokens − 1)`. A concurrent batch is released
//! by a barrier. Before anything is timed, each warm-up length is sent twice (the first
//! requests after a start compile kernels and fill allocators).
//!
//! Load is bounded by the plan: exactly [`Plan::requests`] generation requests at most, one
//! batch at a time, plus the `/tokenize` calls that size the prompts. Time is bounded by a
//! deadline: no batch starts after it, and what was measured by then is kept (every shape
//! must have been measured at least once).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::host::now_utc;
use super::shapes::{Kind, Measurements, Plan, Shape, ShapeResult};

/// Words the prompts are made of: a BPE tokenizer (trained on code or prose) splits them in
/// varied ways.
const WORDS: &[&str] = &[
    "def", "class", "return", "import", "from", "self", "None", "True", "False", "if", "elif",
    "else", "for", "while", "in", "not", "and", "or", "with", "as", "try", "except", "finally",
    "raise", "yield", "lambda", "pass", "break", "continue", "global", "assert", "del", "value",
    "result", "index", "buffer", "stream", "token", "prefix", "cache", "block", "request",
    "server", "engine", "batch", "queue", "thread", "lock", "event", "handler", "config", "parser",
    "module", "object", "string", "number", "list", "dict", "tuple", "set", "length", "offset",
    "count", "total", "first", "last", "next", "prev", "node", "tree", "path", "file", "line",
    "data", "error", "state", "start", "stop", "open", "close", "read", "write", "send", "recv",
    "name", "type", "args", "kwargs",
];

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// An HTTP request failed.
    #[error("{what}: {source}")]
    Http {
        /// The request.
        what: String,
        /// Cause.
        source: reqwest::Error,
    },
    /// The engine answered something unexpected.
    #[error("{0}")]
    Engine(String),
    /// The deadline passed before every shape was measured once.
    #[error(
        "--max-duration passed after {done} of {total} shapes' first repetition; \
         allow more time or measure fewer shapes"
    )]
    OutOfTime {
        /// Shapes measured.
        done: usize,
        /// Shapes in the plan.
        total: usize,
    },
}

fn http(what: impl Into<String>) -> impl FnOnce(reqwest::Error) -> MeasureError {
    let what = what.into();
    move |source| MeasureError::Http { what, source }
}

/// One timed request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds to the first token.
    pub ttft_s: f64,
    /// Mean seconds between tokens, when more than one came.
    pub itl_s: Option<f64>,
    /// `usage.prompt_tokens`, when reported.
    pub prompt_tokens: Option<usize>,
    /// `usage.prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u32>,
}

/// An OpenAI-compatible engine server.
#[derive(Debug, Clone)]
pub struct Server {
    http: reqwest::Client,
    base: String,
    model: String,
}

impl Server {
    /// An engine at `base_url` (with or without a trailing `/v1`) serving `model`.
    pub fn new(base_url: &str, model: &str, timeout: Duration) -> Result<Server, MeasureError> {
        let mut base = base_url.trim_end_matches('/').to_string();
        if let Some(b) = base.strip_suffix("/v1") {
            base = b.to_string();
        }
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .timeout(timeout)
            .pool_max_idle_per_host(64)
            .build()
            .map_err(http("building the HTTP client"))?;
        Ok(Server {
            http,
            base,
            model: model.to_string(),
        })
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Token count of a completions prompt; `None` when the engine has no `/tokenize`.
    pub async fn tokenize(&self, text: &str) -> Result<Option<usize>, MeasureError> {
        let r = self
            .http
            .post(format!("{}/tokenize", self.base))
            .json(&json!({"model": self.model, "prompt": text}))
            .send()
            .await
            .map_err(http("POST /tokenize"))?;
        if !r.status().is_success() {
            return Ok(None);
        }
        let v: Value = r.json().await.map_err(http("POST /tokenize"))?;
        Ok(v["count"].as_u64().map(|n| n as usize))
    }

    async fn get_json(&self, path: &str) -> Option<Value> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.json().await.ok()
    }

    /// The engine's version: `GET /version` (vLLM, the simulator), else the `version` of
    /// `GET /get_server_info` (SGLang).
    pub async fn version(&self) -> Option<String> {
        for path in ["/version", "/get_server_info"] {
            if let Some(v) = self.get_json(path).await {
                if let Some(s) = v["version"].as_str() {
                    return Some(s.to_string());
                }
            }
        }
        None
    }

    /// `(block_size, num_gpu_blocks)` from `vllm:cache_config_info` on `GET /metrics`.
    pub async fn cache_config(&self) -> Option<(usize, usize)> {
        let r = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .ok()?;
        let text = r.text().await.ok()?;
        parse_cache_config(&text)
    }

    /// Send one streaming completion of `prompt` for `max_tokens` tokens; `barrier` (if
    /// any) is waited on just before the clock starts.
    pub async fn stream(
        &self,
        prompt: &str,
        max_tokens: u32,
        barrier: Option<&tokio::sync::Barrier>,
    ) -> Result<Sample, MeasureError> {
        let body = json!({
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true},
        });
        let req = self
            .http
            .post(format!("{}/v1/completions", self.base))
            .json(&body);
        if let Some(b) = barrier {
            b.wait().await;
        }
        let t0 = Instant::now();
        let resp = req.send().await.map_err(http("POST /v1/completions"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(MeasureError::Engine(format!(
                "POST /v1/completions: HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            )));
        }
        let mut first = None;
        let mut last = 0.0;
        let mut usage = Value::Null;
        let mut buf = Vec::new();
        let mut body = resp.bytes_stream();
        'read: while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(http("reading the stream"))?;
            let now = t0.elapsed().as_secs_f64();
            buf.extend_from_slice(&chunk);
            while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                let Some(payload) = line.trim_ascii().strip_prefix(b"data:") else {
                    continue;
                };
                let payload = payload.trim_ascii();
                if payload == b"[DONE]" {
                    break 'read;
                }
                let v: Value = serde_json::from_slice(payload).map_err(|e| {
                    MeasureError::Engine(format!("a stream chunk is not JSON: {e}"))
                })?;
                if v["choices"].as_array().is_some_and(|c| !c.is_empty()) {
                    first.get_or_insert(now);
                    last = now;
                }
                if !v["usage"].is_null() {
                    usage = v["usage"].clone();
                }
            }
        }
        let ttft_s =
            first.ok_or_else(|| MeasureError::Engine("the stream ended without a token".into()))?;
        let ntok = usage["completion_tokens"]
            .as_u64()
            .unwrap_or(u64::from(max_tokens));
        Ok(Sample {
            ttft_s,
            itl_s: (ntok > 1).then(|| (last - ttft_s) / (ntok - 1) as f64),
            prompt_tokens: usage["prompt_tokens"].as_u64().map(|n| n as usize),
            cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .map(|n| n as u32),
        })
    }
}

/// `(block_size, num_gpu_blocks)` of a Prometheus text with `vllm:cache_config_info`.
pub fn parse_cache_config(text: &str) -> Option<(usize, usize)> {
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = &line[line.find('{')? + 1..line.rfind('}')?];
    let label = |key: &str| -> Option<usize> {
        labels.split(',').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').parse().ok())?
        })
    };
    Some((label("block_size")?, label("num_gpu_blocks")?))
}

/// Builds prompts of a target token count, each with a unique seeded nonce.
struct PromptMaker {
    engine: Server,
    rng: SmallRng,
    /// Mixed into every nonce (see the module docs); the words do not depend on it.
    salt: u64,
    has_tokenize: bool,
    /// Characters per token, refined as prompts are measured.
    cpt: f64,
}

impl PromptMaker {
    async fn new(engine: Server, seed: u64, salt: u64) -> Result<PromptMaker, MeasureError> {
        let has_tokenize = engine.tokenize("hello world").await?.is_some();
        Ok(PromptMaker {
            engine,
            rng: SmallRng::seed_from_u64(seed),
            salt,
            has_tokenize,
            cpt: 3.0,
        })
    }

    async fn count(&self, text: &str) -> Result<usize, MeasureError> {
        if self.has_tokenize {
            if let Some(n) = self.engine.tokenize(text).await? {
                return Ok(n);
            }
        }
        Ok((text.len() / 4).max(1))
    }

    fn text(&mut self, nchars: usize) -> String {
        let mut s = format!(
            "# {:016x}{:016x}\n",
            self.rng.gen::<u64>() ^ self.salt,
            self.rng.gen::<u64>()
        );
        while s.len() < nchars {
            s.push_str(WORDS[self.rng.gen_range(0..WORDS.len())]);
            s.push(if self.rng.gen_bool(0.08) { '\n' } else { ' ' });
        }
        s
    }

    /// A unique prompt within 1 % (or 2 tokens) of `target` tokens, as the engine counts
    /// them: `(text, tokens)`. A bisection on the text's length, started at the current
    /// characters-per-token estimate.
    async fn make(&mut self, target: usize) -> Result<(String, usize), MeasureError> {
        let base = self.text((target as f64 * self.cpt * 1.5) as usize + 64);
        let tol = (target / 100).max(2);
        let (mut lo, mut hi) = (16.min(base.len()), base.len());
        let mut cut = ((target as f64 * self.cpt) as usize).clamp(lo, hi);
        let mut best: Option<(usize, usize)> = None;
        for _ in 0..24 {
            // Cut at a char boundary (the text is ASCII, but stay safe).
            while !base.is_char_boundary(cut) {
                cut -= 1;
            }
            let n = self.count(&base[..cut]).await?;
            if best.is_none_or(|(_, b)| n.abs_diff(target) < b.abs_diff(target)) {
                best = Some((cut, n));
            }
            if n.abs_diff(target) <= tol {
                break;
            }
            if n < target {
                lo = cut + 1;
            } else {
                hi = cut.saturating_sub(1);
            }
            if lo > hi {
                break;
            }
            // Secant guess from this point's density, kept inside the bracket.
            let guess = (cut as f64 * target as f64 / n.max(1) as f64) as usize;
            cut = if (lo..=hi).contains(&guess) {
                guess
            } else {
                (lo + hi) / 2
            };
        }
        let (cut, n) = best.expect("at least one count");
        self.cpt = 0.8 * self.cpt + 0.2 * (cut as f64 / n.max(1) as f64);
        Ok((base[..cut].to_string(), n))
    }
}

/// Progress on stderr: a redrawn bar on a terminal, a line per repetition elsewhere.
struct Progress {
    total: usize,
    done: usize,
    start: Instant,
    max: Duration,
    tty: bool,
}

impl Progress {
    fn tick(&mut self, rep: usize, reps: usize, shape: &Shape) {
        self.done += 1;
        let elapsed = self.start.elapsed().as_secs();
        let line = format!(
            "calibrate: {}/{} batches, repetition {}/{reps}, {}, {}m{:02}s (max {}m{:02}s)",
            self.done,
            self.total,
            rep + 1,
            shape.label(),
            elapsed / 60,
            elapsed % 60,
            self.max.as_secs() / 60,
            self.max.as_secs() % 60
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let width = 24;
            let filled = width * self.done / self.total.max(1);
            let _ = write!(
                err,
                "\r[{}{}] {line}\x1b[K",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            if self.done == self.total {
                let _ = writeln!(err);
            }
        } else if self.done % (self.total / reps.max(1)).max(1) == 0 {
            let _ = writeln!(err, "{line}");
        }
    }
}

/// How to measure.
#[derive(Debug, Clone)]
pub struct MeasureOptions {
    /// The shapes.
    pub plan: Plan,
    /// Quiet time before each timed batch.
    pub pause: Duration,
    /// No batch starts later than this after the start.
    pub max_duration: Duration,
    /// Seed of the prompt nonces and words.
    pub seed: u64,
    /// Mixed into every nonce: a value no earlier measurement of this engine used keeps its
    /// cold prompts cold (see the module docs).
    pub nonce_salt: u64,
    /// Free text stored in the measurement.
    pub label: String,
    /// Draw progress on stderr.
    pub progress: bool,
}

#[derive(Default)]
struct Acc {
    samples: Vec<f64>,
    reps: Vec<f64>,
    toks: Vec<usize>,
    cached: Vec<u32>,
}

async fn run_batch(
    engine: &Server,
    prompts: &[(String, usize)],
    max_tokens: u32,
) -> Result<Vec<Sample>, MeasureError> {
    let barrier = Arc::new(tokio::sync::Barrier::new(prompts.len()));
    let tasks: Vec<_> = prompts
        .iter()
        .map(|(p, _)| {
            let (engine, barrier, p) = (engine.clone(), barrier.clone(), p.clone());
            tokio::spawn(async move { engine.stream(&p, max_tokens, Some(&barrier)).await })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        let r = t
            .await
            .map_err(|e| MeasureError::Engine(format!("a request task failed: {e}")))?;
        out.push(r?);
    }
    Ok(out)
}

/// Measure every shape of the plan against `engine`.
pub async fn measure(engine: &Server, opts: &MeasureOptions) -> Result<Measurements, MeasureError> {
    let start = Instant::now();
    let when = now_utc();
    let plan = &opts.plan;
    let mut maker = PromptMaker::new(engine.clone(), opts.seed, opts.nonce_salt).await?;
    let version = engine.version().await;
    let kv_cache = engine.cache_config().await;
    let mut sent = 0;
    for &n in &plan.warmup {
        let (p, _) = maker.make(n).await?;
        for _ in 0..2 {
            engine.stream(&p, 4, None).await?;
            sent += 1;
        }
    }
    let mut acc: Vec<Acc> = plan.shapes.iter().map(|_| Acc::default()).collect();
    let mut progress = Progress {
        total: plan.reps * plan.shapes.len(),
        done: 0,
        start,
        max: opts.max_duration,
        tty: opts.progress && std::io::stderr().is_terminal(),
    };
    let mut reps_done = 0;
    'reps: for rep in 0..plan.reps {
        for (k, shape) in plan.shapes.iter().enumerate() {
            if start.elapsed() >= opts.max_duration {
                if rep == 0 {
                    return Err(MeasureError::OutOfTime {
                        done: k,
                        total: plan.shapes.len(),
                    });
                }
                if opts.progress {
                    eprintln!(
                        "\ncalibrate: --max-duration reached; keeping {rep} full repetitions \
                         and {k} shapes of the next"
                    );
                }
                break 'reps;
            }
            let mut prompts = Vec::with_capacity(shape.conc);
            for _ in 0..shape.conc {
                prompts.push(maker.make(shape.tokens).await?);
            }
            if shape.kind == Kind::PrefixHit {
                for (p, _) in &prompts {
                    engine.stream(p, shape.max_tokens, None).await?;
                    sent += 1;
                }
            }
            tokio::time::sleep(opts.pause).await;
            let batch = run_batch(engine, &prompts, shape.max_tokens).await?;
            sent += batch.len();
            let a = &mut acc[k];
            let mut vals = Vec::with_capacity(batch.len());
            for (s, (_, tokens)) in batch.iter().zip(&prompts) {
                let v = match shape.kind {
                    Kind::Decode => s.itl_s.ok_or_else(|| {
                        MeasureError::Engine("a decode request returned one token".into())
                    })?,
                    _ => s.ttft_s,
                };
                vals.push(v * 1e3);
                a.toks.push(s.prompt_tokens.unwrap_or(*tokens));
                a.cached.extend(s.cached_tokens);
            }
            a.reps.push(super::shapes::median(&vals));
            a.samples.extend(vals);
            if opts.progress {
                progress.tick(rep, plan.reps, shape);
            }
        }
        reps_done = rep + 1;
    }
    let results = plan
        .shapes
        .iter()
        .zip(&acc)
        .filter(|(_, a)| !a.samples.is_empty())
        .map(|(s, a)| ShapeResult::summarise(s, &a.samples, &a.reps, &a.toks, &a.cached))
        .collect();
    Ok(Measurements {
        base_url: engine.base.clone(),
        model: engine.model.clone(),
        label: opts.label.clone(),
        nonce_salt: opts.nonce_salt,
        when,
        reps: reps_done,
        max_tokens: plan
            .shapes
            .iter()
            .find(|s| s.kind != Kind::Decode)
            .map_or(4, |s| s.max_tokens),
        tokenizer: if maker.has_tokenize {
            "server /tokenize".into()
        } else {
            "length / 4".into()
        },
        engine_version: version,
        kv_cache,
        requests_sent: sent,
        duration_s: start.elapsed().as_secs_f64(),
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maker(seed: u64, salt: u64) -> PromptMaker {
        PromptMaker {
            engine: Server::new("http://127.0.0.1:9", "m", Duration::from_secs(1)).unwrap(),
            rng: SmallRng::seed_from_u64(seed),
            salt,
            has_tokenize: false,
            cpt: 3.0,
        }
    }

    #[test]
    fn a_salt_changes_the_nonce_and_nothing_else() {
        let (mut a, mut b, mut c) = (maker(1, 0), maker(1, 0), maker(1, 0x5eed));
        for n in [200, 4000] {
            let (ta, tb, tc) = (a.text(n), b.text(n), c.text(n));
            assert_eq!(ta, tb, "same seed, same salt: same prompt");
            let (nonce_a, words_a) = ta.split_once('\n').unwrap();
            let (nonce_c, words_c) = tc.split_once('\n').unwrap();
            // The first block differs, so no prefix of it is cached; lengths and words match.
            assert_ne!(nonce_a, nonce_c);
            assert_eq!(nonce_a.len(), nonce_c.len());
            assert_eq!(words_a, words_c);
        }
    }

    #[test]
    fn cache_config_is_read_from_vllm_metrics() {
        let text = "# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n\
                    vllm:cache_config_info{block_size=\"128\",cache_dtype=\"auto\",\
                    num_gpu_blocks=\"16384\",prefix_caching_hash_algo=\"sha256\"} 1.0\n";
        assert_eq!(parse_cache_config(text), Some((128, 16384)));
        assert_eq!(parse_cache_config("vllm:num_requests_running 0\n"), None);
        assert_eq!(
            parse_cache_config("vllm:cache_config_info{block_size=\"x\"} 1\n"),
            None
        );
    }
}
