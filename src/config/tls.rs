//! TLS settings: the client listener's certificate (`tls:`) and private CAs for `https`
//! backends (`pools.*.backends[*].ca_file`) — file structs, loading with field paths, and the
//! typed model.
//!
//! ```yaml
//! tls:
//!   cert: tls/gateway.crt          # PEM chain, leaf first; relative to this file's directory
//!   key: tls/gateway.key           # PEM private key (PKCS#8, PKCS#1 or SEC1)
//! pools:
//!   m:
//!     backends:
//!       - name: gpu-0
//!         url: https://gpu-0.internal:8000
//!         ca_file: tls/private-ca.pem   # trust only these CAs for this backend
//! ```
//!
//! **Loading.** Both files are read and parsed while the config is validated, so a missing
//! file, a file holding no certificate or no key, or a key that does not belong to the leaf
//! certificate is a config error located at `tls.cert` / `tls.key` — at start and at reload,
//! where it keeps the running certificate. A relative path is resolved against the config
//! file's directory.
//!
//! **Rotation.** The listener resolves its certificate on every handshake from the current
//! config (`tls`), so a reload that loads new files serves them to new connections;
//! connections already open keep theirs. [`TlsListener::files_changed`] lets a reload notice
//! rotated files under an unchanged config text. Whether the listener speaks TLS at all is
//! bound at start.
//!
//! **Backends.** An `https` backend is verified against the system roots (`SSL_CERT_FILE`
//! honoured) with its host as SNI and expected name. `ca_file` replaces the system roots for
//! that backend by the certificates in the file (a private CA, or a self-signed backend's own
//! certificate); it is an error on an `http` backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pingora_core::tls::sign::CertifiedKey;
use pingora_core::tls::{CertificateDer, CryptoProvider, PrivateKeyDer, RootCertStore};
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;

use super::edge::{sha256, Digest};
use super::validate::Checker;

/// TLS on the client listener (h2 by ALPN, HTTP/1.1 fallback)
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    /// PEM certificate chain, leaf first; relative to this file
    pub cert: Option<String>,
    /// PEM private key of the leaf certificate; relative to this file
    pub key: Option<String>,
}

/// The validated listener identity: where it came from and the loaded chain and key.
#[derive(Clone)]
pub struct TlsListener {
    /// Certificate chain file (absolute when the config came from a file).
    pub cert: PathBuf,
    /// Private key file.
    pub key: PathBuf,
    /// SHA-256 of the two files' bytes, to notice rotation.
    digest: Digest,
}

impl PartialEq for TlsListener {
    fn eq(&self, other: &TlsListener) -> bool {
        self.cert == other.cert && self.key == other.key && self.digest == other.digest
    }
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key material.
        f.debug_struct("TlsListener")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Whether the cert or key file now holds other bytes than were loaded (or is unreadable).
    /// Blocking file I/O.
    pub fn files_changed(&self) -> bool {
        match (std::fs::read(&self.cert), std::fs::read(&self.key)) {
            (Ok(cert), Ok(key)) => files_digest(&cert, &key) != self.digest,
            _ => true,
        }
    }
}

/// Trust anchors for one `https` backend, from its `ca_file`.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendCa {
    /// The file, as resolved.
    pub path: PathBuf,
    /// Its certificates (DER), at least one, each a valid trust anchor.
    pub certs: Arc<[CertificateDer<'static>]>,
}

fn files_digest(cert: &[u8], key: &[u8]) -> Digest {
    let mut both = Vec::with_capacity(cert.len() + key.len() + 8);
    both.extend_from_slice(&(cert.len() as u64).to_le_bytes());
    both.extend_from_slice(cert);
    both.extend_from_slice(key);
    sha256(&both)
}

/// Resolve relative `tls.cert`, `tls.key`, backend `ca_file` and pool `tokenizer` /
/// `chat_template` paths against the directory of the config file at `path` (a `tokenizer`
/// of `tiktoken:<name>` is left as it is).
pub(super) fn resolve_paths(file: &mut super::file::ConfigFile, path: &Path) {
    let Some(dir) = path.parent() else { return };
    let resolve = |p: &mut String| {
        if Path::new(p.as_str()).is_relative() {
            *p = dir.join(p.as_str()).display().to_string();
        }
    };
    if let Some(tls) = file.tls.as_mut() {
        tls.cert.iter_mut().for_each(resolve);
        tls.key.iter_mut().for_each(resolve);
    }
    for (_, pool) in file.pools.iter_mut().flat_map(|p| p.0.iter_mut()) {
        // `tiktoken:<name>` names an encoding, not a file.
        pool.tokenizer
            .iter_mut()
            .filter(|t| !t.starts_with(pronto_tokenizer::tiktoken::TIKTOKEN_PREFIX))
            .for_each(resolve);
        pool.chat_template.iter_mut().for_each(resolve);
        for b in pool.backends.iter_mut().flatten() {
            b.ca_file.iter_mut().for_each(resolve);
        }
    }
}

/// The certificates in a PEM file, or why there are none.
pub(super) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("`{}` is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "`{}` holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
            path.display()
        ));
    }
    Ok(certs)
}

/// Load a certificate chain and its key, checking that they belong together. The error names
/// the field at fault (`"cert"` or `"key"`) and why.
pub fn load_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Arc<CertifiedKey>, Digest), (&'static str, String)> {
    let chain = read_certs(cert).map_err(|m| ("cert", m))?;
    let key_bytes =
        std::fs::read(key).map_err(|e| ("key", format!("cannot read `{}`: {e}", key.display())))?;
    let private = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        (
            "key",
            format!(
                "`{}` holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                key.display()
            ),
        )
    })?;
    pingora_core::tls::install_default_crypto_provider();
    let provider = CryptoProvider::get_default().ok_or(("key", "no TLS crypto provider".into()))?;
    let identity = CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        (
            "key",
            format!("does not fit the certificate's public key: {e}"),
        )
    })?;
    let cert_bytes = std::fs::read(cert)
        .map_err(|e| ("cert", format!("cannot read `{}`: {e}", cert.display())))?;
    Ok((Arc::new(identity), files_digest(&cert_bytes, &key_bytes)))
}

// === impl Checker ===

impl Checker {
    /// `tls:`; `None` when absent or invalid (errors recorded).
    pub(super) fn tls(&mut self, f: Option<&TlsFile>) -> Option<TlsListener> {
        let f = f?;
        let mut missing = false;
        for (field, value) in [("cert", &f.cert), ("key", &f.key)] {
            if value.is_none() {
                self.error(
                    format!("tls.{field}"),
                    "missing; TLS needs both `cert` and `key` (PEM files)",
                );
                missing = true;
            }
        }
        if missing {
            return None;
        }
        let cert = PathBuf::from(f.cert.as_deref()?);
        let key = PathBuf::from(f.key.as_deref()?);
        match load_identity(&cert, &key) {
            Ok((identity, digest)) => {
                // Loaded, so the file holds a PEM key: refuse the repository's example key.
                if let Some(der) = std::fs::read(&key)
                    .ok()
                    .and_then(|pem| PrivateKeyDer::from_pem_slice(&pem).ok())
                {
                    self.not_an_example_secret("tls.key", &sha256(der.secret_der()));
                }
                self.resources.set_tls(identity);
                Some(TlsListener { cert, key, digest })
            }
            Err((field, message)) => {
                self.error(format!("tls.{field}"), message);
                None
            }
        }
    }

    /// A backend's `ca_file` (at `path`); `None` when absent or invalid (errors recorded).
    pub(super) fn ca_file(
        &mut self,
        path: &str,
        file: Option<&str>,
        tls: bool,
    ) -> Option<BackendCa> {
        let file = file?;
        if !tls {
            self.error(
                path,
                "only applies to an `https` backend; remove it or use an https:// URL",
            );
            return None;
        }
        let ca = PathBuf::from(file);
        let certs = match read_certs(&ca) {
            Ok(certs) => certs,
            Err(message) => {
                self.error(path, message);
                return None;
            }
        };
        let mut store = RootCertStore::empty();
        for (i, c) in certs.iter().enumerate() {
            if let Err(e) = store.add(c.clone()) {
                self.error(
                    path,
                    format!("certificate {i} is not a usable trust anchor: {e}"),
                );
                return None;
            }
        }
        Some(BackendCa {
            path: ca,
            certs: certs.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn pem_pair(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (c.cert.pem(), c.key_pair.serialize_pem())
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("pronto-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    const POOLS: &str =
        "pools:\n  m:\n    backends:\n      - name: b0\n        url: http://127.0.0.1:1\n";

    fn load(d: &Dir, text: &str) -> Result<Config, String> {
        let path = d.0.join("pronto.yaml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path).map_err(|e| e.to_string())
    }

    #[test]
    fn relative_files_load_and_rotation_is_noticed() {
        let d = dir("ok");
        let (cert, key) = pem_pair("localhost");
        std::fs::write(d.0.join("c.pem"), &cert).unwrap();
        std::fs::write(d.0.join("k.pem"), &key).unwrap();
        let c = load(&d, &format!("tls:\n  cert: c.pem\n  key: k.pem\n{POOLS}")).unwrap();
        let tls = c.tls.expect("tls");
        assert_eq!(tls.cert, d.0.join("c.pem"));
        let loaded = crate::config::Loaded::load(d.0.join("pronto.yaml")).unwrap();
        assert_eq!(loaded.resources.tls().expect("loaded").cert.len(), 1);
        assert!(!tls.files_changed());
        let (cert2, key2) = pem_pair("localhost");
        std::fs::write(d.0.join("c.pem"), cert2).unwrap();
        std::fs::write(d.0.join("k.pem"), key2).unwrap();
        assert!(tls.files_changed());
    }

    #[test]
    fn bad_files_are_located_errors() {
        let d = dir("bad");
        let (cert, key) = pem_pair("localhost");
        let (_, other_key) = pem_pair("localhost");
        std::fs::write(d.0.join("c.pem"), &cert).unwrap();
        std::fs::write(d.0.join("k.pem"), &key).unwrap();
        std::fs::write(d.0.join("other.pem"), other_key).unwrap();
        std::fs::write(d.0.join("junk.pem"), "not pem").unwrap();
        let cases = [
            (
                "cert: nope.pem\n  key: k.pem",
                ":2:9: tls.cert: cannot read",
            ),
            ("cert: junk.pem\n  key: k.pem", ":2:9: tls.cert: "),
            ("cert: c.pem\n  key: c.pem", ":3:8: tls.key: "),
            ("cert: c.pem\n  key: other.pem", "tls.key: does not fit"),
            ("cert: c.pem", "tls.key: missing"),
        ];
        for (section, want) in cases {
            let e = load(&d, &format!("tls:\n  {section}\n{POOLS}")).unwrap_err();
            assert!(e.contains(want), "{section}: {e}");
        }
    }

    #[test]
    fn ca_file_needs_https_and_certificates() {
        let d = dir("ca");
        let (cert, _) = pem_pair("localhost");
        std::fs::write(d.0.join("ca.pem"), &cert).unwrap();
        std::fs::write(d.0.join("empty.pem"), "").unwrap();
        let backend = |url: &str, ca: &str| {
            format!("pools:\n  m:\n    backends:\n      - name: b0\n        url: {url}\n        ca_file: {ca}\n")
        };
        let ok = load(&d, &backend("https://localhost:8443", "ca.pem")).unwrap();
        let ca = ok.pools[0].backends[0].ca.clone().expect("ca");
        assert_eq!((ca.path, ca.certs.len()), (d.0.join("ca.pem"), 1));
        let e = load(&d, &backend("http://localhost:8000", "ca.pem")).unwrap_err();
        assert!(
            e.contains("pools.m.backends[0].ca_file: only applies"),
            "{e}"
        );
        let e = load(&d, &backend("https://localhost:8443", "empty.pem")).unwrap_err();
        assert!(
            e.contains("pools.m.backends[0].ca_file: ") && e.contains("no PEM"),
            "{e}"
        );
    }
}
