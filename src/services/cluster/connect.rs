//! Connecting to NATS as `cluster.auth` and `cluster.tls` say ([`crate::config::nats`]), and
//! telling why NATS refused.
//!
//! The TLS client config is always Pronto's own: the roots are `cluster.tls.ca` (else the
//! system roots), the client certificate is `cluster.tls.cert` / `key`, and the server's
//! certificate is checked for `cluster.tls.server_name` (else the URL's host) by a verifier
//! that remembers why it refused — async-nats reports a failed handshake only as an "IO
//! error", and an operator needs "certificate not trusted" or "not valid for that name".
//!
//! A refusal (bad credentials, a TLS failure, a publish or subscribe the server's
//! permissions forbid) is counted in `pronto_cluster_nats_errors_total{reason}` and logged
//! as an error at most once per [`REPEAT_EVERY`] per reason; the client keeps retrying (an
//! operator may fix the server's side) and the replica routes on its own state meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_nats::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use async_nats::rustls::client::WebPkiServerVerifier;
use async_nats::rustls::crypto::ring;
use async_nats::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use async_nats::rustls::{self, ClientConfig, DigitallySignedStruct, RootCertStore};
use async_nats::{ClientError, ConnectErrorKind, ConnectOptions, ServerError};

use crate::backend::lifecycle::REPEAT_EVERY;
use crate::config::cluster::Cluster;
use crate::config::nats::NatsAuth;
use crate::telemetry::{ClusterMetrics, NatsError};

/// `options` with the credentials and TLS of `cfg`; `tls_seen` receives the server
/// verifier's refusals. An error says why the connection cannot even be attempted.
pub(super) fn secure(
    mut options: ConnectOptions,
    cfg: &Cluster,
    tls_seen: &Arc<TlsRefusal>,
) -> Result<ConnectOptions, String> {
    options = match &cfg.auth {
        None => options,
        Some(NatsAuth::Token(t)) => options.token(t.value().to_string()),
        Some(NatsAuth::UserPassword { user, password }) => {
            options.user_and_password(user.value().to_string(), password.value().to_string())
        }
        Some(NatsAuth::NKey(seed)) => options.nkey(seed.value().to_string()),
        Some(NatsAuth::Creds(creds)) => options
            .credentials(creds.value())
            .map_err(|e| format!("cluster.auth.creds: {e}"))?,
    };
    match client_config(cfg, tls_seen) {
        Ok(tls) => options = options.tls_client_config(tls),
        // Without cluster.tls there may be no need for TLS at all (nor for the system roots
        // it failed on); async-nats keeps its own defaults for a server that asks for it.
        Err(e) if cfg.requires_tls() => return Err(e),
        Err(_) => {}
    }
    Ok(options.require_tls(cfg.requires_tls()))
}

/// The TLS client config for `cfg`: its CA (else the system roots), its client certificate,
/// its server name.
fn client_config(cfg: &Cluster, tls_seen: &Arc<TlsRefusal>) -> Result<ClientConfig, String> {
    let tls = cfg.tls.as_ref();
    let mut roots = RootCertStore::empty();
    match tls.filter(|t| !t.roots.is_empty()) {
        Some(t) => {
            for c in t.roots.iter() {
                roots
                    .add(c.clone())
                    .map_err(|e| format!("cluster.tls.ca: {e}"))?;
            }
        }
        None => {
            let native = pingora_core::tls::load_native_certs()
                .map_err(|e| format!("cannot load the system's root certificates: {e}"))?;
            roots.add_parsable_certificates(native);
        }
    }
    let provider = Arc::new(ring::default_provider());
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("no usable root certificate for NATS: {e}"))?;
    let name = match tls.and_then(|t| t.server_name.as_deref()) {
        Some(n) => Some(
            ServerName::try_from(n.to_string())
                .map_err(|e| format!("cluster.tls.server_name: {e}"))?,
        ),
        None => None,
    };
    let verifier = Arc::new(NamedVerifier {
        webpki,
        name,
        seen: Arc::clone(tls_seen),
    });
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match tls.and_then(|t| t.identity.as_ref()) {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.to_vec(), key.clone_key())
            .map_err(|e| format!("cluster.tls.key: {e}")),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// Why the server's certificate was last refused (taken by the event handler).
#[derive(Debug, Default)]
pub(super) struct TlsRefusal(Mutex<Option<String>>);

impl TlsRefusal {
    fn note(&self, why: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// WebPKI verification, for `name` when set (instead of the name connected to), noting why it
/// refused. Signatures are WebPKI's.
#[derive(Debug)]
struct NamedVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    name: Option<ServerName<'static>>,
    seen: Arc<TlsRefusal>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = self.name.as_ref().unwrap_or(server_name);
        self.webpki
            .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
            .inspect_err(|e| {
                self.seen.note(format!(
                    "NATS's certificate is refused for `{}`: {e}",
                    name.to_str()
                ))
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Classifies the client's error events, counts them and logs the refusals.
#[derive(Debug)]
pub(super) struct Refusals {
    replica: String,
    metrics: ClusterMetrics,
    tls_seen: Arc<TlsRefusal>,
    /// Per reason: when last logged, and how many were not logged since.
    logged: Mutex<[(Option<Instant>, u64); NatsError::LABELS.len()]>,
}

impl Refusals {
    pub(super) fn new(replica: &str, metrics: ClusterMetrics, tls_seen: Arc<TlsRefusal>) -> Self {
        Refusals {
            replica: replica.to_string(),
            metrics,
            tls_seen,
            logged: Mutex::new([(None, 0); NatsError::LABELS.len()]),
        }
    }

    /// A failed connection attempt (async-nats gives only the kind of error, as text).
    pub(super) fn client_error(&self, e: &ClientError, now: Instant) {
        let ClientError::Other(kind) = e else {
            return;
        };
        let is = |k: ConnectErrorKind| *kind == k.to_string();
        let tls = self.tls_seen.take();
        let (reason, detail) = if is(ConnectErrorKind::AuthorizationViolation)
            || is(ConnectErrorKind::Authentication)
        {
            (
                NatsError::Authorization,
                format!(
                    "NATS refused this replica's credentials ({kind}); check `cluster.auth` \
                     against the server's authorization"
                ),
            )
        } else if let Some(why) = tls {
            (
                NatsError::Tls,
                format!("TLS with NATS failed: {why}; check `cluster.tls` (ca, server_name)"),
            )
        } else if is(ConnectErrorKind::Tls) {
            (
                NatsError::Tls,
                "TLS with NATS failed; check `cluster.tls` (ca, cert, key, server_name)"
                    .to_string(),
            )
        } else {
            (NatsError::Connection, kind.clone())
        };
        self.count(reason, &detail, now);
    }

    /// An error the server sent on an open connection.
    pub(super) fn server_error(&self, e: &ServerError, now: Instant) {
        let (reason, detail) = match e {
            ServerError::AuthorizationViolation => (
                NatsError::Authorization,
                "NATS reports an authorization violation; check `cluster.auth`".to_string(),
            ),
            ServerError::Other(m) if m.to_ascii_lowercase().contains("permissions violation") => (
                NatsError::Permission,
                format!(
                    "NATS refused a publish or subscribe ({m}); each replica needs publish and \
                     subscribe on the cluster's subjects (docs/operating.md, \"Securing the \
                     replica channel\")"
                ),
            ),
            ServerError::Other(m) => (NatsError::Server, m.clone()),
            ServerError::SlowConsumer(_) => return,
        };
        self.count(reason, &detail, now);
    }

    fn count(&self, reason: NatsError, detail: &str, now: Instant) {
        self.metrics
            .nats_errors_total
            .with_label_values(&[reason.label()])
            .inc();
        // Unreachable NATS is the disconnection warning's to tell.
        if reason == NatsError::Connection {
            return;
        }
        let i = NatsError::LABELS
            .iter()
            .position(|l| *l == reason.label())
            .unwrap_or(0);
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let (last, suppressed) = &mut logged[i];
        if last.is_some_and(|t| now.saturating_duration_since(t) < REPEAT_EVERY) {
            *suppressed += 1;
            return;
        }
        tracing::error!(
            replica = %self.replica,
            reason = reason.label(),
            not_logged = *suppressed,
            "cluster sync refused: {detail}; routing on this replica's own state, retrying"
        );
        *last = Some(now);
        *suppressed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    #[test]
    fn refusals_are_counted_by_reason() {
        let metrics = Metrics::new();
        let m = metrics.cluster.clone();
        let seen = Arc::new(TlsRefusal::default());
        let r = Refusals::new("r0", m.clone(), Arc::clone(&seen));
        let count = |reason: &str| m.nats_errors_total.with_label_values(&[reason]).get();
        let t = Instant::now();
        let kind = |k: ConnectErrorKind| ClientError::Other(k.to_string());
        r.client_error(&kind(ConnectErrorKind::AuthorizationViolation), t);
        r.client_error(&kind(ConnectErrorKind::Io), t);
        // A handshake the verifier refused reaches the client as a bare IO error.
        seen.note("NATS's certificate is refused".into());
        r.client_error(&kind(ConnectErrorKind::Io), t);
        r.server_error(
            &ServerError::Other("Permissions Violation for Publish to \"x\"".into()),
            t,
        );
        r.server_error(&ServerError::AuthorizationViolation, t);
        r.server_error(&ServerError::SlowConsumer(1), t);
        let counts: Vec<u64> = NatsError::LABELS.iter().map(|l| count(l)).collect();
        // authorization, tls, permission, connection, server
        assert_eq!(counts, [2, 1, 1, 1, 0]);
    }
}
