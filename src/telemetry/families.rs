//! How the families are made: one registry, and every family with a `backend` label listed as
//! it is registered, so [`super::Metrics::forget_backend`] finds them all.

use std::cell::RefCell;
use std::collections::HashMap;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// A family with a `backend` label: removes every series of one backend, whatever its other
/// labels.
pub(super) trait BackendFamily: Send + Sync + std::fmt::Debug {
    fn forget(&self, backend: &str);
}

impl<T: MetricVecBuilder + 'static> BackendFamily for MetricVec<T> {
    fn forget(&self, backend: &str) {
        for family in self.collect() {
            for m in family.get_metric() {
                let labels: HashMap<&str, &str> = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                if labels.get("backend") == Some(&backend) {
                    // Gone already (a concurrent forget) is fine.
                    let _ = self.remove(&labels);
                }
            }
        }
    }
}

/// The registry being filled, and the families with a `backend` label found so far.
pub(super) struct Families {
    pub(super) registry: Registry,
    pub(super) per_backend: RefCell<Vec<Box<dyn BackendFamily>>>,
}

impl Families {
    pub(super) fn register<T: MetricVecBuilder + 'static>(
        &self,
        family: &MetricVec<T>,
        labels: &[&str],
    ) {
        self.registry
            .register(Box::new(family.clone()))
            .expect("unique metric");
        if labels.contains(&"backend") {
            self.per_backend.borrow_mut().push(Box::new(family.clone()));
        }
    }
}

pub(super) fn counter(r: &Families, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(&c, labels);
    c
}

pub(super) fn gauge(r: &Families, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(&g, labels);
    g
}

pub(super) fn plain_gauge(r: &Families, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    r.registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

pub(super) fn float_gauge(r: &Families, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(&g, labels);
    g
}

pub(super) fn histogram(r: &Families, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    histogram_with(r, name, help, labels, LATENCY_BUCKETS)
}

/// Buckets of signed prediction errors, seconds.
pub(super) const ERROR_BUCKETS: &[f64] = &[
    -5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1.0, 2.0, 5.0,
];
/// Buckets of ratios in 0..=1.
/// Time-per-output-token buckets, seconds (1 ms .. 0.5 s).
pub(super) const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5,
];
/// Buckets for request durations and TTFT, in seconds (5 ms … 60 s).
pub(super) const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
    20.0, 30.0, 60.0,
];

pub(super) const RATIO_BUCKETS: &[f64] =
    &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];

pub(super) fn histogram_with(
    r: &Families,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid histogram");
    r.register(&h, labels);
    h
}
