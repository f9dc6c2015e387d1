//! The models a gateway serves, as `GET /v1/models` and `GET /v1/models/{id}` list them.
//!
//! Without `routes:` the models are the pools' names — for a pool that serves its backends'
//! models (`models::served`, `services::models`), the models they list, once any has answered; with `routes:`, the exact
//! (wildcard-free) model names the routes match, since pool names are then not model names.
//! A caller's API key narrows the list to what it may use (its `models:` globs and `routes:`,
//! as [`crate::edge::auth::authorize`] would judge a request), so a key never learns of a model it
//! would be refused; `GET /v1/models/{id}` of a model outside the list is a 404
//! `model_not_found`, the same as a model nobody serves. Listing costs no rate-limit quota.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use crate::config::edge::ApiKey;
use crate::edge::auth;
use crate::state::GatewayState;

/// The model names `key` (`None`: no `auth:`) may use, sorted and without repeats.
pub fn listed(state: &GatewayState, key: Option<&ApiKey>) -> BTreeSet<String> {
    let allowed = |model: &str, route| key.is_none_or(|k| auth::authorize(k, model, route).is_ok());
    let mut out = BTreeSet::new();
    if state.config.routes.is_empty() {
        for pool in state.pools.values() {
            // A pool serving its backends' models lists those, once it knows any.
            match &pool.served {
                Some(served) if !served.is_empty() => out.extend(
                    served
                        .models()
                        .filter(|m| allowed(m, None))
                        .map(str::to_string),
                ),
                _ if allowed(&pool.model, None) => {
                    out.insert(pool.model.to_string());
                }
                _ => {}
            }
        }
    } else {
        for route in &state.config.routes {
            if let Some(model) = route.matcher.model.as_ref().and_then(|m| m.literal()) {
                if allowed(&model, Some(route)) {
                    out.insert(model);
                }
            }
        }
    }
    out
}

/// One model in the OpenAI shape.
pub fn model_json(id: &str) -> serde_json::Value {
    serde_json::json!({ "id": id, "object": "model", "created": 0, "owned_by": "pronto" })
}

/// `GET /v1/models` for `key`: `{"object": "list", "data": [model, ...]}`, sorted by id.
pub fn list_json(state: &GatewayState, key: Option<&ApiKey>) -> serde_json::Value {
    let data: Vec<serde_json::Value> = listed(state, key).iter().map(|m| model_json(m)).collect();
    serde_json::json!({ "object": "list", "data": data })
}

/// `GET /v1/models/{id}` for `key`: the model, when listed for it.
pub fn get_json(state: &GatewayState, key: Option<&ApiKey>, id: &str) -> Option<serde_json::Value> {
    listed(state, key).contains(id).then(|| model_json(id))
}

/// The model id in a `/v1/models/{id}` path, percent-decoded (ids may hold `/`, as in
/// `meta-llama/Llama-3.1-8B`, sent raw or as `%2F`); `None` for other paths and for an id
/// that is empty or not UTF-8.
pub fn id_from_path(path: &str) -> Option<String> {
    let raw = path.strip_prefix("/v1/models/")?.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (raw[i], raw.get(i + 1).copied(), raw.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::telemetry::Metrics;
    use std::sync::Arc;

    fn state(yaml: &str) -> GatewayState {
        let config = Arc::new(Config::from_yaml_str(yaml, "t").unwrap());
        GatewayState::new(config, Default::default(), &Metrics::new())
    }

    fn ids(v: &serde_json::Value) -> Vec<&str> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect()
    }

    const KEYS: &str = "auth:\n  keys:\n    \
        - {name: all, key: sk-every-model-key}\n    \
        - {name: llama, key: sk-llama-only-key, models: ['llama-*']}\n";
    const ROUTE_KEY: &str = "    - {name: chat, key: sk-chat-route-key, routes: [chat]}\n";

    fn key<'s>(s: &'s GatewayState, name: &str) -> &'s ApiKey {
        let keys = &s.config.auth.as_ref().unwrap().keys;
        keys.iter().find(|k| &*k.name == name).unwrap()
    }

    #[test]
    fn pools_are_listed_per_key() {
        let s = state(&format!(
            "{KEYS}pools:\n  llama-3: {{backends: [{{name: a, url: 'http://127.0.0.1:1'}}]}}\n  \
             qwen: {{backends: [{{name: b, url: 'http://127.0.0.1:2'}}]}}\n"
        ));
        assert_eq!(ids(&list_json(&s, None)), ["llama-3", "qwen"]);
        assert_eq!(
            ids(&list_json(&s, Some(key(&s, "all")))),
            ["llama-3", "qwen"]
        );
        assert_eq!(ids(&list_json(&s, Some(key(&s, "llama")))), ["llama-3"]);
        let m = get_json(&s, Some(key(&s, "llama")), "llama-3").unwrap();
        assert_eq!(
            m,
            serde_json::json!({"id": "llama-3", "object": "model", "created": 0, "owned_by": "pronto"})
        );
        assert!(get_json(&s, Some(key(&s, "llama")), "qwen").is_none());
        assert!(get_json(&s, None, "nope").is_none());
    }

    #[test]
    fn with_routes_the_literal_models_of_usable_routes_are_listed() {
        let s = state(&format!(
            "{KEYS}{ROUTE_KEY}routes:\n  \
             - {{name: chat, match: {{model: llama-3-chat}}, pool: p}}\n  \
             - {{name: batch, match: {{model: llama-3-batch}}, pool: p}}\n  \
             - {{name: any, match: {{model: 'qwen-*'}}, pool: p}}\n\
             pools:\n  p: {{backends: [{{name: a, url: 'http://127.0.0.1:1'}}]}}\n"
        ));
        assert_eq!(ids(&list_json(&s, None)), ["llama-3-batch", "llama-3-chat"]);
        assert_eq!(ids(&list_json(&s, Some(key(&s, "chat")))), ["llama-3-chat"]);
        assert_eq!(
            ids(&list_json(&s, Some(key(&s, "llama")))),
            ["llama-3-batch", "llama-3-chat"]
        );
    }

    #[test]
    fn ids_are_percent_decoded_from_the_path() {
        assert_eq!(id_from_path("/v1/models/m").as_deref(), Some("m"));
        assert_eq!(
            id_from_path("/v1/models/meta-llama/Llama-3.1-8B").as_deref(),
            Some("meta-llama/Llama-3.1-8B")
        );
        assert_eq!(
            id_from_path("/v1/models/meta-llama%2fLlama%203").as_deref(),
            Some("meta-llama/Llama 3")
        );
        assert_eq!(id_from_path("/v1/models/100%").as_deref(), Some("100%"));
        assert_eq!(id_from_path("/v1/models/%zz").as_deref(), Some("%zz"));
        assert_eq!(id_from_path("/v1/models/"), None);
        assert_eq!(id_from_path("/v1/models"), None);
        assert_eq!(id_from_path("/v1/models/%ff"), None, "not UTF-8");
    }
}
