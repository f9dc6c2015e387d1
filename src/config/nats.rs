//! `cluster.auth` and `cluster.tls`: how a replica proves itself to NATS, and how it checks
//! that it talks to the right NATS (`cluster`).
//!
//! ```yaml
//! cluster:
//!   nats: nats://nats:4222
//!   auth:                                  # one kind: token | user + password | nkey | creds
//!     user: pronto                         # a string, {env: NAME} or {file: PATH}
//!     password: {env: NATS_PASSWORD}       # secrets: {env: NAME} or {file: PATH} only
//!     # token: {file: /run/secrets/nats-token}
//!     # nkey: {file: /run/secrets/pronto.nk}        an NKey user seed (`SU...`)
//!     # creds: {file: /run/secrets/pronto.creds}    a user JWT and its seed (`nsc`)
//!   tls:                                   # present: TLS required (also `tls://` URLs)
//!     ca: tls/nats-ca.pem                  # trust only these CAs (default: system roots)
//!     cert: tls/pronto-nats.crt            # client certificate, when NATS verifies clients
//!     key: tls/pronto-nats.key
//!     server_name: nats.internal           # the name NATS's certificate must carry
//! ```
//!
//! Everything is read and checked at load, with the field's path in each error: a variable
//! not set or a file not readable, an inline secret (a secret written in the config file is
//! read by whoever reads the config), two kinds of credentials at once, an NKey that is not a
//! user seed, a `.creds` without its JWT or seed, a CA file without a usable certificate, a
//! client key that does not fit its certificate (or is the repository's example key), an
//! invalid server name. Like the rest of `cluster:`, bound at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pingora_core::tls::{CertificateDer, PrivateKeyDer, RootCertStore};
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;

use super::edge::{sha256, Digest, EnvLookup, SecretFile};
use super::validate::Checker;

/// Credentials NATS asks of this replica: one kind (token, user + password, nkey or creds)
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsAuthFile {
    /// A token: {env: NAME} or {file: PATH}
    #[schemars(with = "Option<super::schema::NatsSource>")]
    pub token: Option<SecretFile>,
    /// A user name (with password): a string, {env: NAME} or {file: PATH}
    #[schemars(with = "Option<super::schema::NatsUser>")]
    pub user: Option<SecretFile>,
    /// The user's password: {env: NAME} or {file: PATH}
    #[schemars(with = "Option<super::schema::NatsSource>")]
    pub password: Option<SecretFile>,
    /// An NKey user seed (SU...): {env: NAME} or {file: PATH}
    #[schemars(with = "Option<super::schema::NatsSource>")]
    pub nkey: Option<SecretFile>,
    /// A .creds file's text (user JWT and NKey seed): {env: NAME} or {file: PATH}
    #[schemars(with = "Option<super::schema::NatsSource>")]
    pub creds: Option<SecretFile>,
}

/// TLS to NATS (present: required, as with tls:// URLs)
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsTlsFile {
    /// PEM file of the CAs to trust instead of the system roots (relative to this file)
    pub ca: Option<String>,
    /// PEM client certificate chain, leaf first, when NATS verifies clients
    pub cert: Option<String>,
    /// PEM private key of the client certificate
    pub key: Option<String>,
    /// The name NATS's certificate must be valid for (default: the URL's host)
    #[serde(default, deserialize_with = "super::value::server_name")]
    pub server_name: Option<String>,
}

/// A credential and where it was read from; never printed.
#[derive(Clone, PartialEq)]
pub struct NatsSecret {
    /// Where it was written: inline (only a user name may be), `{env}` or `{file}`.
    pub from: SecretFile,
    value: String,
}

impl NatsSecret {
    /// The value (trimmed).
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for NatsSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `SecretFile`'s own Debug never shows an inline value.
        write!(f, "NatsSecret({:?})", self.from)
    }
}

/// Validated `cluster.auth`.
#[derive(Debug, Clone, PartialEq)]
pub enum NatsAuth {
    /// A token.
    Token(NatsSecret),
    /// A user name and password.
    UserPassword {
        /// The user.
        user: NatsSecret,
        /// Its password.
        password: NatsSecret,
    },
    /// An NKey user seed (checked to be one).
    NKey(NatsSecret),
    /// A `.creds` text (checked to hold a JWT and a user seed).
    Creds(NatsSecret),
}

impl NatsAuth {
    /// The kind, as the field is named (for logs).
    pub fn kind(&self) -> &'static str {
        match self {
            NatsAuth::Token(_) => "token",
            NatsAuth::UserPassword { .. } => "user",
            NatsAuth::NKey(_) => "nkey",
            NatsAuth::Creds(_) => "creds",
        }
    }
}

/// Validated `cluster.tls`: the files as resolved and what they hold.
#[derive(Clone)]
pub struct NatsTls {
    /// The CA file, if any (absent: the system roots).
    pub ca: Option<PathBuf>,
    /// The client certificate file, if any.
    pub cert: Option<PathBuf>,
    /// Its key file.
    pub key: Option<PathBuf>,
    /// The name the server's certificate is checked against instead of the URL's host.
    pub server_name: Option<String>,
    /// The CA file's certificates (empty: none given).
    pub roots: Arc<[CertificateDer<'static>]>,
    /// The client chain and key, when given.
    pub identity: Option<(Arc<[CertificateDer<'static>]>, Arc<PrivateKeyDer<'static>>)>,
    /// SHA-256 of the files' bytes (equality without comparing key material).
    digest: Digest,
}

impl PartialEq for NatsTls {
    fn eq(&self, other: &NatsTls) -> bool {
        (
            &self.ca,
            &self.cert,
            &self.key,
            &self.server_name,
            self.digest,
        ) == (
            &other.ca,
            &other.cert,
            &other.key,
            &other.server_name,
            other.digest,
        )
    }
}

impl std::fmt::Debug for NatsTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key material.
        f.debug_struct("NatsTls")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Resolve relative `{file: PATH}` and TLS paths of `cluster:` against the directory of the
/// config file at `path`.
pub(super) fn resolve_paths(file: &mut super::file::ConfigFile, path: &Path) {
    let Some(dir) = path.parent() else { return };
    let Some(c) = file.cluster.as_mut() else {
        return;
    };
    let resolve = |p: &mut String| {
        if Path::new(p.as_str()).is_relative() {
            *p = dir.join(p.as_str()).display().to_string();
        }
    };
    let mut secrets = vec![c.replica.as_mut()];
    if let Some(a) = c.auth.as_mut() {
        secrets.extend([
            a.token.as_mut(),
            a.user.as_mut(),
            a.password.as_mut(),
            a.nkey.as_mut(),
            a.creds.as_mut(),
        ]);
    }
    for s in secrets.into_iter().flatten() {
        if let SecretFile::File(p) = s {
            resolve(p);
        }
    }
    if let Some(t) = c.tls.as_mut() {
        for p in [&mut t.ca, &mut t.cert, &mut t.key].into_iter().flatten() {
            resolve(p);
        }
    }
}

// === impl Checker ===

impl Checker {
    /// `cluster.auth`; `None` when absent or invalid (errors recorded).
    pub(super) fn nats_auth(
        &mut self,
        f: Option<&NatsAuthFile>,
        env: EnvLookup,
    ) -> Option<NatsAuth> {
        let f = f?;
        let kinds: Vec<&str> = [
            ("token", f.token.is_some()),
            ("user", f.user.is_some() || f.password.is_some()),
            ("nkey", f.nkey.is_some()),
            ("creds", f.creds.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
        .collect();
        if kinds.len() != 1 {
            let found = if kinds.is_empty() {
                "none".to_string()
            } else {
                kinds
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            };
            self.error(
                "cluster.auth",
                format!(
                    "give one kind of credentials: `token`, `user` + `password`, `nkey` or \
                     `creds` (found {found})"
                ),
            );
            return None;
        }
        let errors = self.error_count();
        let auth = match kinds[0] {
            "token" => self
                .nats_secret("cluster.auth.token", f.token.as_ref(), env)
                .map(NatsAuth::Token),
            "nkey" => {
                let seed = self.nats_secret("cluster.auth.nkey", f.nkey.as_ref(), env)?;
                match nkeys::KeyPair::from_seed(seed.value()) {
                    Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::User => {
                        Some(NatsAuth::NKey(seed))
                    }
                    Ok(kp) => {
                        self.error(
                            secret_path("cluster.auth.nkey", &seed.from),
                            format!(
                                "is an NKey seed of a {:?}, not of a user (`SU...`, from \
                                 `nk -gen user`)",
                                kp.key_pair_type()
                            ),
                        );
                        None
                    }
                    Err(e) => {
                        self.error(
                            secret_path("cluster.auth.nkey", &seed.from),
                            format!("is not an NKey user seed (`SU...`, from `nk -gen user`): {e}"),
                        );
                        None
                    }
                }
            }
            "creds" => {
                let mut creds = self.nats_secret("cluster.auth.creds", f.creds.as_ref(), env)?;
                // Trimmed like every secret; its last armour line ends with a newline.
                creds.value.push('\n');
                match async_nats::ConnectOptions::new().credentials(creds.value()) {
                    Ok(_) => Some(NatsAuth::Creds(creds)),
                    Err(e) => {
                        self.error(
                            secret_path("cluster.auth.creds", &creds.from),
                            format!(
                                "is not a NATS credentials file (a user JWT and its NKey seed, \
                                 as `nsc generate creds` writes): {e}"
                            ),
                        );
                        None
                    }
                }
            }
            _ => {
                for (field, given) in [
                    ("user", f.user.is_some()),
                    ("password", f.password.is_some()),
                ] {
                    if !given {
                        self.error(
                            format!("cluster.auth.{field}"),
                            "missing; `user` and `password` go together",
                        );
                    }
                }
                let user = f.user.as_ref().and_then(|u| {
                    let (at, v) = self.secret("cluster.auth.user", u, env)?;
                    let v = v.trim().to_string();
                    if v.is_empty() {
                        self.error(at, "is empty");
                        return None;
                    }
                    Some(NatsSecret {
                        from: u.clone(),
                        value: v,
                    })
                });
                let password = self.nats_secret("cluster.auth.password", f.password.as_ref(), env);
                match (user, password) {
                    (Some(user), Some(password)) => Some(NatsAuth::UserPassword { user, password }),
                    _ => None,
                }
            }
        };
        (self.error_count() == errors).then_some(auth).flatten()
    }

    /// A credential at `path`: from `{env}` or `{file}` (inline refused), trimmed, not empty.
    fn nats_secret(
        &mut self,
        path: &str,
        f: Option<&SecretFile>,
        env: EnvLookup,
    ) -> Option<NatsSecret> {
        let f = f?;
        if let SecretFile::Inline(_) = f {
            self.error(
                path,
                "write where to read it, `{env: NAME}` or `{file: PATH}`, not the secret itself: \
                 the config file is read by more people and tools than the secret should be",
            );
            return None;
        }
        let (at, value) = self.secret(path, f, env)?;
        let value = value.trim().to_string();
        if value.is_empty() {
            self.error(at, "is empty");
            return None;
        }
        Some(NatsSecret {
            from: f.clone(),
            value,
        })
    }

    /// `cluster.tls`; `None` when absent or invalid (errors recorded).
    pub(super) fn nats_tls(&mut self, f: Option<&NatsTlsFile>) -> Option<NatsTls> {
        let f = f?;
        let errors = self.error_count();
        let mut bytes = Vec::new();
        let roots: Vec<CertificateDer<'static>> = match f.ca.as_deref() {
            None => Vec::new(),
            Some(ca) => match super::tls::read_certs(Path::new(ca)) {
                Err(m) => {
                    self.error("cluster.tls.ca", m);
                    Vec::new()
                }
                Ok(certs) => {
                    let mut store = RootCertStore::empty();
                    for (i, c) in certs.iter().enumerate() {
                        if let Err(e) = store.add(c.clone()) {
                            self.error(
                                "cluster.tls.ca",
                                format!("certificate {i} is not a usable trust anchor: {e}"),
                            );
                        }
                    }
                    bytes.extend(std::fs::read(ca).unwrap_or_default());
                    certs
                }
            },
        };
        let identity = match (f.cert.as_deref(), f.key.as_deref()) {
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                let missing = if f.cert.is_none() { "cert" } else { "key" };
                self.error(
                    format!("cluster.tls.{missing}"),
                    "missing; a client certificate needs both `cert` and `key` (PEM files)",
                );
                None
            }
            (Some(cert), Some(key)) => {
                self.nats_identity(Path::new(cert), Path::new(key), &mut bytes)
            }
        };
        bytes.extend(f.server_name.as_deref().unwrap_or_default().as_bytes());
        (self.error_count() == errors).then(|| NatsTls {
            ca: f.ca.as_deref().map(PathBuf::from),
            cert: f.cert.as_deref().map(PathBuf::from),
            key: f.key.as_deref().map(PathBuf::from),
            server_name: f.server_name.clone(),
            roots: roots.into(),
            identity,
            digest: sha256(&bytes),
        })
    }

    /// The client chain and key of `cluster.tls`, checked to fit together.
    #[allow(clippy::type_complexity)]
    fn nats_identity(
        &mut self,
        cert: &Path,
        key: &Path,
        bytes: &mut Vec<u8>,
    ) -> Option<(Arc<[CertificateDer<'static>]>, Arc<PrivateKeyDer<'static>>)> {
        if let Err((field, message)) = super::tls::load_identity(cert, key) {
            self.error(format!("cluster.tls.{field}"), message);
            return None;
        }
        // Loaded and checked above: both files hold what they should.
        let chain = super::tls::read_certs(cert).ok()?;
        let key_pem = std::fs::read(key).ok()?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).ok()?;
        self.not_an_example_secret("cluster.tls.key", &sha256(private.secret_der()));
        bytes.extend(std::fs::read(cert).unwrap_or_default());
        bytes.extend(&key_pem);
        Some((chain.into(), Arc::new(private)))
    }
}

/// Where the value of a secret at `path` written as `from` came from (`path.env`, ...).
fn secret_path(path: &str, from: &SecretFile) -> String {
    match from {
        SecretFile::Inline(_) => path.to_string(),
        SecretFile::Env(_) => format!("{path}.env"),
        SecretFile::File(_) => format!("{path}.file"),
    }
}
