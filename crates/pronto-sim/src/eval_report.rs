//! Results of an evaluator run: the per-policy report, JSON and a plain-text table.

use serde::Serialize;

/// What one policy achieved on one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// Policy name.
    pub policy: String,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests that finished with output.
    pub completed: u64,
    /// Mean time to first token, ms.
    pub ttft_mean_ms: f64,
    /// Median TTFT, ms.
    pub ttft_p50_ms: f64,
    /// 90th percentile TTFT, ms.
    pub ttft_p90_ms: f64,
    /// 99th percentile TTFT, ms.
    pub ttft_p99_ms: f64,
    /// Mean time to first answer token (after the model's reasoning; = TTFT without), ms.
    pub ttfa_mean_ms: f64,
    /// 99th percentile TTFA, ms.
    pub ttfa_p99_ms: f64,
    /// Mean reasoning tokens per request that got its first token.
    pub reasoning_tokens_mean: f64,
    /// Median time per output token after the first, ms (requests with ≥ 2 output tokens).
    pub tpot_p50_ms: f64,
    /// 90th percentile TPOT, ms.
    pub tpot_p90_ms: f64,
    /// 99th percentile TPOT, ms.
    pub tpot_p99_ms: f64,
    /// The TTFT objective goodput is counted against, ms (`None`: none).
    pub ttft_slo_ms: Option<f64>,
    /// The TPOT objective goodput is counted against, ms (`None`: none).
    pub tpot_slo_ms: Option<f64>,
    /// Share of requests that met both objectives ([`pronto_core::slo`]).
    pub goodput_requests: f64,
    /// Share of output tokens from requests that met both objectives.
    pub goodput_tokens: f64,
    /// Mean end-to-end latency, ms.
    pub e2e_mean_ms: f64,
    /// 99th percentile end-to-end latency, ms.
    pub e2e_p99_ms: f64,
    /// Completed requests / (last finish − first arrival).
    pub throughput_rps: f64,
    /// Prompt tokens served from prefix caches / prompt tokens.
    pub prefix_hit_rate: f64,
    /// Requests per backend, `(name, count)` in pool order.
    pub per_backend: Vec<(String, u64)>,
    /// Requests the policy refused (no eligible backend).
    pub shed: u64,
    /// Requests an engine rejected as too large for its KV cache.
    pub rejected: u64,
    /// Preemptions across the fleet.
    pub preemptions: u64,
    /// Router replicas the requests were spread across (1: one router).
    pub replicas: u32,
    /// How they synced (`off`, or the delay of every message).
    pub sync: String,
    /// Sync bytes the replicas published per request (the gateway's wire format; 0 unsynced).
    pub sync_bytes_per_request: f64,
    /// The races before the first token and the stalls (flattened into the JSON).
    #[serde(flatten)]
    pub races: RaceReport,
    /// Collision repair's margin, when it was on (`--collision-repair`).
    pub collision_repair_margin: Option<f64>,
    /// Requests collision repair moved to another backend.
    pub collision_repairs: u64,
    /// What the fleet file's crash faults did.
    pub crashes: crate::evaluate::CrashCounts,
    /// Every request's outcome, in trace order (written by `--requests-csv`).
    #[serde(skip)]
    pub outcomes: Vec<RequestOutcome>,
}

/// What the races of a run did (`--first-token-deadline`, `--hedge`) and the stall fault held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RaceReport {
    /// Second copies sent at a missed first-token deadline.
    pub failovers: u64,
    /// Failovers the second copy won.
    pub failovers_won: u64,
    /// Hedges sent.
    pub hedges: u64,
    /// Hedges the second copy won.
    pub hedges_won: u64,
    /// First tokens a stall fault held (copies).
    pub stalled: u64,
    /// Prompt tokens the engines prefilled for copies that lost a race and were aborted.
    pub extra_prefill_tokens: u64,
    /// `extra_prefill_tokens` / the uncached prompt tokens of the relayed first tokens.
    pub extra_prefill: f64,
    /// Times a backend was taken out of routing for making no progress (a wedge fault).
    pub stall_exclusions: u64,
}

impl From<crate::evaluate::RaceCounts> for RaceReport {
    fn from(c: crate::evaluate::RaceCounts) -> RaceReport {
        RaceReport {
            failovers: c.failovers,
            failovers_won: c.failovers_won,
            hedges: c.hedges,
            hedges_won: c.hedges_won,
            stalled: c.stalled,
            stall_exclusions: c.stall_exclusions,
            extra_prefill_tokens: c.extra_prefill_tokens,
            extra_prefill: if c.relayed_prefill_tokens > 0 {
                c.extra_prefill_tokens as f64 / c.relayed_prefill_tokens as f64
            } else {
                0.0
            },
        }
    }
}

/// What happened to one request of an evaluator run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestOutcome {
    /// Arrival, virtual seconds.
    pub arrival_s: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Backend index in fleet order; `None` when shed.
    pub backend: Option<usize>,
    /// The policy's predicted TTFT, when it made one.
    pub predicted_ttft_s: Option<f64>,
    /// Why the policy chose the backend (`None` for the oracle or a shed request).
    pub reason: Option<pronto_core::routing::Reason>,
    /// Prompt tokens the engine found in its prefix cache.
    pub cached_tokens: u32,
    /// Time to first token; `None` when shed or rejected.
    pub ttft_s: Option<f64>,
    /// Time to first answer token (after the reasoning); `None` when it never came.
    pub ttfa_s: Option<f64>,
    /// Time per output token after the first; `None` with fewer than 2 output tokens.
    pub tpot_s: Option<f64>,
    /// Output tokens the request asked for (the trace's).
    pub output_tokens: u32,
    /// Whether it finished with output.
    pub completed: bool,
}

/// TPOT percentiles (p50, p90, p99, ms) and goodput against `slo` of a run's outcomes.
pub fn tpot_and_goodput(
    outcomes: &[RequestOutcome],
    slo: &pronto_core::slo::SloTargets,
) -> ([f64; 3], pronto_core::slo::Goodput) {
    let mut tpot: Vec<f64> = outcomes.iter().filter_map(|o| o.tpot_s).collect();
    tpot.sort_by(f64::total_cmp);
    let mut g = pronto_core::slo::Goodput::default();
    for o in outcomes {
        let outcome = o.ttft_s.filter(|_| o.completed).map(|t| (t, o.tpot_s));
        g.add(slo, o.output_tokens, outcome);
    }
    let ms = |q| percentile(&tpot, q) * 1e3;
    ([ms(0.5), ms(0.9), ms(0.99)], g)
}

/// A header and one line per request:
/// `id,arrival_s,prompt_tokens,backend,predicted_ttft_s,cached_tokens,ttft_s,reason,tpot_s`
/// (empty fields where there is no value).
pub fn outcomes_csv(run: &RunReport) -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "id,arrival_s,prompt_tokens,backend,predicted_ttft_s,cached_tokens,ttft_s,reason,tpot_s\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
    for (i, o) in run.outcomes.iter().enumerate() {
        let backend = o
            .backend
            .and_then(|b| run.per_backend.get(b))
            .map_or("", |(n, _)| n.as_str());
        let _ = writeln!(
            out,
            "{i},{:.6},{},{backend},{},{},{},{},{}",
            o.arrival_s,
            o.prompt_tokens,
            opt(o.predicted_ttft_s),
            o.cached_tokens,
            opt(o.ttft_s),
            o.reason.map_or("", |r| r.as_str()),
            opt(o.tpot_s)
        );
    }
    out
}

/// Nearest-rank percentile of sorted values (`q` in 0..=1); 0 when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `{"capacity_rps": .., "runs": [..]}` with `per_backend` as `[{"name", "requests"}]`.
pub fn to_json(runs: &[RunReport], capacity_rps: Option<f64>) -> String {
    let runs: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).expect("report serialises");
            v["per_backend"] = r
                .per_backend
                .iter()
                .map(|(name, n)| serde_json::json!({ "name": name, "requests": n }))
                .collect();
            v
        })
        .collect();
    serde_json::json!({ "capacity_rps": capacity_rps, "runs": runs }).to_string()
}

/// A fixed-width table, one row per policy; with TTFA columns when a run's model reasoned, and
/// race columns when a run raced or stalled.
pub fn table(runs: &[RunReport]) -> String {
    let mut s = table_without_ttfa(runs);
    if runs.iter().any(|r| r.races != RaceReport::default()) {
        s += &format!(
            "\n{:<16} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9}\n",
            "policy", "stalled", "failovers", "(won)", "hedges", "(won)", "extra%"
        );
        for r in runs {
            let c = &r.races;
            s += &format!(
                "{:<16} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9.1}\n",
                r.policy,
                c.stalled,
                c.failovers,
                c.failovers_won,
                c.hedges,
                c.hedges_won,
                c.extra_prefill * 100.0
            );
        }
    }
    if runs.iter().any(|r| r.crashes.crashes > 0) {
        s += &format!(
            "\n{:<16} {:>8} {:>6} {:>8} {:>10} {:>7} {:>10}\n",
            "policy", "crashes", "cut", "retries", "migrations", "errors", "reprefill%"
        );
        for r in runs {
            let c = &r.crashes;
            s += &format!(
                "{:<16} {:>8} {:>6} {:>8} {:>10} {:>7} {:>10.2}\n",
                r.policy,
                c.crashes,
                c.cut,
                c.retries,
                c.migrations,
                c.errors,
                c.reprefill_tokens as f64 * 100.0 / c.prompt_tokens.max(1) as f64
            );
        }
    }
    if runs.iter().any(|r| r.races.stall_exclusions > 0) {
        // A wedge fault: how often the progress rule took a backend out (health.stall).
        s += &format!("\n{:<16} {:>16}\n", "policy", "stall_exclusions");
        for r in runs {
            s += &format!("{:<16} {:>16}\n", r.policy, r.races.stall_exclusions);
        }
    }
    if runs.iter().any(|r| r.reasoning_tokens_mean > 0.0) {
        s += &format!(
            "\n{:<16} {:>9} {:>9} {:>10}\n",
            "policy", "ttfa_mean", "ttfa_p99", "reasoning"
        );
        for r in runs {
            s += &format!(
                "{:<16} {:>9.1} {:>9.1} {:>10.0}\n",
                r.policy, r.ttfa_mean_ms, r.ttfa_p99_ms, r.reasoning_tokens_mean
            );
        }
    }
    s
}

/// What the table's columns mean, and what the oracle is when a run used it.
pub fn legend(runs: &[RunReport]) -> String {
    let mut s = String::from(
        "\nLegend: ttft_* time to first token and tpot_* time per output token (ms; mean, \
         percentiles); good% / goodt% the share of requests / of output tokens within the TTFT \
         and TPOT objectives (--ttft-slo, --tpot-slo); e2e_* request latency (ms); req/s \
         completed requests per second of virtual time; hit% prompt tokens served from the \
         engines' prefix caches; shed requests no backend could take; preempt sequences the \
         engines preempted; per-backend requests sent to each backend, in fleet order.\n",
    );
    if runs.iter().any(|r| r.policy.starts_with("oracle")) {
        s += "oracle: a reference, not a gateway policy. For each request it clones every \
              engine, adds the request and runs the clone to the request's first token (to its \
              first answer token with --objective ttfa), and picks the soonest: it knows the \
              engines' true state, so it bounds what routing on live signals can reach for that \
              request. It is greedy, request by request, not a global optimum.\n";
    }
    s
}

fn table_without_ttfa(runs: &[RunReport]) -> String {
    let mut s = format!(
        "{:<16} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6} {:>9} {:>9} {:>7} {:>6} {:>5} {:>6}  per-backend\n",
        "policy",
        "ttft_mean",
        "ttft_p50",
        "ttft_p90",
        "ttft_p99",
        "tpot_p50",
        "tpot_p99",
        "good%",
        "goodt%",
        "e2e_mean",
        "e2e_p99",
        "req/s",
        "hit%",
        "shed",
        "preempt"
    );
    for r in runs {
        let per: Vec<String> = r.per_backend.iter().map(|(_, n)| n.to_string()).collect();
        s += &format!(
            "{:<16} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>8.1} {:>6.1} {:>6.1} {:>9.1} {:>9.1} {:>7.2} {:>6.1} {:>5} {:>6}  {}\n",
            r.policy,
            r.ttft_mean_ms,
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            r.ttft_p99_ms,
            r.tpot_p50_ms,
            r.tpot_p99_ms,
            r.goodput_requests * 100.0,
            r.goodput_tokens * 100.0,
            r.e2e_mean_ms,
            r.e2e_p99_ms,
            r.throughput_rps,
            r.prefix_hit_rate * 100.0,
            r.shed,
            r.preemptions,
            per.join("/")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn goodput_counts_every_request_and_tpot_only_multi_token_ones() {
        let o = |ttft_s: Option<f64>, tpot_s: Option<f64>, completed| RequestOutcome {
            arrival_s: 0.0,
            prompt_tokens: 10,
            backend: Some(0),
            predicted_ttft_s: None,
            reason: None,
            cached_tokens: 0,
            ttft_s,
            ttfa_s: ttft_s,
            tpot_s,
            output_tokens: 100,
            completed,
        };
        let runs = [
            o(Some(0.5), Some(0.02), true),  // met
            o(Some(0.5), Some(0.09), true),  // slow decode
            o(Some(3.0), Some(0.01), true),  // late
            o(Some(0.1), None, true),        // one token: met
            o(None, None, false),            // shed
            o(Some(0.1), Some(0.01), false), // rejected after a token: not met
        ];
        let slo = pronto_core::slo::SloTargets {
            ttft_s: Some(1.0),
            tpot_s: Some(0.05),
        };
        let ([p50, _, p99], g) = tpot_and_goodput(&runs, &slo);
        assert_eq!((g.requests, g.met_requests), (6, 2));
        assert_eq!((g.tokens, g.met_tokens), (600, 200));
        assert!(
            (p50 - 10.0).abs() < 1e-9 && (p99 - 90.0).abs() < 1e-9,
            "{p50} {p99}"
        );
    }

    #[test]
    fn json_has_the_documented_fields() {
        let r = RunReport {
            policy: "round_robin".into(),
            requests: 2,
            completed: 2,
            ttft_mean_ms: 1.0,
            ttft_p50_ms: 1.0,
            ttft_p90_ms: 1.0,
            ttft_p99_ms: 1.0,
            ttfa_mean_ms: 1.0,
            ttfa_p99_ms: 1.0,
            reasoning_tokens_mean: 0.0,
            tpot_p50_ms: 1.0,
            tpot_p90_ms: 1.0,
            tpot_p99_ms: 1.0,
            ttft_slo_ms: Some(1000.0),
            tpot_slo_ms: None,
            goodput_requests: 1.0,
            goodput_tokens: 1.0,
            e2e_mean_ms: 2.0,
            e2e_p99_ms: 2.0,
            throughput_rps: 1.0,
            prefix_hit_rate: 0.5,
            per_backend: vec![("a".into(), 2)],
            shed: 0,
            rejected: 0,
            preemptions: 0,
            replicas: 1,
            sync: "off".into(),
            sync_bytes_per_request: 0.0,
            races: RaceReport::default(),
            crashes: Default::default(),
            collision_repair_margin: None,
            collision_repairs: 0,
            outcomes: vec![],
        };
        // The legend names every column of the table, and the oracle only when it ran.
        let text = legend(std::slice::from_ref(&r));
        for col in [
            "ttft_", "tpot_", "good%", "goodt%", "e2e_", "req/s", "hit%", "shed", "preempt",
        ] {
            assert!(text.contains(col), "{col}: {text}");
        }
        assert!(!text.contains("oracle"));
        let oracle = RunReport {
            policy: "oracle".into(),
            ..r.clone()
        };
        assert!(legend(&[r.clone(), oracle]).contains("oracle: a reference, not a gateway policy"));
        let v: serde_json::Value =
            serde_json::from_str(&to_json(std::slice::from_ref(&r), None)).unwrap();
        let run = &v["runs"][0];
        for k in [
            "policy",
            "ttft_mean_ms",
            "ttft_p50_ms",
            "ttft_p90_ms",
            "ttft_p99_ms",
            "ttfa_mean_ms",
            "ttfa_p99_ms",
            "reasoning_tokens_mean",
            "tpot_p50_ms",
            "tpot_p99_ms",
            "goodput_requests",
            "goodput_tokens",
            "ttft_slo_ms",
            "e2e_mean_ms",
            "throughput_rps",
            "prefix_hit_rate",
            "shed",
            "failovers",
            "failovers_won",
            "hedges",
            "hedges_won",
            "extra_prefill",
            "stall_exclusions",
        ] {
            assert!(run.get(k).is_some(), "missing {k}");
        }
        assert_eq!(run["per_backend"][0]["requests"], 2);
        assert!(table(&[r]).contains("round_robin"));
    }
}
