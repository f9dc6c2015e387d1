//! `pronto compare-report`: one table and one plot over several replays of the same workload
//! through different routers (the runs `scripts/compare-routers.sh` produces).
//!
//! ## Inputs
//! Each `--run NAME=DIR` names a directory written by `pronto replay` (`results.jsonl`,
//! `summary.json`) plus, optionally, `router.json` written by the script after it stopped the
//! router ([`RouterStats`]: CPU seconds, peak RSS, or why the contender was skipped). The
//! summary is read from `summary.json` when present, else recomputed from `results.jsonl`
//! with [`Summary::of`]; TTFT samples for the plot always come from `results.jsonl`.
//! A run whose `router.json` says `skipped` needs no replay files and becomes a table row that
//! says why. A run with neither is an error: a missing contender must be explained, not hidden.
//!
//! ## Outputs (in `--out`)
//! - `comparison.md`: one table, rows in `--run` order: requests, errors (of which sheds:
//!   429/503 answers), TTFT mean/p50/p90/p99, TPOT p50, cached prompt share, throughput, the
//!   router's CPU seconds and peak RSS; with `--baseline NAME`, TTFT mean and p99 as a ratio
//!   of that run's (`0.70×` = 30 % lower).
//! - `comparison.json`: the same rows, machine-readable ([`ComparisonRow`]).
//! - `ttft_cdf.svg`: every run's TTFT CDF in one plot ([`super::svg::cdf_svg`]).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::report::{RequestRecord, Summary};
use super::svg;

/// HTTP statuses counted as load shedding (rate limited / no capacity).
const SHED_STATUSES: [&str; 2] = ["429", "503"];

/// `pronto compare-report` options.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareReportArgs {
    /// A replay to include, `NAME=DIR` (repeatable; rows keep this order).
    #[arg(long = "run", value_parser = parse_run, required = true)]
    pub runs: Vec<RunSpec>,
    /// Directory for comparison.md, comparison.json and ttft_cdf.svg (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Run whose TTFT mean and p99 the others are divided by (a `--run` NAME).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Heading of comparison.md and the plot's title.
    #[arg(long, default_value = "Router comparison")]
    pub title: String,
    /// A line of context printed under the heading (workload, fleet, machine).
    #[arg(long)]
    pub note: Option<String>,
    /// TTFT objective: with it (or `--tpot-slo`) every run's goodput is recounted from its
    /// `results.jsonl` against these objectives; without both, each run's own (from replay's
    /// `--ttft-slo` / `--tpot-slo`) is shown.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttft_slo: Option<std::time::Duration>,
    /// TPOT objective (see `--ttft-slo`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub tpot_slo: Option<std::time::Duration>,
}

impl CompareReportArgs {
    fn slo(&self) -> pronto_core::slo::SloTargets {
        pronto_core::slo::SloTargets {
            ttft_s: self.ttft_slo.map(|d| d.as_secs_f64()),
            tpot_s: self.tpot_slo.map(|d| d.as_secs_f64()),
        }
    }
}

/// One `--run NAME=DIR`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// Row label.
    pub name: String,
    /// The replay's output directory.
    pub dir: PathBuf,
}

fn parse_run(s: &str) -> Result<RunSpec, String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.trim().is_empty() && !dir.is_empty() => Ok(RunSpec {
            name: name.trim().to_string(),
            dir: PathBuf::from(dir),
        }),
        _ => Err(format!("expected NAME=DIR, got {s:?}")),
    }
}

/// `DIR/router.json`: what the script measured of the router process, or why it did not run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RouterStats {
    /// Router and version, e.g. `sglang-router 0.3.2`.
    #[serde(default)]
    pub router: Option<String>,
    /// Routing policy.
    #[serde(default)]
    pub policy: Option<String>,
    /// User + system CPU seconds of the router process (and its children) from the moment it
    /// answered its first request until the end of the replay (start-up excluded).
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// CPU seconds it spent starting up (before it answered), for reference.
    #[serde(default)]
    pub cpu_startup_s: Option<f64>,
    /// Peak resident set (`VmHWM`), KiB.
    #[serde(default)]
    pub peak_rss_kib: Option<u64>,
    /// Why the contender did not run (not installed, failed to start, ...).
    #[serde(default)]
    pub skipped: Option<String>,
}

/// One row of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonRow {
    /// Row label (`--run` NAME).
    pub name: String,
    /// The replay directory.
    pub dir: PathBuf,
    /// The replay's summary; `None` when skipped.
    pub summary: Option<Summary>,
    /// Answers with status 429 or 503 (included in `summary.errors`).
    pub sheds: usize,
    /// The router's measurements, when `router.json` exists.
    pub router: Option<RouterStats>,
    /// TTFT mean / the baseline's TTFT mean.
    pub ttft_mean_ratio: Option<f64>,
    /// TTFT p99 / the baseline's TTFT p99.
    pub ttft_p99_ratio: Option<f64>,
    /// TTFA p99 / the baseline's TTFA p99 (runs whose summaries have TTFA).
    #[serde(default)]
    pub ttfa_p99_ratio: Option<f64>,
    /// Why there are no numbers (copied from `router.json`).
    pub skipped: Option<String>,
}

/// `comparison.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Heading.
    pub title: String,
    /// Context line.
    pub note: Option<String>,
    /// Name of the baseline run, when one was given.
    pub baseline: Option<String>,
    /// Rows in `--run` order.
    pub rows: Vec<ComparisonRow>,
}

/// A run as loaded: its row and its successful requests' TTFTs (ms).
struct LoadedRun {
    row: ComparisonRow,
    ttft_ms: Vec<f64>,
}

fn load_run(spec: &RunSpec, slo: &pronto_core::slo::SloTargets) -> anyhow::Result<LoadedRun> {
    let router_path = spec.dir.join("router.json");
    let router: Option<RouterStats> = match std::fs::read_to_string(&router_path) {
        Ok(text) => Some(
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not a router.json", router_path.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).context(format!("reading {}", router_path.display())),
    };
    let skipped = router.as_ref().and_then(|r| r.skipped.clone());
    let results_path = spec.dir.join("results.jsonl");
    if skipped.is_some() && !results_path.exists() {
        return Ok(LoadedRun {
            row: ComparisonRow {
                name: spec.name.clone(),
                dir: spec.dir.clone(),
                summary: None,
                sheds: 0,
                router,
                ttft_mean_ratio: None,
                ttft_p99_ratio: None,
                ttfa_p99_ratio: None,
                skipped,
            },
            ttft_ms: Vec::new(),
        });
    }
    let records = read_results(&results_path)
        .with_context(|| format!("run {:?}: reading {}", spec.name, results_path.display()))?;
    let summary_path = spec.dir.join("summary.json");
    let mut summary: Summary = match std::fs::read_to_string(&summary_path) {
        Ok(text) => serde_json::from_str(&text)
            .with_context(|| format!("{}: not a summary.json", summary_path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Summary::of(&records),
        Err(e) => return Err(e).context(format!("reading {}", summary_path.display())),
    };
    if slo.is_set() {
        summary.set_goodput(&records, slo);
    }
    let sheds = shed_count(&summary);
    Ok(LoadedRun {
        row: ComparisonRow {
            name: spec.name.clone(),
            dir: spec.dir.clone(),
            summary: Some(summary),
            sheds,
            router,
            ttft_mean_ratio: None,
            ttft_p99_ratio: None,
            ttfa_p99_ratio: None,
            skipped,
        },
        ttft_ms: records
            .iter()
            .filter(|r| r.ok())
            .filter_map(|r| r.ttft_ms)
            .collect(),
    })
}

/// Parse `results.jsonl` (blank lines ignored; a bad line is an error naming its number).
pub fn read_results(path: &Path) -> anyhow::Result<Vec<RequestRecord>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("line {}: bad record", i + 1))
        })
        .collect()
}

fn shed_count(s: &Summary) -> usize {
    SHED_STATUSES
        .iter()
        .filter_map(|k| s.statuses.get(*k))
        .sum()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Load every run and fill in the baseline ratios. Also returns the TTFT samples per run.
fn build(args: &CompareReportArgs) -> anyhow::Result<(Comparison, Vec<Vec<f64>>)> {
    let slo = args.slo();
    let mut loaded = args
        .runs
        .iter()
        .map(|r| load_run(r, &slo))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(base) = &args.baseline {
        let b = loaded
            .iter()
            .find(|r| &r.row.name == base)
            .with_context(|| format!("--baseline {base:?} is not one of the --run names"))?;
        let (mean, p99, ttfa_p99) = b.row.summary.as_ref().map_or((None, None, None), |s| {
            (s.ttft_mean_ms, s.ttft_p99_ms, s.ttfa_p99_ms)
        });
        for r in &mut loaded {
            if let Some(s) = &r.row.summary {
                r.row.ttft_mean_ratio = ratio(s.ttft_mean_ms, mean);
                r.row.ttft_p99_ratio = ratio(s.ttft_p99_ms, p99);
                r.row.ttfa_p99_ratio = ratio(s.ttfa_p99_ms, ttfa_p99);
            }
        }
    }
    let ttfts = loaded.iter().map(|r| r.ttft_ms.clone()).collect();
    let comparison = Comparison {
        title: args.title.clone(),
        note: args.note.clone(),
        baseline: args.baseline.clone(),
        rows: loaded.into_iter().map(|r| r.row).collect(),
    };
    Ok((comparison, ttfts))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.0}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{:.1}", 100.0 * x))
}

fn times(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.2}×"))
}

impl Comparison {
    /// The markdown table (`comparison.md`).
    pub fn markdown(&self) -> String {
        let mut s = format!("# {}\n\n", self.title);
        if let Some(note) = &self.note {
            s.push_str(&format!("{note}\n\n"));
        }
        let mut head = vec![
            "router",
            "requests",
            "errors (sheds)",
            "TTFT mean",
            "p50",
            "p90",
            "p99",
            "TPOT p50",
            "goodput %",
            "goodput tokens %",
            "cached %",
            "req/s",
            "router CPU s",
            "router peak RSS",
        ];
        // Time to first answer, only when some run's model reasoned (else it equals TTFT).
        let reasoning = self.rows.iter().any(|r| {
            r.summary
                .as_ref()
                .and_then(|s| s.reasoning_tokens_mean)
                .is_some_and(|n| n > 0.0)
        });
        if reasoning {
            head.extend(["TTFA mean", "TTFA p99"]);
        }
        let base = self.baseline.as_deref();
        if base.is_some() {
            head.extend(["mean vs base", "p99 vs base"]);
            if reasoning {
                head.push("TTFA p99 vs base");
            }
        }
        s.push_str(&format!("| {} |\n", head.join(" | ")));
        s.push_str(&format!(
            "| --- |{}\n",
            " ---: |".repeat(head.len().saturating_sub(1))
        ));
        for row in &self.rows {
            let router = row.router.as_ref();
            let cpu = router
                .and_then(|r| r.cpu_s)
                .map_or_else(|| "-".into(), |c| format!("{c:.1}"));
            let rss = router
                .and_then(|r| r.peak_rss_kib)
                .map_or_else(|| "-".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
            let mut cells = match (&row.summary, &row.skipped) {
                (None, reason) => {
                    let why = reason.as_deref().unwrap_or("no results");
                    let mut c = vec![row.name.clone(), format!("skipped: {why}")];
                    c.resize(head.len(), "-".into());
                    c
                }
                (Some(sm), _) => {
                    let mut c = vec![
                        row.name.clone(),
                        sm.requests.to_string(),
                        format!("{} ({})", sm.errors, row.sheds),
                        ms(sm.ttft_mean_ms),
                        ms(sm.ttft_p50_ms),
                        ms(sm.ttft_p90_ms),
                        ms(sm.ttft_p99_ms),
                        sm.tpot_p50_ms
                            .map_or_else(|| "-".into(), |x| format!("{x:.1}")),
                        pct(sm.goodput_requests),
                        pct(sm.goodput_tokens),
                        sm.cached_token_ratio
                            .map_or_else(|| "-".into(), |x| format!("{:.1}", 100.0 * x)),
                        format!("{:.2}", sm.throughput_rps),
                        cpu,
                        rss,
                    ];
                    if reasoning {
                        c.push(ms(sm.ttfa_mean_ms));
                        c.push(ms(sm.ttfa_p99_ms));
                    }
                    c
                }
            };
            if base.is_some() && row.summary.is_some() {
                cells.push(times(row.ttft_mean_ratio));
                cells.push(times(row.ttft_p99_ratio));
                if reasoning {
                    cells.push(times(row.ttfa_p99_ratio));
                }
            }
            s.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        if reasoning {
            s.push_str(
                "\nTTFA: time to the first answer token (content or a tool call, after the \
                 model's reasoning), in ms.",
            );
        }
        s.push_str(
            "\nTTFT and TPOT in ms over successful requests; sheds are 429/503 answers, \
             counted among the errors. Cached %: the engines' prefix-cache hits over prompt \
             tokens, from responses' `usage` (`-` when the engines do not report it). Goodput: \
             the share of requests (and of their output tokens) that succeeded within the TTFT \
             and TPOT objectives (`-` without objectives). Router CPU: seconds of the router process (children \
             included) from ready to the end of the replay, start-up excluded; peak RSS: its \
             VmHWM. Fleet and load generator are not counted.\n",
        );
        if let Some(b) = base {
            s.push_str(&format!("Ratios are to `{b}` (below 1 = faster).\n"));
        }
        s.push_str(
            "\nA fair comparison starts every run from the same engine state: a fresh fleet per \
             run (`scripts/compare-routers.sh` restarts it), or one `pronto replay --target \
             A,B` whose requests alternate between the routers in front of one fleet \
             (interleaved). Back-to-back runs against one live fleet find the caches the \
             previous run warmed.\n",
        );
        if let Some(w) = self.warm_cache_warning() {
            s.push_str(&format!("\n**Warning:** {w}\n"));
        }
        s
    }

    /// A warning when the cached prompt share rises run after run (each at least 1.5× the
    /// one before, over three or more runs): the signature of back-to-back runs against one
    /// fleet whose caches the earlier runs warmed.
    pub fn warm_cache_warning(&self) -> Option<String> {
        let cached: Vec<f64> = self
            .rows
            .iter()
            .filter_map(|r| r.summary.as_ref()?.cached_token_ratio)
            .collect();
        let rising = cached.len() >= 3
            && cached
                .windows(2)
                .all(|w| w[1] >= 1.5 * w[0] && w[1] > w[0] + 0.02);
        rising.then(|| {
            format!(
                "the cached prompt share rises run after run ({}): were these runs back to back \
                 against one fleet? Later runs then find warm caches.",
                cached
                    .iter()
                    .map(|c| format!("{:.0} %", c * 100.0))
                    .collect::<Vec<_>>()
                    .join(" → ")
            )
        })
    }
}

/// Build the comparison from `args` and write `comparison.md`, `comparison.json` and
/// `ttft_cdf.svg` into `args.out`; returns what was written.
pub fn write_comparison(args: &CompareReportArgs) -> anyhow::Result<Comparison> {
    let (comparison, ttfts) = build(args)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("comparison.md"), comparison.markdown())?;
    std::fs::write(
        args.out.join("comparison.json"),
        serde_json::to_string_pretty(&comparison)? + "\n",
    )?;
    let series: Vec<(&str, &[f64])> = comparison
        .rows
        .iter()
        .zip(&ttfts)
        .filter(|(row, _)| row.summary.is_some())
        .map(|(row, v)| (row.name.as_str(), v.as_slice()))
        .collect();
    std::fs::write(
        args.out.join("ttft_cdf.svg"),
        svg::cdf_svg(&series, &format!("{}: TTFT CDF", comparison.title)),
    )?;
    Ok(comparison)
}

/// `pronto compare-report`: write the files and print the table.
pub fn run_compare_report(args: CompareReportArgs) -> anyhow::Result<()> {
    let comparison = write_comparison(&args)?;
    print!("{}", comparison.markdown());
    if let Some(w) = comparison.warm_cache_warning() {
        eprintln!("compare-report: warning: {w}");
    }
    eprintln!(
        "compare-report: wrote comparison.md, comparison.json, ttft_cdf.svg to {}",
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::write_report;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pronto-compare-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn rec(index: u64, ttft: Option<f64>, status: u16) -> RequestRecord {
        RequestRecord {
            index,
            sent_s: index as f64,
            status: Some(status),
            ttft_ms: ttft,
            e2e_ms: Some(ttft.unwrap_or(1.0) + 100.0),
            tpot_ms: ttft.map(|_| 5.0),
            output_events: 21,
            error: (status != 200).then(|| format!("status {status}")),
            ..RequestRecord::default()
        }
    }

    fn args(out: &Path, runs: &[(&str, &Path)], baseline: Option<&str>) -> CompareReportArgs {
        CompareReportArgs {
            runs: runs
                .iter()
                .map(|(n, d)| RunSpec {
                    name: n.to_string(),
                    dir: d.to_path_buf(),
                })
                .collect(),
            out: out.to_path_buf(),
            baseline: baseline.map(str::to_string),
            title: "unit".into(),
            note: Some("a note".into()),
            ttft_slo: None,
            tpot_slo: None,
        }
    }

    #[test]
    fn a_cached_share_rising_run_after_run_is_warned_about() {
        let comparison = |cached: &[f64]| Comparison {
            title: "t".into(),
            note: None,
            baseline: None,
            rows: cached
                .iter()
                .enumerate()
                .map(|(i, c)| ComparisonRow {
                    name: format!("r{i}"),
                    dir: PathBuf::new(),
                    summary: Some(Summary {
                        cached_token_ratio: Some(*c),
                        ..Summary::of(&[])
                    }),
                    sheds: 0,
                    router: None,
                    ttft_mean_ratio: None,
                    ttft_p99_ratio: None,
                    ttfa_p99_ratio: None,
                    skipped: None,
                })
                .collect(),
        };
        let warm = comparison(&[0.05, 0.2, 0.5]);
        let w = warm.warm_cache_warning().expect("warned");
        assert!(w.contains("5 % → 20 % → 50 %"), "{w}");
        assert!(warm
            .markdown()
            .contains("**Warning:** the cached prompt share rises"));
        assert!(comparison(&[0.05, 0.2]).warm_cache_warning().is_none());
        assert!(comparison(&[0.3, 0.2, 0.5]).warm_cache_warning().is_none());
        assert!(comparison(&[0.3, 0.31, 0.32])
            .warm_cache_warning()
            .is_none());
        assert!(comparison(&[0.3, 0.31, 0.32])
            .markdown()
            .contains("A fair comparison"));
    }

    #[test]
    fn run_specs_need_a_name_and_a_dir() {
        assert_eq!(
            parse_run("pronto=/tmp/a=b").unwrap(),
            RunSpec {
                name: "pronto".into(),
                dir: PathBuf::from("/tmp/a=b")
            }
        );
        for bad in ["pronto", "=dir", "name=", ""] {
            assert!(parse_run(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn table_json_and_plot_cover_every_run_in_order() {
        let root = tmp("full");
        let (fast, slow, gone) = (root.join("fast"), root.join("slow"), root.join("gone"));
        // fast: TTFT 10, 20, 33 and one shed (503). slow: TTFT 40, 80 and a 500.
        write_report(
            &fast,
            &[
                rec(0, Some(10.0), 200),
                rec(1, Some(20.0), 200),
                rec(2, Some(33.0), 200),
                rec(3, None, 503),
            ],
            "fast",
        )
        .unwrap();
        write_report(
            &slow,
            &[
                rec(0, Some(40.0), 200),
                rec(1, Some(80.0), 200),
                rec(2, None, 500),
            ],
            "slow",
        )
        .unwrap();
        let stats = RouterStats {
            router: Some("r 1.0".into()),
            policy: Some("p".into()),
            cpu_s: Some(1.5),
            cpu_startup_s: Some(0.5),
            peak_rss_kib: Some(20480),
            skipped: None,
        };
        std::fs::write(
            slow.join("router.json"),
            serde_json::to_string(&stats).unwrap(),
        )
        .unwrap();
        std::fs::create_dir_all(&gone).unwrap();
        std::fs::write(
            gone.join("router.json"),
            r#"{"router": "vllm-router", "skipped": "not installed (no network)"}"#,
        )
        .unwrap();
        let out = root.join("out");
        let a = args(
            &out,
            &[("fast", &fast), ("gone", &gone), ("slow", &slow)],
            Some("slow"),
        );
        let c = write_comparison(&a).unwrap();
        let names: Vec<&str> = c.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["fast", "gone", "slow"]);
        let fast_row = &c.rows[0];
        let s = fast_row.summary.as_ref().unwrap();
        assert_eq!((s.requests, s.errors, fast_row.sheds), (4, 1, 1));
        assert_eq!(fast_row.ttft_mean_ratio, Some(21.0 / 60.0));
        assert_eq!(fast_row.ttft_p99_ratio, Some(33.0 / 80.0));
        assert_eq!(c.rows[2].ttft_mean_ratio, Some(1.0));
        assert_eq!(c.rows[2].sheds, 0);
        assert_eq!(c.rows[2].router, Some(stats));
        assert_eq!(
            c.rows[1].skipped.as_deref(),
            Some("not installed (no network)")
        );
        assert!(c.rows[1].summary.is_none());

        let md = std::fs::read_to_string(out.join("comparison.md")).unwrap();
        assert!(md.starts_with("# unit\n\na note\n"), "{md}");
        assert!(
            md.contains("| fast | 4 | 1 (1) | 21 | 20 | 33 | 33 | 5.0 |"),
            "{md}"
        );
        assert!(md.contains("| - | - | 0.35× | 0.41× |"), "{md}");
        assert!(md.contains("| 1.5 | 20 MiB | 1.00× | 1.00× |"), "{md}");
        assert!(
            md.contains("| gone | skipped: not installed (no network) | - |"),
            "{md}"
        );
        let header = md.lines().find(|l| l.starts_with("| router |")).unwrap();
        for line in md.lines().filter(|l| l.starts_with("| ")) {
            assert_eq!(
                line.matches(" | ").count(),
                header.matches(" | ").count(),
                "{line}"
            );
        }

        let back: Comparison =
            serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
                .unwrap();
        assert_eq!(back, c);
        let svg = std::fs::read_to_string(out.join("ttft_cdf.svg")).unwrap();
        assert!(
            svg.contains("fast (n=3)") && svg.contains("slow (n=2)"),
            "{svg}"
        );
        assert!(!svg.contains("gone"), "a skipped run has no curve");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn goodput_is_recounted_against_the_given_objectives() {
        let root = tmp("goodput");
        let run = root.join("run");
        // TTFT 7 ms and 40 ms, TPOT 5 ms each; one 429.
        let mut shed = rec(2, None, 429);
        shed.max_tokens = 21;
        let recs = [rec(0, Some(7.0), 200), rec(1, Some(40.0), 200), shed];
        write_report(&run, &recs, "r").unwrap();
        let plain = write_comparison(&args(&root.join("out"), &[("r", &run)], None)).unwrap();
        let s = plain.rows[0].summary.as_ref().unwrap();
        assert_eq!(s.goodput_requests, None, "replayed without objectives");
        assert!(plain.markdown().contains("| - | - |"));
        let mut a = args(&root.join("out"), &[("r", &run)], None);
        a.ttft_slo = Some(std::time::Duration::from_millis(10));
        a.tpot_slo = Some(std::time::Duration::from_millis(5));
        let c = write_comparison(&a).unwrap();
        let s = c.rows[0].summary.as_ref().unwrap();
        assert_eq!(s.goodput_requests, Some(1.0 / 3.0));
        assert_eq!(
            s.goodput_tokens,
            Some(1.0 / 3.0),
            "21 tokens each (the shed asked for 21)"
        );
        assert!(c.markdown().contains("| 33.3 | 33.3 |"), "{}", c.markdown());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn summary_is_recomputed_when_summary_json_is_missing() {
        let root = tmp("nosummary");
        let run = root.join("run");
        write_report(&run, &[rec(0, Some(7.0), 200), rec(1, None, 429)], "r").unwrap();
        std::fs::remove_file(run.join("summary.json")).unwrap();
        let c = write_comparison(&args(&root.join("out"), &[("r", &run)], None)).unwrap();
        let s = c.rows[0].summary.as_ref().unwrap();
        assert_eq!((s.requests, s.errors, s.ttft_p50_ms), (2, 1, Some(7.0)));
        assert_eq!(c.rows[0].sheds, 1);
        assert_eq!(c.rows[0].ttft_mean_ratio, None);
        let md = c.markdown();
        assert!(!md.contains("vs base"), "{md}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn unexplained_missing_runs_and_unknown_baselines_are_errors() {
        let root = tmp("errors");
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let err =
            write_comparison(&args(&root.join("out"), &[("ghost", &empty)], None)).unwrap_err();
        assert!(format!("{err:#}").contains("ghost"), "{err:#}");

        let run = root.join("run");
        write_report(&run, &[rec(0, Some(7.0), 200)], "r").unwrap();
        std::fs::write(run.join("router.json"), "not json").unwrap();
        let err = write_comparison(&args(&root.join("out"), &[("r", &run)], None)).unwrap_err();
        assert!(format!("{err:#}").contains("router.json"), "{err:#}");
        std::fs::remove_file(run.join("router.json")).unwrap();

        let err =
            write_comparison(&args(&root.join("out"), &[("r", &run)], Some("nope"))).unwrap_err();
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn reasoning_runs_get_ttfa_columns() {
        let root = tmp("ttfa");
        let think = |index, ttfa| RequestRecord {
            ttfa_ms: Some(ttfa),
            reasoning_events: 100,
            ..rec(index, Some(10.0), 200)
        };
        let (a, b) = (root.join("a"), root.join("b"));
        write_report(&a, &[think(0, 400.0), think(1, 600.0)], "a").unwrap();
        write_report(&b, &[think(0, 800.0), think(1, 1200.0)], "b").unwrap();
        let c =
            write_comparison(&args(&root.join("out"), &[("a", &a), ("b", &b)], Some("b"))).unwrap();
        assert_eq!(c.rows[0].ttfa_p99_ratio, Some(0.5));
        let md = c.markdown();
        let header = md.lines().find(|l| l.starts_with("| router |")).unwrap();
        assert!(header.contains("| TTFA mean | TTFA p99 |"), "{md}");
        assert!(header.ends_with("| TTFA p99 vs base |"), "{md}");
        assert!(md.contains("| 500 | 600 | 1.00× | 1.00× | 0.50× |"), "{md}");
        for line in md.lines().filter(|l| l.starts_with("| ")) {
            assert_eq!(
                line.matches(" | ").count(),
                header.matches(" | ").count(),
                "{line}"
            );
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
