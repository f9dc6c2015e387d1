//! Replaying workloads against a live endpoint: trace readers and a seeded synthetic workload
//! generator ([`trace`]), the timed streaming client ([`client`]), the open-loop runner behind
//! `pronto replay` ([`run`]), the per-request records and summary ([`report`]) and hand-drawn
//! SVG plots ([`svg`]).

pub mod client;
pub mod report;
pub mod run;
pub mod svg;
pub mod trace;

pub use report::{RequestRecord, Summary};
pub use run::{replay_to_dir, run_replay, ReplayArgs};
pub use svg::cdf_svg;
