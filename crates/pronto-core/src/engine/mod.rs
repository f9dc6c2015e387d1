//! What the router learns from an engine's own `/metrics`: the parser ([`metrics`]) and the
//! per-backend state with its staleness rule ([`state`]), both pure; the scraping loop that
//! feeds them lives in the gateway.

pub mod metrics;
pub mod state;

pub use metrics::{EngineFlavor, EngineMetricsError, EngineSample};
pub use state::{EngineState, Scraped, STALE_AFTER_FAILURES};
