//! The simulator: a vLLM-like engine model on a virtual clock, GPU/model profiles, fleet
//! configuration and the offline evaluator.
//!
//! - [`engine`]: one inference server's scheduler, paged KV cache ([`kv`]) and step timing.
//! - [`profile`]: step-time coefficients and KV capacity per GPU + model (`config/sim/*.yaml`).
//! - [`fleet_config`]: the fleet file (`config/sim/fleet*.yaml`): which backends, which profile.
//!
//! The engine is synchronous and clock-agnostic: callers own time. The live HTTP fleet drives
//! it in real time; the offline evaluator in virtual time.

pub mod engine;
pub mod fleet_config;
pub mod kv;
pub mod profile;
