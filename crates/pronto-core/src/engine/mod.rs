//! What the router learns from an engine's own `/metrics`: the parser ([`metrics`]) and the
//! per-backend state with its staleness rule ([`state`]), both pure; the scraping loop that
//! feeds them lives in the gateway.

pub mod metrics;
pub mod state;

pub use metrics::{EngineFlavor, EngineMetricsError, EngineSample};
pub use state::{
    stale_after, EngineState, Scraped, DEFAULT_SCRAPE_INTERVAL, MIN_STALE_AFTER,
    STALE_AFTER_FAILURES,
};
