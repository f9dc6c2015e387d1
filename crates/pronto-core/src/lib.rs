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
//!
//! # Surface
//!
//! Each item has one path, `pronto_core::module::Item`; what no other crate needs is
//! `pub(crate)`. What the gateway and the evaluator (`pronto-sim`; `pronto-bench` for goodput
//! and SSE) take from each module:
//!
//! - [`admission`]: the SLO admission verdict ([`admission::Verdict`]), shed reasons, the queue
//!   order.
//! - [`affinity`]: the approximate prefix index ([`affinity::PrefixIndex`]) and its config.
//! - [`cluster`]: replica sync — events ([`cluster::SyncEvent`]), their [`cluster::wire`]
//!   format, folding peers' news ([`cluster::Remote`]), the [`cluster::Outbox`] and
//!   [`cluster::repair`].
//! - [`engine`]: the `/metrics` parser ([`engine::EngineSample`]) and per-backend scrape state
//!   with its staleness rule.
//! - [`ids`]: backend and route identities.
//! - [`kv_index`]: KV-event decoding and the exact per-backend prefix index
//!   ([`kv_index::ExactIndex`]).
//! - [`load`]: the load [`load::Ledger`], its bookings and storages ([`load::Atomic`] for the
//!   gateway, [`load::Plain`] for the evaluator).
//! - [`predict`]: TTFT and TPOT coefficients, the model's inputs, expected reasoning lengths.
//! - [`race`]: first-token deadlines, hedging and its budget, the race state machine
//!   ([`race::Race`]).
//! - [`request`]: request parsing into [`request::RequestFeatures`] and the per-model token
//!   ratio.
//! - [`routing`]: policies from their spec ([`routing::PolicySpec::build`]), the
//!   [`routing::views`] builder, [`routing::decide`] and its [`routing::Decision`].
//! - [`slo`]: a request's SLO targets and goodput.
//! - [`splice`]: stream migration's splicer and continuation body.
//! - [`sse`]: the SSE stream scanner ([`sse::SseScanner`]).
//! - [`stall`]: the stall rule.
//! - [`state`]: what is kept per backend ([`state::BackendState`]).
//! - [`time`]: calendar dates and nanosecond spans.
//! - [`tokens`]: Pronto's token count and prefix block hashes.
//! - `fuzzing` (feature `fuzzing`): the cargo-fuzz targets' bodies.

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
