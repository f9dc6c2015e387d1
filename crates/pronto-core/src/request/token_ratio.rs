//! Per-model correction from Pronto's token count to the engine's, learned from `usage`.
//!
//! The gateway counts prompt tokens with its own fast, prefix-stable tokenizer
//! ([`crate::tokens`]): about 3.5–4 bytes per token on English text. A model's real tokenizer
//! may charge 20 % more or less for the same text, and the router's costs (prefill seconds,
//! KV tokens) are in the *engine's* tokens. Every response that reports
//! `usage.prompt_tokens` (non-streaming responses always; streams when the client asked for
//! `stream_options.include_usage` — Pronto never adds that field, since it changes what the
//! client receives) gives one sample of `engine tokens / our tokens`.
//!
//! [`TokenRatio`] keeps an EWMA of the log of that ratio (weight `ALPHA` per sample, so
//! about the last 20 responses count), clamped to `MIN_RATIO`..=`MAX_RATIO` so a template
//! mismatch or a bogus `usage` cannot distort routing by more than 4×. Starts at 1 (trust our
//! count). Lock-free: one atomic holding the f64 bits, updated by compare-and-swap; readers pay
//! one relaxed load.

use std::sync::atomic::{AtomicU64, Ordering};

/// EWMA weight of the newest sample.
pub(crate) const ALPHA: f64 = 0.05;
/// Smallest ratio believed.
pub(crate) const MIN_RATIO: f64 = 0.25;
/// Largest ratio believed.
pub(crate) const MAX_RATIO: f64 = 4.0;
/// Prompts shorter than this (our count) are not sampled: the chat template's fixed tokens
/// dominate them and would bias the ratio.
pub(crate) const MIN_SAMPLE_TOKENS: u32 = 32;

/// The learned engine-tokens-per-Pronto-token ratio of one model's pool.
#[derive(Debug)]
pub struct TokenRatio {
    /// ln(ratio) as f64 bits.
    log_bits: AtomicU64,
    samples: AtomicU64,
}

impl Default for TokenRatio {
    fn default() -> Self {
        TokenRatio {
            log_bits: AtomicU64::new(0f64.to_bits()),
            samples: AtomicU64::new(0),
        }
    }
}

impl TokenRatio {
    /// Current ratio (1 until a sample arrives).
    pub fn ratio(&self) -> f64 {
        f64::from_bits(self.log_bits.load(Ordering::Relaxed)).exp()
    }

    /// Samples learned from.
    #[cfg(test)]
    pub(crate) fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Learn from a response: the engine charged `engine_tokens` for a prompt Pronto counted as
    /// `our_tokens`. Ignores short prompts and zero counts.
    pub fn observe(&self, engine_tokens: u32, our_tokens: u32) {
        if our_tokens < MIN_SAMPLE_TOKENS || engine_tokens == 0 {
            return;
        }
        let sample = (f64::from(engine_tokens) / f64::from(our_tokens))
            .clamp(MIN_RATIO, MAX_RATIO)
            .ln();
        let first = self.samples.fetch_add(1, Ordering::Relaxed) == 0;
        let _ = self
            .log_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let cur = f64::from_bits(bits);
                let next = if first {
                    sample
                } else {
                    cur + ALPHA * (sample - cur)
                };
                Some(next.to_bits())
            });
    }

    /// `tokens` (our count) in the engine's tokens.
    pub fn scale(&self, tokens: u32) -> u32 {
        let r = self.ratio();
        if r == 1.0 {
            return tokens;
        }
        (f64::from(tokens) * r).round().min(f64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_one_and_converges_to_the_engines_ratio() {
        let r = TokenRatio::default();
        assert_eq!(r.ratio(), 1.0);
        assert_eq!(r.scale(1000), 1000);
        for i in 0..200u32 {
            // The engine charges 1.25× ours, with ±4 % noise.
            let ours = 500 + i * 7;
            let noise = if i % 2 == 0 { 1.04 } else { 0.96 };
            r.observe((f64::from(ours) * 1.25 * noise) as u32, ours);
        }
        assert!((r.ratio() - 1.25).abs() < 0.03, "ratio {}", r.ratio());
        assert!((r.scale(1000) as i64 - 1250).abs() < 30);
        assert_eq!(r.samples(), 200);
    }

    #[test]
    fn short_prompts_zero_counts_and_absurd_ratios_are_contained() {
        let r = TokenRatio::default();
        r.observe(100, 10);
        r.observe(0, 1000);
        assert_eq!((r.ratio(), r.samples()), (1.0, 0));
        r.observe(1_000_000, 100);
        assert!((r.ratio() - MAX_RATIO).abs() < 1e-9, "clamped to 4×");
        for _ in 0..400 {
            r.observe(1, 1000);
        }
        assert!((r.ratio() - MIN_RATIO).abs() < 1e-6);
    }

    #[test]
    fn concurrent_observers_do_not_lose_the_estimate() {
        let r = std::sync::Arc::new(TokenRatio::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        r.observe(900, 1000);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(r.samples(), 2000);
        assert!((r.ratio() - 0.9).abs() < 1e-6);
    }
}
