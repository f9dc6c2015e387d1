//! The status page: `GET /` on the admin listener.
//!
//! One HTML file with an inline script (`status.html`, embedded at build time; no external
//! assets, no build step). Every two seconds it fetches `GET /admin/backends` and
//! `GET /metrics` and shows each backend's health, requests in flight, engine queue and KV
//! usage, and from one window, the requests each backend completed in the last 60 s
//! (`latency.window_60s`): their TTFT p50/p99 and their mean predicted and measured TTFT; then
//! the TTFT model's relative error, and routing
//! decisions by reason (`pronto_route_decisions_total`). When `/admin/backends` carries a
//! `recent_decisions` array (`[{at_ms, backend, reason, predicted_ttft_ms,
//! actual_ttft_ms}]`, `at_ms` in Unix milliseconds; this gateway's do, see
//! [`crate::state::activity::RecentDecisions`]) it lists those too.
//!
//! **With `admin.token`**, a browser cannot send a bearer header when it navigates, so the
//! page also takes the token once as `GET /?token=...` (only on `/`; every other route wants
//! the header). Without a valid token `GET /` answers 401 with a small form that submits it
//! so. The page's script then moves the token from the address bar into the tab's
//! `sessionStorage` (`history.replaceState`, so it does not stay in the history) and sends it
//! as `Authorization: Bearer` on its fetches. The page is sent with `Cache-Control:
//! no-store`, `Referrer-Policy: no-referrer` and a Content-Security-Policy that allows only
//! its own inline code and same-origin fetches.

use http::StatusCode;

use crate::config::edge::{sha256, AdminSettings};
use crate::config::route::constant_time_eq;

/// The status page.
pub const PAGE: &str = include_str!("status.html");

/// What `GET /` answers without a valid token: a form that submits it as `?token=`.
const LOGIN: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<title>Pronto status: token needed</title>
<style>body{font:14px/1.4 system-ui,sans-serif;margin:2rem}input{font:inherit;padding:.3rem}</style>
</head><body>
<h1>Pronto status</h1>
<p>This admin listener needs its token (<code>admin.token</code>).</p>
<form method="get" action="/">
<label>Admin token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button type="submit">Open</button>
</form>
<script>
"use strict";
// A token this tab already holds (the page stores it there): open the page with it.
const t = sessionStorage.getItem("pronto-admin-token");
if (t && !new URLSearchParams(location.search).has("token")) {
  location.replace("/?token=" + encodeURIComponent(t));
}
</script>
</body></html>
"#;

/// Headers of both pages.
pub const HEADERS: [(&str, &str); 5] = [
    ("cache-control", "no-store"),
    ("referrer-policy", "no-referrer"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    (
        "content-security-policy",
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
         connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; \
         frame-ancestors 'none'",
    ),
];

/// `GET /` with the request's `authorized` (a valid bearer header, or no token configured)
/// and `query`: the page, or 401 with the form.
pub fn respond(
    admin: &AdminSettings,
    authorized: bool,
    query: Option<&str>,
) -> (StatusCode, Vec<u8>) {
    if authorized || query_token_ok(admin, query) {
        (StatusCode::OK, PAGE.as_bytes().to_vec())
    } else {
        (StatusCode::UNAUTHORIZED, LOGIN.as_bytes().to_vec())
    }
}

/// Whether `query` carries `token=<the admin token>` (percent-decoded).
fn query_token_ok(admin: &AdminSettings, query: Option<&str>) -> bool {
    let Some(want) = &admin.token_digest else {
        return true;
    };
    let Some(raw) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("token="))
    else {
        return false;
    };
    percent_decode(raw).is_some_and(|t| constant_time_eq(&sha256(t.trim_ascii()), want))
}

/// `application/x-www-form-urlencoded` value decoding (`+` is a space); `None` when malformed.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token(t: &str) -> AdminSettings {
        AdminSettings {
            token_digest: Some(sha256(t.as_bytes())),
            allowed_hosts: Vec::new(),
            token_from: None,
        }
    }

    #[test]
    fn the_page_needs_the_token_when_one_is_set() {
        let open = AdminSettings::default();
        assert_eq!(respond(&open, true, None).0, StatusCode::OK);
        let admin = with_token("s3cret+token/x");
        assert_eq!(respond(&admin, true, None).0, StatusCode::OK);
        let (status, body) = respond(&admin, false, None);
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(String::from_utf8(body).unwrap().contains("name=\"token\""));
        for (query, ok) in [
            ("token=s3cret%2Btoken%2Fx", true),
            ("a=1&token=s3cret%2btoken/x", true),
            ("token=s3cret+token/x", false),
            ("token=s3cret", false),
            ("token=%zz", false),
            ("tok=s3cret%2Btoken%2Fx", false),
        ] {
            let status = respond(&admin, false, Some(query)).0;
            assert_eq!(status == StatusCode::OK, ok, "{query}");
        }
    }

    #[test]
    fn the_page_has_no_external_assets() {
        for needle in ["src=\"http", "href=\"http", "@import", "<link"] {
            assert!(!PAGE.contains(needle), "{needle}");
        }
        assert!(PAGE.contains("/admin/backends") && PAGE.contains("recent_decisions"));
    }
}
