//! `GET /metrics` of one simulated backend, with vLLM's metric names.
//!
//! Each backend owns a Prometheus [`Registry`]; every series carries the constant labels
//! `model_name` and `engine="0"`, as vLLM's do. The engine task publishes its
//! [`EngineStats`] after each step and each batch of commands ([`BackendMetrics::publish`]):
//! gauges are set, and the engine's cumulative counters are turned into counter increments (an
//! engine whose counters went backwards — restarted — is treated as counting from zero again).
//! TTFT is observed by the response side in wall time as the client sees it (from the request
//! reaching the handler to its first token chunk), with vLLM's buckets.
//!
//! Simulator-only series: `sim_lag_seconds_total` (how far the engine task fell behind real
//! time), `sim_aborted_requests_total` (client hang-ups that aborted a request in the engine),
//! `sim_injected_errors_total` (answers failed by the `error_rate` fault), `sim_crashes_total`,
//! `sim_cancelled_requests_total` (responses dropped by the client before their last token —
//! a gateway cancelling a failover or hedge loser — whether or not the engine was still
//! generating) and `sim_stalled_requests_total` (first tokens held back by the stall fault).

use prometheus::{
    Counter, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::engine::EngineStats;

/// vLLM's `time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// The metric families of one backend.
pub(crate) struct BackendMetrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    kv_usage: Gauge,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    preemptions: IntCounter,
    /// TTFT as the client sees it, seconds.
    pub ttft: Histogram,
    /// Seconds the engine task fell behind real time.
    pub lag: Counter,
    /// Requests aborted in the engine because the client went away.
    pub aborted: IntCounter,
    /// Requests failed by the `error_rate` fault.
    pub injected_errors: IntCounter,
    /// Responses dropped by the client before their last token.
    pub cancelled: IntCounter,
    /// First tokens held back by the stall fault.
    pub stalled: IntCounter,
    /// Crashes (run-time `crash()` calls and scheduled ones).
    pub crashes: IntCounter,
}

/// Last published engine counters, kept by the engine task to compute increments.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Published(EngineStats);

fn delta(counter: &IntCounter, now: u64, before: u64) {
    // A counter that went backwards was reset (engine restarted): count from zero.
    let d = if now >= before { now - before } else { now };
    if d > 0 {
        counter.inc_by(d);
    }
}

impl BackendMetrics {
    /// Register every family for a backend serving `model` with the given KV geometry.
    pub fn new(model: &str, block_size: usize, num_gpu_blocks: usize) -> BackendMetrics {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .const_label("model_name", model)
                .const_label("engine", "0")
        };
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("metric definition is valid");
                registry
                    .register(Box::new(m.clone()))
                    .expect("metric names are unique");
                m
            }};
        }
        let running = reg!(IntGauge::with_opts(opts(
            "vllm:num_requests_running",
            "Number of requests in the running batch."
        )));
        let waiting = reg!(IntGauge::with_opts(opts(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be scheduled."
        )));
        let kv_usage = reg!(Gauge::with_opts(opts(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: referenced blocks / total blocks (0-1)."
        )));
        let prefix_queries = reg!(IntCounter::with_opts(opts(
            "vllm:prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache."
        )));
        let prefix_hits = reg!(IntCounter::with_opts(opts(
            "vllm:prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache."
        )));
        let prompt_tokens = reg!(IntCounter::with_opts(opts(
            "vllm:prompt_tokens_total",
            "Prompt tokens processed."
        )));
        let generation_tokens = reg!(IntCounter::with_opts(opts(
            "vllm:generation_tokens_total",
            "Output tokens generated."
        )));
        let preemptions = reg!(IntCounter::with_opts(opts(
            "vllm:num_preemptions_total",
            "Requests preempted (recomputed) for lack of KV blocks."
        )));
        let ttft = reg!(Histogram::with_opts(
            HistogramOpts::new(
                "vllm:time_to_first_token_seconds",
                "Time to first token as the client sees it, seconds (wall time)."
            )
            .const_label("model_name", model)
            .const_label("engine", "0")
            .buckets(TTFT_BUCKETS.to_vec())
        ));
        let info = reg!(IntGauge::with_opts(
            opts("vllm:cache_config_info", "KV-cache configuration.")
                .const_label("block_size", block_size.to_string())
                .const_label("num_gpu_blocks", num_gpu_blocks.to_string())
        ));
        info.set(1);
        let lag = reg!(Counter::with_opts(opts(
            "sim_lag_seconds_total",
            "Seconds the simulated engine fell behind real time."
        )));
        let aborted = reg!(IntCounter::with_opts(opts(
            "sim_aborted_requests_total",
            "Requests aborted in the engine because the client went away."
        )));
        let cancelled = reg!(IntCounter::with_opts(opts(
            "sim_cancelled_requests_total",
            "Responses the client dropped before their last token."
        )));
        let stalled = reg!(IntCounter::with_opts(opts(
            "sim_stalled_requests_total",
            "First tokens held back by the stall_first_token fault."
        )));
        let injected_errors = reg!(IntCounter::with_opts(opts(
            "sim_injected_errors_total",
            "Requests answered 500 by the error_rate fault."
        )));
        let crashes = reg!(IntCounter::with_opts(opts(
            "sim_crashes_total",
            "Simulated crashes."
        )));
        BackendMetrics {
            registry,
            running,
            waiting,
            kv_usage,
            prefix_queries,
            prefix_hits,
            prompt_tokens,
            generation_tokens,
            preemptions,
            ttft,
            lag,
            aborted,
            injected_errors,
            cancelled,
            stalled,
            crashes,
        }
    }

    /// Publish the engine's current stats; `last` holds what was published before.
    pub fn publish(&self, stats: &EngineStats, last: &mut Published) {
        self.running.set(stats.running as i64);
        self.waiting.set(stats.waiting as i64);
        self.kv_usage.set(stats.kv_usage);
        let b = &last.0;
        delta(
            &self.prefix_queries,
            stats.prefix_queries_tokens,
            b.prefix_queries_tokens,
        );
        delta(
            &self.prefix_hits,
            stats.prefix_hits_tokens,
            b.prefix_hits_tokens,
        );
        delta(
            &self.prompt_tokens,
            stats.prompt_tokens_total,
            b.prompt_tokens_total,
        );
        delta(
            &self.generation_tokens,
            stats.generation_tokens_total,
            b.generation_tokens_total,
        );
        delta(
            &self.preemptions,
            stats.preemptions_total,
            b.preemptions_total,
        );
        last.0 = *stats;
    }

    /// Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encoding to a Vec cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_engine_totals_across_a_reset() {
        let m = BackendMetrics::new("m", 16, 100);
        let mut last = Published::default();
        let mut s = EngineStats {
            running: 2,
            waiting: 1,
            kv_usage: 0.5,
            prompt_tokens_total: 100,
            ..EngineStats::default()
        };
        m.publish(&s, &mut last);
        s.prompt_tokens_total = 150;
        m.publish(&s, &mut last);
        assert_eq!(m.prompt_tokens.get(), 150);
        // Engine restarted: its total counts from zero again.
        s.prompt_tokens_total = 20;
        m.publish(&s, &mut last);
        assert_eq!(m.prompt_tokens.get(), 170);
        assert_eq!(m.running.get(), 2);
        let text = m.render();
        assert!(text.contains("vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 170"));
        assert!(text.contains("block_size=\"16\""));
        assert!(text.contains("num_gpu_blocks=\"100\""));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket"));
    }
}
