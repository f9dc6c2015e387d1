//! What the router learns from an engine's own `/metrics`: the parser
//! ([`EngineSample::parse`]) and the per-backend state with its staleness rule
//! ([`EngineState`]), both pure; the scraping loop that feeds them lives in the gateway.

mod metrics;
mod state;

pub use metrics::{EngineFlavor, EngineMetricsError, EngineSample};
pub use state::{
    stale_after, EngineState, Scraped, DEFAULT_SCRAPE_INTERVAL, MIN_STALE_AFTER,
    STALE_AFTER_FAILURES,
};
