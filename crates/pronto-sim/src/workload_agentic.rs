//! A seeded agentic workload: multi-turn tool-using sessions.
//!
//! Each session is an agent loop. Its first prompt is one of a few long *tool prompts* (the
//! system prompt with every tool's schema, shared by all sessions of that agent, thousands of
//! tokens) followed by the session's task; each later turn appends the model's previous answer
//! (a tool call) and the tool's result (one to a few 512-token blocks), so the prompt grows by
//! what the last turn added and every turn re-sends the whole history. Between turns the agent
//! waits for its tool (exponential think time); sessions start as a Poisson process. Output is
//! short (a tool call) except at the last turn (the answer).
//!
//! What it stresses: very high prefix reuse (tool prompt across sessions, history within one),
//! long prompts with short outputs — where a router that keeps a session on the backend that
//! holds its history saves most of the prefill, and one that piles every session of an agent
//! onto one backend builds a hot spot.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::workload::{normalise, TraceRequest, TRACE_BLOCK_TOKENS};

/// Parameters of the agentic workload (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct AgenticWorkload {
    /// RNG seed.
    pub seed: u64,
    /// Sessions to generate.
    pub sessions: usize,
    /// Session starts per second.
    pub rate_per_s: f64,
    /// Distinct agents, each with its own tool prompt.
    pub agents: usize,
    /// 512-token blocks of each tool prompt.
    pub tool_prompt_blocks: usize,
    /// Turns per session are uniform in this range.
    pub turns: (usize, usize),
    /// 512-token blocks a tool result appends, uniform in this range.
    pub result_blocks: (usize, usize),
    /// Mean seconds between a session's turns (the tool running).
    pub think_time_s: f64,
    /// Output tokens of a tool-calling turn, uniform in this range.
    pub call_tokens: (u32, u32),
    /// Output tokens of a session's last turn (its answer), uniform in this range.
    pub answer_tokens: (u32, u32),
}

impl Default for AgenticWorkload {
    fn default() -> Self {
        AgenticWorkload {
            seed: 1,
            sessions: 300,
            rate_per_s: 1.0,
            agents: 3,
            tool_prompt_blocks: 12,
            turns: (3, 10),
            result_blocks: (1, 3),
            think_time_s: 2.0,
            call_tokens: (16, 96),
            answer_tokens: (128, 512),
        }
    }
}

impl AgenticWorkload {
    /// Generate the requests, sorted by arrival.
    pub fn generate(&self) -> Vec<TraceRequest> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let exp = |rng: &mut SmallRng, mean: f64| -mean * (1.0 - rng.gen::<f64>()).ln();
        let range =
            |rng: &mut SmallRng, (lo, hi): (usize, usize)| rng.gen_range(lo.min(hi)..=hi.max(lo));
        let range32 =
            |rng: &mut SmallRng, (lo, hi): (u32, u32)| rng.gen_range(lo.min(hi)..=hi.max(lo));
        let mut out = Vec::new();
        let mut start = 0.0;
        // Block ids: tool prompts below 10⁶ (agent × 1000 + k), the rest unique per seed.
        let mut next_block = 2_000_000u64 + (self.seed % 1000) * 1_000_000_000;
        for s in 0..self.sessions {
            start += exp(&mut rng, 1.0 / self.rate_per_s.max(1e-9));
            let agent = rng.gen_range(0..self.agents.max(1)) as u64;
            let mut ids: Vec<u64> = (0..self.tool_prompt_blocks as u64)
                .map(|k| agent * 1000 + k)
                .collect();
            // The task.
            ids.push(next_block);
            next_block += 1;
            let turns = range(&mut rng, self.turns).max(1);
            let mut t = start;
            for turn in 0..turns {
                if turn > 0 {
                    // The previous tool call and its result.
                    for _ in 0..range(&mut rng, self.result_blocks).max(1) {
                        ids.push(next_block);
                        next_block += 1;
                    }
                }
                let partial = rng.gen_range(64..=TRACE_BLOCK_TOKENS) as u32;
                let input = (ids.len() as u32 - 1) * TRACE_BLOCK_TOKENS as u32 + partial;
                let output = if turn + 1 == turns {
                    range32(&mut rng, self.answer_tokens)
                } else {
                    range32(&mut rng, self.call_tokens)
                };
                out.push(TraceRequest {
                    arrival_s: t,
                    input_tokens: input,
                    output_tokens: output.max(1),
                    hash_ids: ids.clone(),
                    block_tokens: TRACE_BLOCK_TOKENS as u32,
                    session: Some(s as u64),
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
    fn sessions_share_tool_prompts_and_grow_their_history() {
        let w = AgenticWorkload {
            sessions: 40,
            ..AgenticWorkload::default()
        };
        let reqs = w.generate();
        assert_eq!(reqs, w.generate(), "seeded");
        assert_ne!(
            reqs,
            AgenticWorkload {
                seed: 2,
                ..w.clone()
            }
            .generate()
        );
        assert!(reqs.windows(2).all(|p| p[0].arrival_s <= p[1].arrival_s));
        let turns = |s| reqs.iter().filter(|r| r.session == Some(s)).count();
        assert!((0..40).all(|s| (3..=10).contains(&turns(s))));
        for s in 0..40u64 {
            let mine: Vec<&TraceRequest> = reqs.iter().filter(|r| r.session == Some(s)).collect();
            // The tool prompt leads every turn; each turn extends the previous one's prompt.
            assert!(mine
                .iter()
                .all(|r| r.hash_ids[..12] == mine[0].hash_ids[..12]));
            for p in mine.windows(2) {
                assert!(p[1].hash_ids.starts_with(&p[0].hash_ids));
                assert!(p[1].hash_ids.len() > p[0].hash_ids.len());
                assert!(p[1].input_tokens > p[0].input_tokens);
            }
            let last = mine.last().unwrap();
            assert!(last.output_tokens >= 128, "the answer is long");
            assert!(mine[..mine.len() - 1].iter().all(|r| r.output_tokens <= 96));
        }
        // At most 3 tool prompts across all sessions.
        let mut heads: Vec<u64> = reqs.iter().map(|r| r.hash_ids[0]).collect();
        heads.sort_unstable();
        heads.dedup();
        assert!(heads.len() <= 3 && heads.len() >= 2, "{heads:?}");
    }
}
