//! Host and Origin checks on the admin listener's state-changing requests
//! (`POST /admin/reload`, `POST /admin/tokenize`).
//!
//! A browser on the operator's machine can be made to send requests to the admin listener:
//! a page on another site can `POST` to `http://127.0.0.1:9400/admin/reload` (cross-site
//! request), and a hostile name that resolves to the gateway's address can make the browser
//! treat the listener as that site (DNS rebinding). Both are refused with 403:
//!
//! - **`Host`** (or the HTTP/2 `:authority`) must name the listener by an IP address, by
//!   `localhost`, or by one of `admin.allowed_hosts`. A rebinding attack always carries the
//!   attacker's host name, never an IP literal; the port is not checked, so port forwarding
//!   (`kubectl port-forward 19400:9400`) keeps working.
//! - **`Origin`**, when present (browsers send it on every cross-origin and every `POST`
//!   request; `curl` and other tools do not), must be the same origin as `Host` (an
//!   `http://` or `https://` URL whose authority equals it) or name one of
//!   `admin.allowed_hosts`. `Origin: null` (sandboxed pages, some redirects) is refused.
//!
//! Requests without a browser (scripts, `curl`, the tests) pass as long as they send a
//! plain `Host`. The admin token, when set, is checked as well.

use std::net::IpAddr;

/// Why a state-changing admin request is refused; `Ok` when it may proceed. `authority` is
/// the request URI's authority (HTTP/2), used when there is no `Host` header; `allowed` the
/// lowercase `admin.allowed_hosts`.
pub fn check_post(
    headers: &http::HeaderMap,
    authority: Option<&str>,
    allowed: &[String],
) -> Result<(), String> {
    let host = match headers.get(http::header::HOST) {
        Some(v) => v
            .to_str()
            .map_err(|_| "the Host header is not text".to_string())?,
        None => authority.ok_or("no Host header")?,
    };
    let name = hostname(host).ok_or_else(|| format!("Host `{host}` is not a host[:port]"))?;
    if !host_allowed(&name, allowed) {
        return Err(format!(
            "Host `{host}` is not an IP address, localhost or one of admin.allowed_hosts \
             (DNS rebinding protection)"
        ));
    }
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let origin_authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .filter(|a| !a.is_empty() && !a.contains('/'));
    let same_origin = origin_authority.is_some_and(|a| a.eq_ignore_ascii_case(host));
    let allowed_origin = origin_authority
        .and_then(hostname)
        .is_some_and(|n| allowed.contains(&n));
    if same_origin || allowed_origin {
        Ok(())
    } else {
        Err(format!(
            "Origin `{origin}` is not this listener (`{host}`) or one of admin.allowed_hosts \
             (cross-site request protection)"
        ))
    }
}

/// The lowercase host of `host[:port]` / `[v6]:port`, without a trailing dot; `None` when it
/// is not of that shape.
fn hostname(authority: &str) -> Option<String> {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || port(after.strip_prefix(':')?)) {
            return None;
        }
        inside
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) if port(p) => h,
            Some(_) => return None,
            None => authority,
        }
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':'));
    valid.then_some(host)
}

fn port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

fn host_allowed(name: &str, allowed: &[String]) -> bool {
    name.parse::<IpAddr>().is_ok() || name == "localhost" || allowed.iter().any(|a| a == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn check(pairs: &[(&str, &str)]) -> Result<(), String> {
        check_post(
            &headers(pairs),
            None,
            &["pronto-admin.internal".to_string()],
        )
    }

    #[test]
    fn hosts_by_address_localhost_or_configured_name_pass() {
        for host in [
            "127.0.0.1:9400",
            "10.1.2.3:9400",
            "[::1]:9400",
            "[fd00::7]",
            "localhost:19400",
            "LOCALHOST",
            "pronto-admin.internal:9400",
            "pronto-admin.internal.",
        ] {
            assert_eq!(check(&[("host", host)]), Ok(()), "{host}");
        }
    }

    #[test]
    fn other_names_and_malformed_hosts_are_refused() {
        for host in [
            "attacker.example:9400",
            "localhost.attacker.example",
            "127.0.0.1.nip.io:9400",
            "127.0.0.1:port",
            "[::1",
            "",
            "a b",
        ] {
            let e = check(&[("host", host)]).unwrap_err();
            assert!(e.contains("Host"), "{host}: {e}");
        }
        assert_eq!(
            check_post(&http::HeaderMap::new(), None, &[]).unwrap_err(),
            "no Host header"
        );
        // HTTP/2: the URI's authority stands in for Host.
        assert_eq!(
            check_post(&http::HeaderMap::new(), Some("127.0.0.1:9400"), &[]),
            Ok(())
        );
        assert!(check_post(&http::HeaderMap::new(), Some("evil.example"), &[]).is_err());
    }

    #[test]
    fn origin_must_be_same_origin_or_a_configured_name() {
        let host = ("host", "127.0.0.1:9400");
        assert_eq!(check(&[host, ("origin", "http://127.0.0.1:9400")]), Ok(()));
        assert_eq!(
            check(&[host, ("origin", "https://pronto-admin.internal")]),
            Ok(())
        );
        for origin in [
            "http://evil.example",
            "http://127.0.0.1:8000",
            "http://localhost:9400",
            "null",
            "file://",
            "http://127.0.0.1:9400/path",
        ] {
            let e = check(&[host, ("origin", origin)]).unwrap_err();
            assert!(e.contains("Origin"), "{origin}: {e}");
        }
    }
}
