//! The simulator: a vLLM-like engine model on a virtual clock, GPU/model profiles, fleet
//! configuration, workloads and the offline evaluator.
//!
//! - [`engine`]: one inference server's scheduler, paged KV cache ([`kv`]) and step timing.
//! - [`profile`]: step-time coefficients and KV capacity per GPU + model (`config/sim/*.yaml`).
//! - [`evaluate`]: the offline evaluator (`pronto evaluate`), with [`eval_router`] (what the
//!   router knows) and [`eval_report`] (results).
//! - [`fleet_config`]: the fleet file (`config/sim/fleet*.yaml`): which backends, which profile.
//! - [`fleet`]: the live fleet — each backend an OpenAI-compatible HTTP server driving an engine
//!   in (scaled) real time, with vLLM's `/metrics` and fault injection.
//! - [`calibrate`]: `pronto calibrate` — measure a live engine, fit a profile to it with the
//!   engine's own scheduler replayed, write it.
//! - [`reasoning`]: a reasoning model's reasoning length per request (`reasoning:` in the
//!   fleet file), for the live fleet and the evaluator alike.
//! - [`workload`]: trace readers (Mooncake, Azure) and the seeded synthetic multi-turn workload.
//!
//! The engine is synchronous and clock-agnostic: callers own time. The live HTTP fleet drives
//! it in real time; the offline evaluator in virtual time.

#![warn(missing_docs)]

pub mod calibrate;
pub mod engine;
pub mod eval_args;
#[cfg(test)]
mod eval_race_tests;
pub mod eval_replicas;
pub mod eval_report;
pub mod eval_router;
#[cfg(test)]
mod eval_tests;
pub mod evaluate;
pub mod fleet;
pub mod fleet_config;
mod fleet_driver;
mod fleet_faults;
mod fleet_http;
mod fleet_kv_events;
mod fleet_metrics;
mod fleet_openai;
mod fleet_timer;
pub mod kv;
pub mod profile;
pub mod reasoning;
pub mod testing;
pub mod workload;
pub mod workload_agentic;
