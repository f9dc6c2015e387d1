//! Expected reasoning length: how many reasoning tokens a reasoning model spends before its
//! answer, learned online per pool (model) and per `reasoning_effort` the client asked for.
//!
//! A route whose `objective` is `ttfa` (time to first answer) ranks backends by
//!
//! ```text
//! ttfa(b) ≈ ttft(b) + E[reasoning tokens | effort] × tpot(b)
//! ```
//!
//! (see [`crate::routing::PredictedTtft`]); this module supplies the expectation. Each effort
//! level (`none`, `minimal`, `low`, `medium`, `high`, or not given) keeps its own mean of the
//! reasoning tokens counted on the streams that completed: a running mean over the first
//! [`WINDOW`] observations, then an exponentially weighted one (weight `1/WINDOW`), so a model
//! upgrade or a prompt-mix change is followed within a few hundred requests. A level with no
//! observation yet borrows the mean of requests that gave no effort (the model's default),
//! and with none at all the expectation is 0: the objective then ranks as `ttft` does.
//!
//! Learning is off the decision path (when a stream ends) and lock-free: each level's mean
//! and count live in atomics, updated by compare-and-swap; a decision reads one atomic.

use std::sync::atomic::{AtomicU64, Ordering};

/// Observations after which the mean becomes exponentially weighted (weight `1 / WINDOW`).
pub(crate) const WINDOW: u64 = 200;

/// A request's `reasoning_effort` (OpenAI's chat completions field), as far as routing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningEffort {
    /// `none`.
    None,
    /// `minimal`.
    Minimal,
    /// `low`.
    Low,
    /// `medium`.
    Medium,
    /// `high`.
    High,
}

impl ReasoningEffort {
    /// Every level, in order.
    pub const ALL: [ReasoningEffort; 5] = [
        ReasoningEffort::None,
        ReasoningEffort::Minimal,
        ReasoningEffort::Low,
        ReasoningEffort::Medium,
        ReasoningEffort::High,
    ];

    /// The level a field value names (case-sensitive, as the API spells them); `None` for
    /// anything else (an engine-specific value is passed through and routed as not given).
    pub fn parse(value: &str) -> Option<ReasoningEffort> {
        Some(match value {
            "none" => ReasoningEffort::None,
            "minimal" => ReasoningEffort::Minimal,
            "low" => ReasoningEffort::Low,
            "medium" => ReasoningEffort::Medium,
            "high" => ReasoningEffort::High,
            _ => return None,
        })
    }

    /// The field value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::None => "none",
            ReasoningEffort::Minimal => "minimal",
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }

    fn slot(effort: Option<ReasoningEffort>) -> usize {
        effort.map_or(0, |e| e as usize + 1)
    }
}

/// One level's learned mean.
#[derive(Debug, Default)]
struct Level {
    /// f64 bits of the mean reasoning tokens.
    mean: AtomicU64,
    /// Observations learned from.
    count: AtomicU64,
}

/// Learned reasoning lengths of one pool (see the module docs).
#[derive(Debug, Default)]
pub struct ReasoningLengths {
    /// Not given, then [`ReasoningEffort::ALL`] in order.
    levels: [Level; 6],
}

impl ReasoningLengths {
    /// A completed stream at `effort` spent `tokens` reasoning tokens (0 for an answer given
    /// at once: a model that does not reason teaches an expectation of 0).
    pub fn observe(&self, effort: Option<ReasoningEffort>, tokens: u32) {
        let level = &self.levels[ReasoningEffort::slot(effort)];
        let n = level
            .count
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let weight = 1.0 / n.min(WINDOW) as f64;
        let x = f64::from(tokens);
        // Another stream may land between the read and the write: retry on its result.
        let _ = level
            .mean
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let m = f64::from_bits(bits);
                Some((m + (x - m) * weight).to_bits())
            });
    }

    /// Expected reasoning tokens of a request at `effort` (module docs: a level not seen yet
    /// borrows the not-given level's mean; 0 with nothing learnt).
    pub fn expected(&self, effort: Option<ReasoningEffort>) -> f64 {
        let own = &self.levels[ReasoningEffort::slot(effort)];
        let level = if own.count.load(Ordering::Relaxed) > 0 {
            own
        } else {
            &self.levels[0]
        };
        if level.count.load(Ordering::Relaxed) == 0 {
            return 0.0;
        }
        f64::from_bits(level.mean.load(Ordering::Relaxed))
    }

    /// Observations learned at `effort`.
    #[cfg(test)]
    pub(crate) fn samples(&self, effort: Option<ReasoningEffort>) -> u64 {
        self.levels[ReasoningEffort::slot(effort)]
            .count
            .load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_mean_then_a_moving_one() {
        let r = ReasoningLengths::default();
        assert_eq!(
            r.expected(None),
            0.0,
            "nothing learnt: no reasoning expected"
        );
        for t in [100, 200, 300] {
            r.observe(None, t);
        }
        assert!((r.expected(None) - 200.0).abs() < 1e-9);
        // The model changes: after many observations at 1000 the mean follows.
        for _ in 0..2000 {
            r.observe(None, 1000);
        }
        assert!(
            (r.expected(None) - 1000.0).abs() < 1.0,
            "{}",
            r.expected(None)
        );
        assert_eq!(r.samples(None), 2003);
    }

    #[test]
    fn each_effort_learns_apart_and_an_unseen_one_borrows_the_default() {
        let r = ReasoningLengths::default();
        r.observe(None, 400);
        r.observe(Some(ReasoningEffort::High), 2000);
        r.observe(Some(ReasoningEffort::Low), 50);
        assert_eq!(r.expected(Some(ReasoningEffort::High)), 2000.0);
        assert_eq!(r.expected(Some(ReasoningEffort::Low)), 50.0);
        assert_eq!(r.expected(Some(ReasoningEffort::Medium)), 400.0, "borrowed");
        assert_eq!(r.expected(None), 400.0);
        r.observe(Some(ReasoningEffort::None), 0);
        assert_eq!(r.expected(Some(ReasoningEffort::None)), 0.0);
    }

    #[test]
    fn effort_names_round_trip() {
        for e in ReasoningEffort::ALL {
            assert_eq!(ReasoningEffort::parse(e.as_str()), Some(e));
        }
        assert_eq!(ReasoningEffort::parse("HIGH"), None);
        assert_eq!(ReasoningEffort::parse("xhigh"), None);
    }
}
