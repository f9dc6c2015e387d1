//! `pronto check-config FILE`: validate a config without starting anything.
//!
//! Prints `OK: N pools, M backends` and any warnings to stdout and exits 0, or prints every
//! error (and warning) to stderr and exits 1. Each problem is one line,
//! `error: FILE:LINE:COL: PATH: MESSAGE` or `warning: ...`, so editors and CI can jump to it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::Config;

/// Arguments of `pronto check-config`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckConfigArgs {
    /// Path to the gateway's YAML config.
    pub file: PathBuf,
}

/// Run `check-config` with `args`, writing to the process's stdout and stderr.
pub fn run_check_config(args: &CheckConfigArgs) -> ExitCode {
    let code = check_config(
        &args.file,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}

/// Validate the file at `path`; report on `out` (success) or `err` (failure). Returns the
/// exit code: 0 when the config loads, 1 when it does not.
pub fn check_config(path: &Path, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    // Write failures (a closed pipe) cannot be reported anywhere better; the exit code stands.
    match Config::load(path) {
        Ok(config) => {
            let pools = config.pools.len();
            let backends = config.backend_count();
            let _ = writeln!(
                out,
                "OK: {pools} pool{}, {backends} backend{}",
                plural(pools),
                plural(backends)
            );
            for w in &config.warnings {
                let _ = writeln!(out, "warning: {}", w.display(&config.origin));
            }
            0
        }
        Err(e) => {
            for d in &e.errors {
                let _ = writeln!(err, "error: {}", d.display(&e.origin));
            }
            for w in &e.warnings {
                let _ = writeln!(err, "warning: {}", w.display(&e.origin));
            }
            let n = e.errors.len();
            let _ = writeln!(err, "{n} error{} in {}", plural(n), e.origin);
            1
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
