//! The simulator: a vLLM-like engine model on a virtual clock, GPU/model profiles, fleet
//! configuration and the offline evaluator.
//!
//! - [`engine`]: one inference server's scheduler, paged KV cache ([`kv`]) and step timing.
//! - [`profile`]: step-time coefficients and KV capacity per GPU + model (`config/sim/*.yaml`).
//! - [`fleet_config`]: the fleet file (`config/sim/fleet*.yaml`): which backends, which profile.
//! - [`fleet`]: the live fleet — each backend an OpenAI-compatible HTTP server driving an engine
//!   in (scaled) real time, with vLLM's `/metrics` and fault injection.
//!
//! The engine is synchronous and clock-agnostic: callers own time. The live HTTP fleet drives
//! it in real time; the offline evaluator in virtual time.

pub mod engine;
pub mod fleet;
pub mod fleet_config;
mod fleet_driver;
mod fleet_faults;
mod fleet_http;
mod fleet_metrics;
mod fleet_openai;
pub mod kv;
pub mod profile;
