//! `pools:` and their backends: names, URLs, credentials, KV-event endpoints, profiles,
//! discovery, and the checks on how many backends a pool has against its retries.

use super::*;
use crate::config::value::BackendUrl;

/// What a pool hands each of its backends unless the backend sets its own.
#[derive(Clone, Copy)]
pub(super) struct BackendDefaults<'a> {
    pub profile: Option<ProfileHint>,
    pub api_key: &'a Option<UpstreamKey>,
    pub served_model_name: &'a Option<ServedName>,
}

impl Checker {
    pub(super) fn pools(&mut self, f: &ConfigFile, retry: Retry) -> Vec<Pool> {
        let entries = f.pools.as_ref().map(|p| p.0.as_slice()).unwrap_or(&[]);
        if entries.is_empty() {
            self.error(
                "pools",
                "at least one pool is required (a map from model name to backends)",
            );
        }
        let mut pools = Vec::with_capacity(entries.len());
        let mut pool_names: HashSet<&str> = HashSet::new();
        // Backend name → path of its first use, for duplicate messages.
        let mut backend_names: HashMap<String, String> = HashMap::new();
        for (model, pool) in entries {
            let path = key_path("pools", model);
            if model.trim().is_empty() {
                self.error(&path, "model name must not be empty");
            }
            if !pool_names.insert(model) {
                self.error(&path, format!("pool `{model}` is defined more than once"));
            }
            pools.push(self.pool(&path, model, pool, retry, &mut backend_names));
        }
        pools
    }

    pub(super) fn pool(
        &mut self,
        path: &str,
        model: &str,
        pool: &PoolFile,
        retry: Retry,
        backend_names: &mut HashMap<String, String>,
    ) -> Pool {
        let policy = match &pool.policy {
            None => PolicySpec::default(),
            Some(file) => self.policy_spec(&format!("{path}.policy"), file),
        };
        let entries = pool.backends.as_deref().unwrap_or(&[]);
        let backends_path = format!("{path}.backends");
        let discover = pool
            .discover
            .as_ref()
            .and_then(|d| self.discover(&format!("{path}.discover"), d));
        let profile = pool
            .profile
            .as_ref()
            .map(|p| self.profile(&format!("{path}.profile"), p));
        let tokenizer = self.tokenizer(path, model, pool);
        let api_key = pool
            .api_key
            .as_ref()
            .and_then(|k| self.upstream_key(&format!("{path}.api_key"), k));
        let scrape = pool.scrape.unwrap_or_default();
        let served_model_name = pool.served_model_name.clone();
        if pool.discover.is_none() {
            self.backend_count_checks(path, pool, retry);
        }
        let mut urls: HashMap<String, usize> = HashMap::new();
        let mut backends = Vec::with_capacity(entries.len());
        for (i, b) in entries.iter().enumerate() {
            let bpath = format!("{backends_path}[{i}]");
            let defaults = BackendDefaults {
                profile,
                api_key: &api_key,
                served_model_name: &served_model_name,
            };
            if let Some(backend) = self.backend(&bpath, b, defaults, backend_names) {
                if let Some(first) = urls.insert(backend.base_url(), i) {
                    self.warn(
                        format!("{bpath}.url"),
                        format!(
                            "same server as {backends_path}[{first}]: it will get a double share"
                        ),
                    );
                }
                backends.push(backend);
            }
        }
        Pool {
            model: Arc::from(model),
            policy,
            backends,
            discover,
            profile,
            tokenizer,
            serve_listed_models: pool.serve_listed_models.unwrap_or(false),
            api_key,
            scrape,
            served_model_name,
            continue_streams: pool.continue_streams.unwrap_or(true),
        }
    }

    /// A backend key as written; `None` when unreadable or not a valid header token (errors
    /// recorded).
    pub(super) fn upstream_key(
        &mut self,
        path: &str,
        f: &crate::config::edge::SecretFile,
    ) -> Option<UpstreamKey> {
        let env = self.env.unwrap_or(crate::config::edge::process_env);
        let (at, text) = self.secret(path, f, env)?;
        let key = text.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            self.error(
                at,
                "must be a non-empty key of visible ASCII characters (no spaces)",
            );
            return None;
        }
        Some(UpstreamKey::read_from(key, f.clone()))
    }

    /// Checks on the number of static backends, for a pool without `discover` (a discovered
    /// pool's size is only known at run time).
    pub(super) fn backend_count_checks(&mut self, path: &str, pool: &PoolFile, retry: Retry) {
        let entries = pool.backends.as_deref().unwrap_or(&[]);
        let backends_path = format!("{path}.backends");
        if entries.is_empty() {
            self.error(
                &backends_path,
                "pool has no backends; at least one is required (or a `discover:` section)",
            );
        }
        if entries.len() == 1 && retry.max_retries > 0 {
            self.warn(
                &backends_path,
                format!(
                    "only one backend, so retry.max_retries = {} has no other backend to try",
                    retry.max_retries
                ),
            );
        }
        if entries.len() > 1 && retry.max_retries as usize > entries.len() {
            self.warn(
                &backends_path,
                format!(
                    "retry.max_retries = {} exceeds the pool's {} backends: each retry goes to a \
                     backend not yet tried, so at most {} can happen",
                    retry.max_retries,
                    entries.len(),
                    entries.len() - 1
                ),
            );
        }
        if let (1, Some(file)) = (entries.len(), &pool.policy) {
            self.warn(
                format!("{path}.policy"),
                format!(
                    "policy `{}` balances between backends, but the pool has only one",
                    file.name
                ),
            );
        }
    }

    /// One backend; `None` when a required part is missing or invalid (errors recorded).
    pub(super) fn backend(
        &mut self,
        path: &str,
        b: &BackendFile,
        pool: BackendDefaults<'_>,
        names: &mut HashMap<String, String>,
    ) -> Option<Backend> {
        let name = match self.label_name(path, "backend", b.name.as_ref()) {
            None => None,
            Some(n) => match names.get(n) {
                Some(first) => {
                    self.error(
                        format!("{path}.name"),
                        format!("duplicate backend name `{n}` (first used at {first})"),
                    );
                    None
                }
                None => {
                    names.insert(n.to_string(), path.to_string());
                    Some(Arc::<str>::from(n))
                }
            },
        };
        if b.url.is_none() {
            self.error(
                format!("{path}.url"),
                "missing; e.g. `http://10.0.0.1:8000`",
            );
        }
        let weight = b.weight.unwrap_or(DEFAULT_WEIGHT);
        let max_inflight = b.max_inflight;
        let mut labels = BTreeMap::new();
        for (k, v) in b.labels.iter().flatten() {
            if valid_label_name(k) {
                labels.insert(k.clone(), v.0.clone());
            } else {
                self.error(
                    key_path(&format!("{path}.labels"), k),
                    format!(
                        "`{k}` is not a valid label name: start with a letter or `_`, then \
                         letters, digits or `_`"
                    ),
                );
            }
        }
        let kv_events = b
            .kv_events
            .as_ref()
            .and_then(|k| self.kv_events(&format!("{path}.kv_events"), k));
        let own = b
            .profile
            .as_ref()
            .map(|p| self.profile(&format!("{path}.profile"), p));
        let profile = match (own, pool.profile) {
            (Some(own), Some(pool)) => Some(own.or(pool)),
            (own, pool) => own.or(pool),
        };
        let api_key = match &b.api_key {
            Some(k) => self.upstream_key(&format!("{path}.api_key"), k),
            None => pool.api_key.clone(),
        };
        let served_model_name = b
            .served_model_name
            .clone()
            .or_else(|| pool.served_model_name.clone());
        let BackendUrl { host, port, tls } = b.url.clone()?;
        let ca = self.ca_file(&format!("{path}.ca_file"), b.ca_file.as_deref(), tls);
        if b.ca_file.is_some() && ca.is_none() {
            return None;
        }
        Some(Backend {
            name: name?,
            host,
            port,
            tls,
            weight,
            max_inflight,
            labels,
            kv_events,
            profile,
            ca,
            api_key,
            served_model_name,
        })
    }

    /// A backend's `kv_events`; `None` when invalid (errors recorded).
    pub(super) fn kv_events(&mut self, path: &str, k: &KvEventsFile) -> Option<KvEvents> {
        let endpoint = match &k.endpoint {
            None => {
                self.error(
                    format!("{path}.endpoint"),
                    "missing; e.g. `tcp://10.0.0.1:5557`",
                );
                None
            }
            Some(e) => Some(e.clone()),
        };
        let block_size = k.block_size.map(|n| n as usize);
        if block_size.is_none() {
            self.error(
                format!("{path}.block_size"),
                "missing; the engine's tokens per KV block (16 on GPU, 128 for vLLM on CPU)",
            );
        }
        Some(KvEvents {
            endpoint: endpoint?,
            block_size: block_size?,
        })
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`, Prometheus' label-name rule.
fn valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::super::tests::{errors, run};
    use crate::config::{file, ServedName};

    #[test]
    fn served_model_names_are_inherited_overridden_and_checked() {
        let yaml = "pools:\n  chat:\n    served_model_name: discover\n    backends:\n      \
                    - {name: a, url: 'http://h:1'}\n      \
                    - {name: b, url: 'http://h:2', served_model_name: /models/llama}\n";
        let (config, _) = run(yaml).unwrap();
        let pool = &config.pools[0];
        assert_eq!(pool.served_model_name, Some(ServedName::Discover));
        assert!(pool.asks_models());
        assert_eq!(
            pool.backends[0].served_model_name,
            Some(ServedName::Discover)
        );
        assert_eq!(
            pool.backends[1].served_model_name,
            Some(ServedName::Named("/models/llama".into()))
        );
        let long = "x".repeat(513);
        let yaml = format!(
            "pools:\n  chat:\n    served_model_name: ' '\n    backends:\n      \
             - {{name: a, url: 'http://h:1', served_model_name: \"a\\tb\"}}\n      \
             - {{name: b, url: 'http://h:2', served_model_name: {long}}}\n"
        );
        let message = "must be at most 512 bytes without control characters";
        assert_eq!(
            errors(&yaml),
            [
                (
                    "pools.chat.served_model_name".to_string(),
                    "must be a model name or `discover` (ask each backend's GET /v1/models)"
                        .to_string()
                ),
                (
                    "pools.chat.backends[0].served_model_name".to_string(),
                    message.to_string()
                ),
                (
                    "pools.chat.backends[1].served_model_name".to_string(),
                    message.to_string()
                ),
            ]
        );
        let typed = file::parse("pools:\n  chat:\n    served_model_name: [a]\n");
        assert!(typed.is_err(), "a list is not a name");
    }
}
