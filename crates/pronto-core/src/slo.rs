//! Service-level objectives of one request and *goodput*: the share of requests (and of their
//! output tokens) that met them.
//!
//! A route may set a `ttft_slo` (time to the first token) and a `tpot_slo` (time per output
//! token after the first, `(last token − first token) / (tokens − 1)`). A request *meets its
//! SLO* when it completed with output, its TTFT is within `ttft_slo` (when set) and its TPOT
//! within `tpot_slo` (when set; a one-token answer has no TPOT and cannot break it). Goodput is
//! counted the same way by the evaluator (`pronto evaluate`), the replay client
//! (`pronto replay`) and `compare-report`:
//!
//! ```text
//! goodput_requests = requests that met the SLO / requests
//! goodput_tokens   = output tokens of requests that met the SLO / output tokens of all requests
//! ```
//! where a failed, shed or rejected request counts in the denominator with the output it was
//! asked for (or produced), and never in the numerator.

/// A request's objectives, in seconds; `None`: no objective.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloTargets {
    /// Time to the first token.
    pub ttft_s: Option<f64>,
    /// Time per output token after the first.
    pub tpot_s: Option<f64>,
}

impl SloTargets {
    /// Whether any objective is set.
    pub fn is_set(&self) -> bool {
        self.ttft_s.is_some() || self.tpot_s.is_some()
    }

    /// Whether a completed request with this TTFT and TPOT met both objectives (an absent
    /// TPOT — one output token — meets any `tpot_s`).
    pub(crate) fn met(&self, ttft_s: f64, tpot_s: Option<f64>) -> bool {
        self.ttft_s.is_none_or(|slo| ttft_s <= slo)
            && self
                .tpot_s
                .is_none_or(|slo| tpot_s.is_none_or(|t| t <= slo))
    }
}

/// What a route's `predicted_ttft` policy minimises (`objective:`; default `ttft`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Objective {
    /// The time to the first token of any kind.
    #[default]
    Ttft,
    /// The time to the first *answer* token: the TTFT plus the expected reasoning tokens at
    /// the backend's predicted time per output token ([`crate::predict::ReasoningLengths`]).
    Ttfa {
        /// Reasoning tokens expected before the answer (learned per pool and effort).
        reasoning_tokens: f64,
    },
}

impl Objective {
    /// Reasoning tokens to add at each backend's TPOT (0 for [`Objective::Ttft`]).
    #[inline]
    pub fn reasoning_tokens(&self) -> f64 {
        match *self {
            Objective::Ttft => 0.0,
            Objective::Ttfa { reasoning_tokens } => reasoning_tokens.max(0.0),
        }
    }
}

/// Goodput counters over a run (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Goodput {
    /// Requests counted.
    pub requests: u64,
    /// Of those, requests that met the SLO.
    pub met_requests: u64,
    /// Output tokens of every request counted.
    pub tokens: u64,
    /// Output tokens of the requests that met the SLO.
    pub met_tokens: u64,
}

impl Goodput {
    /// Count one request with `output_tokens`: `outcome` is its TTFT and TPOT when it
    /// completed with output, `None` when it failed, was shed or rejected.
    pub fn add(
        &mut self,
        slo: &SloTargets,
        output_tokens: u32,
        outcome: Option<(f64, Option<f64>)>,
    ) {
        self.requests += 1;
        self.tokens += u64::from(output_tokens);
        if outcome.is_some_and(|(ttft, tpot)| slo.met(ttft, tpot)) {
            self.met_requests += 1;
            self.met_tokens += u64::from(output_tokens);
        }
    }

    /// Share of requests that met the SLO (0 when none were counted).
    pub fn request_share(&self) -> f64 {
        share(self.met_requests, self.requests)
    }

    /// Share of output tokens from requests that met the SLO (0 when there were none).
    pub fn token_share(&self) -> f64 {
        share(self.met_tokens, self.tokens)
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_meets_its_slo_only_within_both_objectives() {
        let slo = SloTargets {
            ttft_s: Some(1.0),
            tpot_s: Some(0.05),
        };
        assert!(slo.met(1.0, Some(0.05)), "bounds are inclusive");
        assert!(!slo.met(1.01, Some(0.01)), "late first token");
        assert!(!slo.met(0.1, Some(0.06)), "slow tokens after it");
        assert!(slo.met(0.1, None), "one token: no TPOT to break");
        let ttft_only = SloTargets {
            ttft_s: Some(1.0),
            tpot_s: None,
        };
        assert!(ttft_only.met(0.5, Some(10.0)));
        assert!(!SloTargets::default().is_set());
        assert!(SloTargets::default().met(1e9, Some(1e9)));
    }

    #[test]
    fn goodput_counts_requests_and_their_tokens_failures_in_the_denominator() {
        let slo = SloTargets {
            ttft_s: Some(1.0),
            tpot_s: Some(0.05),
        };
        let mut g = Goodput::default();
        g.add(&slo, 100, Some((0.5, Some(0.02)))); // met
        g.add(&slo, 300, Some((2.0, Some(0.02)))); // late
        g.add(&slo, 100, None); // failed
        g.add(&slo, 500, Some((0.2, Some(0.04)))); // met
        assert_eq!(
            (g.requests, g.met_requests, g.tokens, g.met_tokens),
            (4, 2, 1000, 600)
        );
        assert_eq!(g.request_share(), 0.5);
        assert_eq!(g.token_share(), 0.6);
        assert_eq!(Goodput::default().request_share(), 0.0);
    }
}
