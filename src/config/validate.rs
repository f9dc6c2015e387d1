//! File structs → typed [`Config`], collecting every problem in one pass.
//!
//! Validation never stops at the first error: an operator fixing a file wants the whole list.
//! Each problem names the field it is about as a path from the document root —
//! `pools.llama-3-8b.backends[2].url` — which [`super::locate`] later turns into a line and
//! column. Map keys that are not plain identifiers (`[A-Za-z0-9_-]+`, e.g. a model name with a
//! `/` or `.`) are written as JSON strings: `pools."meta-llama/Llama-3.1-8B".policy`.
//!
//! Errors make the config unusable. Warnings flag settings that are valid but probably not
//! what was meant (an admin listener open to the network, a first-token timeout shorter than
//! the connect timeout, retries in a one-backend pool or more retries than a pool has other
//! backends, an explicit policy for a one-backend pool, a health interval longer than the
//! readmission delay, a probe timeout not shorter than the interval, one server listed twice);
//! the config still loads.
//!
//! What serde already read is not checked again here: addresses, URLs, globs, durations
//! (never zero), sizes, enums and the integer ranges (`threads` 1..=256, `weight` >= 1, ...)
//! arrive parsed and in range ([`super::value`], [`super::duration`]); a bad one was a
//! located shape error. What is checked here: presence (a missing required field is reported
//! with every other problem, so it cannot be serde's); the ranges whose bounds are sizes,
//! fractions or durations (`max_body_bytes` 1 KiB..=1 GiB, a sample rate, the stall floor);
//! the health path's form; backend, route and class names, well-formed and unique across the
//! file; label names (map keys); each policy's parameters (`pronto_core::routing`); the rules
//! between fields (the two listeners cannot collide, `peer_timeout` > `heartbeat`, a pool has
//! backends or `discover`); the references between sections (a route's pool, a key's routes,
//! a class); the files (certificates, tokenizers, profiles) and the secrets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use super::duration::format_size;
use super::file::{BackendFile, ConfigFile, KvEventsFile, PolicyFile, PoolFile};
use super::model::*;
use pronto_core::routing::PolicySpec;

mod limits;
mod pools;

/// Smallest accepted `limits.max_body_bytes`.
pub const MIN_BODY_BYTES: u64 = 1 << 10;
/// Largest accepted `limits.max_body_bytes`.
pub const MAX_BODY_BYTES: u64 = 1 << 30;
/// Largest accepted `threads`.
pub const MAX_THREADS: u64 = 256;

/// A problem that makes the config unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path from the document root, e.g. `pools.llama-3-8b.backends[2].url`.
    pub path: String,
    /// What is wrong, and where useful how to fix it.
    pub message: String,
}

/// A valid but suspicious setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// Field path from the document root.
    pub path: String,
    /// Why it looks wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a config that failed validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invalid {
    /// At least one.
    pub errors: Vec<ConfigError>,
    /// Warnings found along the way.
    pub warnings: Vec<ConfigWarning>,
}

/// Validate `file` and build the typed model.
///
/// On success the returned [`Config`] has an empty `origin`, no `warnings` and a zero source
/// hash: the loader ([`Config::from_yaml_str`]) fills those in, locating each warning.
pub fn validate(
    file: &ConfigFile,
) -> Result<(Config, super::Resources, Vec<ConfigWarning>), Invalid> {
    validate_with_env(file, super::edge::process_env)
}

/// [`validate`], looking up `admin.token: {env: NAME}` with `env`.
pub fn validate_with_env(
    file: &ConfigFile,
    env: super::edge::EnvLookup,
) -> Result<(Config, super::Resources, Vec<ConfigWarning>), Invalid> {
    let mut c = Checker {
        env: Some(env),
        ..Checker::default()
    };
    let config = c.config(file);
    let secret_errors = std::mem::take(&mut c.secret_errors);
    c.errors.extend(secret_errors);
    if c.errors.is_empty() {
        Ok((config, c.resources, c.warnings))
    } else {
        Err(Invalid {
            errors: c.errors,
            warnings: c.warnings,
        })
    }
}

/// `parent.key`, quoting `key` as a JSON string unless it is `[A-Za-z0-9_-]+`.
pub fn key_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key = if plain {
        key.to_string()
    } else {
        serde_json::Value::String(key.to_string()).to_string()
    };
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

/// Collects problems while building the model; on error, substitutes a default and goes on.
#[derive(Default)]
pub(super) struct Checker {
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigWarning>,
    /// What the files the config names were loaded into.
    pub(super) resources: super::Resources,
    /// Where `{env: NAME}` secrets are looked up (`None`: the process environment).
    env: Option<super::edge::EnvLookup>,
    /// Example secrets found ([`super::secrets`]): errors that do not invalidate the entity
    /// holding them (so they cause no follow-on errors), added at the end.
    pub(super) secret_errors: Vec<ConfigError>,
}

impl Checker {
    pub(super) fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(super) fn error_count(&self) -> usize {
        self.errors.len()
    }

    pub(super) fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(ConfigWarning {
            path: path.into(),
            message: message.into(),
        });
    }

    fn config(&mut self, f: &ConfigFile) -> Config {
        let listen = f.listen.unwrap_or(DEFAULT_LISTEN);
        let admin_listen = f.admin_listen.unwrap_or(DEFAULT_ADMIN_LISTEN);
        if collide(listen, admin_listen) {
            self.error(
                "admin_listen",
                format!("must differ from listen ({listen}): both would bind the same port"),
            );
        }
        let threads = f.threads.map_or(DEFAULT_THREADS, |n| n as usize);
        let grace_period = f.grace_period.unwrap_or(DEFAULT_GRACE_PERIOD);
        let limits = self.limits(f);
        let retry = f.retry.unwrap_or_default();
        let migration = f.migration.unwrap_or_default();
        let health = self.health(f);
        let reload = f.reload.unwrap_or_default();
        let pools = self.pools(f, retry);
        let priority_classes = self.priority_classes(f);
        let admission = f.admission.unwrap_or_default();
        let routes = self.routes(f, &pools, &priority_classes);
        let auth = self.auth(f.auth.as_ref(), &routes, &priority_classes);
        let admin = self.admin(
            f.admin.as_ref(),
            self.env.unwrap_or(super::edge::process_env),
        );
        let token_written = f.admin.as_ref().is_some_and(|a| a.token.is_some());
        match super::edge::admin_exposure_error(admin_listen, &admin) {
            // A token written but not loaded has its own error.
            Some(message) if !token_written => self.error("admin_listen", message),
            _ => {}
        }
        let rate_limits = self.rate_limits(f.rate_limits.as_ref(), auth.as_ref(), &routes);
        let tls = self.tls(f.tls.as_ref());
        let cluster = self.cluster(
            f.cluster.as_ref(),
            self.env.unwrap_or(super::edge::process_env),
        );
        Config {
            listen,
            admin_listen,
            threads,
            grace_period,
            limits,
            retry,
            migration,
            health,
            explain_headers: f.explain_headers.unwrap_or(false),
            access_log: f.access_log.unwrap_or_default(),
            reload,
            pools,
            priority_classes,
            admission,
            routes,
            auth,
            admin,
            rate_limits,
            tls,
            cluster,
            origin: String::new(),
            source_path: None,
            warnings: Vec::new(),
            source_hash: 0,
        }
    }

    /// `health:` as read (serde checked the values and filled the defaults): the warnings
    /// between fields.
    fn health(&mut self, f: &ConfigFile) -> Health {
        let health = f.health.clone().unwrap_or_default();
        if health.interval > health.readmit_after {
            self.warn(
                "health.interval",
                format!(
                    "{:?} is longer than health.readmit_after ({:?}): an ejected backend is \
                     readmitted on the strength of a probe up to {:?} old",
                    health.interval, health.readmit_after, health.interval
                ),
            );
        }
        if health.timeout >= health.interval {
            self.warn(
                "health.timeout",
                format!(
                    "{:?} is not shorter than health.interval ({:?}): probes can overlap",
                    health.timeout, health.interval
                ),
            );
        }
        health
    }

    /// The `name` of the `what` at `path` (serde checked its form); `None` (error recorded)
    /// when missing.
    pub(super) fn label_name<'n>(
        &mut self,
        path: &str,
        what: &str,
        name: Option<&'n super::value::Name>,
    ) -> Option<&'n str> {
        if name.is_none() {
            self.error(
                format!("{path}.name"),
                format!("missing; every {what} needs a unique name (it is a metric label)"),
            );
        }
        name.map(super::value::Name::as_str)
    }

    /// A `policy:` (a pool's or a route's at `path`); the default policy when invalid (errors
    /// recorded, with the parameter's path).
    pub(super) fn policy_spec(&mut self, path: &str, file: &PolicyFile) -> PolicySpec {
        PolicySpec::from_parts(&file.name, &file.params).unwrap_or_else(|errors| {
            for e in errors {
                let at = match &e.param {
                    None => path.to_string(),
                    Some(param) => key_path(path, param),
                };
                self.error(at, e.message);
            }
            PolicySpec::default()
        })
    }
}

/// Whether two listeners would bind the same socket. Port 0 never collides.
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `[A-Za-z0-9_.-]+`.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
#[path = "validate_engine_tests.rs"]
mod engine_tests;
#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
