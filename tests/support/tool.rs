//! External tools the deployment tests run (promtool, prometheus, chromium,
//! kubernetes-validate), installed by `scripts/bootstrap.sh`.
//!
//! A missing tool fails the test under CI (`CI` set), and skips it with a message elsewhere,
//! so a developer without the tools still runs the rest of the suite.
#![allow(dead_code)]

use std::path::PathBuf;

/// The first of `names` found on `PATH`; `None` (after printing why the test is skipped)
/// when none is and `CI` is unset; a panic when `CI` is set.
pub fn find(names: &[&str], installs: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let msg = format!("{} not found on PATH ({installs})", names.join(" / "));
    if std::env::var_os("CI").is_some() {
        panic!("{msg}: needed under CI; scripts/bootstrap.sh installs it");
    }
    eprintln!("skipping: {msg}; run scripts/bootstrap.sh");
    None
}

/// Run `cmd`; its stdout and stderr, and a panic with both when it fails.
pub fn run_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} could not run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    text
}
