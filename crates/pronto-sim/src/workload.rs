//! Request traces: Mooncake JSONL, Azure CSV, and a seeded synthetic multi-turn workload.
//!
//! Every reader yields [`TraceRequest`]s sorted by arrival, with times in seconds relative to
//! the first request. Prompts are not stored; [`TraceRequest::prompt_ids`] derives them:
//!
//! - **Mooncake**: each `hash_id` stands for one [`TRACE_BLOCK_TOKENS`]-token block whose ids
//!   are [`pronto_core::tokens::synthetic_block_ids`]`(hash_id, n)`; the last block is partial so the
//!   total is `input_length`. Equal leading hash ids therefore give equal leading tokens, hence
//!   equal engine KV blocks and equal gateway block hashes at any block size dividing 512.
//!   A trace written at a finer grain (the real-fleet bench's 128-token blocks) sets
//!   [`TraceRequest::block_tokens`] (`pronto evaluate --trace-block-tokens`), and its prompts
//!   share prefixes at that grain.
//! - **Azure**: no prefix information, so each request gets ids unique to its index (no sharing).
//!
//! The Mooncake conversation trace is quantised to 3 s; [`spread_ties`] spreads each group of
//! equal timestamps evenly up to the next distinct timestamp so a replay has no bursts that
//! the original traffic did not have.

use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use pronto_core::tokens::{mix64, synthetic_block_ids, synthetic_block_text, TokenId};

/// Tokens per Mooncake `hash_id` block.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// Salt that keeps per-request unique block ids away from trace hash ids.
const UNIQUE_SALT: u64 = 0xa2e5_0000_0000_0000;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRequest {
    /// Arrival, seconds after the first request.
    pub arrival_s: f64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// One id per `block_tokens`-token prompt block (Mooncake); empty when the trace has no
    /// prefixes.
    pub hash_ids: Vec<u64>,
    /// Prompt tokens each hash id stands for: [`TRACE_BLOCK_TOKENS`] (Mooncake's grain), or a
    /// trace's own grain (`pronto evaluate --trace-block-tokens`).
    pub block_tokens: u32,
    /// Conversation id, when the trace has one.
    pub session: Option<u64>,
}

impl TraceRequest {
    /// Append this request's prompt token ids to `out`; `index` (the request's position in
    /// its trace) seeds ids that no other request shares.
    pub fn prompt_ids(&self, index: u64, out: &mut Vec<TokenId>) {
        let total = self.input_tokens as usize;
        let start = out.len();
        for &h in &self.hash_ids {
            let done = out.len() - start;
            if done >= total {
                break;
            }
            synthetic_block_ids(h, (total - done).min(self.block_tokens as usize), out);
        }
        let done = out.len() - start;
        if done < total {
            synthetic_block_ids(mix64(UNIQUE_SALT ^ index), total - done, out);
        }
    }

    /// Append this request's prompt text to `out`: the text whose tokenization by
    /// [`pronto_core::tokens::token_ids`] is exactly [`TraceRequest::prompt_ids`]`(index)` (same
    /// blocks, same salts, [`synthetic_block_text`] in place of [`synthetic_block_ids`]).
    /// Every token is four bytes, so the text is `4 × input_tokens` bytes long.
    pub fn prompt_text(&self, index: u64, out: &mut String) {
        let total = self.input_tokens as usize;
        let mut done = 0;
        for &h in &self.hash_ids {
            if done >= total {
                break;
            }
            let n = (total - done).min(self.block_tokens as usize);
            synthetic_block_text(h, n, out);
            done += n;
        }
        if done < total {
            synthetic_block_text(mix64(UNIQUE_SALT ^ index), total - done, out);
        }
    }
}

/// Trace file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TraceFormat {
    /// Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).
    #[default]
    Mooncake,
    /// Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`).
    Azure,
}

/// A trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A row is malformed.
    #[error("{path}:{line}: {reason}")]
    Row {
        /// File path.
        path: String,
        /// 1-based line number.
        line: usize,
        /// Why.
        reason: String,
    },
}

/// Read a trace of the given format.
pub fn read(path: &Path, format: TraceFormat) -> Result<Vec<TraceRequest>, TraceError> {
    match format {
        TraceFormat::Mooncake => read_mooncake(path),
        TraceFormat::Azure => read_azure(path),
    }
}

fn read_text(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[derive(serde::Deserialize)]
struct MooncakeRow {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Read a Mooncake JSONL trace (times in ms → seconds, relative to the first row).
pub fn read_mooncake(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    parse_mooncake(&read_text(path)?, &path.display().to_string())
}

/// Parse Mooncake JSONL text; `origin` names it in errors.
pub fn parse_mooncake(text: &str, origin: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: MooncakeRow = serde_json::from_str(line).map_err(|e| TraceError::Row {
            path: origin.to_string(),
            line: i + 1,
            reason: e.to_string(),
        })?;
        out.push(TraceRequest {
            arrival_s: row.timestamp / 1e3,
            input_tokens: row.input_length,
            output_tokens: row.output_length,
            hash_ids: row.hash_ids,
            block_tokens: TRACE_BLOCK_TOKENS as u32,
            session: None,
        });
    }
    Ok(normalise(out))
}

/// Read an Azure LLM inference CSV (relative time from the first row, 100 ns precision).
pub fn read_azure(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    parse_azure(&read_text(path)?, &path.display().to_string())
}

/// Parse Azure CSV text; `origin` names it in errors.
pub fn parse_azure(text: &str, origin: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (i == 0 && line.starts_with("TIMESTAMP")) {
            continue;
        }
        let err = |reason: String| TraceError::Row {
            path: origin.to_string(),
            line: i + 1,
            reason,
        };
        let mut f = line.split(',');
        let (Some(ts), Some(ctx), Some(gen), None) = (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(err("expected 3 columns".into()));
        };
        let ticks =
            parse_timestamp_ticks(ts).ok_or_else(|| err(format!("bad timestamp {ts:?}")))?;
        let ctx: u32 = ctx
            .trim()
            .parse()
            .map_err(|_| err(format!("bad ContextTokens {ctx:?}")))?;
        let gen: u32 = gen
            .trim()
            .parse()
            .map_err(|_| err(format!("bad GeneratedTokens {gen:?}")))?;
        rows.push((ticks, ctx, gen));
    }
    let t0 = rows.iter().map(|r| r.0).min().unwrap_or(0);
    let out = rows
        .into_iter()
        .map(|(t, ctx, gen)| TraceRequest {
            arrival_s: (t - t0) as f64 * 1e-7,
            input_tokens: ctx,
            output_tokens: gen,
            hash_ids: Vec::new(),
            block_tokens: TRACE_BLOCK_TOKENS as u32,
            session: None,
        })
        .collect();
    Ok(normalise(out))
}

/// `YYYY-MM-DD HH:MM:SS[.fffffff]` → 100 ns ticks since 1970-01-01.
fn parse_timestamp_ticks(s: &str) -> Option<i64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if frac.len() > 7 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_ticks = if frac.is_empty() {
        0
    } else {
        frac.parse::<i64>().ok()? * 10i64.pow(7 - frac.len() as u32)
    };
    let days = days_from_civil(y, m, day);
    Some(((days * 86_400 + hh * 3_600 + mm * 60 + ss) * 10_000_000) + frac_ticks)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Sort by arrival (stable) and shift times so the first request arrives at 0.
pub(crate) fn normalise(mut v: Vec<TraceRequest>) -> Vec<TraceRequest> {
    v.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    let t0 = v.first().map_or(0.0, |r| r.arrival_s);
    for r in &mut v {
        r.arrival_s -= t0;
    }
    v
}

/// Spread each run of equal arrival times evenly over the gap to the next distinct time (the
/// last run over the previous gap), keeping order. Traces without ties are unchanged.
pub fn spread_ties(reqs: &mut [TraceRequest]) {
    let mut i = 0;
    let mut last_gap = 0.0;
    while i < reqs.len() {
        let t = reqs[i].arrival_s;
        let mut j = i + 1;
        while j < reqs.len() && reqs[j].arrival_s == t {
            j += 1;
        }
        let gap = if j < reqs.len() {
            reqs[j].arrival_s - t
        } else {
            last_gap
        };
        let k = (j - i) as f64;
        for (n, r) in reqs[i..j].iter_mut().enumerate() {
            r.arrival_s = t + gap * n as f64 / k;
        }
        last_gap = gap;
        i = j;
    }
}

/// Scale arrival times by `factor` (< 1 compresses: a higher offered rate).
pub fn scale_arrivals(reqs: &mut [TraceRequest], factor: f64) {
    for r in reqs {
        r.arrival_s *= factor;
    }
}

/// A seeded multi-turn chat workload that needs no files.
///
/// Conversations start as a Poisson process; each picks one of `system_prompts` shared system
/// prompts and runs 1..=`max_turns` turns separated by exponential think times. Turn `k`'s
/// prompt is the system prompt, the whole history and a new user message, so consecutive
/// turns of a conversation share a growing prefix — the Mooncake synthetic trace's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticWorkload {
    /// RNG seed.
    pub seed: u64,
    /// Conversations to generate.
    pub conversations: usize,
    /// Conversation starts per second.
    pub rate_per_s: f64,
    /// Distinct shared system prompts.
    pub system_prompts: usize,
    /// 512-token blocks per system prompt.
    pub system_blocks: usize,
    /// Most turns per conversation.
    pub max_turns: usize,
    /// Mean seconds between a conversation's turns.
    pub think_time_s: f64,
    /// Output tokens per turn are uniform in this range.
    pub output_tokens: (u32, u32),
}

impl Default for SyntheticWorkload {
    fn default() -> Self {
        SyntheticWorkload {
            seed: 1,
            conversations: 200,
            rate_per_s: 2.0,
            system_prompts: 4,
            system_blocks: 3,
            max_turns: 5,
            think_time_s: 8.0,
            output_tokens: (32, 256),
        }
    }
}

impl SyntheticWorkload {
    /// Generate the requests, sorted by arrival.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let exp = |rng: &mut SmallRng, mean: f64| -mean * (1.0 - rng.gen::<f64>()).ln();
        let mut out = Vec::new();
        let mut start = 0.0;
        let mut next_block = 1_000_000u64 + (self.seed % 1000) * 1_000_000_000;
        for c in 0..self.conversations {
            start += exp(&mut rng, 1.0 / self.rate_per_s.max(1e-9));
            let sys = rng.gen_range(0..self.system_prompts.max(1)) as u64;
            let mut ids: Vec<u64> = (0..self.system_blocks as u64)
                .map(|k| sys * 1000 + k)
                .collect();
            let turns = rng.gen_range(1..=self.max_turns.max(1));
            let mut t = start;
            for _ in 0..turns {
                // The previous turn's answer and this user message: 1..=2 new blocks.
                for _ in 0..rng.gen_range(1..=2) {
                    ids.push(next_block);
                    next_block += 1;
                }
                let partial = rng.gen_range(64..=TRACE_BLOCK_TOKENS) as u32;
                let input = (ids.len() as u32 - 1) * TRACE_BLOCK_TOKENS as u32 + partial;
                let (lo, hi) = self.output_tokens;
                out.push(TraceRequest {
                    arrival_s: t,
                    input_tokens: input,
                    output_tokens: rng.gen_range(lo.min(hi)..=hi.max(lo)),
                    hash_ids: ids.clone(),
                    block_tokens: TRACE_BLOCK_TOKENS as u32,
                    session: Some(c as u64),
                });
                t += exp(&mut rng, self.think_time_s);
            }
        }
        normalise(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_rows_parse_and_prompts_share_prefixes() {
        let text = "{\"timestamp\": 3000, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [0, 2]}\n\
                    {\"timestamp\": 0, \"input_length\": 600, \"output_length\": 9, \"hash_ids\": [0, 1]}\n";
        let t = parse_mooncake(text, "t").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].arrival_s, t[1].arrival_s), (0.0, 3.0));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t[0].prompt_ids(0, &mut a);
        t[1].prompt_ids(1, &mut b);
        assert_eq!((a.len(), b.len()), (600, 700));
        assert_eq!(a[..512], b[..512]);
        assert_ne!(a[512..600], b[512..600]);
        let err = parse_mooncake("{\"timestamp\": 1}\n", "f").unwrap_err();
        assert!(err.to_string().starts_with("f:1:"), "{err}");
    }

    #[test]
    fn prompt_text_tokenizes_to_prompt_ids() {
        let reqs = [
            // Mooncake-like: full blocks, a partial last block.
            (vec![0, 1, 2], 1100),
            // More tokens than the hash ids cover: the rest is unique to the index.
            (vec![5], 700),
            // Fewer tokens than the hash ids cover.
            (vec![7, 8, 9], 300),
            // No prefix information (Azure), and an empty prompt.
            (vec![], 90),
            (vec![], 0),
        ];
        for (i, (hash_ids, input)) in reqs.into_iter().enumerate() {
            let r = TraceRequest {
                arrival_s: 0.0,
                input_tokens: input,
                output_tokens: 1,
                hash_ids,
                block_tokens: TRACE_BLOCK_TOKENS as u32,
                session: None,
            };
            let (mut text, mut ids) = (String::new(), Vec::new());
            r.prompt_text(i as u64, &mut text);
            r.prompt_ids(i as u64, &mut ids);
            assert_eq!(ids.len(), input as usize);
            assert_eq!(text.len(), 4 * input as usize);
            assert_eq!(
                pronto_core::tokens::token_ids(text.as_bytes()),
                ids,
                "request {i}"
            );
        }
        // The synthetic workload's turns share their conversation's leading text.
        let w = SyntheticWorkload::default().generate();
        let s0: Vec<&TraceRequest> = w.iter().filter(|r| r.session == w[0].session).collect();
        if let [a, b, ..] = s0[..] {
            let (mut ta, mut tb) = (String::new(), String::new());
            a.prompt_text(0, &mut ta);
            b.prompt_text(1, &mut tb);
            let full = (a.hash_ids.len() - 1) * TRACE_BLOCK_TOKENS * 4;
            assert_eq!(ta[..full], tb[..full]);
        }
    }

    #[test]
    fn a_finer_grain_shares_prefixes_at_that_grain() {
        // Two 128-token-block prompts that agree on their first three blocks share exactly
        // 3 × 128 tokens, text and ids alike.
        let mk = |hash_ids| TraceRequest {
            arrival_s: 0.0,
            input_tokens: 4 * 128,
            output_tokens: 1,
            hash_ids,
            block_tokens: 128,
            session: None,
        };
        let (a, b) = (mk(vec![1, 2, 3, 4]), mk(vec![1, 2, 3, 5]));
        let (mut ia, mut ib) = (Vec::new(), Vec::new());
        a.prompt_ids(0, &mut ia);
        b.prompt_ids(1, &mut ib);
        assert_eq!((ia.len(), ib.len()), (512, 512));
        let shared = ia.iter().zip(&ib).take_while(|(x, y)| x == y).count();
        assert_eq!(shared, 3 * 128);
        let mut text = String::new();
        a.prompt_text(0, &mut text);
        assert_eq!(pronto_core::tokens::token_ids(text.as_bytes()), ia);
    }

    #[test]
    fn azure_times_are_relative_with_100ns_precision() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 23:59:59.9999999,374,44\n\
                    2023-11-17 00:00:00.0000001,396,109\n\
                    2023-11-17 00:00:01,10,1\n";
        let t = parse_azure(text, "a").unwrap();
        assert!((t[1].arrival_s - 2e-7).abs() < 1e-12, "{}", t[1].arrival_s);
        assert!((t[2].arrival_s - 1.000_000_1).abs() < 1e-9);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t[0].prompt_ids(0, &mut a);
        t[1].prompt_ids(1, &mut b);
        assert_eq!((a.len(), b.len()), (374, 396));
        assert_ne!(a[..16], b[..16]);
        assert!(parse_azure("x,1,2\n", "a").is_err());
        assert!(parse_azure("2023-11-16 18:15:46.5,1\n", "a").is_err());
    }

    #[test]
    fn spread_ties_fills_each_bucket() {
        let mk = |t| TraceRequest {
            arrival_s: t,
            input_tokens: 1,
            output_tokens: 1,
            hash_ids: vec![],
            block_tokens: TRACE_BLOCK_TOKENS as u32,
            session: None,
        };
        let mut v = vec![mk(0.0), mk(0.0), mk(0.0), mk(3.0), mk(3.0)];
        spread_ties(&mut v);
        let t: Vec<f64> = v.iter().map(|r| r.arrival_s).collect();
        assert_eq!(t, [0.0, 1.0, 2.0, 3.0, 4.5]);
    }

    #[test]
    fn synthetic_workload_is_seeded_and_multi_turn() {
        let w = SyntheticWorkload::default();
        let a = w.generate();
        assert_eq!(a, w.generate());
        assert_ne!(
            a,
            SyntheticWorkload {
                seed: 2,
                ..w.clone()
            }
            .generate()
        );
        assert!(a.windows(2).all(|p| p[0].arrival_s <= p[1].arrival_s));
        // Later turns extend earlier ones.
        let s0: Vec<&TraceRequest> = a.iter().filter(|r| r.session == a[0].session).collect();
        for p in s0.windows(2) {
            assert!(p[1]
                .hash_ids
                .starts_with(&p[0].hash_ids[..p[0].hash_ids.len()]));
        }
        assert!(a.len() > w.conversations);
    }

    #[test]
    fn shared_traces_when_present() {
        let (Some(conv), Some(azure)) = (
            crate::testing::shared("traces/mooncake/conversation_trace.jsonl"),
            crate::testing::shared("traces/azure/AzureLLMInferenceTrace_conv.csv"),
        ) else {
            return;
        };
        let t = read_mooncake(&conv).unwrap();
        assert_eq!(t.len(), 12_031);
        assert!(t.iter().all(|r| r.hash_ids.len()
            == (r.input_tokens as usize).div_ceil(TRACE_BLOCK_TOKENS)
            && r.hash_ids[0] == 0));
        let span = t.last().unwrap().arrival_s;
        assert!((3_500.0..3_600.0).contains(&span), "{span}");
        let a = read_azure(&azure).unwrap();
        assert_eq!(a.len(), 19_366);
        let span = a.last().unwrap().arrival_s;
        assert!((3_400.0..3_600.0).contains(&span), "{span}");
    }
}
