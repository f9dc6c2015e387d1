//! Replaying workloads: trace readers and a seeded synthetic workload generator.

pub mod trace;
