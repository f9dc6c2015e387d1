//! Pronto: a gateway that sends each LLM prompt to the backend that will produce its first
//! token soonest.
//!
//! This crate is the gateway: config, the pingora glue ([`proxy`]), live backend state
//! ([`backend`]), background services, admin and telemetry. What decides — request features,
//! the TTFT predictor, prefix indexes, the load ledger, views and policies — is the pure
//! routing core, `pronto_core` (re-exported here as [`request`], [`routing`], …). The
//! simulator and the bench tools (`pronto_sim`, `pronto_bench`) are behind the default
//! `tools` feature.
//!
//! Data flows one way: request bytes → [`request::RequestFeatures`] → [`routing`] decision →
//! [`proxy`] → observations fed back into the backends' live state ([`backend`]).

#![warn(missing_docs)]

pub use pronto_core::{affinity, predict, request, routing, sse, tokens};
pub use pronto_tokenizer as tokenizer;

pub mod admin;
pub mod admission;
pub mod auth;
pub mod backend;
pub mod cluster;
pub mod coalesce;
pub mod config;
#[cfg(feature = "tools")]
pub mod demo;
pub mod discovery;
pub mod error;
pub mod framing;
/// The cargo-fuzz target's body (`fuzz/`, `tests/fuzz_smoke.rs`); only with the `fuzzing`
/// feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod head_deadline;
pub mod kv_events;
pub mod listener;
pub mod models;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod server;
pub mod telemetry;
pub mod tls;
