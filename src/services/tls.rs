//! The client listener's TLS: [`listener_settings`] builds pingora's rustls [`TlsSettings`]
//! with ALPN `h2, http/1.1` (HTTP/2 when the client offers it, HTTP/1.1 otherwise) and a
//! [`CertResolver`] instead of fixed files. The resolver answers every handshake with the
//! certificate of the config active *now* (one `ArcSwap` load, no lock, no I/O), so a reload
//! that loads rotated files ([`crate::config::tls`]) is picked up by the next connection while
//! open connections keep theirs. Should a reload drop the `tls:` section, the listener (bound
//! at start) keeps serving the last certificate it had.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::tls::sign::CertifiedKey;
use pingora_core::tls::{ClientHello, ResolvesServerCert};

use crate::state::StateHandle;

/// Picks the listener certificate of the current config on each handshake.
pub struct CertResolver {
    state: StateHandle,
    /// The last certificate served, for a config that no longer has `tls:`.
    last: ArcSwapOption<CertifiedKey>,
}

impl std::fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertResolver").finish_non_exhaustive()
    }
}

impl CertResolver {
    /// A resolver over the (reloadable) gateway state, starting from `initial`.
    pub fn new(state: StateHandle, initial: Arc<CertifiedKey>) -> CertResolver {
        CertResolver {
            state,
            last: ArcSwapOption::from(Some(initial)),
        }
    }

    /// The certificate a handshake starting now gets.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        let state = self.state.load();
        match state.resources.tls() {
            Some(now) => {
                let stale = self
                    .last
                    .load()
                    .as_ref()
                    .is_none_or(|last| !Arc::ptr_eq(last, now));
                if stale {
                    self.last.store(Some(Arc::clone(now)));
                }
                Some(Arc::clone(now))
            }
            None => self.last.load_full(),
        }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// pingora TLS settings for the client listener: h2 + HTTP/1.1 by ALPN, certificate from
/// [`CertResolver`].
pub fn listener_settings(
    state: StateHandle,
    initial: Arc<CertifiedKey>,
) -> pingora_core::Result<TlsSettings> {
    let mut settings = TlsSettings::intermediate("", "")?;
    settings.set_cert_resolver(Arc::new(CertResolver::new(state, initial)));
    settings.enable_h2();
    Ok(settings)
}
