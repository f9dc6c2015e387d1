//! Profile hints (a pool's or a backend's `profile:`): the prior of a backend's TTFT model,
//! used until it has measured its own requests ([`ProfileHint::coefficients`]).
//!
//! `profile: {file, base_ms, prefill_tokens_per_s, decode_ms_per_running}`. A pool's profile
//! is the default of its backends, which may override it field by field. Every given value
//! must be positive and finite.
//!
//! `file` names a simulator profile written by `pronto calibrate` (relative to the config
//! file; e.g. `config/sim/cpu-tiny.yaml`). Its `prior:` block holds the TTFT-model
//! coefficients the calibrated step model implies (`pronto_sim::profile::TtftPrior`, in
//! seconds), and gives each field not set beside it:
//!
//! ```text
//! base_ms               = prior.base_s × 1000
//! prefill_tokens_per_s  = 1 / prior.s_per_token          (a 0 leaves the generic prior)
//! decode_ms_per_running = prior.s_per_decode × 1000      (a 0 leaves the generic prior)
//! ```
//!
//! The block's `s_per_token_sq` and `s_per_waiting` have no hint field yet, so the generic
//! prior's values stay for those two. A 0 in the block (a term the fit found absent) cannot be
//! a hint value either: that field keeps the generic prior, with a warning.
//!
//! Only the `prior:` block is read: the gateway needs no simulator (it builds without the
//! `tools` feature), and the simulator checks on load that the block is what the file's
//! timing terms imply. A relative `file` is resolved against the config file's directory
//! ([`resolve_paths`]). The file is read whenever the config is loaded, so a reload picks up a
//! recalibrated profile — but a reload of an unchanged config text is skipped, so touch the
//! config after replacing the profile.

use std::path::Path;

use serde::Deserialize;

use super::file::{ConfigFile, ProfileFile};
use super::model::ProfileHint;
use super::validate::Checker;

/// Resolve relative profile `file` paths (pools' and backends') against the directory of the
/// config file at `path`.
pub(super) fn resolve_paths(file: &mut ConfigFile, path: &Path) {
    let Some(dir) = path.parent() else { return };
    let resolve = |p: &mut String| {
        if Path::new(p.as_str()).is_relative() {
            *p = dir.join(p.as_str()).display().to_string();
        }
    };
    for (_, pool) in file.pools.iter_mut().flat_map(|p| p.0.iter_mut()) {
        let backends = pool.backends.iter_mut().flatten();
        let hints = pool
            .profile
            .iter_mut()
            .chain(backends.flat_map(|b| b.profile.iter_mut()));
        for hint in hints {
            hint.file.iter_mut().for_each(resolve);
        }
    }
}

/// The part of a simulator profile the gateway reads.
#[derive(Debug, Deserialize)]
struct CalibratedProfile {
    prior: Option<PriorBlock>,
}

/// `prior:` of a simulator profile (seconds).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorBlock {
    base_s: f64,
    s_per_token: f64,
    #[allow(dead_code)] // no hint field yet (see the module docs)
    s_per_token_sq: f64,
    s_per_decode: f64,
    #[allow(dead_code)] // no hint field yet (see the module docs)
    s_per_waiting: f64,
}

/// The hint a profile file's `prior:` block gives, and what it could not express.
fn read_prior(path: &Path) -> Result<(ProfileHint, Vec<String>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let doc: CalibratedProfile = serde_yaml_ng::from_str(&text)
        .map_err(|e| format!("`{}` is not a simulator profile: {e}", path.display()))?;
    let prior = doc.prior.ok_or_else(|| {
        format!(
            "`{}` has no `prior:` block; write the profile with `pronto calibrate`",
            path.display()
        )
    })?;
    let mut notes = Vec::new();
    let mut positive = |name: &str, v: f64| -> Result<Option<f64>, String> {
        if !v.is_finite() || v < 0.0 {
            return Err(format!(
                "`{}`: prior.{name} must be a finite number >= 0, got {v}",
                path.display()
            ));
        }
        if v == 0.0 {
            notes.push(format!(
                "prior.{name} is 0 in `{}`: that field keeps the generic prior",
                path.display()
            ));
            return Ok(None);
        }
        Ok(Some(v))
    };
    let hint = ProfileHint {
        base_ms: positive("base_s", prior.base_s)?.map(|s| s * 1e3),
        prefill_tokens_per_s: positive("s_per_token", prior.s_per_token)?.map(|s| 1.0 / s),
        decode_ms_per_running: positive("s_per_decode", prior.s_per_decode)?.map(|s| s * 1e3),
    };
    Ok((hint, notes))
}

impl Checker {
    /// A profile hint (serde checked its numbers), the calibrated file's prior filling the
    /// fields not set beside it.
    pub(super) fn profile(&mut self, path: &str, p: &ProfileFile) -> ProfileHint {
        let own = ProfileHint {
            base_ms: p.base_ms,
            prefill_tokens_per_s: p.prefill_tokens_per_s,
            decode_ms_per_running: p.decode_ms_per_running,
        };
        let Some(file) = p.file.as_deref() else {
            return own;
        };
        match read_prior(Path::new(file)) {
            Ok((from_file, notes)) => {
                for note in notes {
                    self.warn(format!("{path}.file"), note);
                }
                own.or(from_file)
            }
            Err(message) => {
                self.error(format!("{path}.file"), message);
                own
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::config::Config;

    /// A directory of its own under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let d =
                std::env::temp_dir().join(format!("pronto-profile-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const PROFILE: &str = "# a calibrated profile\nname: x\ndescription: \"y\"\n\
        step: {floor_ms: 3}\nprior:\n  base_s: 0.0215\n  s_per_token: 1.0e-5\n  \
        s_per_token_sq: 1.5e-9\n  s_per_decode: 0\n  s_per_waiting: 0.01\n\
        kv_bytes_per_token: 512\nblock_size: 128\n";

    fn load_in(dir: &TempDir, yaml: &str) -> Result<Config, String> {
        let path = dir.0.join("pronto.yaml");
        std::fs::write(&path, yaml).unwrap();
        Config::load(&path).map_err(|e| e.to_string())
    }

    #[test]
    fn a_calibrated_file_gives_the_fields_not_set_beside_it() {
        let dir = TempDir::new("file");
        std::fs::write(dir.0.join("cal.yaml"), PROFILE).unwrap();
        let c = load_in(
            &dir,
            "retry: {max_retries: 0}\npools:\n  m:\n    profile: {file: cal.yaml}\n    \
             backends:\n      - {name: a, url: 'http://h:1'}\n      \
             - {name: b, url: 'http://h:2', profile: {base_ms: 40}}\n",
        )
        .unwrap();
        let pool = c.pool("m").unwrap();
        let close =
            |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-9 * want);
        let a = pool.backends[0].profile.unwrap();
        assert!(close(a.base_ms, 21.5), "{a:?}");
        assert!(close(a.prefill_tokens_per_s, 100_000.0), "{a:?}");
        assert_eq!(a.decode_ms_per_running, None, "a 0 keeps the generic prior");
        let b = pool.backends[1].profile.unwrap();
        assert_eq!(b.base_ms, Some(40.0), "the backend's own field wins");
        assert!(close(b.prefill_tokens_per_s, 100_000.0), "{b:?}");
        assert!(
            c.warnings.iter().any(|w| w.path == "pools.m.profile.file"
                && w.message.contains("prior.s_per_decode is 0")),
            "{:?}",
            c.warnings
        );
        let coef = a.coefficients();
        assert!((coef.base_s - 0.0215).abs() < 1e-12 && (coef.s_per_token - 1e-5).abs() < 1e-15);
    }

    #[test]
    fn the_committed_cpu_tiny_profile_is_a_usable_hint() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/config/sim/cpu-tiny.yaml");
        let (hint, _) = super::read_prior(std::path::Path::new(file)).unwrap();
        assert!(hint.base_ms.is_some_and(|b| b > 0.0), "{hint:?}");
    }

    #[test]
    fn missing_or_unfit_files_are_located_errors() {
        let dir = TempDir::new("bad");
        std::fs::write(dir.0.join("plain.yaml"), "name: x\nstep: {floor_ms: 3}\n").unwrap();
        let cfg = |file: &str| {
            format!(
                "retry: {{max_retries: 0}}\npools:\n  m:\n    backends:\n      \
                 - {{name: a, url: 'http://h:1', profile: {{file: {file}}}}}\n"
            )
        };
        let err = load_in(&dir, &cfg("nope.yaml")).unwrap_err();
        assert!(
            err.contains("pools.m.backends[0].profile.file: cannot read"),
            "{err}"
        );
        let err = load_in(&dir, &cfg("plain.yaml")).unwrap_err();
        assert!(err.contains("has no `prior:` block"), "{err}");
    }
}
