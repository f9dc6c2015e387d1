//! The end of a run: what it tallied as it went, and its [`RunReport`].

use super::{RaceCounts, Run};
use crate::eval_report::{percentile, tpot_and_goodput, RequestOutcome, RunReport};

/// What a run tallies as its events come (the samples in event order: the means sum them so).
#[derive(Debug)]
pub(super) struct Tally {
    /// TTFT of every first token, seconds.
    pub ttft: Vec<f64>,
    /// TTFA of every first answer token, seconds.
    pub ttfa: Vec<f64>,
    /// End-to-end latency of every request that finished with output, seconds.
    pub e2e: Vec<f64>,
    /// Requests the policy refused (no eligible backend) or admission shed.
    pub shed: u64,
    /// Requests an engine rejected.
    pub rejected: u64,
    /// Prompt tokens found in prefix caches, over the first tokens.
    pub hit_tokens: u64,
    /// Prompt tokens, over the first tokens.
    pub prompt_tokens: u64,
    /// The last finish with output, virtual seconds.
    pub last_finish: f64,
}

impl Tally {
    /// Nothing yet, with room for `requests` samples each.
    pub fn new(requests: usize) -> Tally {
        Tally {
            ttft: Vec::with_capacity(requests),
            ttfa: Vec::with_capacity(requests),
            e2e: Vec::with_capacity(requests),
            shed: 0,
            rejected: 0,
            hit_tokens: 0,
            prompt_tokens: 0,
            last_finish: 0.0,
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn ms(v: f64) -> f64 {
    v * 1e3
}

impl Run<'_> {
    /// Every request's outcome, in trace order.
    fn outcomes(&self) -> Vec<RequestOutcome> {
        self.tracks
            .iter()
            .map(|t| RequestOutcome {
                arrival_s: t.arrival_s,
                prompt_tokens: t.prompt_tokens,
                backend: (t.backend != usize::MAX).then_some(t.backend),
                predicted_ttft_s: t.predicted_ttft_s,
                reason: t.reason,
                cached_tokens: t.cached_tokens,
                ttft_s: t.first_token_s.map(|f| f - t.arrival_s),
                ttfa_s: t.first_answer_s.map(|f| f - t.arrival_s),
                tpot_s: t.tpot_s,
                output_tokens: t.output_tokens,
                completed: t.completed,
            })
            .collect()
    }

    /// The run's report, once every event has happened.
    pub(super) fn report(self) -> RunReport {
        let outcomes = self.outcomes();
        let preemptions = self
            .backends
            .iter()
            .map(|b| b.engine.stats().preemptions_total)
            .sum();
        let Tally {
            mut ttft,
            mut ttfa,
            mut e2e,
            shed,
            rejected,
            hit_tokens,
            prompt_tokens,
            last_finish,
        } = self.tally;
        let first_arrival = self.reqs.first().map_or(0.0, |r| r.arrival_s);
        let span = last_finish - first_arrival;
        let ttft_mean = mean(&ttft);
        let ttfa_mean = mean(&ttfa);
        let e2e_mean = mean(&e2e);
        ttft.sort_by(f64::total_cmp);
        ttfa.sort_by(f64::total_cmp);
        let started: Vec<f64> = self
            .tracks
            .iter()
            .filter(|t| t.first_token_s.is_some())
            .map(|t| f64::from(t.reasoning_tokens))
            .collect();
        e2e.sort_by(f64::total_cmp);
        let slo = &self.parse.slo;
        let ([tpot_p50, tpot_p90, tpot_p99], goodput) = tpot_and_goodput(&outcomes, slo);
        let (router, rep) = (&self.router, &self.rep);
        RunReport {
            policy: self.policy.to_string(),
            requests: self.reqs.len() as u64,
            completed: e2e.len() as u64,
            ttft_mean_ms: ms(ttft_mean),
            ttft_p50_ms: ms(percentile(&ttft, 0.50)),
            ttft_p90_ms: ms(percentile(&ttft, 0.90)),
            ttft_p99_ms: ms(percentile(&ttft, 0.99)),
            ttfa_mean_ms: ms(ttfa_mean),
            ttfa_p99_ms: ms(percentile(&ttfa, 0.99)),
            reasoning_tokens_mean: mean(&started),
            tpot_p50_ms: tpot_p50,
            tpot_p90_ms: tpot_p90,
            tpot_p99_ms: tpot_p99,
            ttft_slo_ms: slo.ttft_s.map(ms),
            tpot_slo_ms: slo.tpot_s.map(ms),
            goodput_requests: goodput.request_share(),
            goodput_tokens: goodput.token_share(),
            e2e_mean_ms: ms(e2e_mean),
            e2e_p99_ms: ms(percentile(&e2e, 0.99)),
            throughput_rps: if span > 0.0 {
                e2e.len() as f64 / span
            } else {
                0.0
            },
            prefix_hit_rate: if prompt_tokens > 0 {
                hit_tokens as f64 / prompt_tokens as f64
            } else {
                0.0
            },
            per_backend: router
                .names()
                .zip(self.per_backend)
                .map(|(n, c)| (n.to_string(), c))
                .collect(),
            shed,
            rejected,
            preemptions,
            replicas: rep.replicas.max(1) as u32,
            sync: rep.sync.to_string(),
            sync_bytes_per_request: router.sync_bytes() as f64 / self.reqs.len().max(1) as f64,
            races: RaceCounts {
                stall_exclusions: router.stall_exclusions(),
                ..self.race.counts
            }
            .into(),
            collision_repair_margin: self.repair.as_ref().map(|rp| rp.margin()),
            collision_repairs: self.repair.map_or(0, |rp| rp.moves),
            crashes: self.crashes.counts,
            outcomes,
        }
    }
}
