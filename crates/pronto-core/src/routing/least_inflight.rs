//! `least_inflight`: the eligible backend with the fewest requests in flight per unit weight.
//!
//! In-flight counts are the router's own (incremented when a request is sent, decremented when
//! its response stream ends), so a burst spreads at once instead of herding on a stale metric.
//! Ties are broken by a rotating offset so equal backends share the load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{Decision, NoBackend, Policy, Reason, Snapshot};
use crate::request::RequestFeatures;

/// Least in-flight requests, weighted, ties rotated.
#[derive(Debug, Default)]
pub(crate) struct LeastInflight {
    tiebreak: AtomicU64,
}

impl Policy for LeastInflight {
    fn name(&self) -> &'static str {
        "least_inflight"
    }

    fn select(
        &self,
        _features: &RequestFeatures,
        snapshot: &Snapshot<'_>,
        _now: Instant,
    ) -> Result<Decision, NoBackend> {
        let n = snapshot.backends.len();
        if n == 0 {
            return Err(NoBackend);
        }
        let start = (self.tiebreak.fetch_add(1, Ordering::Relaxed) % n as u64) as usize;
        let mut best: Option<(usize, f64)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let b = &snapshot.backends[i];
            if !b.eligible() {
                continue;
            }
            let load = f64::from(b.inflight) / f64::from(b.weight.max(1));
            if best.is_none_or(|(_, l)| load < l) {
                best = Some((i, load));
            }
        }
        best.map(|(index, _)| Decision {
            index,
            predicted_ttft_s: None,
            reason: Reason::LeastLoaded,
        })
        .ok_or(NoBackend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_support::{features, views};

    #[test]
    fn picks_least_loaded_eligible() {
        let p = LeastInflight::default();
        let mut v = views(3);
        v[0].inflight = 5;
        v[1].inflight = 1;
        v[2].inflight = 0;
        v[2].healthy = false;
        let d = p
            .select(&features(), &Snapshot { backends: &v }, Instant::now())
            .unwrap();
        assert_eq!(d.index, 1);
    }

    #[test]
    fn weight_scales_load_and_ties_rotate() {
        let p = LeastInflight::default();
        let mut v = views(2);
        v[0].inflight = 4;
        v[0].weight = 4;
        v[1].inflight = 1;
        let f = features();
        let now = Instant::now();
        let picks: Vec<usize> = (0..4)
            .map(|_| p.select(&f, &Snapshot { backends: &v }, now).unwrap().index)
            .collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
    }
}
