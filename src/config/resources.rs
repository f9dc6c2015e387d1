//! What a config *loads* but is not: the pools' tokenizers and the listener's TLS identity.
//!
//! The typed [`Config`](super::Config) is plain data — comparable, printable, cheap to clone.
//! Validation loads the files it names (so a broken tokenizer or key is a located error and
//! an invalid config never replaces a working one) and hands the loaded objects back beside
//! the config, as [`Resources`]; the gateway state is built from both ([`Loaded`]).

use std::collections::HashMap;
use std::sync::Arc;

use pingora_core::tls::sign::CertifiedKey;

use super::Config;
use pronto_tokenizer::ModelTokenizer;

/// The runtime objects a config's files were loaded into.
#[derive(Default, Clone)]
pub struct Resources {
    tokenizers: HashMap<Arc<str>, Arc<ModelTokenizer>>,
    tls: Option<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Resources")
            .field("tokenizers", &self.tokenizers.keys().collect::<Vec<_>>())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Resources {
    /// Pool `model`'s tokenizer, when its config names one.
    pub fn tokenizer(&self, model: &str) -> Option<&Arc<ModelTokenizer>> {
        self.tokenizers.get(model)
    }

    /// The client listener's certificate chain and key, when the config has `tls:`.
    pub fn tls(&self) -> Option<&Arc<CertifiedKey>> {
        self.tls.as_ref()
    }

    pub(super) fn add_tokenizer(&mut self, model: &str, t: Arc<ModelTokenizer>) {
        self.tokenizers.insert(Arc::from(model), t);
    }

    pub(super) fn set_tls(&mut self, identity: Arc<CertifiedKey>) {
        self.tls = Some(identity);
    }

    /// Whether these resources are the ones `config` needs: a tokenizer for every pool that
    /// names one (and none other), an identity when it has `tls:`.
    pub fn cover(&self, config: &Config) -> bool {
        let pools = config.pools.iter().filter(|p| p.tokenizer.is_some());
        pools
            .clone()
            .all(|p| self.tokenizers.contains_key(&p.model))
            && pools.count() == self.tokenizers.len()
            && config.tls.is_some() == self.tls.is_some()
    }
}

/// A validated config and what its files were loaded into.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The typed config.
    pub config: Config,
    /// Its loaded tokenizers and TLS identity.
    pub resources: Resources,
}
