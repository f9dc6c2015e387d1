//! API-key authentication and authorization.
//!
//! With `auth:` configured ([`crate::config::edge`]), every inference request must carry
//! `Authorization: Bearer <key>`:
//! - no header, another scheme, or a key the gateway does not know → 401 `invalid_api_key`;
//! - a known key used for a model outside its `models:` globs or a route outside its
//!   `routes:` → 403 `model_not_allowed` / `route_not_allowed`.
//!
//! The presented token is hashed (SHA-256) once and compared with every configured digest in
//! constant time, folding the results without an early exit, so response timing reveals
//! neither which key matched nor how much of a key was right. Only digests are held in
//! memory. The admin listener uses the same comparison for its optional `admin.token`.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use crate::config::edge::{sha256, AdminSettings, ApiKey, Auth, Digest};
use crate::config::route::constant_time_eq;
use crate::config::Route;
use crate::error::GatewayError;

pub use crate::config::route::bearer_token;

/// The index of the key whose digest equals `digest`, comparing against every key.
fn find(keys: &[ApiKey], digest: &Digest) -> Option<usize> {
    keys.iter().enumerate().fold(None, |found, (i, k)| {
        let eq = constant_time_eq(&k.digest, digest);
        if eq && found.is_none() {
            Some(i)
        } else {
            found
        }
    })
}

/// The key presenting `headers`, or 401.
pub fn authenticate<'a>(
    auth: &'a Auth,
    headers: &http::HeaderMap,
) -> Result<&'a ApiKey, GatewayError> {
    let token = bearer_token(headers).ok_or(GatewayError::Unauthorized(
        "You didn't provide an API key: send it as `Authorization: Bearer <key>`",
    ))?;
    find(&auth.keys, &sha256(token))
        .map(|i| &auth.keys[i])
        .ok_or(GatewayError::Unauthorized("Incorrect API key provided"))
}

/// Whether `key` may send a request for `model` through `route` (`None`: no routes
/// configured); 403 otherwise.
pub fn authorize(key: &ApiKey, model: &str, route: Option<&Route>) -> Result<(), GatewayError> {
    if !key.models.is_empty() && !key.models.iter().any(|g| g.matches(model)) {
        return Err(GatewayError::Forbidden {
            key: key.name.to_string(),
            what: format!("model `{model}`"),
            code: "model_not_allowed",
        });
    }
    if !key.routes.is_empty() {
        let allowed = route.is_some_and(|r| key.routes.contains(&r.name));
        if !allowed {
            let what = match route {
                Some(r) => format!("route `{}`", r.name),
                None => "requests outside its routes".to_string(),
            };
            return Err(GatewayError::Forbidden {
                key: key.name.to_string(),
                what,
                code: "route_not_allowed",
            });
        }
    }
    Ok(())
}

/// Whether a request to the admin listener with `headers` may proceed.
pub fn admin_allowed(admin: &AdminSettings, headers: &http::HeaderMap) -> bool {
    match &admin.token_digest {
        None => true,
        Some(want) => bearer_token(headers).is_some_and(|t| constant_time_eq(&sha256(t), want)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Glob;
    use std::sync::Arc;

    fn key(name: &str, secret: &str) -> ApiKey {
        ApiKey {
            name: Arc::from(name),
            digest: sha256(secret.as_bytes()),
            models: Vec::new(),
            routes: Vec::new(),
            priority: None,
        }
    }

    fn headers(auth: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(&headers("Bearer abc ")), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&headers("bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&headers("Basic abc")), None);
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&http::HeaderMap::new()), None);
    }

    #[test]
    fn authenticate_finds_the_right_key_or_401() {
        let auth = Auth {
            keys: vec![key("a", "sk-aaaaaaaa"), key("b", "sk-bbbbbbbb")],
        };
        assert_eq!(
            &*authenticate(&auth, &headers("Bearer sk-bbbbbbbb"))
                .unwrap()
                .name,
            "b"
        );
        let missing = authenticate(&auth, &http::HeaderMap::new()).unwrap_err();
        assert_eq!((missing.status(), missing.code()), (401, "invalid_api_key"));
        let wrong = authenticate(&auth, &headers("Bearer sk-bbbbbbbc")).unwrap_err();
        assert_eq!(wrong.status(), 401);
        assert!(wrong.to_string().contains("Incorrect"));
    }

    #[test]
    fn authorize_checks_models_and_routes() {
        let mut k = key("a", "sk-aaaaaaaa");
        k.models = vec![Glob::parse("llama-*").unwrap()];
        assert!(authorize(&k, "llama-3", None).is_ok());
        let e = authorize(&k, "qwen", None).unwrap_err();
        assert_eq!((e.status(), e.code()), (403, "model_not_allowed"));
        k.routes = vec![Arc::from("chat")];
        let e = authorize(&k, "llama-3", None).unwrap_err();
        assert_eq!(e.code(), "route_not_allowed");
    }

    #[test]
    fn admin_token() {
        let open = AdminSettings::default();
        assert!(admin_allowed(&open, &http::HeaderMap::new()));
        let closed = AdminSettings {
            token_digest: Some(sha256(b"admin-secret")),
            allowed_hosts: Vec::new(),
            token_from: None,
        };
        assert!(!admin_allowed(&closed, &http::HeaderMap::new()));
        assert!(!admin_allowed(&closed, &headers("Bearer admin-secreT")));
        assert!(admin_allowed(&closed, &headers("Bearer admin-secret")));
    }
}
