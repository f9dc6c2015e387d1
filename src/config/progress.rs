//! Before the first token, two guards against silence: `health.stall` takes a backend that
//! makes no progress out of routing ([`pronto_core::stall`]), and a route's `keepalive` keeps
//! the client's connection busy while a stream waits for its first token
//! (`proxy::keepalive`). The file structs and their validation with field paths.
//!
//! ```yaml
//! health:
//!   # A backend with streams in flight and no token on any of them for
//!   # max(floor, factor × predicted time of its booked prefill) gets no new requests
//!   # until it produces again (not ejected: its prefix index and TTFT model are kept).
//!   stall: {floor: 10s, factor: 4}        # the defaults; {enabled: false} turns it off
//! routes:
//!   - name: chat
//!     pool: llama
//!     keepalive: 15s   # an SSE comment (`: keep-alive`) every 15 s until the first token
//! ```

use std::time::Duration;

use serde::Deserialize;

use pronto_core::stall::{StallRule, DEFAULT_FLOOR};

/// Shortest `health.stall.floor` accepted (shorter would take a merely slow prefill for a
/// wedge).
pub const MIN_STALL_FLOOR: Duration = Duration::from_millis(100);
/// Longest `health.stall.floor` accepted.
pub const MAX_STALL_FLOOR: Duration = Duration::from_secs(3600);
/// Shortest route `keepalive` accepted.
pub const MIN_KEEPALIVE: Duration = Duration::from_millis(100);
/// Longest route `keepalive` accepted (longer outlasts every proxy idle timeout it is for).
pub const MAX_KEEPALIVE: Duration = Duration::from_secs(600);

/// Progress-based exclusion: a backend with streams in flight and no token on any of them for
/// max(floor, factor x the predicted time of its booked prefill) gets no new requests until
/// it produces again (not ejected)
///
/// Both the file's `health.stall` and the model: serde fills the defaults and checks the
/// ranges; [`Stall::rule`] is what the gateway runs.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Stall {
    /// Judge backends on their progress
    pub enabled: bool,
    /// The shortest silence that counts (100ms..=1h)
    #[serde(
        serialize_with = "super::duration::text_duration::serialize",
        deserialize_with = "super::duration::text_duration::within::<_, { MIN_STALL_FLOOR.as_millis() as u64 }, { MAX_STALL_FLOOR.as_millis() as u64 }>"
    )]
    #[schemars(with = "super::schema::DurationText")]
    #[schemars(extend("default" = super::schema::dur(DEFAULT_FLOOR)))]
    pub floor: Duration,
    /// Multiple of the predicted time of the booked prefill work
    #[serde(deserialize_with = "super::value::float_in::<_, 1, 1000>")]
    #[schemars(range(min = 1, max = 1000))]
    pub factor: f64,
}

impl Default for Stall {
    fn default() -> Stall {
        let rule = StallRule::default();
        Stall {
            enabled: true,
            floor: rule.floor,
            factor: rule.factor,
        }
    }
}

impl Stall {
    /// The rule the gateway applies; `None` when turned off.
    pub fn rule(&self) -> Option<StallRule> {
        self.enabled.then_some(StallRule {
            floor: self.floor,
            factor: self.factor,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::time::Duration;

    const POOL: &str = "pools:\n  m: {backends: [{name: a, url: 'http://127.0.0.1:1'}]}\n";

    fn load(yaml: &str) -> Result<Config, String> {
        Config::from_yaml_str(&format!("{yaml}{POOL}"), "t.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn stall_defaults_on_and_can_be_tuned_or_turned_off() {
        let c = load("").unwrap();
        let rule = c.health.stall.rule().unwrap();
        assert_eq!(rule.floor, Duration::from_secs(10));
        assert_eq!(rule.factor, 4.0);
        let c = load("health: {stall: {floor: 2s, factor: 3}}\n").unwrap();
        let rule = c.health.stall.rule().unwrap();
        assert_eq!((rule.floor, rule.factor), (Duration::from_secs(2), 3.0));
        let c = load("health: {stall: {enabled: false}}\n").unwrap();
        assert_eq!(c.health.stall.rule(), None);
    }

    #[test]
    fn bad_stall_values_name_their_field() {
        for (yaml, field, why) in [
            ("{floor: 10ms}", "health.stall.floor", "must be between"),
            ("{floor: 2h}", "health.stall.floor", "must be between"),
            ("{floor: 5}", "health.stall.floor", "no unit"),
            (
                "{factor: 0.5}",
                "health.stall.factor",
                "must be between 1 and 1000",
            ),
            ("{factor: .nan}", "health.stall.factor", "must be between"),
        ] {
            let e = load(&format!("health: {{stall: {yaml}}}\n")).unwrap_err();
            assert!(e.contains(field) && e.contains(why), "{yaml}: {e}");
        }
        let e = load("health: {stall: {after: 3s}}\n").unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn a_route_keepalive_is_a_bounded_duration() {
        let route = |k: &str| format!("routes:\n  - {{name: r, pool: m, keepalive: {k}}}\n");
        let c = load(&route("15s")).unwrap();
        assert_eq!(c.routes[0].keepalive, Some(Duration::from_secs(15)));
        assert_eq!(
            load("routes:\n  - {name: r, pool: m}\n").unwrap().routes[0].keepalive,
            None
        );
        for (k, why) in [
            ("10ms", "must be between"),
            ("1h", "must be between"),
            ("15", "no unit"),
        ] {
            let e = load(&route(k)).unwrap_err();
            assert!(
                e.contains("routes[0].keepalive") && e.contains(why),
                "{k}: {e}"
            );
        }
    }
}
