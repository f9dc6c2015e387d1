//! TLS to backends: the trust settings of connections to `https` backends (the proxy's
//! pingora peer and the reqwest client used by health checks and engine scrapes). The client
//! listener's certificate resolver, which reads the state hub, is `services::tls`.
//!
//! An `https` backend is verified with its host as SNI and expected name (an IP
//! host is checked against the certificate's IP addresses), against the system roots or, when
//! the backend has `ca_file`, against exactly those certificates ([`peer_ca`],
//! [`backend_http_client`]). There is no "skip verification" switch.

use std::sync::{Arc, OnceLock};

use pingora_core::utils::tls::{parse_x509, WrappedX509};

use crate::config::Backend as BackendConfig;

/// The SNI / expected name for a backend host as written in its URL (`[::1]` → `::1`).
pub fn sni(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

/// The per-peer trust anchors pingora checks an `https` backend against: its `ca_file`'s
/// certificates; `None` (system roots) without one.
pub fn peer_ca(config: &BackendConfig) -> Option<Arc<[WrappedX509]>> {
    let ca = config.ca.as_ref()?;
    let certs: Vec<WrappedX509> = ca
        .certs
        .iter()
        .map(|c| WrappedX509::new(c.to_vec(), parse_x509))
        .collect();
    Some(certs.into())
}

/// The system roots as reqwest certificates, loaded once (`SSL_CERT_FILE` honoured).
fn system_roots() -> &'static [reqwest::Certificate] {
    static ROOTS: OnceLock<Vec<reqwest::Certificate>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let certs = pingora_core::tls::load_native_certs().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot load the system's CA certificates");
            Vec::new()
        });
        certs
            .iter()
            .filter_map(|c| reqwest::Certificate::from_der(c).ok())
            .collect()
    })
}

/// `Bearer <key>` as a header value marked sensitive (kept out of HPACK tables and debug
/// output); `None` for a key that is not a valid header value (validation rules it out).
pub fn bearer(key: &crate::config::model::UpstreamKey) -> Option<http::HeaderValue> {
    let mut v = http::HeaderValue::from_str(&format!("Bearer {}", key.expose())).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// The HTTP client for a backend's health checks and metrics scrapes: one idle connection,
/// for `https` the same trust as the proxy's peer (the `ca_file`, else the system roots), and
/// the backend's `api_key` on every request when it has one.
pub fn backend_http_client(config: &BackendConfig) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().pool_max_idle_per_host(1);
    if config.tls {
        builder = builder.tls_built_in_root_certs(false);
        match &config.ca {
            Some(ca) => {
                for c in ca.certs.iter() {
                    // Validated as a trust anchor at load; a reqwest refusal only narrows trust.
                    if let Ok(cert) = reqwest::Certificate::from_der(c) {
                        builder = builder.add_root_certificate(cert);
                    }
                }
            }
            None => {
                for cert in system_roots() {
                    builder = builder.add_root_certificate(cert.clone());
                }
            }
        }
    }
    if let Some(key) = config.api_key.as_ref().and_then(bearer) {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, key);
        builder = builder.default_headers(headers);
    }
    builder.build().unwrap_or_else(|e| {
        tracing::error!(backend = %config.name, error = %e, "backend HTTP client: using defaults");
        reqwest::Client::new()
    })
}
