//! Edge settings: API keys (`auth:`), the admin token (`admin:`) and rate limits
//! (`rate_limits:`) — file structs, validation with field paths, and the typed model.
//!
//! ```yaml
//! auth:
//!   keys:
//!     - name: team-a                 # unique; the rate-limit and log identity of the key
//!       key: sk-team-a-secret        # or `sha256: <64 hex digits>` (hashed at rest)
//!       models: ["llama-*"]          # globs; absent: every model
//!       routes: [chat]               # route names; absent: every route
//!       priority: interactive        # admission class when the route names none
//!   keys_file: keys.yaml             # more keys, a YAML list of the same entries
//! admin:
//!   token: admin-secret              # Bearer token for /metrics and /admin/*, or
//!   # token: {env: PRONTO_ADMIN_TOKEN}      read from an environment variable, or
//!   # token: {file: /run/secrets/admin}     read from a file (trimmed; relative to this file)
//!   allowed_hosts: [pronto-admin.internal]   # names POST /admin/* may carry in `Host`
//! rate_limits:
//!   per_key: {requests_per_minute: 600, tokens_per_minute: 200000, max_concurrent: 32}
//!   keys: {team-a: {requests_per_minute: 60}}     # replaces per_key for this key
//!   routes: {chat: {max_concurrent: 256}}
//! ```
//!
//! **Keys at rest.** Only SHA-256 digests are kept in memory: a plaintext `key:` is hashed at
//! load, and a `sha256:` entry is taken as is. A presented token is hashed once and compared
//! in constant time against every key (`auth`).
//!
//! **`keys_file`** is read at load (and at every reload); a relative path is resolved against
//! the config file's directory. Editing only the keys file does not change the config's hash:
//! `POST /admin/reload` after touching the config file, or touch it.
//!
//! **The admin token** is read at load and at every reload (so a rotated token file or a
//! restart with a new environment takes effect). An admin listener that is not on loopback
//! must have one: [`admin_exposure_error`] refuses it at load, after a `--admin-listen`
//! override and on a reload that would drop the token (`reload`). Tokens, keys
//! and the TLS key published in the repository's examples are refused
//! ([`super::secrets`]).
//!
//! **Validation** reports, with field paths: a key with neither or both of `key`/`sha256`, a
//! malformed digest, duplicate key names or key values, unknown routes or priority classes,
//! malformed model globs, an unreadable keys file, zero limits, and rate limits naming keys or
//! routes that do not exist.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;

use super::route::{Glob, Route};
use super::validate::Checker;

/// API keys; with it every request needs `Authorization: Bearer <key>`
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    /// Keys, each with a unique name
    pub keys: Option<Vec<KeyFile>>,
    /// A YAML list of further keys (same entries); relative to this file
    pub keys_file: Option<String>,
}

/// One API key as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "api_key", extend("required" = ["name"]))]
pub struct KeyFile {
    /// Unique key name (logs, rate limits)
    pub name: Option<String>,
    /// The key in plaintext
    #[schemars(length(min = 8))]
    pub key: Option<String>,
    /// The key's SHA-256 (64 hex digits) instead of `key`
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{64}$"))]
    pub sha256: Option<String>,
    /// Model globs the key may use; absent: all
    #[schemars(with = "Option<Vec<String>>", length(min = 1))]
    pub models: Option<Vec<Glob>>,
    /// Route names the key may use; absent: all
    #[schemars(length(min = 1))]
    pub routes: Option<Vec<String>>,
    /// Admission priority class for routes that name none
    pub priority: Option<String>,
}

/// Admin listener settings
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// Bearer token required for the status page, /metrics and /admin/* (not /healthz,
    /// /readyz); required when admin_listen is not loopback. The token, {env: NAME} or
    /// {file: PATH}
    #[schemars(with = "Option<super::schema::AdminToken>")]
    pub token: Option<SecretFile>,
    /// Host names POST /admin/* may carry in Host and Origin, besides IP addresses and
    /// localhost
    #[schemars(with = "Option<Vec<String>>")]
    pub allowed_hosts: Option<Vec<super::value::HostName>>,
}

/// A secret as written: the value itself (`token: s3cret`), or where to read it
/// (`token: {env: NAME}`, `token: {file: PATH}`).
#[derive(Clone, PartialEq, Eq)]
pub enum SecretFile {
    /// The secret in the file.
    Inline(String),
    /// The name of an environment variable holding it.
    Env(String),
    /// A file holding it (surrounding whitespace trimmed).
    File(String),
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretFile::Inline(_) => f.write_str("Inline(..)"),
            SecretFile::Env(name) => f.debug_tuple("Env").field(name).finish(),
            SecretFile::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// The map form of [`SecretFile`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretSourceFile {
    env: Option<String>,
    file: Option<String>,
}

impl serde::Serialize for SecretFile {
    /// The file's forms: the value, `{env: NAME}` or `{file: PATH}`.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (key, value) = match self {
            SecretFile::Inline(v) => return serializer.serialize_str(v),
            SecretFile::Env(name) => ("env", name),
            SecretFile::File(path) => ("file", path),
        };
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(key, value)?;
        map.end()
    }
}

impl JsonSchema for SecretFile {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "secret".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        super::schema::inline_or_source(
            serde_json::json!({ "type": "string", "minLength": 1, "pattern": "^[!-~]+$" }),
            "secret",
        )
    }
}

impl<'de> Deserialize<'de> for SecretFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SecretFile, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = SecretFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, `{env: NAME}` or `{file: PATH}`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SecretFile, E> {
                Ok(SecretFile::Inline(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<SecretFile, A::Error> {
                let f = SecretSourceFile::deserialize(
                    serde::de::value::MapAccessDeserializer::new(map),
                )?;
                match (f.env, f.file) {
                    (Some(env), None) => Ok(SecretFile::Env(env)),
                    (None, Some(file)) => Ok(SecretFile::File(file)),
                    _ => Err(serde::de::Error::custom(
                        "give exactly one of `env` (a variable name) or `file` (a path)",
                    )),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Rate limits per API key and per route (429 with Retry-After)
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsFile {
    /// Limits applied to every key without its own entry
    pub per_key: Option<RateLimit>,
    /// Limits by key name (replace per_key for that key)
    pub keys: Option<BTreeMap<String, RateLimit>>,
    /// Limits by route name
    pub routes: Option<BTreeMap<String, RateLimit>>,
}

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// One validated API key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Unique name (log and rate-limit identity; never the key itself).
    pub name: Arc<str>,
    /// SHA-256 of the key.
    pub digest: Digest,
    /// Allowed model globs; empty: every model.
    pub models: Vec<Glob>,
    /// Allowed route names; empty: every route.
    pub routes: Vec<Arc<str>>,
    /// Admission class (name, rank) for routes that name none.
    pub priority: Option<(Arc<str>, u32)>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the digest: it is as good as the key against an offline guesser.
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("routes", &self.routes)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// Validated `auth:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    /// Every key (inline then from the file); at least one.
    pub keys: Vec<ApiKey>,
}

/// Validated `admin:`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminSettings {
    /// SHA-256 of the admin token; `None`: the admin listener is open (loopback by default).
    pub token_digest: Option<Digest>,
    /// Where the token is read from, as written (the effective config shows it, redacting
    /// an inline token).
    pub token_from: Option<SecretFile>,
    /// Lowercase host names `POST /admin/*` may name in `Host` / `Origin`, besides IP
    /// addresses and `localhost`.
    pub allowed_hosts: Vec<String>,
}

/// Why an admin listener on `addr` with `admin` may not start: one that is not on loopback
/// needs a token. `None` when it may.
pub fn admin_exposure_error(addr: std::net::SocketAddr, admin: &AdminSettings) -> Option<String> {
    (!addr.ip().is_loopback() && admin.token_digest.is_none()).then(|| {
        format!(
            "{addr} is not a loopback address, and `admin.token` is not set: anyone who can \
             reach it could read metrics and backend state and reload the config. Set \
             `admin.token` (the token, `{{env: NAME}}` or `{{file: PATH}}`) or bind loopback"
        )
    })
}

/// Where `admin.token: {env: NAME}` variables are looked up: the process environment, or a
/// test's own lookup (no global state to race on).
pub type EnvLookup = fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// One set of limits; `None` fields are unlimited.
///
/// Both the file's entries (`rate_limits.per_key`, `.keys.<name>`, `.routes.<name>`) and the
/// model: serde refuses zeros ([`super::value::at_least_option`]); the checker clamps to
/// [`MAX_PER_MINUTE`].
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize, JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
#[schemars(rename = "rate_limit")]
pub struct RateLimit {
    /// Requests per minute (burst: the whole minute)
    #[serde(default, deserialize_with = "super::value::at_least_option::<_, _, 1>")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<u32>,
    /// Prompt (estimated, then usage-corrected) + completion tokens per minute
    #[serde(default, deserialize_with = "super::value::at_least_option::<_, _, 1>")]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<u32>,
    /// Requests in flight at once
    #[serde(default, deserialize_with = "super::value::at_least_option::<_, _, 1>")]
    #[schemars(range(min = 1))]
    pub max_concurrent: Option<u32>,
}

/// Validated `rate_limits:`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// Limits for keys without their own entry.
    pub per_key: Option<RateLimit>,
    /// Limits by key name.
    pub keys: BTreeMap<Arc<str>, RateLimit>,
    /// Limits by route name.
    pub routes: BTreeMap<Arc<str>, RateLimit>,
}

impl RateLimits {
    /// The limits that apply to the key named `name`.
    pub fn for_key(&self, name: &str) -> Option<&RateLimit> {
        self.keys.get(name).or(self.per_key.as_ref())
    }
}

/// Resolve a relative `auth.keys_file`, `admin.token: {file: ...}` and pool or backend
/// `api_key: {file: ...}` against the directory of the config file at `path`.
pub(super) fn resolve_keys_file(file: &mut super::file::ConfigFile, path: &Path) {
    let Some(dir) = path.parent() else { return };
    let token_file = file.admin.as_mut().and_then(|a| match a.token.as_mut() {
        Some(SecretFile::File(p)) => Some(p),
        _ => None,
    });
    let keys_file = file.auth.as_mut().and_then(|a| a.keys_file.as_mut());
    let mut key_files: Vec<&mut String> = Vec::new();
    for pool in file
        .pools
        .iter_mut()
        .flat_map(|p| p.0.iter_mut())
        .map(|(_, p)| p)
    {
        if let Some(SecretFile::File(f)) = pool.api_key.as_mut() {
            key_files.push(f);
        }
        for b in pool.backends.iter_mut().flatten() {
            if let Some(SecretFile::File(f)) = b.api_key.as_mut() {
                key_files.push(f);
            }
        }
    }
    for kf in keys_file.into_iter().chain(token_file).chain(key_files) {
        if Path::new(kf).is_relative() {
            *kf = dir.join(&*kf).display().to_string();
        }
    }
}

fn parse_digest(text: &str) -> Result<Digest, String> {
    let t = text.trim();
    if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("must be 64 hexadecimal digits (a SHA-256 digest)".into());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

// === impl Checker ===

impl Checker {
    /// `auth:`; `None` when absent (the gateway is open).
    pub(super) fn auth(
        &mut self,
        f: Option<&AuthFile>,
        routes: &[Route],
        classes: &[Arc<str>],
    ) -> Option<Auth> {
        let f = f?;
        let mut entries: Vec<(String, KeyFile)> = f
            .keys
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, k)| (format!("auth.keys[{i}]"), k.clone()))
            .collect();
        if let Some(path) = &f.keys_file {
            match std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read `{path}`: {e}"))
                .and_then(|t| {
                    serde_yaml_ng::from_str::<Vec<KeyFile>>(&t)
                        .map_err(|e| format!("`{path}` is not a YAML list of keys: {e}"))
                }) {
                Ok(list) => entries.extend(
                    list.into_iter()
                        .enumerate()
                        .map(|(i, k)| (format!("auth.keys_file[{i}]"), k)),
                ),
                Err(message) => self.error("auth.keys_file", message),
            }
        }
        if entries.is_empty() {
            self.error(
                "auth.keys",
                "no keys: list at least one (or remove `auth:` to leave the gateway open)",
            );
            return None;
        }
        let route_names: HashSet<&str> = routes.iter().map(|r| &*r.name).collect();
        let mut names = HashSet::new();
        let mut digests = HashSet::new();
        let mut keys = Vec::new();
        for (path, k) in &entries {
            if let Some(key) = self.api_key(path, k, &route_names, classes) {
                if !names.insert(key.name.clone()) {
                    self.error(
                        format!("{path}.name"),
                        format!("duplicate key name `{}`", key.name),
                    );
                }
                if !digests.insert(key.digest) {
                    self.error(path.clone(), "the same key value is listed twice");
                }
                keys.push(key);
            }
        }
        Some(Auth { keys })
    }

    fn api_key(
        &mut self,
        path: &str,
        k: &KeyFile,
        routes: &HashSet<&str>,
        classes: &[Arc<str>],
    ) -> Option<ApiKey> {
        let errors = self.error_count();
        let name = match k.name.as_deref() {
            Some(n) if !n.trim().is_empty() => Arc::<str>::from(n),
            _ => {
                self.error(format!("{path}.name"), "missing: every key needs a name");
                Arc::from("")
            }
        };
        let digest = match (&k.key, &k.sha256) {
            (Some(key), None) if key.trim().len() >= 8 => {
                let d = sha256(key.trim().as_bytes());
                self.not_an_example_secret(format!("{path}.key"), &d);
                d
            }
            (Some(_), None) => {
                self.error(
                    format!("{path}.key"),
                    "too short: use at least 8 characters",
                );
                [0; 32]
            }
            (None, Some(hex)) => match parse_digest(hex) {
                Ok(d) => {
                    self.not_an_example_secret(format!("{path}.sha256"), &d);
                    d
                }
                Err(m) => {
                    self.error(format!("{path}.sha256"), m);
                    [0; 32]
                }
            },
            (Some(_), Some(_)) => {
                self.error(path.to_string(), "give `key` or `sha256`, not both");
                [0; 32]
            }
            (None, None) => {
                self.error(path.to_string(), "missing `key` (or `sha256`)");
                [0; 32]
            }
        };
        let models = k.models.clone().unwrap_or_default();
        let mut allowed_routes = Vec::new();
        for (i, r) in k.routes.iter().flatten().enumerate() {
            if routes.contains(r.as_str()) {
                allowed_routes.push(Arc::<str>::from(r.as_str()));
            } else {
                self.error(
                    format!("{path}.routes[{i}]"),
                    format!("no route is named `{r}`"),
                );
            }
        }
        let lengths = [
            k.models.as_ref().map(Vec::len),
            k.routes.as_ref().map(Vec::len),
        ];
        for (field, len) in ["models", "routes"].into_iter().zip(lengths) {
            if len == Some(0) {
                self.error(
                    format!("{path}.{field}"),
                    "empty list: the key could use nothing (omit it to allow everything)",
                );
            }
        }
        let priority =
            k.priority
                .as_deref()
                .and_then(|p| match classes.iter().position(|c| &**c == p) {
                    Some(rank) => Some((classes[rank].clone(), rank as u32)),
                    None => {
                        self.error(
                            format!("{path}.priority"),
                            format!("unknown priority class `{p}`"),
                        );
                        None
                    }
                });
        (self.error_count() == errors).then_some(ApiKey {
            name,
            digest,
            models,
            routes: allowed_routes,
            priority,
        })
    }

    /// The value of the secret at `path` as written: inline, from the environment (`env`) or
    /// from a file; with the path of the field it came from (`admin.token.env`, ...), or
    /// `None` (error recorded) when the variable is unset or the file unreadable.
    pub(super) fn secret(
        &mut self,
        path: &str,
        f: &SecretFile,
        env: EnvLookup,
    ) -> Option<(String, String)> {
        match f {
            SecretFile::Inline(t) if t.trim() == super::secrets::REDACTED => {
                self.error(path, super::secrets::REDACTED_MESSAGE);
                None
            }
            SecretFile::Inline(t) => Some((path.to_string(), t.clone())),
            SecretFile::Env(name) => {
                let at = format!("{path}.env");
                let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if !valid {
                    self.error(at, format!("`{name}` is not an environment variable name"));
                    return None;
                }
                match env(name) {
                    Some(v) if !v.trim().is_empty() => Some((at, v)),
                    _ => {
                        self.error(
                            at,
                            format!("the environment variable `{name}` is not set (or empty)"),
                        );
                        None
                    }
                }
            }
            SecretFile::File(file) => {
                let at = format!("{path}.file");
                match std::fs::read_to_string(file) {
                    Ok(text) => Some((at, text)),
                    Err(e) => {
                        self.error(at, format!("cannot read `{file}`: {e}"));
                        None
                    }
                }
            }
        }
    }

    /// `admin:`, reading the token from the environment (`env`) or a file when so written.
    pub(super) fn admin(&mut self, f: Option<&AdminFile>, env: EnvLookup) -> AdminSettings {
        let Some(f) = f else {
            return AdminSettings::default();
        };
        let token = f
            .token
            .as_ref()
            .and_then(|t| self.secret("admin.token", t, env));
        let token_digest = token.and_then(|(path, t)| {
            if t.trim().len() >= 8 {
                let d = sha256(t.trim().as_bytes());
                self.not_an_example_secret(&path, &d);
                Some(d)
            } else {
                self.error(path, "too short: use at least 8 characters");
                None
            }
        });
        AdminSettings {
            token_from: token_digest.and(f.token.clone()),
            token_digest,
            allowed_hosts: (f.allowed_hosts.iter().flatten())
                .map(|h| h.as_str().to_string())
                .collect(),
        }
    }

    /// `rate_limits:`.
    pub(super) fn rate_limits(
        &mut self,
        f: Option<&RateLimitsFile>,
        auth: Option<&Auth>,
        routes: &[Route],
    ) -> RateLimits {
        let Some(f) = f else {
            return RateLimits::default();
        };
        let per_key = f
            .per_key
            .as_ref()
            .map(|l| self.rate_limit("rate_limits.per_key", l));
        if (per_key.is_some() || f.keys.is_some()) && auth.is_none() {
            self.error(
                "rate_limits",
                "per-key limits need `auth:` keys (requests without a key have no identity)",
            );
        }
        let mut keys = BTreeMap::new();
        for (name, l) in f.keys.iter().flatten() {
            let path = super::validate::key_path("rate_limits.keys", name);
            if auth.is_some_and(|a| !a.keys.iter().any(|k| &*k.name == name)) {
                self.error(path.clone(), format!("no key in `auth:` is named `{name}`"));
            }
            keys.insert(Arc::from(name.as_str()), self.rate_limit(&path, l));
        }
        let mut by_route = BTreeMap::new();
        for (name, l) in f.routes.iter().flatten() {
            let path = super::validate::key_path("rate_limits.routes", name);
            if !routes.iter().any(|r| &*r.name == name) {
                self.error(path.clone(), format!("no route is named `{name}`"));
            }
            by_route.insert(Arc::from(name.as_str()), self.rate_limit(&path, l));
        }
        RateLimits {
            per_key,
            keys,
            routes: by_route,
        }
    }

    fn rate_limit(&mut self, path: &str, l: &RateLimit) -> RateLimit {
        let one = |v: Option<u32>| v.map(|n| n.min(MAX_PER_MINUTE));
        let limit = RateLimit {
            requests_per_minute: one(l.requests_per_minute),
            tokens_per_minute: one(l.tokens_per_minute),
            max_concurrent: one(l.max_concurrent),
        };
        if limit == RateLimit::default() {
            self.warn(
                path.to_string(),
                "no limit given: this entry limits nothing",
            );
        }
        limit
    }
}

/// Largest accepted per-minute (or concurrency) limit; higher values are clamped.
pub const MAX_PER_MINUTE: u32 = 1_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const POOLS: &str = "pools:\n  m: {backends: [{name: a, url: 'http://h:1'}]}\n";

    fn load(extra: &str) -> Result<Config, String> {
        Config::from_yaml_str(&format!("{extra}{POOLS}"), "t").map_err(|e| e.to_string())
    }

    #[test]
    fn keys_are_hashed_and_limits_resolved() {
        let c = load(
            "auth:\n  keys:\n    - {name: a, key: sk-aaaaaaaa, models: ['m*'], priority: batch}\n    \
             - {name: b, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}\n\
             admin: {token: admin-secret}\n\
             rate_limits:\n  per_key: {requests_per_minute: 10}\n  keys: {b: {max_concurrent: 2}}\n",
        )
        .unwrap();
        let auth = c.auth.as_ref().unwrap();
        assert_eq!(auth.keys[0].digest, sha256(b"sk-aaaaaaaa"));
        assert_eq!(auth.keys[0].priority, Some((Arc::from("batch"), 1)));
        assert_eq!(auth.keys[1].digest, sha256(b"test"));
        assert_eq!(c.admin.token_digest, Some(sha256(b"admin-secret")));
        assert_eq!(
            c.rate_limits.for_key("a").unwrap().requests_per_minute,
            Some(10)
        );
        assert_eq!(c.rate_limits.for_key("b").unwrap().max_concurrent, Some(2));
        assert!(!format!("{:?}", auth.keys[0]).contains("digest"));
    }

    #[test]
    fn problems_are_reported_with_field_paths() {
        let e = load(
            "auth:\n  keys:\n    - {name: a, key: short}\n    - {name: a, key: sk-aaaaaaaa, routes: [nope]}\n    \
             - {name: c, sha256: xyz}\n    - {name: d, key: sk-dddddddd, sha256: ab, priority: vip}\n\
             rate_limits:\n  keys: {ghost: {requests_per_minute: 0}}\n  routes: {r: {max_concurrent: 1}}\n",
        )
        .unwrap_err();
        for expected in [
            "auth.keys[0].key: too short",
            "auth.keys[1].routes[0]: no route is named `nope`",
            "auth.keys[2].sha256: must be 64 hexadecimal digits",
            "auth.keys[3]: give `key` or `sha256`, not both",
            "auth.keys[3].priority: unknown priority class `vip`",
            "rate_limits.keys.ghost: no key in `auth:` is named `ghost`",
            "rate_limits.keys.ghost.requests_per_minute: must be at least 1",
            "rate_limits.routes.r: no route is named `r`",
        ] {
            assert!(e.contains(expected), "missing {expected:?} in:\n{e}");
        }
        let dup = load("auth:\n  keys:\n    - {name: a, key: sk-aaaaaaaa}\n    - {name: a, key: sk-aaaaaaaa}\n")
            .unwrap_err();
        assert!(
            dup.contains("duplicate key name `a`") && dup.contains("listed twice"),
            "{dup}"
        );
        let no_auth = load("rate_limits:\n  per_key: {max_concurrent: 1}\n").unwrap_err();
        assert!(no_auth.contains("per-key limits need `auth:`"), "{no_auth}");
        assert!(load("auth: {keys: []}\n")
            .unwrap_err()
            .contains("auth.keys: no keys"));
    }

    #[test]
    fn keys_file_is_relative_to_the_config_file() {
        let dir = std::env::temp_dir().join(format!("pronto-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keys.yaml"), "- {name: f, key: sk-ffffffff}\n").unwrap();
        let text = format!("auth:\n  keys_file: keys.yaml\n{POOLS}");
        let c = Config::from_file_text(&dir.join("pronto.yaml"), &text).unwrap();
        assert_eq!(&*c.auth.unwrap().keys[0].name, "f");
        std::fs::write(dir.join("keys.yaml"), "not: a list\n").unwrap();
        let e = Config::from_file_text(&dir.join("pronto.yaml"), &text).unwrap_err();
        assert!(e.to_string().contains("auth.keys_file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
