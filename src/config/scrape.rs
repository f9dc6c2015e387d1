//! A pool's `scrape:` section ([`super::model::Scrape`]): serde reads it whole, its range
//! included, so what is left here are its tests.
//!
//! `scrape: {interval: 250ms}` sets how often the engine scraper
//! (`backend::EngineScraper`) reads each of the pool's backends' `/metrics` while
//! the scrapes succeed (default [`super::model::DEFAULT_SCRAPE_INTERVAL`], at least
//! [`super::model::MIN_SCRAPE_INTERVAL`]); a failing backend backs off from it, and a sample
//! is trusted for `pronto_core::engine::stale_after(interval)`.

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;

    fn load(scrape: &str) -> Result<Config, String> {
        Config::from_yaml_str(
            &format!(
                "retry: {{max_retries: 0}}\npools:\n  m:\n{scrape}    backends:\n      - {{name: a, url: 'http://127.0.0.1:1'}}\n"
            ),
            "t.yaml",
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_interval_defaults_parses_and_round_trips_through_the_effective_config() {
        let c = load("").unwrap();
        assert_eq!(c.pools[0].scrape.interval, Duration::from_millis(250));
        let c = load("    scrape: {interval: 2s}\n").unwrap();
        assert_eq!(c.pools[0].scrape.interval, Duration::from_secs(2));
        let c = load("    scrape: {}\n").unwrap();
        assert_eq!(c.pools[0].scrape.interval, Duration::from_millis(250));
        let json = c.to_json();
        assert_eq!(json["pools"]["m"]["scrape"]["interval"], "250ms");
    }

    #[test]
    fn errors_name_the_field_and_its_line() {
        let e = load("    scrape: {interval: 1ms}\n").unwrap_err();
        assert_eq!(
            e,
            "t.yaml:4:24: pools.m.scrape.interval: must be at least 10ms, got 1ms"
        );
        let e = load("    scrape: {interval: 0s}\n").unwrap_err();
        assert_eq!(
            e,
            "t.yaml:4:24: pools.m.scrape.interval: must be greater than zero"
        );
        let e = load("    scrape: {interval: 5}\n").unwrap_err();
        assert!(
            e.contains("pools.m.scrape.interval: `5` has no unit"),
            "{e}"
        );
        let e = load("    scrape: {intervl: 1s}\n").unwrap_err();
        assert!(e.contains("unknown field `intervl`"), "{e}");
    }
}
