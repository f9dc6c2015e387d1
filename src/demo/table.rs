//! The demo's side-by-side table: one row per policy, TTFT mean / p50 / p99, the ratios to the
//! baseline policy, and each backend's share of the requests; then a legend that explains
//! every column. Pure formatting over [`Summary`]s, so it is tested without a fleet.

use std::fmt::Write;

use pronto_bench::Summary;

/// One policy's run, as the table needs it.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// Policy name (`round_robin`, `predicted_ttft`, ...).
    pub policy: String,
    /// The run's summary (requests, errors, TTFT percentiles, requests per backend).
    pub summary: Summary,
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.0}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "-".into(),
    }
}

/// Percent of `n` in `total`, `-` for an empty run.
fn share(n: usize, total: usize) -> String {
    if total == 0 {
        "-".into()
    } else {
        format!("{:.0}%", 100.0 * n as f64 / total as f64)
    }
}

/// The table, aligned for a terminal: a header line, a rule, one line per run in the order
/// given. `backends` are the share columns, in pool order; `baseline` names the run the ratio
/// columns divide by (no ratio columns when it is `None` or not among the runs).
pub fn table(runs: &[PolicyRun], backends: &[String], baseline: Option<&str>) -> String {
    let base = baseline.and_then(|b| runs.iter().find(|r| r.policy == b));
    let mut head: Vec<String> = ["policy", "requests", "errors", "TTFT mean", "p50", "p99"]
        .map(String::from)
        .to_vec();
    if let Some(b) = base {
        head.push(format!("mean vs {}", b.policy));
        head.push(format!("p99 vs {}", b.policy));
    }
    head.extend(backends.iter().cloned());
    let mut rows = vec![head];
    for r in runs {
        let s = &r.summary;
        let mut row = vec![
            r.policy.clone(),
            s.requests.to_string(),
            s.errors.to_string(),
            ms(s.ttft_mean_ms),
            ms(s.ttft_p50_ms),
            ms(s.ttft_p99_ms),
        ];
        if let Some(b) = base {
            row.push(ratio(s.ttft_mean_ms, b.summary.ttft_mean_ms));
            row.push(ratio(s.ttft_p99_ms, b.summary.ttft_p99_ms));
        }
        for name in backends {
            row.push(share(
                s.backends.get(name).copied().unwrap_or(0),
                s.requests,
            ));
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 {
                let _ = write!(line, "{cell}{}", " ".repeat(pad));
            } else {
                let _ = write!(line, "  {}{cell}", " ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
        if i == 0 {
            let width: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(width));
            out.push('\n');
        }
    }
    out
}

/// What each column means. `time_scale` is the fleet's step-time multiplier (the TTFTs are
/// the client's wall-clock times on that fleet); `baseline` as for [`table`].
pub fn legend(time_scale: f64, backends: &[String], baseline: Option<&str>) -> String {
    let mut items: Vec<(String, String)> = Vec::new();
    let mut item = |name: &str, text: &str| items.push((name.to_string(), text.to_string()));
    item(
        "policy",
        "the gateway's routing policy for the run (config `pools.<model>.policy`)",
    );
    item(
        "requests",
        "requests sent: the same seeded workload, at the same times, in every run",
    );
    item(
        "errors",
        "requests that failed (non-2xx answer, broken or empty stream)",
    );
    let clock = if time_scale == 1.0 {
        "the fleet runs at the modelled GPUs' speed".to_string()
    } else {
        format!(
            "the fleet's steps take {time_scale}× their modelled time (--time-scale), so \
             every time is that fraction of what those GPUs would give"
        )
    };
    item(
        "TTFT mean",
        &format!(
            "time to first token as the client measured it, ms (mean over successful \
             requests); {clock}"
        ),
    );
    item(
        "p50, p99",
        "the median and 99th-percentile TTFT, ms: p99 is the queueing tail",
    );
    if let Some(b) = baseline {
        item(
            &format!("… vs {b}"),
            &format!("this run's TTFT mean / p99 divided by {b}'s (below 1× = faster)"),
        );
    }
    if let (Some(first), Some(last)) = (backends.first(), backends.last()) {
        item(
            &format!("{first} … {last}"),
            "share of the run's requests each backend served (h100: fast prefill, a100: \
             about 3× slower prefill)",
        );
    }
    let width = items
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let mut s = String::from("Legend:\n");
    for (name, text) in &items {
        let pad = width - name.chars().count();
        let _ = writeln!(s, "  {name}{}  {text}", " ".repeat(pad));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use pronto_bench::RequestRecord;

    fn run(policy: &str, ttfts: &[f64], backends: &[&str]) -> PolicyRun {
        let records: Vec<RequestRecord> = ttfts
            .iter()
            .zip(backends.iter().cycle())
            .enumerate()
            .map(|(i, (&t, b))| RequestRecord {
                index: i as u64,
                ttft_ms: Some(t),
                backend: Some(b.to_string()),
                ..RequestRecord::default()
            })
            .collect();
        PolicyRun {
            policy: policy.into(),
            summary: Summary::of(&records),
        }
    }

    #[test]
    fn rows_align_and_shares_and_ratios_follow_the_summaries() {
        let names: Vec<String> = ["h100-a", "a100-a"].map(String::from).to_vec();
        let runs = [
            run("round_robin", &[100.0, 300.0], &["h100-a", "a100-a"]),
            run("predicted_ttft", &[50.0, 100.0, 150.0, 100.0], &["h100-a"]),
        ];
        let t = table(&runs, &names, Some("round_robin"));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("policy"), "{t}");
        assert!(lines[0].contains("mean vs round_robin") && lines[0].ends_with("a100-a"));
        assert!(lines[1].chars().all(|c| c == '-'));
        // Every line ends in the same column: right-aligned cells.
        let width = lines[1].chars().count();
        for l in &lines {
            assert_eq!(l.chars().count(), width, "{l:?}");
        }
        let rr: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            rr,
            [
                "round_robin",
                "2",
                "0",
                "200",
                "100",
                "300",
                "1.00×",
                "1.00×",
                "50%",
                "50%"
            ]
        );
        let p: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            p,
            [
                "predicted_ttft",
                "4",
                "0",
                "100",
                "100",
                "150",
                "0.50×",
                "0.50×",
                "100%",
                "0%"
            ]
        );
    }

    #[test]
    fn no_baseline_no_ratio_columns_and_an_empty_run_prints_dashes() {
        let names = vec!["b".to_string()];
        let runs = [run("random", &[], &["b"])];
        let t = table(&runs, &names, Some("round_robin"));
        assert!(!t.contains(" vs "), "{t}");
        let cells: Vec<&str> = t.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(cells, ["random", "0", "0", "-", "-", "-", "-"]);
    }

    #[test]
    fn the_legend_names_every_column() {
        let names: Vec<String> = ["h100-a", "a100-b"].map(String::from).to_vec();
        let l = legend(0.25, &names, Some("round_robin"));
        for col in [
            "policy",
            "requests",
            "errors",
            "TTFT mean",
            "p50, p99",
            "… vs round_robin",
            "h100-a … a100-b",
        ] {
            assert!(
                l.lines().any(|line| line.trim_start().starts_with(col)),
                "{col}: {l}"
            );
        }
        assert!(l.contains("0.25× their modelled time"), "{l}");
        // The explanations start in one column: the one after `policy`'s padding.
        let lines: Vec<Vec<char>> = l.lines().skip(1).map(|x| x.chars().collect()).collect();
        let col = 2 + "policy".len() + lines[0][8..].iter().take_while(|c| **c == ' ').count();
        for line in &lines {
            assert!(line[col - 1] == ' ' && line[col] != ' ', "{l}");
        }
        assert!(!legend(1.0, &names, None).contains(" vs "));
    }
}
