//! Refusing the repository's example secrets.
//!
//! The annotated example and `config/tls/` publish an admin token, API keys and a TLS private
//! key so that the examples are complete; anyone can read them. A config that uses one of
//! them — as `admin.token` (inline, from the environment or from a file), an `auth:` key
//! (inline, `sha256:` or in `keys_file`), a route's `match.api_keys`, or the `tls.key` — is
//! refused with the field's path, at start and at reload, so no deployment serves with a
//! published secret by accident.
//!
//! The digests come from `build.rs`, which hashes every such value under `config/` at build
//! time (commented-out examples included). Tokens compare by the SHA-256 of their trimmed
//! text (as the gateway holds them), TLS keys by the SHA-256 of their DER, so re-wrapping the
//! PEM does not get past the check.

use super::edge::Digest;
use super::validate::Checker;

include!(concat!(env!("OUT_DIR"), "/example_secrets.rs"));

/// What the effective config (`GET /admin/config`) writes in place of a secret written
/// inline; the loader refuses it wherever a secret is read, so a copy of the effective
/// config never runs with a placeholder as its key or token.
pub const REDACTED: &str = "<redacted>";

/// The error for [`REDACTED`] where a secret belongs.
pub(super) const REDACTED_MESSAGE: &str = "`<redacted>` is the effective config's placeholder \
     for a secret (GET /admin/config never shows one): write the secret itself, {env: NAME} \
     or {file: PATH}";

/// Where the example secret with `digest` is written, and what it is, if it is one.
pub fn example_secret(digest: &Digest) -> Option<(&'static str, &'static str)> {
    EXAMPLE_SECRETS
        .iter()
        .find(|(_, _, d)| d == digest)
        .map(|(kind, at, _)| (*kind, *at))
}

/// Every example secret: `(what, where)`.
pub fn example_secrets() -> impl Iterator<Item = (&'static str, &'static str)> {
    EXAMPLE_SECRETS.iter().map(|(kind, at, _)| (*kind, *at))
}

impl Checker {
    /// Refuse `digest` at `path` when it is one of the repository's example secrets.
    pub(super) fn not_an_example_secret(&mut self, path: impl Into<String>, digest: &Digest) {
        if *digest == super::edge::sha256(REDACTED.as_bytes()) {
            self.secret_errors.push(super::validate::ConfigError {
                path: path.into(),
                message: REDACTED_MESSAGE.to_string(),
            });
            return;
        }
        if let Some((kind, at)) = example_secret(digest) {
            let advice = if kind == "TLS private key" {
                "make your own certificate and key (see config/tls/README.md)"
            } else {
                "generate your own (e.g. `openssl rand -hex 32`)"
            };
            self.secret_errors.push(super::validate::ConfigError {
                path: path.into(),
                message: format!(
                    "this is the example {kind} published in Pronto's repository ({at}): \
                     anyone can use it; {advice}"
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::edge::sha256;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn the_example_key_and_tokens_are_known() {
        let kinds: Vec<&str> = example_secrets().map(|(k, _)| k).collect();
        assert!(kinds.contains(&"TLS private key"), "{kinds:?}");
        assert!(kinds.contains(&"admin token"), "{kinds:?}");
        assert!(kinds.contains(&"API key"), "{kinds:?}");
        let key = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/tls/example.key"
        ))
        .unwrap();
        let der = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key).unwrap();
        let (kind, at) = example_secret(&sha256(der.secret_der())).expect("the example key");
        assert_eq!((kind, at), ("TLS private key", "config/tls/example.key"));
        assert_eq!(example_secret(&sha256(b"a-token-of-my-own")), None);
    }
}
