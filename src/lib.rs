//! Pronto: a gateway that sends each LLM prompt to the backend that will produce its first
//! token soonest.
//!
//! This crate is the gateway: config, the pingora glue ([`proxy`]), live backend state
//! ([`backend`]), background services, admin and telemetry. What decides — request features,
//! the TTFT predictor, prefix indexes, the load ledger, views and policies — is the pure
//! routing core, `pronto_core`, used under its own name (`pronto_core::routing`, …). The
//! simulator and the bench tools (`pronto_sim`, `pronto_bench`) are behind the default
//! `tools` feature.
//!
//! Data flows one way: request bytes → [`pronto_core::request::RequestFeatures`] → [`pronto_core::routing`] decision →
//! [`proxy`] → observations fed back into the backends' live state ([`backend`]).

#![warn(missing_docs)]

pub mod admin;
pub mod backend;
pub mod cluster;
pub mod coalesce;
pub mod config;
#[cfg(feature = "tools")]
pub mod demo;
pub mod edge;
pub mod error;
/// The cargo-fuzz target's body (`fuzz/`, `tests/fuzz_smoke.rs`); only with the `fuzzing`
/// feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod kv_events;
pub mod listener;
pub mod models;
pub mod proxy;
pub mod server;
pub mod services;
pub mod state;
pub mod telemetry;
pub mod tls;
