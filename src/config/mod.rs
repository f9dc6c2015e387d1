//! Gateway configuration: YAML file → validated, typed [`Config`].
//!
//! Two layers (STYLE habit 5):
//! 1. [`mod@file`]: serde structs mirroring the YAML, `deny_unknown_fields`, every field
//!    optional. Every value is read whole, with its range: durations and sizes
//!    ([`duration`]), addresses, URLs, globs, names and integer ranges ([`value`]), enums.
//!    A bad one is a shape error; every shape error of a file is collected in one pass
//!    (`shape.rs`), each located at its field.
//! 2. [`validate()`]: what needs more than one value, collecting *all* errors and warnings
//!    with their field paths: presence, uniqueness, the rules between fields, the references
//!    between sections, the files the config names and the secrets. It builds the typed
//!    [`model`] ([`Config`]); a section that needs none of that is its own model.
//!
//! [`Config::from_yaml_str`] runs both and locates each problem's path in the text
//! ([`locate`]), so a [`LoadError`] reads like a compiler's:
//!
//! ```text
//! pronto.yaml:14:14: pools.llama-3-8b.backends[1].url: unsupported scheme `ftp`; use http or https
//! pronto.yaml:15:17: pools.llama-3-8b.backends[1].weight: must be at least 1, got 0
//! ```
//!
//! [`Config::from_backend_urls`] builds the same model for `pronto serve --backend URL ...`,
//! through the same validation. [`check_config`] is the `pronto check-config FILE` command.

mod check;
pub mod cluster;
mod discover;
pub mod duration;
pub mod edge;
mod effective;
pub mod file;
pub mod locate;
pub mod migration;
pub mod model;
pub mod nats;
mod profile;
pub mod progress;
pub mod race;
mod reference;
mod resources;
pub mod route;
mod schema;
mod scrape;
pub mod secrets;
mod shape;
pub mod tls;
mod tokenizer;
pub mod validate;
pub mod value;

use std::fmt;
use std::path::Path;

pub use check::{check_config, run_check_config, CheckConfigArgs};
pub use model::{
    AccessLog, AddressFamily, Backend, Config, Discover, Health, KvEvents, Limits, Pool,
    ProfileHint, ReloadSettings, Retry, Scrape, ServedName, TokenizerRef,
};
pub use reference::config_reference;
pub use resources::{Loaded, Resources};
pub use route::{AdmissionSettings, Glob, Route, RouteMatch, Slo, SloAction};
pub use schema::config_schema;

/// [`Config::hash`] of a file whose text is `text`: equal hashes mean an identical file.
pub fn text_hash(text: &str) -> String {
    format!("{:016x}", model::fnv1a(text.as_bytes()))
}
pub use validate::{validate, validate_with_env, ConfigError, ConfigWarning};

use pronto_core::routing::PolicySpec;

/// A 1-based line and column in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

/// One error or warning, with its position when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where in the file, when known.
    pub location: Option<Location>,
    /// Field path (`pools.m.backends[0].url`); empty for document-level problems.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl Diagnostic {
    /// `origin:line:col: path: message`, or `origin: path: message` without a location.
    pub fn display<'a>(&'a self, origin: &'a str) -> impl fmt::Display + 'a {
        DiagnosticDisplay {
            origin,
            diagnostic: self,
        }
    }
}

struct DiagnosticDisplay<'a> {
    origin: &'a str,
    diagnostic: &'a Diagnostic,
}

impl fmt::Display for DiagnosticDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.diagnostic;
        f.write_str(self.origin)?;
        if let Some(loc) = d.location {
            write!(f, ":{}:{}", loc.line, loc.column)?;
        }
        if !d.path.is_empty() {
            write!(f, ": {}", d.path)?;
        }
        write!(f, ": {}", d.message)
    }
}

/// A config that could not be loaded: every problem, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// File path or other origin the problems refer to.
    pub origin: String,
    /// At least one error.
    pub errors: Vec<Diagnostic>,
    /// Warnings found along the way (shown by `check-config`, not by `Display`).
    pub warnings: Vec<Diagnostic>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}", e.display(&self.origin))?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

impl LoadError {
    fn single(origin: &str, location: Option<Location>, message: String) -> LoadError {
        LoadError {
            origin: origin.to_string(),
            errors: vec![Diagnostic {
                location,
                path: String::new(),
                message,
            }],
            warnings: Vec::new(),
        }
    }
}

// === impl Loaded ===

impl Loaded {
    /// Read and validate the YAML file at `path`, loading the files it names.
    pub fn load(path: impl AsRef<Path>) -> Result<Loaded, LoadError> {
        Loaded::load_with_env(path, edge::process_env)
    }

    /// [`Loaded::load`], looking up `{env: NAME}` secrets with `env` instead of the process
    /// environment.
    pub fn load_with_env(
        path: impl AsRef<Path>,
        env: edge::EnvLookup,
    ) -> Result<Loaded, LoadError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| LoadError::single(&origin, None, format!("cannot read: {e}")))?;
        let mut loaded = Loaded::from_yaml_in(&text, &origin, Some(path), env)?;
        loaded.config.source_path = Some(path.to_path_buf());
        Ok(loaded)
    }

    /// Parse and validate `text`, already read from the file at `path` (which becomes the
    /// config's origin and [`Config::source_path`]).
    pub fn from_file_text(path: &Path, text: &str) -> Result<Loaded, LoadError> {
        Loaded::from_file_text_with_env(path, text, edge::process_env)
    }

    /// [`Loaded::from_file_text`], looking up `{env: NAME}` secrets with `env`.
    pub fn from_file_text_with_env(
        path: &Path,
        text: &str,
        env: edge::EnvLookup,
    ) -> Result<Loaded, LoadError> {
        let origin = path.display().to_string();
        let mut loaded = Loaded::from_yaml_in(text, &origin, Some(path), env)?;
        loaded.config.source_path = Some(path.to_path_buf());
        Ok(loaded)
    }

    /// Parse and validate YAML `text`; `origin` (usually the file path) prefixes messages.
    pub fn from_yaml_str(text: &str, origin: &str) -> Result<Loaded, LoadError> {
        Loaded::from_yaml_in(text, origin, None, edge::process_env)
    }

    /// [`Loaded::from_yaml_str`] with `env` as the environment of `{env: NAME}` secrets.
    pub fn from_yaml_str_with_env(
        text: &str,
        origin: &str,
        env: edge::EnvLookup,
    ) -> Result<Loaded, LoadError> {
        Loaded::from_yaml_in(text, origin, None, env)
    }

    /// [`Loaded::from_yaml_str`] for a file at `path` (relative paths in it resolve against
    /// its directory).
    fn from_yaml_in(
        text: &str,
        origin: &str,
        path: Option<&Path>,
        env: edge::EnvLookup,
    ) -> Result<Loaded, LoadError> {
        let (mut file, shape_errors) =
            shape::parse_all(text).map_err(|e| yaml_error(text, origin, &e))?;
        if let Some(path) = path {
            edge::resolve_keys_file(&mut file, path);
            tls::resolve_paths(&mut file, path);
            nats::resolve_paths(&mut file, path);
            profile::resolve_paths(&mut file, path);
        }
        let located = |path: String, message: String| Diagnostic {
            location: locate::locate(text, &path),
            path,
            message,
        };
        // Shape errors and the semantic errors of what remains, in file order: none about a
        // node a shape error removed (that would repeat it as "missing"), and none beside it
        // that names it (`hedge: needs after`, `on_slo_miss: has no effect without ttft_slo`).
        let shape: Vec<Diagnostic> = shape_errors
            .into_iter()
            .map(|e| located(e.path, e.message))
            .collect();
        let removed = |e: &ConfigError| {
            shape
                .iter()
                .any(|d| under(&e.path, &d.path) || names_removed(e, &d.path))
        };
        match validate_with_env(&file, env) {
            Ok((_, _, warnings)) if !shape.is_empty() => Err(LoadError {
                origin: origin.to_string(),
                errors: in_file_order(shape.iter().cloned()),
                warnings: warnings
                    .into_iter()
                    .map(|w| located(w.path, w.message))
                    .collect(),
            }),
            Ok((mut config, resources, warnings)) => {
                config.origin = origin.to_string();
                config.warnings = warnings
                    .into_iter()
                    .map(|w| located(w.path, w.message))
                    .collect();
                config.source_hash = model::fnv1a(text.as_bytes());
                Ok(Loaded { config, resources })
            }
            Err(invalid) => Err(LoadError {
                origin: origin.to_string(),
                errors: in_file_order(
                    shape.iter().cloned().chain(
                        invalid
                            .errors
                            .into_iter()
                            .filter(|e| !removed(e))
                            .map(|e| located(e.path, e.message)),
                    ),
                ),
                warnings: invalid
                    .warnings
                    .into_iter()
                    .map(|w| located(w.path, w.message))
                    .collect(),
            }),
        }
    }
}

// === impl Config ===

impl Config {
    /// Read and validate the YAML file at `path` ([`Loaded::load`] without the resources).
    pub fn load(path: impl AsRef<Path>) -> Result<Config, LoadError> {
        Loaded::load(path).map(|l| l.config)
    }

    /// [`Loaded::from_file_text`] without the resources.
    pub fn from_file_text(path: &Path, text: &str) -> Result<Config, LoadError> {
        Loaded::from_file_text(path, text).map(|l| l.config)
    }

    /// [`Loaded::from_yaml_str`] without the resources.
    pub fn from_yaml_str(text: &str, origin: &str) -> Result<Config, LoadError> {
        Loaded::from_yaml_str(text, origin).map(|l| l.config)
    }

    /// The quick-start config for `pronto serve --backend URL ...`: one pool named `model`
    /// with backends `backend-0`, `backend-1`, … in argument order, every other setting at
    /// its default. URLs are validated as in a file; errors name the pool path and the
    /// origin `--backend`.
    pub fn from_backend_urls(
        urls: &[String],
        model: &str,
        policy: impl Into<PolicySpec>,
    ) -> Result<Config, LoadError> {
        let origin = "--backend";
        let policy = policy_file(&policy.into());
        let unlocated = |path: String, message: String| Diagnostic {
            location: None,
            path,
            message,
        };
        // Each URL is read as the file's `url:` is; every bad one is reported.
        let mut bad_urls = Vec::new();
        let mut backends = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            match value::BackendUrl::parse(url) {
                Ok(url) => backends.push(file::BackendFile {
                    name: Some(value::Name::written(&format!("backend-{i}"))),
                    url: Some(url),
                    ..Default::default()
                }),
                Err(message) => bad_urls.push(unlocated(
                    format!("{}.backends[{i}].url", validate::key_path("pools", model)),
                    message,
                )),
            }
        }
        if !bad_urls.is_empty() {
            return Err(LoadError {
                origin: origin.to_string(),
                errors: bad_urls,
                warnings: Vec::new(),
            });
        }
        let pool = file::PoolFile {
            policy: Some(policy.clone()),
            backends: Some(backends),
            ..Default::default()
        };
        let f = file::ConfigFile {
            pools: Some(file::Pools(vec![(model.to_string(), pool)])),
            ..Default::default()
        };
        match validate(&f) {
            Ok((mut config, _no_files, warnings)) => {
                config.origin = origin.to_string();
                config.warnings = warnings
                    .into_iter()
                    .map(|w| unlocated(w.path, w.message))
                    .collect();
                let mut source = format!("{model}\n{}\n", policy.name);
                for (k, v) in &policy.params {
                    source.push_str(&format!("{k}={v}\n"));
                }
                for url in urls {
                    source.push_str(url);
                    source.push('\n');
                }
                config.source_hash = model::fnv1a(source.as_bytes());
                Ok(config)
            }
            Err(invalid) => Err(LoadError {
                origin: origin.to_string(),
                errors: invalid
                    .errors
                    .into_iter()
                    .map(|e| unlocated(e.path, e.message))
                    .collect(),
                warnings: invalid
                    .warnings
                    .into_iter()
                    .map(|w| unlocated(w.path, w.message))
                    .collect(),
            }),
        }
    }
}

impl Config {
    /// The pool name of [`Config::from_backend_urls_serving_listed`].
    pub const LISTED_MODELS_POOL: &'static str = "default";

    /// The quick-start config for `pronto serve --backend URL ...` without `--model`: as
    /// [`Config::from_backend_urls`] with the pool named [`Config::LISTED_MODELS_POOL`],
    /// which also serves every model its backends list at `GET /v1/models`
    /// ([`Pool::serve_listed_models`]).
    pub fn from_backend_urls_serving_listed(
        urls: &[String],
        policy: impl Into<PolicySpec>,
    ) -> Result<Config, LoadError> {
        let mut config = Config::from_backend_urls(urls, Config::LISTED_MODELS_POOL, policy)?;
        for p in &mut config.pools {
            p.serve_listed_models = true;
        }
        Ok(config)
    }
}

/// The file form of `spec`: its name and every parameter, as a file would write them.
pub(super) fn policy_file(spec: &PolicySpec) -> file::PolicyFile {
    let mut fields = match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(fields)) => fields,
        // A tagged enum always serializes to an object.
        _ => serde_json::Map::new(),
    };
    fields.remove("name");
    file::PolicyFile {
        name: spec.name().to_string(),
        params: fields.into_iter().collect(),
    }
}

/// Whether `path` is `node` or inside it.
fn under(path: &str, node: &str) -> bool {
    path == node
        || path
            .strip_prefix(node)
            .is_some_and(|rest| rest.starts_with(['.', '[']))
}

/// `path` split into its parent and its last map key (`None` for a list index or the root).
fn split_key(path: &str) -> Option<(&str, &str)> {
    if path.ends_with(']') {
        return None;
    }
    let at = if path.ends_with('"') {
        path.rfind(".\"").map_or(0, |i| i + 1)
    } else {
        path.rfind(['.', ']']).map_or(0, |i| i + 1)
    };
    let parent = path[..at].strip_suffix('.').unwrap_or(&path[..at]);
    Some((parent, path[at..].trim_matches('"')))
}

/// Whether `e` is about the node or a sibling of the node a shape error removed at `node`,
/// and names it: a follow-on of the removal (`routes[0].hedge: needs after`).
fn names_removed(e: &ConfigError, node: &str) -> bool {
    let Some((parent, key)) = split_key(node).filter(|(_, key)| !key.is_empty()) else {
        return false;
    };
    let beside = e.path == parent || split_key(&e.path).is_some_and(|(p, _)| p == parent);
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    beside
        && e.message.match_indices(key).any(|(i, _)| {
            !e.message[..i].ends_with(word) && !e.message[i + key.len()..].starts_with(word)
        })
}

/// `errors` by their place in the file (shape and semantic errors interleaved, as a
/// compiler lists them), those without a place last, each group otherwise in the order found.
fn in_file_order(errors: impl Iterator<Item = Diagnostic>) -> Vec<Diagnostic> {
    let mut errors: Vec<Diagnostic> = errors.collect();
    errors.sort_by_key(|d| d.location.map_or((usize::MAX, 0), |l| (l.line, l.column)));
    errors
}

/// A syntax or type error from `serde_yaml_ng` in `text`, with its position split out of the
/// message and kept inside the text.
fn yaml_error(text: &str, origin: &str, e: &serde_yaml_ng::Error) -> LoadError {
    let reported = e.location().map(|l| Location {
        line: l.line(),
        column: l.column(),
    });
    let mut message = e.to_string();
    if let Some(l) = &reported {
        // serde_yaml_ng appends " at line L column C" (and for parser errors may continue
        // with ", while parsing ..."); the position is already in the prefix.
        let suffix = format!(" at line {} column {}", l.line, l.column);
        if let Some(at) = message.find(&suffix) {
            message.replace_range(at..at + suffix.len(), "");
        }
    }
    LoadError::single(origin, reported.map(|l| within(text, l)), message)
}

/// `loc`, or the end of `text` when `loc` lies past it: the parser reports an error at the
/// end of a text without a final line break on the line after the last one.
fn within(text: &str, loc: Location) -> Location {
    // Lines as YAML breaks them: `\r\n`, `\n`, `\r`, NEL, LS and PS.
    let lines: Vec<&str> = text
        .split("\r\n")
        .flat_map(|l| l.split(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}']))
        .collect();
    let last = lines.last().map_or(0, |l| l.chars().count());
    if loc.line > lines.len() {
        return Location {
            line: lines.len(),
            column: last + 1,
        };
    }
    loc
}

#[cfg(test)]
mod admin_tests;
#[cfg(test)]
mod tests;
