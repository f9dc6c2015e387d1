//! The measurement shapes and what was measured for each.
//!
//! A shape is one kind of timed batch: `conc` different prompts of about `tokens` tokens sent
//! at once (released together), streaming `/v1/completions` with `ignore_eos`.
//! - **cold**: every prompt new (a unique leading nonce), so nothing is cached; the statistic is
//!   the time to the first streamed token (TTFT).
//! - **prefix-hit**: each prompt is first sent alone, untimed, to fill the prefix cache, then
//!   the batch is timed: every full KV block but the last token's is cached.
//! - **decode**: cold prompts generating `decode_tokens` tokens; the statistic is the mean
//!   inter-token latency of each request, (last token − first) / (tokens − 1).
//!
//! Every sample of a shape (conc per repetition) is kept; the headline statistic is the
//! median of all samples. [`Measurements`] is also the JSON file `--measurements` writes and
//! `--from` reads, in the format `scripts/sim-fidelity.py compare` reads.

use serde::{Deserialize, Serialize};

/// What a shape times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Unique prompts, TTFT.
    Cold,
    /// Prompts already in the prefix cache, TTFT.
    PrefixHit,
    /// Inter-token latency of unique prompts.
    Decode,
}

impl Kind {
    /// The name used in shape labels.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Cold => "cold",
            Kind::PrefixHit => "prefix-hit",
            Kind::Decode => "decode",
        }
    }

    /// `"ttft"` or `"itl"`.
    pub fn metric(self) -> &'static str {
        match self {
            Kind::Decode => "itl",
            _ => "ttft",
        }
    }
}

/// One shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// What it times.
    pub kind: Kind,
    /// Requests per batch.
    pub conc: usize,
    /// Target prompt tokens.
    pub tokens: usize,
    /// Output tokens per request.
    pub max_tokens: u32,
}

impl Shape {
    /// `cold c=1 n=128`, `decode c=8 n=128 (ITL)`: the label the fidelity files use.
    pub fn label(&self) -> String {
        let itl = if self.kind == Kind::Decode {
            " (ITL)"
        } else {
            ""
        };
        format!(
            "{} c={} n={}{itl}",
            self.kind.label(),
            self.conc,
            self.tokens
        )
    }

    /// Requests one repetition sends: the batch, plus the fills of a prefix-hit shape.
    pub fn requests(&self) -> usize {
        match self.kind {
            Kind::PrefixHit => 2 * self.conc,
            _ => self.conc,
        }
    }
}

/// The shapes of one calibration.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Shapes, in the order each repetition runs them.
    pub shapes: Vec<Shape>,
    /// Repetitions (every shape once per repetition, so a burst of host load hits all alike).
    pub reps: usize,
    /// Warm-up prompt lengths, each sent twice before anything is timed.
    pub warmup: Vec<usize>,
}

impl Plan {
    /// Cold and prefix-hit shapes for every length × concurrency, TTFT with `max_tokens`
    /// output tokens, then a decode shape per concurrency.
    pub fn new(
        lengths: &[usize],
        concurrency: &[usize],
        max_tokens: u32,
        decode_prompt: usize,
        decode_tokens: u32,
        reps: usize,
    ) -> Plan {
        let mut shapes = Vec::new();
        for kind in [Kind::Cold, Kind::PrefixHit] {
            for &conc in concurrency {
                for &tokens in lengths {
                    shapes.push(Shape {
                        kind,
                        conc,
                        tokens,
                        max_tokens,
                    });
                }
            }
        }
        for &conc in concurrency {
            shapes.push(Shape {
                kind: Kind::Decode,
                conc,
                tokens: decode_prompt,
                max_tokens: decode_tokens,
            });
        }
        let mut warmup: Vec<usize> = [128, 1000, 4000]
            .into_iter()
            .filter(|&n| n <= lengths.iter().copied().max().unwrap_or(0))
            .collect();
        if warmup.is_empty() {
            warmup.push(lengths.first().copied().unwrap_or(128));
        }
        Plan {
            shapes,
            reps,
            warmup,
        }
    }

    /// The default plan: 128–4000 tokens, concurrency 1 and 8, 4 output tokens, decode of 32
    /// tokens after 128, 7 repetitions (what `pronto calibrate` runs by default).
    pub fn standard() -> Plan {
        Plan::new(&[128, 512, 1000, 2000, 4000], &[1, 8], 4, 128, 32, 7)
    }

    /// Generation requests the plan sends at most (warm-ups included; `/tokenize` calls that
    /// size the prompts are not generation requests and are not counted).
    pub fn requests(&self) -> usize {
        2 * self.warmup.len() + self.reps * self.shapes.iter().map(Shape::requests).sum::<usize>()
    }

    /// Prompt tokens the plan sends at most.
    pub fn prompt_tokens(&self) -> usize {
        2 * self.warmup.iter().sum::<usize>()
            + self.reps
                * self
                    .shapes
                    .iter()
                    .map(|s| s.requests() * s.tokens)
                    .sum::<usize>()
    }
}

/// What was measured for one shape (the JSON row of `scripts/sim-fidelity.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeResult {
    /// [`Shape::label`].
    pub shape: String,
    /// What it times.
    pub kind: Kind,
    /// `"ttft"` or `"itl"`.
    pub metric: String,
    /// Requests per batch.
    pub concurrency: usize,
    /// Target prompt tokens.
    pub target_tokens: usize,
    /// Output tokens per request.
    pub max_tokens: u32,
    /// Mean prompt tokens of the timed requests, as the server counted them.
    pub prompt_tokens_mean: f64,
    /// Mean `usage.prompt_tokens_details.cached_tokens` of the timed requests, when reported.
    pub cached_tokens_mean: Option<f64>,
    /// Median of all samples: the headline statistic.
    pub ms_median: f64,
    /// Lower quartile of the per-repetition medians (the quiet-host estimate).
    pub ms_quiet: f64,
    /// Mean of all samples.
    pub ms_mean: f64,
    /// Smallest sample.
    pub ms_min: f64,
    /// Largest sample.
    pub ms_max: f64,
    /// Every sample, ms.
    pub samples_ms: Vec<f64>,
    /// Median of each repetition's samples, ms.
    pub rep_medians_ms: Vec<f64>,
}

impl ShapeResult {
    /// The shape this row measured.
    pub fn shape(&self) -> Shape {
        Shape {
            kind: self.kind,
            conc: self.concurrency,
            tokens: self.target_tokens,
            max_tokens: self.max_tokens,
        }
    }

    /// The prompt length the replay uses: the measured mean, rounded.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens_mean.round().max(1.0) as usize
    }
}

/// A whole measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    /// The engine's base URL.
    pub base_url: String,
    /// The model name requests used.
    pub model: String,
    /// Free text.
    #[serde(default)]
    pub label: String,
    /// The salt mixed into the prompts' nonces (0 in files written before it existed).
    #[serde(default)]
    pub nonce_salt: u64,
    /// UTC start time, `YYYY-MM-DDTHH:MM:SSZ`.
    pub when: String,
    /// Repetitions completed.
    pub reps: usize,
    /// Output tokens of the TTFT shapes.
    pub max_tokens: u32,
    /// How prompts were counted.
    pub tokenizer: String,
    /// The engine's version, as it reports it.
    #[serde(default)]
    pub engine_version: Option<String>,
    /// `(block_size, num_kv_blocks)` as the engine's metrics report them.
    #[serde(default)]
    pub kv_cache: Option<(usize, usize)>,
    /// Generation requests sent (warm-ups and fills included).
    #[serde(default)]
    pub requests_sent: usize,
    /// Seconds the measurement took.
    #[serde(default)]
    pub duration_s: f64,
    /// One row per shape.
    pub results: Vec<ShapeResult>,
}

/// Median (mean of the middle two when even) of a non-empty slice.
pub fn median(xs: &[f64]) -> f64 {
    quantile(xs, 0.5)
}

/// Linear-interpolated quantile of a non-empty slice.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    assert!(!xs.is_empty(), "quantile of nothing");
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

impl ShapeResult {
    /// Summarise the samples of one shape.
    pub fn summarise(
        shape: &Shape,
        samples: &[f64],
        rep_medians: &[f64],
        prompt_tokens: &[usize],
        cached: &[u32],
    ) -> ShapeResult {
        let r3 = |x: f64| (x * 1e3).round() / 1e3;
        ShapeResult {
            shape: shape.label(),
            kind: shape.kind,
            metric: shape.kind.metric().to_string(),
            concurrency: shape.conc,
            target_tokens: shape.tokens,
            max_tokens: shape.max_tokens,
            prompt_tokens_mean: prompt_tokens.iter().sum::<usize>() as f64
                / prompt_tokens.len().max(1) as f64,
            cached_tokens_mean: (!cached.is_empty())
                .then(|| cached.iter().map(|&c| f64::from(c)).sum::<f64>() / cached.len() as f64),
            ms_median: median(samples),
            ms_quiet: quantile(rep_medians, 0.25),
            ms_mean: samples.iter().sum::<f64>() / samples.len() as f64,
            ms_min: samples.iter().copied().fold(f64::INFINITY, f64::min),
            ms_max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            samples_ms: samples.iter().copied().map(r3).collect(),
            rep_medians_ms: rep_medians.iter().copied().map(r3).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_plan_has_the_fidelity_shapes() {
        let p = Plan::standard();
        assert_eq!(p.shapes.len(), 22);
        assert_eq!(p.shapes[0].label(), "cold c=1 n=128");
        assert_eq!(p.shapes[10].label(), "prefix-hit c=1 n=128");
        assert_eq!(p.shapes[21].label(), "decode c=8 n=128 (ITL)");
        // 2 warm-ups each of 3 lengths; per rep: cold 5·(1+8), prefix-hit 2·5·(1+8), decode 9.
        assert_eq!(p.requests(), 6 + 7 * (45 + 90 + 9));
        assert_eq!(p.warmup, vec![128, 1000, 4000]);
    }

    #[test]
    fn quantiles_interpolate() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0);
        assert_eq!(quantile(&[7.0], 0.25), 7.0);
    }

    #[test]
    fn results_round_trip_through_json() {
        let s = Shape {
            kind: Kind::PrefixHit,
            conc: 8,
            tokens: 1000,
            max_tokens: 4,
        };
        let r = ShapeResult::summarise(&s, &[2.0, 4.0, 3.0], &[3.0], &[999, 1001], &[896]);
        assert_eq!(r.prompt_tokens(), 1000);
        assert_eq!(r.shape(), s);
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"kind\":\"prefix-hit\""), "{text}");
        let back: ShapeResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert_eq!((r.ms_median, r.ms_min, r.ms_max), (3.0, 2.0, 4.0));
    }
}
