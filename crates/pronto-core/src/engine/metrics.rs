//! Engine `/metrics` → [`EngineSample`]: a small Prometheus text-format parser and an extractor
//! that recognises vLLM, SGLang and TGI.
//!
//! ## Parser
//! [`samples`] walks the exposition line by line without allocating: blank lines and comments
//! (`# HELP`, `# TYPE`, `# EOF`, …) are skipped; every other line is
//! `name[{label="value",…}] value [timestamp] [# exemplar]`. Label values may hold escaped
//! `\"`, `\\` and `\n` (and so `}` or `,` inside quotes); [`Sample::label`] unescapes on demand.
//! Values are Go/Python float spellings: `1`, `1.5e+06`, `NaN`, `+Inf`, `-Inf`.
//!
//! ## Extractor
//! [`EngineSample::parse`] sums each recognised family over its label sets (one series per
//! engine when an engine runs data-parallel ranks) and averages the ratio families:
//!
//! | flavour | waiting | running | KV usage (0..1) | prefix queries / hits |
//! | --- | --- | --- | --- | --- |
//! | vLLM | `vllm:num_requests_waiting` | `vllm:num_requests_running` | `vllm:kv_cache_usage_perc`, older `vllm:gpu_cache_usage_perc` | `vllm:prefix_cache_{queries,hits}_total`, older `vllm:gpu_prefix_cache_{queries,hits}_total` |
//! | SGLang | `sglang:num_queue_reqs` | `sglang:num_running_reqs` | `sglang:token_usage` | `sglang:prompt_tokens_total` / `sglang:cached_tokens_total`; also `sglang:cache_hit_rate` |
//! | TGI | `tgi_queue_size` | `tgi_batch_current_size` | not exported: 0 | — |
//!
//! The flavour is the first of vLLM, SGLang, TGI whose waiting *and* running families are both
//! present. Anything else (no recognised families, a malformed line of a recognised family, a
//! non-finite or negative load value) is an [`EngineMetricsError`], never a panic; malformed
//! lines of families we do not read are skipped, so one odd series elsewhere on the page does
//! not blind the router. Only lines that start with a family we read are parsed at all (the
//! rest, mostly histogram buckets, cost a prefix compare).

#[cfg(test)]
use std::borrow::Cow;

/// Which engine produced a metrics page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineFlavor {
    /// vLLM (`vllm:` families).
    Vllm,
    /// SGLang (`sglang:` families).
    Sglang,
    /// Hugging Face Text Generation Inference (`tgi_` families).
    Tgi,
}

impl EngineFlavor {
    /// Lower-case name (admin JSON, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            EngineFlavor::Vllm => "vllm",
            EngineFlavor::Sglang => "sglang",
            EngineFlavor::Tgi => "tgi",
        }
    }
}

/// Engine load read from one metrics page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSample {
    /// Requests waiting in the engine's queue (summed over engines).
    pub waiting: f64,
    /// Requests in the running batch (summed over engines).
    pub running: f64,
    /// KV-cache usage in 0..=1 (mean over engines; 0 when the engine does not export it).
    pub kv_usage: f64,
    /// Cumulative prompt tokens looked up in the prefix cache, when exported.
    pub prefix_queries: Option<f64>,
    /// Cumulative prompt tokens found in the prefix cache, when exported.
    pub prefix_hits: Option<f64>,
    /// The engine's own recent prefix-cache hit rate (SGLang's gauge), when exported.
    pub cache_hit_rate: Option<f64>,
    /// KV-cache capacity in tokens (vLLM's `cache_config_info` labels `num_gpu_blocks` ×
    /// `block_size`, summed over engines), when exported.
    pub kv_capacity_tokens: Option<f64>,
    /// Which engine.
    pub flavor: EngineFlavor,
}

/// A metrics page could not be read as engine load.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineMetricsError {
    /// No vLLM, SGLang or TGI queue/batch families on the page.
    #[error("no recognised engine metrics (vLLM, SGLang or TGI)")]
    UnknownFormat,
    /// A line of a family we read is not valid exposition text.
    #[error("line {line}: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A load value is NaN, infinite or negative.
    #[error("{metric}: value {value} is not a finite non-negative number")]
    BadValue {
        /// Family name.
        metric: &'static str,
        /// The value read.
        value: f64,
    },
}

// === parser ===

/// One sample line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample<'a> {
    /// Metric name (`vllm:num_requests_waiting`, `x_bucket`, …).
    pub name: &'a str,
    /// Raw text between `{` and `}` (escapes intact), empty when there are no labels.
    pub labels: &'a str,
    /// The value.
    pub value: f64,
    /// Milliseconds since the epoch, when given.
    pub timestamp_ms: Option<i64>,
}

#[cfg(test)]
impl<'a> Sample<'a> {
    /// The unescaped value of label `key`, if present.
    fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        let mut rest = self.labels;
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            if rest.is_empty() {
                return None;
            }
            let eq = rest.find('=')?;
            let k = rest[..eq].trim();
            let after = rest[eq + 1..].trim_start();
            let raw = after.strip_prefix('"')?;
            let end = closing_quote(raw)?;
            if k == key {
                return Some(unescape(&raw[..end]));
            }
            rest = &raw[end + 1..];
        }
    }
}

/// A sample line that could not be parsed: the metric name when one was read, and why.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LineError<'a> {
    /// 1-based line number.
    pub line: usize,
    /// The metric name, when the line got that far.
    pub name: Option<&'a str>,
    /// What is wrong.
    pub reason: &'static str,
}

/// Every sample line of `text`, in order; comments and blank lines are skipped.
#[cfg(test)]
fn samples(text: &str) -> impl Iterator<Item = Result<Sample<'_>, LineError<'_>>> + '_ {
    text.lines().enumerate().filter_map(|(i, line)| {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        Some(parse_line(line).map_err(|(name, reason)| LineError {
            line: i + 1,
            name,
            reason,
        }))
    })
}

type ParseErr<'a> = (Option<&'a str>, &'static str);

fn parse_line(line: &str) -> Result<Sample<'_>, ParseErr<'_>> {
    let name_end = line.find(['{', ' ', '\t']).ok_or((None, "no value"))?;
    let name = &line[..name_end];
    if name.is_empty() || !name.bytes().all(is_name_byte) {
        return Err((None, "invalid metric name"));
    }
    let mut rest = &line[name_end..];
    let mut labels = "";
    if let Some(body) = rest.strip_prefix('{') {
        let end = labels_end(body).ok_or((Some(name), "unterminated label set"))?;
        labels = &body[..end];
        rest = &body[end + 1..];
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().ok_or((Some(name), "no value"))?;
    let value = parse_value(value).ok_or((Some(name), "invalid value"))?;
    let timestamp_ms = match fields.next() {
        None => None,
        Some(t) if t.starts_with('#') => None, // OpenMetrics exemplar
        Some(t) => Some(t.parse().map_err(|_| (Some(name), "invalid timestamp"))?),
    };
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// Index of the `}` closing a label set, skipping quoted values (which may hold `}`).
fn labels_end(body: &str) -> Option<usize> {
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'}' => return Some(i),
            b'"' => i += 1 + closing_quote(&body[i + 1..])?,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Index of the unescaped `"` ending a quoted value that starts just after its opening quote.
fn closing_quote(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if v
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            v.parse().ok()
        }
        _ => None,
    }
}

// === extractor ===

/// How a family's series combine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Combine {
    Sum,
    Mean,
}

/// The slots an extractor fills.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Waiting,
    Running,
    KvUsage,
    PrefixQueries,
    PrefixHits,
    HitRate,
}

const SLOTS: usize = 6;
const FLAVORS: [EngineFlavor; 3] = [EngineFlavor::Vllm, EngineFlavor::Sglang, EngineFlavor::Tgi];

/// `(family, flavour, slot, combine)`. When two families fill one slot (new and old vLLM
/// names), the first listed wins.
const FAMILIES: &[(&str, EngineFlavor, Slot, Combine)] = &[
    (
        "vllm:num_requests_waiting",
        EngineFlavor::Vllm,
        Slot::Waiting,
        Combine::Sum,
    ),
    (
        "vllm:num_requests_running",
        EngineFlavor::Vllm,
        Slot::Running,
        Combine::Sum,
    ),
    (
        "vllm:kv_cache_usage_perc",
        EngineFlavor::Vllm,
        Slot::KvUsage,
        Combine::Mean,
    ),
    (
        "vllm:gpu_cache_usage_perc",
        EngineFlavor::Vllm,
        Slot::KvUsage,
        Combine::Mean,
    ),
    (
        "vllm:prefix_cache_queries_total",
        EngineFlavor::Vllm,
        Slot::PrefixQueries,
        Combine::Sum,
    ),
    (
        "vllm:gpu_prefix_cache_queries_total",
        EngineFlavor::Vllm,
        Slot::PrefixQueries,
        Combine::Sum,
    ),
    (
        "vllm:prefix_cache_hits_total",
        EngineFlavor::Vllm,
        Slot::PrefixHits,
        Combine::Sum,
    ),
    (
        "vllm:gpu_prefix_cache_hits_total",
        EngineFlavor::Vllm,
        Slot::PrefixHits,
        Combine::Sum,
    ),
    (
        "sglang:num_queue_reqs",
        EngineFlavor::Sglang,
        Slot::Waiting,
        Combine::Sum,
    ),
    (
        "sglang:num_running_reqs",
        EngineFlavor::Sglang,
        Slot::Running,
        Combine::Sum,
    ),
    (
        "sglang:token_usage",
        EngineFlavor::Sglang,
        Slot::KvUsage,
        Combine::Mean,
    ),
    (
        "sglang:prompt_tokens_total",
        EngineFlavor::Sglang,
        Slot::PrefixQueries,
        Combine::Sum,
    ),
    (
        "sglang:cached_tokens_total",
        EngineFlavor::Sglang,
        Slot::PrefixHits,
        Combine::Sum,
    ),
    (
        "sglang:cache_hit_rate",
        EngineFlavor::Sglang,
        Slot::HitRate,
        Combine::Mean,
    ),
    (
        "tgi_queue_size",
        EngineFlavor::Tgi,
        Slot::Waiting,
        Combine::Sum,
    ),
    (
        "tgi_batch_current_size",
        EngineFlavor::Tgi,
        Slot::Running,
        Combine::Sum,
    ),
];

/// vLLM's info gauge whose labels give the KV cache's size.
const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

/// `num_gpu_blocks × block_size` from `cache_config_info`'s label text, when both are numbers.
fn kv_capacity(labels: &str) -> Option<f64> {
    let label = |key: &str| -> Option<f64> {
        labels.split(',').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').parse::<f64>().ok())?
        })
    };
    let c = label("num_gpu_blocks")? * label("block_size")?;
    (c.is_finite() && c > 0.0).then_some(c)
}

/// Running total of one family.
#[derive(Clone, Copy, Default)]
struct Acc {
    sum: f64,
    n: u32,
}

impl EngineSample {
    /// Read engine load from a Prometheus text page.
    pub fn parse(text: &str) -> Result<EngineSample, EngineMetricsError> {
        let mut acc = [Acc::default(); FAMILIES.len()];
        let mut capacity: Option<f64> = None;
        for (n, line) in text.lines().enumerate() {
            // Only lines of a family we read are parsed; the rest (histogram buckets, process
            // metrics) are skipped on a prefix compare.
            let line = line.trim_start();
            if line.starts_with(CACHE_CONFIG_INFO) {
                if let Some(c) = parse_line(line).ok().and_then(|s| kv_capacity(s.labels)) {
                    *capacity.get_or_insert(0.0) += c;
                }
                continue;
            }
            let Some(i) = FAMILIES.iter().position(|f| {
                line.starts_with(f.0)
                    && matches!(line.as_bytes().get(f.0.len()), Some(b'{' | b' ' | b'\t'))
            }) else {
                continue;
            };
            let s = parse_line(line).map_err(|(_, reason)| EngineMetricsError::Malformed {
                line: n + 1,
                reason,
            })?;
            let v = s.value;
            if !v.is_finite() || v < 0.0 {
                return Err(EngineMetricsError::BadValue {
                    metric: FAMILIES[i].0,
                    value: v,
                });
            }
            acc[i].sum += v;
            acc[i].n += 1;
        }
        let mut sample = FLAVORS
            .iter()
            .find_map(|&flavor| Self::assemble(flavor, &acc))
            .ok_or(EngineMetricsError::UnknownFormat)?;
        sample.kv_capacity_tokens = capacity;
        Ok(sample)
    }

    fn assemble(flavor: EngineFlavor, acc: &[Acc; FAMILIES.len()]) -> Option<EngineSample> {
        let mut slots = [None::<f64>; SLOTS];
        for (f, a) in FAMILIES.iter().zip(acc) {
            let (_, fl, slot, combine) = *f;
            if fl != flavor || a.n == 0 || slots[slot as usize].is_some() {
                continue;
            }
            slots[slot as usize] = Some(match combine {
                Combine::Sum => a.sum,
                Combine::Mean => a.sum / f64::from(a.n),
            });
        }
        Some(EngineSample {
            waiting: slots[Slot::Waiting as usize]?,
            running: slots[Slot::Running as usize]?,
            kv_usage: slots[Slot::KvUsage as usize].unwrap_or(0.0).min(1.0),
            prefix_queries: slots[Slot::PrefixQueries as usize],
            prefix_hits: slots[Slot::PrefixHits as usize],
            cache_hit_rate: slots[Slot::HitRate as usize].map(|r| r.min(1.0)),
            kv_capacity_tokens: None,
            flavor,
        })
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
