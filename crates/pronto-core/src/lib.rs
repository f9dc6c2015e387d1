//! Pronto's routing core: everything that decides where a request goes, pure and synchronous.
//!
//! No async runtime, no sockets, no files, no metrics registry: every function takes the time
//! (`now`) as an argument, so the gateway (the `pronto` crate) and the offline evaluator
//! (`pronto-sim`) drive the *same* code, one on the wall clock and one on a virtual clock.
//!
//! Data flows one way: request bytes → [`request::RequestFeatures`] → routing views
//! ([`routing::views`], built from the [`load`] ledger, the [`affinity`] and [`kv_index`]
//! prefix indexes, the scraped [`engine`] state and each backend's [`predict`] model) →
//! [`routing::Policy::select`] → a [`routing::Decision`] carrying the one prediction it acted
//! on → observations at the first token fed back into the ledger and the model.

#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::disallowed_methods))]
// Reached from every request: no panics (tests may unwrap, clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod admission;
pub mod affinity;
pub mod cluster;
pub mod engine;
/// The cargo-fuzz targets' bodies (`fuzz/`, `tests/fuzz_smoke.rs`); only with the `fuzzing`
/// feature.
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod ids;
pub mod kv_index;
pub mod load;
pub mod predict;
pub mod race;
pub mod request;
pub mod routing;
pub(crate) mod seq_cell;
pub mod slo;
pub mod splice;
pub mod sse;
pub mod stall;
pub mod state;
pub mod time;
pub mod tokens;
