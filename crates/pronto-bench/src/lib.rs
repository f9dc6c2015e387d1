//! Pronto's bench tools: replaying workloads against a live endpoint (the workloads themselves
//! — trace readers and the seeded synthetic generator — are `pronto_sim::workload`): the timed
//! streaming client ([`client`]), the open-loop runner behind `pronto replay` ([`run`]), the per-request records and summary ([`report`]), hand-drawn
//! SVG plots ([`svg`]) and the side-by-side table over several replays behind
//! `pronto compare-report` ([`compare`]).

#![warn(missing_docs)]

pub mod client;
pub mod compare;
pub mod report;
pub mod run;
pub mod svg;

pub use compare::{run_compare_report, CompareReportArgs};
pub use report::{RequestRecord, Summary};
pub use run::{replay_to_dir, run_replay, ReplayArgs};
pub use svg::cdf_svg;
