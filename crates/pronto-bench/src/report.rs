//! What a replay measured: one [`RequestRecord`] per request, the [`Summary`] over them, and
//! the files a run writes (`results.jsonl`, `summary.json`, `summary.md`, the SVG plots).
//!
//! ## Definitions
//! - **TTFT**: from the moment the request is handed to the HTTP client to the first SSE event
//!   that carries output (see [`pronto_core::sse`]); the role-only first chunk does not count.
//! - **TTFA** (time to first answer): the same clock to the first event carrying an *answer*
//!   — content or a tool call — after any reasoning (`reasoning_content` / `reasoning`); equal
//!   to TTFT for a model that does not reason (AIPerf's `time_to_first_output_token`).
//! - **TPOT**: `(e2e − ttft) / (tokens − 1)`, defined only for successful requests with at least
//!   two output tokens; `tokens` is the server's `usage.completion_tokens` when it reports it,
//!   else the number of output events.
//! - **Send lag**: how late the request left compared with its scheduled time (timer slack, a
//!   busy client, or `--concurrency-cap`).
//! - **Percentiles** are nearest-rank: the `p`-th percentile of `n` sorted values is the value at
//!   rank `⌈p/100 · n⌉` (1-based), so it is always an observed value; `p50` of `[1, 2, 3, 4]` is 2.
//! - **Throughput**: successful requests per second, from the first send to the last completion.
//! - **Goodput** (with `--ttft-slo` / `--tpot-slo`): the share of requests that succeeded
//!   within both objectives, and the share of output tokens they carry
//!   ([`pronto_core::slo`]); a failed request counts with the `max_tokens` it asked for.
//!
//! Only successful requests enter the latency statistics; failed ones count in `errors`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::svg;
use pronto_core::slo::{Goodput, SloTargets};

/// The outcome of one replayed request (a line of `results.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RequestRecord {
    /// Position of the request in its trace.
    pub index: u64,
    /// Scheduled send time, seconds after the replay started.
    pub scheduled_s: f64,
    /// Actual send time, seconds after the replay started.
    pub sent_s: f64,
    /// `sent_s − scheduled_s`, in milliseconds.
    pub send_lag_ms: f64,
    /// Prompt tokens the trace asked for.
    pub input_tokens: u32,
    /// `max_tokens` sent.
    pub max_tokens: u32,
    /// HTTP status, when a response head arrived.
    pub status: Option<u16>,
    /// Time to first output token, ms (successful requests).
    pub ttft_ms: Option<f64>,
    /// Time to the first answer token (content or tool call, after any reasoning), ms
    /// (successful requests).
    #[serde(default)]
    pub ttfa_ms: Option<f64>,
    /// Reasoning-only output events received (≈ reasoning tokens).
    #[serde(default)]
    pub reasoning_events: u32,
    /// Time per output token after the first, ms (successful requests with ≥ 2 tokens).
    pub tpot_ms: Option<f64>,
    /// Send to end of the response body, ms (whenever the body ended).
    pub e2e_ms: Option<f64>,
    /// Output events received (≈ tokens).
    pub output_events: u32,
    /// `usage.completion_tokens`, when the server reported usage.
    pub completion_tokens: Option<u32>,
    /// `usage.prompt_tokens` (the prompt as the server counted it, template included).
    pub prompt_tokens: Option<u32>,
    /// `usage.prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u32>,
    /// `x-pronto-backend` response header.
    pub backend: Option<String>,
    /// `x-pronto-predicted-ttft-ms` response header.
    pub predicted_ttft_ms: Option<f64>,
    /// Why the request failed; `None` for a success.
    pub error: Option<String>,
}

impl RequestRecord {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Output tokens: the server's count when reported, else the output events seen.
    pub fn output_tokens(&self) -> u32 {
        self.completion_tokens.unwrap_or(self.output_events)
    }
}

/// Aggregates of a run (`summary.json`). Latency fields are `null` when no request succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests replayed.
    pub requests: usize,
    /// Failed requests.
    pub errors: usize,
    /// Mean TTFT, ms.
    pub ttft_mean_ms: Option<f64>,
    /// Median TTFT, ms.
    pub ttft_p50_ms: Option<f64>,
    /// 90th-percentile TTFT, ms.
    pub ttft_p90_ms: Option<f64>,
    /// 99th-percentile TTFT, ms.
    pub ttft_p99_ms: Option<f64>,
    /// Mean TTFA, ms (older summaries lack the TTFA fields: `null`).
    #[serde(default)]
    pub ttfa_mean_ms: Option<f64>,
    /// Median TTFA, ms.
    #[serde(default)]
    pub ttfa_p50_ms: Option<f64>,
    /// 90th-percentile TTFA, ms.
    #[serde(default)]
    pub ttfa_p90_ms: Option<f64>,
    /// 99th-percentile TTFA, ms.
    #[serde(default)]
    pub ttfa_p99_ms: Option<f64>,
    /// Mean reasoning tokens (output events) per successful request.
    #[serde(default)]
    pub reasoning_tokens_mean: Option<f64>,
    /// Median TPOT, ms.
    pub tpot_p50_ms: Option<f64>,
    /// 90th-percentile TPOT, ms.
    pub tpot_p90_ms: Option<f64>,
    /// Median end-to-end latency, ms.
    pub e2e_p50_ms: Option<f64>,
    /// 99th-percentile end-to-end latency, ms.
    pub e2e_p99_ms: Option<f64>,
    /// Successful requests per second.
    pub throughput_rps: f64,
    /// Output tokens per second (successful requests).
    pub output_tokens_per_s: f64,
    /// Seconds from the first send to the last completion.
    pub duration_s: f64,
    /// 99th-percentile send lag, ms (all requests).
    pub send_lag_p99_ms: Option<f64>,
    /// Largest send lag, ms.
    pub send_lag_max_ms: Option<f64>,
    /// Cached prompt tokens / prompt tokens, over successful requests whose usage reports both.
    pub cached_token_ratio: Option<f64>,
    /// Requests per `x-pronto-backend` value (successful and failed).
    pub backends: BTreeMap<String, usize>,
    /// Requests per HTTP status (`"none"` when no response head arrived).
    pub statuses: BTreeMap<String, usize>,
    /// The TTFT objective goodput was counted against, ms.
    #[serde(default)]
    pub ttft_slo_ms: Option<f64>,
    /// The TPOT objective goodput was counted against, ms.
    #[serde(default)]
    pub tpot_slo_ms: Option<f64>,
    /// Share of requests that met both objectives (`None` without objectives).
    #[serde(default)]
    pub goodput_requests: Option<f64>,
    /// Share of output tokens from requests that met both objectives.
    #[serde(default)]
    pub goodput_tokens: Option<f64>,
    /// What the reader of the numbers should know about the run (e.g. the workload ran out
    /// before `--duration`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Nearest-rank `p`-th percentile (0 ≤ p ≤ 100) of ascending `sorted`; `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Goodput of `records` against `slo` (module docs, *Goodput*).
pub fn goodput(records: &[RequestRecord], slo: &SloTargets) -> Goodput {
    let mut g = Goodput::default();
    for r in records {
        let outcome = r
            .ttft_ms
            .filter(|_| r.ok())
            .map(|t| (t / 1e3, r.tpot_ms.map(|t| t / 1e3)));
        let tokens = if r.ok() {
            r.output_tokens()
        } else {
            r.max_tokens
        };
        g.add(slo, tokens, outcome);
    }
    g
}

impl Summary {
    /// [`Summary::of`] with goodput against `slo` (when it sets an objective).
    pub fn with_slo(records: &[RequestRecord], slo: &SloTargets) -> Summary {
        let mut s = Summary::of(records);
        s.set_goodput(records, slo);
        s
    }

    /// Count goodput of `records` against `slo` into this summary (cleared without objectives).
    pub fn set_goodput(&mut self, records: &[RequestRecord], slo: &SloTargets) {
        let g = slo.is_set().then(|| goodput(records, slo));
        self.ttft_slo_ms = slo.ttft_s.map(|s| s * 1e3);
        self.tpot_slo_ms = slo.tpot_s.map(|s| s * 1e3);
        self.goodput_requests = g.map(|g| g.request_share());
        self.goodput_tokens = g.map(|g| g.token_share());
    }

    /// Summarise `records` (any order); no goodput (see [`Summary::with_slo`]).
    pub fn of(records: &[RequestRecord]) -> Summary {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
        let ttft = sorted(ok.iter().filter_map(|r| r.ttft_ms));
        let ttfa = sorted(ok.iter().filter_map(|r| r.ttfa_ms));
        let reasoning: Vec<f64> = ok.iter().map(|r| f64::from(r.reasoning_events)).collect();
        let tpot = sorted(ok.iter().filter_map(|r| r.tpot_ms));
        let e2e = sorted(ok.iter().filter_map(|r| r.e2e_ms));
        let lag = sorted(records.iter().map(|r| r.send_lag_ms));
        let start = records
            .iter()
            .map(|r| r.sent_s)
            .fold(f64::INFINITY, f64::min);
        let end = records
            .iter()
            .map(|r| r.sent_s + r.e2e_ms.unwrap_or(0.0) / 1e3)
            .fold(f64::NEG_INFINITY, f64::max);
        let duration_s = if records.is_empty() {
            0.0
        } else {
            (end - start).max(0.0)
        };
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let out_tokens: u64 = ok.iter().map(|r| u64::from(r.output_tokens())).sum();
        let (mut cached, mut prompt) = (0u64, 0u64);
        for r in &ok {
            if let (Some(c), Some(p)) = (r.cached_tokens, r.prompt_tokens) {
                cached += u64::from(c);
                prompt += u64::from(p);
            }
        }
        let mut backends = BTreeMap::new();
        let mut statuses = BTreeMap::new();
        for r in records {
            if let Some(b) = &r.backend {
                *backends.entry(b.clone()).or_insert(0) += 1;
            }
            let s = r
                .status
                .map_or_else(|| "none".to_string(), |s| s.to_string());
            *statuses.entry(s).or_insert(0) += 1;
        }
        Summary {
            requests: records.len(),
            errors: records.len() - ok.len(),
            ttft_mean_ms: mean(&ttft),
            ttft_p50_ms: percentile(&ttft, 50.0),
            ttft_p90_ms: percentile(&ttft, 90.0),
            ttft_p99_ms: percentile(&ttft, 99.0),
            ttfa_mean_ms: mean(&ttfa),
            ttfa_p50_ms: percentile(&ttfa, 50.0),
            ttfa_p90_ms: percentile(&ttfa, 90.0),
            ttfa_p99_ms: percentile(&ttfa, 99.0),
            reasoning_tokens_mean: mean(&reasoning),
            tpot_p50_ms: percentile(&tpot, 50.0),
            tpot_p90_ms: percentile(&tpot, 90.0),
            e2e_p50_ms: percentile(&e2e, 50.0),
            e2e_p99_ms: percentile(&e2e, 99.0),
            throughput_rps: per_s(ok.len() as f64),
            output_tokens_per_s: per_s(out_tokens as f64),
            duration_s,
            send_lag_p99_ms: percentile(&lag, 99.0),
            send_lag_max_ms: lag.last().copied(),
            cached_token_ratio: (prompt > 0).then(|| cached as f64 / prompt as f64),
            backends,
            statuses,
            ttft_slo_ms: None,
            tpot_slo_ms: None,
            goodput_requests: None,
            goodput_tokens: None,
            notes: Vec::new(),
        }
    }

    /// One line for logs: requests, errors, TTFT p50/p99, throughput.
    pub fn one_line(&self) -> String {
        format!(
            "{} requests, {} errors, TTFT p50 {} ms p99 {} ms, TTFA p99 {} ms, {:.2} req/s over {:.1} s",
            self.requests,
            self.errors,
            fmt_ms(self.ttft_p50_ms),
            fmt_ms(self.ttft_p99_ms),
            fmt_ms(self.ttfa_p99_ms),
            self.throughput_rps,
            self.duration_s
        ) + &self
            .notes
            .iter()
            .map(|n| format!("\nnote: {n}"))
            .collect::<String>()
    }

    /// A small markdown report: the headline table and the per-backend split.
    pub fn markdown(&self, title: &str) -> String {
        let mut s = format!("# {title}\n\n| metric | value |\n| --- | ---: |\n");
        let rows = [
            ("requests", self.requests.to_string()),
            ("errors", self.errors.to_string()),
            ("TTFT mean (ms)", fmt_ms(self.ttft_mean_ms)),
            ("TTFT p50 (ms)", fmt_ms(self.ttft_p50_ms)),
            ("TTFT p90 (ms)", fmt_ms(self.ttft_p90_ms)),
            ("TTFT p99 (ms)", fmt_ms(self.ttft_p99_ms)),
            ("TTFA mean (ms)", fmt_ms(self.ttfa_mean_ms)),
            ("TTFA p50 (ms)", fmt_ms(self.ttfa_p50_ms)),
            ("TTFA p99 (ms)", fmt_ms(self.ttfa_p99_ms)),
            (
                "reasoning tokens (mean)",
                self.reasoning_tokens_mean
                    .map_or_else(|| "-".into(), |r| format!("{r:.0}")),
            ),
            ("TPOT p50 (ms)", fmt_ms(self.tpot_p50_ms)),
            ("E2E p50 (ms)", fmt_ms(self.e2e_p50_ms)),
            ("E2E p99 (ms)", fmt_ms(self.e2e_p99_ms)),
            ("throughput (req/s)", format!("{:.2}", self.throughput_rps)),
            (
                "output tokens/s",
                format!("{:.0}", self.output_tokens_per_s),
            ),
            ("duration (s)", format!("{:.1}", self.duration_s)),
            ("send lag p99 (ms)", fmt_ms(self.send_lag_p99_ms)),
            (
                "cached prompt tokens",
                self.cached_token_ratio
                    .map_or_else(|| "-".into(), |r| format!("{:.1} %", r * 100.0)),
            ),
        ];
        for (k, v) in rows {
            s.push_str(&format!("| {k} | {v} |\n"));
        }
        let pct = |x: Option<f64>| x.map_or_else(|| "-".into(), |r| format!("{:.1} %", r * 100.0));
        if self.goodput_requests.is_some() {
            let slo = format!(
                "TTFT ≤ {} ms, TPOT ≤ {} ms",
                fmt_ms(self.ttft_slo_ms),
                fmt_ms(self.tpot_slo_ms)
            );
            s.push_str(&format!(
                "| goodput, requests ({slo}) | {} |\n| goodput, output tokens | {} |\n",
                pct(self.goodput_requests),
                pct(self.goodput_tokens)
            ));
        }
        if !self.backends.is_empty() {
            s.push_str("\n| backend | requests |\n| --- | ---: |\n");
            for (b, n) in &self.backends {
                s.push_str(&format!("| {b} | {n} |\n"));
            }
        }
        for n in &self.notes {
            s.push_str(&format!("\n**Note:** {n}\n"));
        }
        s
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.1}"))
}

/// Write `results.jsonl`, `summary.json`, `summary.md`, `ttft_cdf.svg` and
/// `ttft_over_time.svg` into `dir` (created if missing); returns the summary.
pub fn write_report(
    dir: &Path,
    records: &[RequestRecord],
    title: &str,
) -> std::io::Result<Summary> {
    write_report_with_slo(dir, records, title, &SloTargets::default())
}

/// [`write_report`] with goodput against `slo` in the summary ([`Summary::with_slo`]).
pub fn write_report_with_slo(
    dir: &Path,
    records: &[RequestRecord],
    title: &str,
    slo: &SloTargets,
) -> std::io::Result<Summary> {
    write_report_with_notes(dir, records, title, slo, Vec::new())
}

/// [`write_report_with_slo`] with `notes` in the summary (JSON, Markdown and its one line).
pub fn write_report_with_notes(
    dir: &Path,
    records: &[RequestRecord],
    title: &str,
    slo: &SloTargets,
    notes: Vec<String>,
) -> std::io::Result<Summary> {
    std::fs::create_dir_all(dir)?;
    let mut lines = std::io::BufWriter::new(std::fs::File::create(dir.join("results.jsonl"))?);
    for r in records {
        serde_json::to_writer(&mut lines, r)?;
        lines.write_all(b"\n")?;
    }
    lines.flush()?;
    let mut summary = Summary::with_slo(records, slo);
    summary.notes = notes;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    std::fs::write(dir.join("summary.md"), summary.markdown(title))?;
    let ttft: Vec<f64> = records.iter().filter_map(|r| r.ttft_ms).collect();
    let ttfa: Vec<f64> = records
        .iter()
        .filter(|r| r.reasoning_events > 0)
        .filter_map(|r| r.ttfa_ms)
        .collect();
    // A reasoning workload's TTFA differs from its TTFT: both curves, else TTFT alone.
    let (series, name): (Vec<(&str, &[f64])>, &str) = if ttfa.is_empty() {
        (vec![("TTFT", &ttft)], "TTFT")
    } else {
        (vec![("TTFT", &ttft), ("TTFA", &ttfa)], "TTFT and TTFA")
    };
    std::fs::write(
        dir.join("ttft_cdf.svg"),
        svg::cdf_svg(&series, &format!("{title}: {name} CDF")),
    )?;
    let points: Vec<svg::TimePoint> = records
        .iter()
        .map(|r| svg::TimePoint {
            t_s: r.sent_s,
            ttft_ms: r.ttft_ms,
            error: !r.ok(),
        })
        .collect();
    std::fs::write(
        dir.join("ttft_over_time.svg"),
        svg::over_time_svg(&points, &format!("{title}: TTFT by send time")),
    )?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(index: u64, sent_s: f64, ttft: f64, e2e: f64, tokens: u32) -> RequestRecord {
        RequestRecord {
            index,
            sent_s,
            status: Some(200),
            ttft_ms: Some(ttft),
            ttfa_ms: Some(ttft),
            e2e_ms: Some(e2e),
            tpot_ms: (tokens > 1).then(|| (e2e - ttft) / f64::from(tokens - 1)),
            output_events: tokens,
            backend: Some(format!("b{}", index % 2)),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 0.0), Some(7.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.0));
        assert_eq!(percentile(&v, 75.0), Some(3.0));
        assert_eq!(percentile(&v, 76.0), Some(4.0));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 90.0), Some(90.0));
        assert_eq!(percentile(&hundred, 99.0), Some(99.0));
        assert_eq!(percentile(&hundred, 99.5), Some(100.0));
    }

    #[test]
    fn summary_counts_errors_and_averages_successes_only() {
        let mut recs = vec![
            ok(0, 0.0, 10.0, 110.0, 11),
            ok(1, 1.0, 30.0, 230.0, 21),
            ok(2, 2.0, 20.0, 20.0, 1),
        ];
        (recs[0].prompt_tokens, recs[0].cached_tokens) = (Some(100), Some(40));
        (recs[1].prompt_tokens, recs[1].cached_tokens) = (Some(100), Some(0));
        recs.push(RequestRecord {
            index: 3,
            sent_s: 2.5,
            status: Some(503),
            ttft_ms: None,
            e2e_ms: Some(1.0),
            error: Some("status 503".into()),
            backend: Some("b1".into()),
            ..RequestRecord::default()
        });
        recs.push(RequestRecord {
            index: 4,
            sent_s: 2.6,
            send_lag_ms: 9.0,
            error: Some("connection refused".into()),
            ..RequestRecord::default()
        });
        let s = Summary::of(&recs);
        assert_eq!((s.requests, s.errors), (5, 2));
        assert_eq!(s.ttft_mean_ms, Some(20.0));
        assert_eq!(s.ttft_p50_ms, Some(20.0));
        assert_eq!(s.ttft_p99_ms, Some(30.0));
        // Without reasoning TTFA is TTFT.
        assert_eq!((s.ttfa_mean_ms, s.ttfa_p99_ms), (Some(20.0), Some(30.0)));
        assert_eq!(s.reasoning_tokens_mean, Some(0.0));
        // TPOT: 10 ms (request 0) and 10 ms (request 1); request 2 has one token.
        assert_eq!(s.tpot_p50_ms, Some(10.0));
        // From the first send (0 s) to the last end (the refused request at 2.6 s).
        assert!((s.duration_s - 2.6).abs() < 1e-9, "{}", s.duration_s);
        assert!((s.throughput_rps - 3.0 / 2.6).abs() < 1e-9);
        assert!((s.output_tokens_per_s - 33.0 / 2.6).abs() < 1e-9);
        assert_eq!(s.send_lag_max_ms, Some(9.0));
        assert_eq!(s.cached_token_ratio, Some(0.2));
        assert_eq!(s.backends["b0"], 2);
        assert_eq!(s.backends["b1"], 2);
        assert_eq!(
            (s.statuses["200"], s.statuses["503"], s.statuses["none"]),
            (3, 1, 1)
        );
        let md = s.markdown("t");
        assert!(
            md.contains("| errors | 2 |") && md.contains("| b0 | 2 |"),
            "{md}"
        );

        let empty = Summary::of(&[]);
        assert_eq!((empty.requests, empty.ttft_p50_ms), (0, None));
        assert_eq!((empty.duration_s, empty.throughput_rps), (0.0, 0.0));
    }

    #[test]
    fn goodput_counts_requests_within_both_objectives_and_failures_with_their_max_tokens() {
        // TTFT 12 ms, TPOT (50 − 12) / 3 ≈ 12.7 ms; TTFT 15 ms, TPOT (200 − 15) / 7 ≈ 26 ms;
        // TTFT 300 ms (late); a failure that asked for 10 tokens.
        let mut failed = ok(3, 1.5, 0.0, 0.0, 0);
        failed.ttft_ms = None;
        failed.error = Some("status 503".into());
        failed.max_tokens = 10;
        let recs = [
            ok(0, 0.0, 12.0, 50.0, 4),
            ok(1, 0.5, 15.0, 200.0, 8),
            ok(2, 1.0, 300.0, 400.0, 8),
            failed,
        ];
        let slo = SloTargets {
            ttft_s: Some(0.1),
            tpot_s: Some(0.02),
        };
        let g = goodput(&recs, &slo);
        assert_eq!((g.requests, g.met_requests), (4, 1));
        assert_eq!((g.tokens, g.met_tokens), (4 + 8 + 8 + 10, 4));
        let s = Summary::with_slo(&recs, &slo);
        assert_eq!(s.goodput_requests, Some(0.25));
        assert_eq!((s.ttft_slo_ms, s.tpot_slo_ms), (Some(100.0), Some(20.0)));
        assert!(s.markdown("t").contains("| goodput, requests"));
        // Without objectives there is no goodput, and the markdown says nothing of it.
        let none = Summary::with_slo(&recs, &SloTargets::default());
        assert_eq!(none.goodput_requests, None);
        assert!(!none.markdown("t").contains("goodput"));
        // An old summary.json without the fields still reads.
        let mut v = serde_json::to_value(&none).unwrap();
        v.as_object_mut().unwrap().remove("goodput_requests");
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back, none);
    }

    #[test]
    fn report_files_have_the_required_keys() {
        let dir = std::env::temp_dir().join(format!("pronto-report-{}", std::process::id()));
        let recs = [ok(0, 0.0, 12.0, 50.0, 4), ok(1, 0.5, 15.0, 70.0, 8)];
        let s = write_report(&dir, &recs, "unit").unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        for key in [
            "ttft_mean_ms",
            "ttft_p50_ms",
            "ttft_p90_ms",
            "ttft_p99_ms",
            "tpot_p50_ms",
            "ttfa_mean_ms",
            "ttfa_p99_ms",
            "reasoning_tokens_mean",
            "throughput_rps",
            "errors",
            "requests",
        ] {
            assert!(json.get(key).is_some(), "summary.json lacks {key}");
        }
        assert_eq!(json["requests"], 2);
        let lines = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
        let back: Vec<RequestRecord> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, recs);
        assert_eq!(s.requests, 2);
        for f in ["summary.md", "ttft_cdf.svg", "ttft_over_time.svg"] {
            assert!(dir.join(f).exists(), "{f}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_reasoning_run_reports_ttfa_apart_from_ttft_and_old_files_still_load() {
        let mut recs = vec![ok(0, 0.0, 10.0, 500.0, 50), ok(1, 0.1, 12.0, 600.0, 60)];
        (recs[0].ttfa_ms, recs[0].reasoning_events) = (Some(210.0), 40);
        (recs[1].ttfa_ms, recs[1].reasoning_events) = (Some(312.0), 60);
        let s = Summary::of(&recs);
        assert_eq!(s.ttfa_mean_ms, Some(261.0));
        assert_eq!(s.ttfa_p99_ms, Some(312.0));
        assert_eq!(s.reasoning_tokens_mean, Some(50.0));
        assert!(s.markdown("r").contains("| TTFA p99 (ms) | 312.0 |"));
        // A record and a summary written before TTFA existed still parse.
        let mut old = serde_json::to_value(&recs[0]).unwrap();
        old.as_object_mut().unwrap().remove("ttfa_ms");
        old.as_object_mut().unwrap().remove("reasoning_events");
        let back: RequestRecord = serde_json::from_value(old).unwrap();
        assert_eq!((back.ttfa_ms, back.reasoning_events), (None, 0));
        let mut old = serde_json::to_value(&s).unwrap();
        for k in [
            "ttfa_mean_ms",
            "ttfa_p50_ms",
            "ttfa_p90_ms",
            "ttfa_p99_ms",
            "reasoning_tokens_mean",
        ] {
            old.as_object_mut().unwrap().remove(k);
        }
        let back: Summary = serde_json::from_value(old).unwrap();
        assert_eq!(back.ttfa_p99_ms, None);
    }
}
