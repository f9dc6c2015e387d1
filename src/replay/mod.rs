//! Replaying workloads against a live endpoint: trace readers and a seeded synthetic workload
//! generator ([`trace`]), the timed streaming client ([`client`]), the open-loop runner behind
//! `pronto replay` ([`run`]), the per-request records and summary ([`report`]), hand-drawn
//! SVG plots ([`svg`]) and the side-by-side table over several replays behind
//! `pronto compare-report` ([`compare`]).

pub mod client;
pub mod compare;
pub mod report;
pub mod run;
pub mod svg;
pub mod trace;

pub use compare::{run_compare_report, CompareReportArgs};
pub use report::{RequestRecord, Summary};
pub use run::{replay_to_dir, run_replay, ReplayArgs};
pub use svg::cdf_svg;
