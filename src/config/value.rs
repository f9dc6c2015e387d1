//! Values serde reads whole: a listener address, a backend URL, a KV-event endpoint, NATS
//! URLs, a glob. Each parses its own text, so a bad value is a shape error located at its
//! field ([`super::shape`]) like an unknown key or a bad duration, and the checker sees only
//! values that parsed. What needs context (a reference to another section, a file, a
//! secret, a rule between two fields) stays in the checker.

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use super::model::ServedName;

/// Reads a string with `parse`, turning its message into serde's error.
fn parsed<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).map_err(de::Error::custom)
}

/// [`parsed`] for an optional field read with `deserialize_with` (`null`: absent).
fn parsed_option<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, D::Error> {
    match Option::<String>::deserialize(deserializer)? {
        None => Ok(None),
        Some(text) => parse(&text).map(Some).map_err(de::Error::custom),
    }
}

/// `listen:` and `admin_listen:`: an `IP:port` address.
pub fn socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    parsed_option(d, |text| {
        text.trim()
            .parse()
            .map_err(|_| format!("`{text}` is not an IP:port address (e.g. 127.0.0.1:8080)"))
    })
}

/// A KV-event publisher, `tcp://HOST:PORT` with a non-empty host and a port number.
pub fn kv_endpoint<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    parsed_option(d, |e| {
        let valid = e
            .strip_prefix("tcp://")
            .and_then(|rest| rest.rsplit_once(':'))
            .is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
        match valid {
            true => Ok(e.to_string()),
            false => Err(format!("`{e}` is not `tcp://HOST:PORT`")),
        }
    })
}

/// `cluster.nats`: one or more `nats://host:port` or `tls://host:port` URLs (port
/// optional), comma-separated; kept as written.
pub fn nats_urls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    parsed_option(d, |text| {
        for part in text.split(',').map(str::trim) {
            nats_url(part)?;
        }
        Ok(text.to_string())
    })
}

fn nats_url(s: &str) -> Result<(), String> {
    let url = url::Url::parse(s).map_err(|e| format!("`{s}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "nats" | "tls") {
        return Err(format!(
            "`{s}`: the scheme must be `nats` or `tls` (e.g. `nats://nats:4222`)"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // Not echoed: the URL holds a secret.
        return Err(
            "a URL with credentials in it is refused; give them in `cluster.auth` (from \
             `{env: NAME}` or `{file: PATH}`)"
                .into(),
        );
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{s}` has no host"));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!("`{s}`: give only `nats://host:port`"));
    }
    Ok(())
}

// === integer ranges ===

/// An integer in `MIN..=MAX`, read with its range (`deserialize_with`): out of it, a shape
/// error saying "must be at least MIN, got N" (no upper bound), "must be at most MAX, got N"
/// (no lower bound) or "must be between MIN and MAX, got N"; past the field's type, "N is too
/// large (at most ..)". The field's `#[schemars(range(..))]` states the same bounds in the schema.
pub fn int_in<'de, D, T, const MIN: u64, const MAX: u64>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Int,
{
    in_range::<T, MIN, MAX>(u64::deserialize(d)?).map_err(de::Error::custom)
}

/// [`int_in`] for an optional field (`null`: absent).
pub fn int_in_option<'de, D, T, const MIN: u64, const MAX: u64>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Int,
{
    Option::<u64>::deserialize(d)?
        .map(in_range::<T, MIN, MAX>)
        .transpose()
        .map_err(de::Error::custom)
}

/// [`int_in`] with no upper bound but the type's.
pub fn at_least<'de, D, T, const MIN: u64>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Int,
{
    int_in::<D, T, MIN, { u64::MAX }>(d)
}

/// [`at_least`] for an optional field (`null`: absent).
pub fn at_least_option<'de, D, T, const MIN: u64>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Int,
{
    int_in_option::<D, T, MIN, { u64::MAX }>(d)
}

/// An unsigned integer type a config field holds.
pub trait Int: TryFrom<u64> {
    /// Its largest value.
    const MAX: u64;
}

impl Int for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl Int for u64 {
    const MAX: u64 = u64::MAX;
}

impl Int for usize {
    const MAX: u64 = usize::MAX as u64;
}

/// The message of a value out of its range, bounds as written in the file: "must be at least
/// MIN, got X" (no upper bound), "must be at most MAX, got X" (no lower bound) or "must be
/// between MIN and MAX, got X".
pub(super) fn out_of_range(
    min: Option<impl fmt::Display>,
    max: Option<impl fmt::Display>,
    got: impl fmt::Display,
) -> String {
    match (min, max) {
        (Some(min), None) => format!("must be at least {min}, got {got}"),
        (None, Some(max)) => format!("must be at most {max}, got {got}"),
        (Some(min), Some(max)) => format!("must be between {min} and {max}, got {got}"),
        (None, None) => format!("{got} is out of range"),
    }
}

fn in_range<T: Int, const MIN: u64, const MAX: u64>(n: u64) -> Result<T, String> {
    if !(MIN..=MAX).contains(&n) {
        let (min, max) = ((MIN > 0).then_some(MIN), (MAX < u64::MAX).then_some(MAX));
        return Err(out_of_range(min, max, n));
    }
    T::try_from(n).map_err(|_| format!("{n} is too large (at most {})", T::MAX))
}

/// A number in `MIN..=MAX` (`deserialize_with`): out of it, or not a number (`.nan`), "must
/// be between MIN and MAX, got X".
pub fn float_in<'de, D, const MIN: u64, const MAX: u64>(d: D) -> Result<f64, D::Error>
where
    D: Deserializer<'de>,
{
    let x = f64::deserialize(d)?;
    match (MIN as f64..=MAX as f64).contains(&x) {
        true => Ok(x),
        false => Err(de::Error::custom(out_of_range(Some(MIN), Some(MAX), x))),
    }
}

/// `health.path`: an absolute HTTP path without spaces (`/health`).
pub fn http_path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    parsed(d, |p| {
        match p.starts_with('/') && !p.contains(char::is_whitespace) {
            true => Ok(p.to_string()),
            false => Err(format!(
                "`{p}` is not an absolute HTTP path (e.g. `/health`)"
            )),
        }
    })
}

/// `discover.scheme`: only `http` (a discovered backend is addressed by IP; TLS would need
/// the name as SNI).
pub fn discover_scheme<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    parsed(d, |s| match s {
        "http" => Ok(s.to_string()),
        _ => Err(format!(
            "`{s}` is not supported for discovered backends; use `http` (or list https \
             backends under `backends:`)"
        )),
    })
}

/// `cluster.tls.server_name`: a DNS name or an IP address.
pub fn server_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    parsed_option(d, |name| {
        match rustls_pki_types::ServerName::try_from(name) {
            Ok(_) => Ok(name.to_string()),
            Err(_) => Err(format!("`{name}` is not a DNS name or an IP address")),
        }
    })
}

/// A positive, finite number (a profile hint's): "must be a positive, finite number, got X".
pub fn positive_option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Option::<f64>::deserialize(d)? {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(de::Error::custom(format!(
            "must be a positive, finite number, got {x}"
        ))),
        x => Ok(x),
    }
}

// === impl HostName ===

/// An `admin.allowed_hosts` entry: a host name (letters, digits, `-` and `.`; no port), kept
/// in lower case without a final `.`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostName(String);

impl HostName {
    /// `text`, normalised, or why it is not a host name.
    pub fn parse(text: &str) -> Result<HostName, String> {
        let host = text.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        match valid {
            true => Ok(HostName(host)),
            false => Err(format!(
                "`{text}` is not a host name (letters, digits, `-` and `.`; no port)"
            )),
        }
    }

    /// A name the model holds (read by [`HostName::parse`]), to be written back.
    pub(super) fn written(name: &str) -> HostName {
        HostName(name.to_string())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for HostName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<HostName, D::Error> {
        parsed(deserializer, HostName::parse)
    }
}

impl Serialize for HostName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

// === impl Name ===

/// A backend's or a route's name: a metric label value, `[A-Za-z0-9_.-]+`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// `text`, or why it is not a name.
    pub fn parse(text: &str) -> Result<Name, String> {
        match super::validate::valid_name(text) {
            true => Ok(Name(text.to_string())),
            false => Err(format!(
                "`{text}` is not a valid name: use letters, digits, `_`, `.` and `-`"
            )),
        }
    }

    /// A name the model holds, to be written back as is (the checker read it from a file, or
    /// the gateway made it).
    pub(super) fn written(name: &str) -> Name {
        Name(name.to_string())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        parsed(deserializer, Name::parse)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

// === impl BackendUrl ===

/// A backend's base URL: `http` or `https`, a host, a port (explicit or the scheme's), and
/// nothing after it (no path beyond `/`, query, fragment or credentials: Pronto forwards the
/// client's request path as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// As written in the URL: a DNS name, an IPv4 address or a bracketed IPv6 address.
    pub host: String,
    /// Explicit, or 80 / 443.
    pub port: u16,
    /// `https`.
    pub tls: bool,
}

impl BackendUrl {
    /// Parse `text`, or say what is wrong with it.
    pub fn parse(text: &str) -> Result<BackendUrl, String> {
        let text = text.trim();
        if !text.contains("://") {
            return Err(format!(
                "`{text}` is not a URL; write it with a scheme, e.g. `http://{text}`"
            ));
        }
        let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a valid URL: {e}"))?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            other => return Err(format!("unsupported scheme `{other}`; use http or https")),
        };
        let host = match url.host() {
            Some(h) => h.to_string(),
            None => return Err(format!("`{text}` has no host")),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err("credentials in backend URLs are not supported".to_string());
        }
        if url.path() != "/" && !url.path().is_empty() {
            return Err(format!(
                "must not have a path (`{}`): Pronto forwards the client's request path as is",
                url.path()
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("must not have a query or fragment".to_string());
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("`{text}` has no port"))?;
        Ok(BackendUrl { host, port, tls })
    }
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

impl<'de> Deserialize<'de> for BackendUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<BackendUrl, D::Error> {
        parsed(deserializer, BackendUrl::parse)
    }
}

impl Serialize for BackendUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl JsonSchema for BackendUrl {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "backend_url".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "pattern": "^https?://" })
    }
}

// === impl HostPort ===

/// `discover.dns`: a name (or an IP literal, IPv6 bracketed) and a port, 80 when absent;
/// no scheme or path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The name to resolve, as written.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl HostPort {
    /// Parse `text`, or say what is wrong with it.
    pub fn parse(text: &str) -> Result<HostPort, String> {
        let dns = text.trim();
        if dns.is_empty() {
            return Err("empty; a name to resolve, e.g. `vllm.internal:8000`".to_string());
        }
        if dns.contains("://") || dns.contains('/') {
            return Err(format!(
                "`{dns}` must be `host:port`, without a scheme or path"
            ));
        }
        let BackendUrl { host, port, .. } =
            BackendUrl::parse(&format!("http://{dns}")).map_err(|m| m.replace("http://", ""))?;
        Ok(HostPort { host, port })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<HostPort, D::Error> {
        parsed(deserializer, HostPort::parse)
    }
}

impl Serialize for HostPort {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

// === impl ServedName ===

/// Longest `served_model_name` (as discovery keeps the ids a backend lists).
const MAX_SERVED_NAME_LEN: usize = 512;

impl ServedName {
    /// A `served_model_name` as written: a model name, or `discover`.
    pub fn parse(name: &str) -> Result<ServedName, String> {
        if name == ServedName::DISCOVER {
            return Ok(ServedName::Discover);
        }
        if name.trim().is_empty() {
            return Err(
                "must be a model name or `discover` (ask each backend's GET /v1/models)".into(),
            );
        }
        if name.len() > MAX_SERVED_NAME_LEN || name.chars().any(char::is_control) {
            return Err(format!(
                "must be at most {MAX_SERVED_NAME_LEN} bytes without control characters"
            ));
        }
        Ok(ServedName::Named(name.into()))
    }
}

impl<'de> Deserialize<'de> for ServedName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ServedName, D::Error> {
        parsed(deserializer, ServedName::parse)
    }
}

impl Serialize for ServedName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

// === impl Glob ===

/// A shell-style pattern (`globset`): `*` any run of characters (`/` included), `?` one
/// character, `[abc]`, `[a-z]`, `[!0-9]` a class, `{a,b}` alternatives, `\` escapes.
#[derive(Debug, Clone)]
pub struct Glob {
    text: String,
    matcher: globset::GlobMatcher,
}

impl PartialEq for Glob {
    fn eq(&self, other: &Glob) -> bool {
        self.text == other.text
    }
}

impl Eq for Glob {}

impl Glob {
    /// Parse `text`, or say why it is not a valid pattern.
    pub fn parse(text: &str) -> Result<Glob, String> {
        if text.is_empty() {
            return Err("empty pattern".to_string());
        }
        let glob = globset::GlobBuilder::new(text)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("`{text}` is not a valid glob: {}", e.kind()))?;
        Ok(Glob {
            text: text.to_string(),
            matcher: glob.compile_matcher(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern has no wildcard (it matches exactly one string, its text with
    /// escapes removed); that string, if so.
    pub fn literal(&self) -> Option<String> {
        let mut out = String::new();
        let mut chars = self.text.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next()?),
                '*' | '?' | '[' | '{' => return None,
                c => out.push(c),
            }
        }
        Some(out)
    }

    pub(super) fn is_match_all(&self) -> bool {
        self.text.chars().all(|c| c == '*')
    }

    /// Whether `s` matches the whole pattern (a compiled automaton: linear in `s`).
    pub fn matches(&self, s: &str) -> bool {
        self.matcher.is_match(s)
    }
}

impl<'de> Deserialize<'de> for Glob {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Glob, D::Error> {
        parsed(deserializer, Glob::parse)
    }
}

impl Serialize for Glob {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl JsonSchema for Glob {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "glob".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string" })
    }
}

/// A route's `match.path`: a glob of an absolute path (`/v1/chat/*`, or starting with `*`).
pub fn path_glob<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Glob>, D::Error> {
    parsed_option(d, |text| {
        if !text.starts_with('/') && !text.starts_with('*') {
            return Err(format!(
                "`{text}` is not an absolute path pattern (e.g. `/v1/chat/*`)"
            ));
        }
        Glob::parse(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_urls_round_trip_through_their_text() {
        for (text, shown) in [
            ("http://h:1", "http://h:1"),
            ("https://h", "https://h:443"),
            ("http://[::1]:8000/", "http://[::1]:8000"),
        ] {
            let url = BackendUrl::parse(text).unwrap();
            assert_eq!(url.to_string(), shown);
            assert_eq!(BackendUrl::parse(shown), Ok(url));
        }
    }

    #[test]
    fn integers_are_read_with_their_range() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct T {
            #[serde(default, deserialize_with = "at_least_option::<_, _, 1>")]
            weight: Option<u32>,
            #[serde(default, deserialize_with = "int_in_option::<_, _, 0, 8>")]
            attempts: Option<u32>,
            #[serde(default, deserialize_with = "int_in_option::<_, _, 1, 256>")]
            threads: Option<u64>,
        }
        let err = |yaml: &str| serde_yaml_ng::from_str::<T>(yaml).unwrap_err().to_string();
        assert!(err("weight: 0").contains("must be at least 1, got 0"));
        assert!(err("weight: 4294967296").contains("4294967296 is too large (at most 4294967295)"));
        assert!(err("weight: -1").contains("invalid type: integer `-1`, expected u64"));
        assert!(err("attempts: 9").contains("must be at most 8, got 9"));
        assert!(err("threads: 0").contains("must be between 1 and 256, got 0"));
        let t: T =
            serde_yaml_ng::from_str("{weight: 4294967295, attempts: 0, threads: ~}").unwrap();
        assert_eq!(
            (t.weight, t.attempts, t.threads),
            (Some(u32::MAX), Some(0), None)
        );
    }

    #[test]
    fn values_are_read_by_serde_with_their_messages() {
        #[derive(Deserialize)]
        struct T {
            #[serde(default, deserialize_with = "socket_addr")]
            addr: Option<SocketAddr>,
            #[serde(default, deserialize_with = "kv_endpoint")]
            kv: Option<String>,
            #[serde(default, deserialize_with = "nats_urls")]
            nats: Option<String>,
            #[serde(default, deserialize_with = "path_glob")]
            path: Option<Glob>,
            glob: Option<Glob>,
        }
        let err = |yaml: &str| {
            serde_yaml_ng::from_str::<T>(yaml)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("addr: localhost:80")
            .contains("`localhost:80` is not an IP:port address (e.g. 127.0.0.1:8080)"));
        assert!(err("kv: 'http://h:1'").contains("`http://h:1` is not `tcp://HOST:PORT`"));
        assert!(err("kv: 'tcp://h:0'").contains("is not `tcp://HOST:PORT`"));
        assert!(
            err("nats: 'nats://a:1, http://b:2'").contains("the scheme must be `nats` or `tls`")
        );
        assert!(err("nats: 'nats://u:p@a:1'").contains("credentials in it is refused"));
        assert!(err("path: 'v1/*'").contains("`v1/*` is not an absolute path pattern"));
        assert!(err("glob: 'a[0-9'").contains("`a[0-9` is not a valid glob: unclosed"));
        let t: T = serde_yaml_ng::from_str("{addr: null, kv: ~, nats: null, path: null}").unwrap();
        assert!(t.addr.is_none() && t.kv.is_none() && t.nats.is_none() && t.path.is_none());
        let t: T = serde_yaml_ng::from_str(
            "{addr: '[::1]:80', kv: 'tcp://h:5557', nats: 'nats://a:1, tls://b', path: '/v1/*', \
             glob: 'llama-*'}",
        )
        .unwrap();
        assert_eq!(t.addr, Some("[::1]:80".parse().unwrap()));
        assert_eq!(t.kv.as_deref(), Some("tcp://h:5557"));
        assert_eq!(t.nats.as_deref(), Some("nats://a:1, tls://b"));
        assert!(t.path.unwrap().matches("/v1/chat"));
        assert!(t.glob.unwrap().matches("llama-3"));
    }
}
