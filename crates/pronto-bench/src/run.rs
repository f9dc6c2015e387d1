//! `pronto replay`: open-loop replay of a trace (or the seeded synthetic workload) against a
//! live OpenAI-compatible endpoint, usually the gateway.
//!
//! ## Workload
//! A trace file ([`pronto_sim::workload::read`]) or, without `--trace`, a [`SyntheticWorkload`] seeded
//! by `--seed`. Then, in this order: `--spread` spreads equal timestamps over their bucket
//! ([`spread_ties`]; the Mooncake conversation trace is quantised to 3 s), `--limit N` keeps the
//! first N requests, `--load-scale X` offers X times the trace's request rate (arrival times are
//! divided by X via [`scale_arrivals`]), `--duration D` drops requests scheduled after D, and
//! `--max-input-tokens N` drops prompts longer than N tokens (a backend's context length).
//! Each request keeps its position in the original trace as its index, so its prompt (and the
//! ids no other request shares) does not depend on these options.
//!
//! ## Open loop
//! One dispatcher walks the requests in arrival order, sleeps until each one's scheduled time
//! (tokio timers, millisecond resolution) and spawns it; it never waits for earlier requests,
//! so a slow target sees the offered rate regardless — queueing shows up as TTFT, not as a
//! lower send rate. `--concurrency-cap N` bounds requests in flight (a safety valve for file
//! descriptors); a request held back by it starts late, which its `send_lag_ms` records.
//!
//! ## Output
//! `--out DIR` receives the files of [`super::report::write_report`]. On a terminal, stderr
//! shows a progress bar (sent / done / errors / elapsed); otherwise one summary line at the end.
//! Failed requests are counted, never fatal; the command fails only when every request failed
//! (e.g. the target refused connections) or there was nothing to replay.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Semaphore;

use super::client::{discover_model, http_client, Sender};
use super::report::{write_report_with_notes, RequestRecord, Summary};
use pronto_sim::workload::{
    self as trace, scale_arrivals, spread_ties, SyntheticWorkload, TraceFormat, TraceRequest,
};

/// Idle connections kept to the target when `--concurrency-cap` is not given.
const DEFAULT_POOL: usize = 1024;

/// `pronto replay` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Trace file; without it, the seeded synthetic multi-turn workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace format.
    #[arg(long, value_enum, default_value_t = TraceFormat::Mooncake)]
    pub format: TraceFormat,
    /// Base URL of the OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080); several,
    /// comma-separated, spread the requests round robin (replicas of one router).
    #[arg(long)]
    pub target: String,
    /// Model to request (default: the first one `GET /v1/models` lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Offer this many times the trace's request rate (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub load_scale: f64,
    /// Instead of --load-scale: offer this fraction of the capacity of the simulated fleet
    /// described by --fleet (calibrated for this workload's request mix, as `pronto evaluate
    /// --load` does; for a `sim-fleet --time-scale 1` fleet).
    #[arg(long, requires = "fleet")]
    pub load: Option<f64>,
    /// Fleet file of the simulated fleet, for --load.
    #[arg(long)]
    pub fleet: Option<std::path::PathBuf>,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Replay only requests scheduled within this time (after --load-scale), e.g. `60s`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Conversations in the synthetic workload.
    #[arg(long, default_value_t = 200)]
    pub conversations: usize,
    /// Skip requests whose prompt is longer than this many tokens (e.g. the backends'
    /// context length); the number skipped is printed.
    #[arg(long)]
    pub max_input_tokens: Option<u32>,
    /// Spread runs of equal timestamps evenly over their bucket.
    #[arg(long)]
    pub spread: bool,
    /// Most requests in flight (default: unbounded, a pure open loop).
    #[arg(long)]
    pub concurrency_cap: Option<usize>,
    /// Per-request limit on the whole exchange, e.g. `10m`.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub timeout: Duration,
    /// Send `ignore_eos: true` so real engines generate the trace's full output length.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Directory for results.jsonl, summary.json, summary.md and the SVG plots.
    #[arg(long)]
    pub out: PathBuf,
    /// TTFT objective for goodput in the summary (e.g. the route's `ttft_slo`, `800ms`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttft_slo: Option<Duration>,
    /// TPOT objective for goodput in the summary (e.g. the route's `tpot_slo`, `50ms`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub tpot_slo: Option<Duration>,
}

impl ReplayArgs {
    /// The objectives goodput is counted against (none: no goodput).
    pub fn slo(&self) -> pronto_core::slo::SloTargets {
        pronto_core::slo::SloTargets {
            ttft_s: self.ttft_slo.map(|d| d.as_secs_f64()),
            tpot_s: self.tpot_slo.map(|d| d.as_secs_f64()),
        }
    }
}

/// The requests `args` describe, each with its index in the original trace, sorted by
/// scheduled send time (seconds after the replay starts).
pub fn workload(args: &ReplayArgs) -> anyhow::Result<Vec<(u64, TraceRequest)>> {
    anyhow::ensure!(
        args.load_scale.is_finite() && args.load_scale > 0.0,
        "--load-scale must be a positive number, got {}",
        args.load_scale
    );
    let mut reqs = match &args.trace {
        Some(path) => trace::read(path, args.format)?,
        None => SyntheticWorkload {
            seed: args.seed,
            conversations: args.conversations,
            ..SyntheticWorkload::default()
        }
        .generate(),
    };
    if args.spread {
        spread_ties(&mut reqs);
    }
    if let Some(n) = args.limit {
        reqs.truncate(n);
    }
    match (args.load, &args.fleet) {
        (Some(load), Some(path)) => {
            anyhow::ensure!(load > 0.0, "--load must be positive, got {load}");
            let fleet = pronto_sim::evaluate::load_fleet(path)?;
            let capacity = pronto_sim::evaluate::apply_load(&fleet, &mut reqs, load);
            eprintln!(
                "replay: offering {load} × the fleet's capacity of {capacity:.2} req/s for this workload"
            );
        }
        _ => scale_arrivals(&mut reqs, 1.0 / args.load_scale),
    }
    if let Some(d) = args.duration {
        let end = d.as_secs_f64();
        reqs.retain(|r| r.arrival_s <= end);
    }
    let mut out: Vec<(u64, TraceRequest)> = (0u64..).zip(reqs).collect();
    if let Some(max) = args.max_input_tokens {
        let before = out.len();
        out.retain(|(_, r)| r.input_tokens <= max);
        if out.len() < before {
            eprintln!(
                "skipping {} of {before} requests with more than {max} prompt tokens",
                before - out.len()
            );
        }
    }
    Ok(out)
}

/// A note when the workload's arrivals end well before `--duration` (the last arrival before
/// 95 % of it): the run then offers load for less time than asked, and says so.
pub fn short_workload(
    duration: Option<Duration>,
    requests: &[(u64, TraceRequest)],
) -> Option<String> {
    let d = duration?.as_secs_f64();
    let last = requests
        .iter()
        .map(|(_, r)| r.arrival_s)
        .fold(0.0, f64::max);
    (last < 0.95 * d).then(|| {
        format!(
            "the workload's arrivals end at {last:.1} s, before --duration {d:.0} s: this run offered \
             load for {last:.1} s (a longer trace, more --conversations or a higher --load fills it)"
        )
    })
}

/// Counters shared by the request tasks and the progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests scheduled in total.
    pub total: usize,
    /// Requests handed to the HTTP client.
    pub sent: AtomicUsize,
    /// Requests finished (successfully or not).
    pub done: AtomicUsize,
    /// Requests failed.
    pub errors: AtomicUsize,
}

impl Progress {
    fn line(&self, elapsed: Duration) -> String {
        const BAR: usize = 30;
        let done = self.done.load(Ordering::Relaxed);
        let filled = (done * BAR).checked_div(self.total).unwrap_or(BAR);
        format!(
            "[{}{}] sent {}/{} done {} errors {} elapsed {:.1}s",
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            self.sent.load(Ordering::Relaxed),
            self.total,
            done,
            self.errors.load(Ordering::Relaxed),
            elapsed.as_secs_f64()
        )
    }
}

/// Replay `requests` open loop through `sender`; returns one record per request, by index.
pub async fn replay(
    requests: Vec<(u64, TraceRequest)>,
    sender: Arc<Sender>,
    concurrency_cap: Option<usize>,
    progress: Arc<Progress>,
) -> Vec<RequestRecord> {
    let epoch = Instant::now();
    let start = tokio::time::Instant::from_std(epoch);
    let cap = concurrency_cap.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let mut handles = Vec::with_capacity(requests.len());
    for (index, req) in requests {
        let at = Duration::from_secs_f64(req.arrival_s.max(0.0));
        tokio::time::sleep_until(start + at).await;
        let (sender, cap, progress) = (sender.clone(), cap.clone(), progress.clone());
        handles.push(tokio::spawn(async move {
            let _permit = match cap {
                Some(sem) => Some(sem.acquire_owned().await.expect("semaphore never closed")),
                None => None,
            };
            progress.sent.fetch_add(1, Ordering::Relaxed);
            let rec = sender.send(&req, index, at.as_secs_f64(), epoch).await;
            if !rec.ok() {
                progress.errors.fetch_add(1, Ordering::Relaxed);
            }
            progress.done.fetch_add(1, Ordering::Relaxed);
            rec
        }));
    }
    let mut records = Vec::with_capacity(handles.len());
    for h in handles {
        records.push(h.await.expect("a replay task panicked"));
    }
    records.sort_by_key(|r| r.index);
    records
}

/// Draw the progress bar on stderr every 250 ms until `stop` is dropped or sent to.
fn spawn_progress_bar(
    progress: Arc<Progress>,
    stop: std::sync::mpsc::Receiver<()>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("replay-progress".into())
        .spawn(move || {
            let start = Instant::now();
            loop {
                let finished = !matches!(
                    stop.recv_timeout(Duration::from_millis(250)),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                );
                eprint!("\r{}", progress.line(start.elapsed()));
                if finished {
                    eprintln!();
                    return;
                }
            }
        })
}

/// Replay as `args` say and write the report; returns the summary. Errors when nothing could
/// be replayed or every request failed (the report is written first).
pub async fn replay_to_dir(args: &ReplayArgs) -> anyhow::Result<Summary> {
    let a = args.clone();
    let requests = tokio::task::spawn_blocking(move || workload(&a)).await??;
    anyhow::ensure!(!requests.is_empty(), "no requests to replay");
    let notes: Vec<String> = short_workload(args.duration, &requests)
        .into_iter()
        .collect();
    for n in &notes {
        eprintln!("replay: warning: {n}");
    }
    let pool = args.concurrency_cap.unwrap_or(DEFAULT_POOL);
    let client = http_client(pool)?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => discover_model(&client, args.target.split(',').next().unwrap_or("")).await?,
    };
    let sender = Arc::new(Sender::new(
        client,
        &args.target,
        model.clone(),
        args.timeout,
        args.ignore_eos,
    ));
    let progress = Arc::new(Progress {
        total: requests.len(),
        ..Progress::default()
    });
    let bar = if std::io::stderr().is_terminal() {
        let (tx, rx) = std::sync::mpsc::channel();
        Some((tx, spawn_progress_bar(progress.clone(), rx)?))
    } else {
        None
    };
    let records = replay(requests, sender, args.concurrency_cap, progress).await;
    if let Some((tx, thread)) = bar {
        drop(tx);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    let title = format!("{} → {} ({model})", workload_name(args), args.target);
    let out = args.out.clone();
    let slo = args.slo();
    let summary = {
        let records = records.clone();
        tokio::task::spawn_blocking(move || {
            write_report_with_notes(&out, &records, &title, &slo, notes)
        })
        .await?
        .with_context(|| format!("writing the report to {}", args.out.display()))?
    };
    if summary.errors == summary.requests {
        let first = records
            .iter()
            .find_map(|r| r.error.as_deref())
            .unwrap_or("unknown");
        anyhow::bail!(
            "all {} requests to {} failed; first error: {first}",
            summary.requests,
            args.target
        );
    }
    Ok(summary)
}

fn workload_name(args: &ReplayArgs) -> String {
    match &args.trace {
        Some(p) => Path::new(p)
            .file_name()
            .map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into()),
        None => format!("synthetic workload (seed {})", args.seed),
    }
}

/// `pronto replay`: run [`replay_to_dir`] on its own tokio runtime and print the summary line.
pub fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pronto-replay")
        .build()?;
    let summary = rt.block_on(replay_to_dir(&args))?;
    eprintln!("{}", summary.one_line());
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
