//! Validation of a pool's `discover:` section and of profile hints (pool and backend).
//!
//! `discover: {dns: "vllm.internal:8000", interval: 10s, scheme: http, family: any}` makes every
//! address the name resolves to a backend of the pool (see `discovery`); the port
//! defaults to 80 when `dns` has none. Only `http` is accepted: a discovered backend is
//! addressed by IP, and TLS would need the name as SNI and `Host`, which the peer does not
//! carry yet. `weight` and `max_inflight` apply to each discovered backend.
//!
//! Profile hints are checked in [`super::profile`]; their tests are here.

use super::file::DiscoverFile;
use super::model::Discover;
use super::validate::Checker;

impl Checker {
    /// A `discover:` section (serde read and checked its values); `None` when `dns` is
    /// missing (error recorded).
    pub(super) fn discover(&mut self, path: &str, d: &DiscoverFile) -> Option<Discover> {
        let Some(super::value::HostPort { host, port }) = d.dns.clone() else {
            self.error(
                format!("{path}.dns"),
                "missing; a name to resolve, e.g. `vllm.internal:8000`",
            );
            return None;
        };
        Some(Discover {
            host,
            port,
            interval: d.interval,
            family: d.family,
            weight: d.weight,
            max_inflight: d.max_inflight,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{AddressFamily, Config, ProfileHint};

    fn load(pool: &str) -> Result<Config, String> {
        Config::from_yaml_str(
            &format!("retry: {{max_retries: 0}}\npools:\n  m:\n{pool}"),
            "t",
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn backend_profile_overrides_the_pool_default_field_by_field() {
        let c = load(
            "    profile: {base_ms: 30, prefill_tokens_per_s: 10000}\n    backends:\n      \
             - {name: a, url: 'http://h:1', profile: {base_ms: 5, decode_ms_per_running: 2}}\n      \
             - {name: b, url: 'http://h:2'}\n",
        )
        .unwrap();
        let pool = c.pool("m").unwrap();
        assert_eq!(
            pool.backends[0].profile,
            Some(ProfileHint {
                base_ms: Some(5.0),
                prefill_tokens_per_s: Some(10000.0),
                decode_ms_per_running: Some(2.0),
            })
        );
        let b = pool.backends[1].profile.unwrap().coefficients();
        assert_eq!((b.base_s, b.s_per_token), (0.03, 1e-4));
    }

    #[test]
    fn profile_values_must_be_positive_and_finite() {
        let err = load(
            "    backends:\n      - {name: a, url: 'http://h:1', profile: {base_ms: 0, \
             prefill_tokens_per_s: .inf, decode_ms_per_running: -1}}\n",
        )
        .unwrap_err();
        for field in ["base_ms", "prefill_tokens_per_s", "decode_ms_per_running"] {
            assert!(
                err.contains(&format!(
                    "pools.m.backends[0].profile.{field}: must be a positive"
                )),
                "{err}"
            );
        }
        let err =
            load("    profile: {base_ms: .nan}\n    backends: [{name: a, url: 'http://h:1'}]\n")
                .unwrap_err();
        assert!(
            err.contains("pools.m.profile.base_ms: must be a positive"),
            "{err}"
        );
    }

    #[test]
    fn a_discovered_pool_needs_no_static_backends() {
        let c = load("    discover: {dns: 'vllm.internal:8000', interval: 2s, family: ipv4}\n")
            .unwrap();
        let d = c.pool("m").unwrap().discover.clone().unwrap();
        assert_eq!((d.host.as_str(), d.port), ("vllm.internal", 8000));
        assert_eq!(
            (d.interval, d.family),
            (Duration::from_secs(2), AddressFamily::Ipv4)
        );
        let d = load("    discover: {dns: vllm}\n").unwrap();
        let d = d.pool("m").unwrap().discover.clone().unwrap();
        assert_eq!((d.port, d.interval), (80, Duration::from_secs(10)));
        let err = load("    policy: round_robin\n").unwrap_err();
        assert!(
            err.contains("pools.m.backends: pool has no backends"),
            "{err}"
        );
    }

    #[test]
    fn discover_errors_name_their_field() {
        let err = load(
            "    discover: {dns: 'http://x:1', scheme: https, family: ipv5, interval: 0s, \
             weight: 0}\n",
        )
        .unwrap_err();
        for needle in [
            "pools.m.discover.dns: `http://x:1` must be `host:port`",
            "pools.m.discover.scheme: `https` is not supported",
            "pools.m.discover.family: unknown variant `ipv5`, expected one of `any`, `ipv4`, `ipv6`",
            "pools.m.discover.interval: must be greater than zero",
            "pools.m.discover.weight: must be at least 1",
        ] {
            assert!(err.contains(needle), "{needle} in {err}");
        }
        let err = load("    discover: {interval: 1s}\n").unwrap_err();
        assert!(err.contains("pools.m.discover.dns: missing"), "{err}");
    }
}
