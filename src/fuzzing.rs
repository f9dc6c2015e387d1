//! The body of the `config_loader` cargo-fuzz target (`fuzz/`), kept here so that the same
//! property also runs on stable in an ordinary test (`tests/fuzz_smoke.rs`). The request,
//! SSE and KV-event targets' bodies are in `pronto_core::fuzzing`.

use crate::config::{Config, Diagnostic};

/// The origin every message of a fuzzed config names.
const ORIGIN: &str = "fuzz.yaml";

/// [`Config::from_yaml_str`] over any text: never panics; a failure names at least one
/// problem, its text starts with the origin, and every location (errors and warnings
/// alike) lies inside the text. Input that is not UTF-8 is skipped (a file is read as text
/// first).
pub fn config_loader(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_yaml_str(text, ORIGIN) {
        Ok(config) => {
            for w in &config.warnings {
                check_location(text, w);
            }
        }
        Err(e) => {
            assert!(!e.errors.is_empty(), "a load error names a problem");
            for d in e.errors.iter().chain(&e.warnings) {
                check_location(text, d);
            }
            let shown = e.to_string();
            assert!(shown.starts_with(ORIGIN), "{shown}");
        }
    }
}

/// A diagnostic's line and column, when it has them, are inside `text` (lines broken as YAML
/// breaks them; columns at most one past the longest line).
fn check_location(text: &str, d: &Diagnostic) {
    let Some(loc) = d.location else {
        return;
    };
    let is_break = |c: char| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}');
    let lines = text.chars().filter(|&c| is_break(c)).count() + 1;
    let widest = text
        .split(is_break)
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    assert!(
        (1..=lines).contains(&loc.line),
        "line {} outside a text of {lines} lines: {d:?}",
        loc.line
    );
    assert!(
        (1..=widest + 1).contains(&loc.column),
        "column {} outside lines at most {widest} wide: {d:?}",
        loc.column
    );
}
