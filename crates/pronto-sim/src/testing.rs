//! For tests that need the shared traces and calibration data (`../shared/` beside the
//! repository): they are never copied into the repository, so a test finds them there. Away
//! from CI a missing file skips the test with a line on stderr; under CI (`CI` set to anything
//! but `false` or `0`) it fails the test, so a CI run can never pass by skipping.

use std::path::{Path, PathBuf};

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether this is a CI run (`CI` set, and not to `false` or `0`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `../shared/<rel>`, if it exists. Missing: `None` (the caller returns, skipping) — or, under
/// CI, a panic naming the path.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = repo_root().join("../shared").join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        !in_ci(),
        "{} is missing: CI must provide ../shared/ beside the repository",
        p.display()
    );
    eprintln!("skipping: {} not found (not in CI)", p.display());
    None
}
