//! The wedge fault offline: an engine that stops stepping (module docs of [`super`]).

/// A wedged engine ([`crate::fleet_faults`]): from `from_s` (virtual seconds from the run's
/// start) until `until_s` (for good without one) it runs no step — no token, no request
/// finishes — while requests still reach it and queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wedge {
    /// When it wedges.
    pub from_s: f64,
    /// When it goes on again; `None`: never.
    pub until_s: Option<f64>,
}

impl Wedge {
    /// The wedge in `faults`, if any.
    pub fn of(faults: &crate::fleet_config::FaultConfig) -> Option<Wedge> {
        let from_s = faults.wedge_after?.as_secs_f64();
        Some(Wedge {
            from_s,
            until_s: faults.wedge_for.map(|d| from_s + d.as_secs_f64()),
        })
    }

    /// Whether a backend of `fleet` is wedged until the end of any run.
    pub fn for_good(fleet: &[super::SimBackend]) -> bool {
        fleet
            .iter()
            .any(|b| b.wedge.is_some_and(|w| w.until_s.is_none()))
    }

    /// Whether it holds at `t`; `Some(end)` when it does (`f64::INFINITY`: for good).
    pub fn holds_at(&self, t: f64) -> Option<f64> {
        let end = self.until_s.unwrap_or(f64::INFINITY);
        (t >= self.from_s && t < end).then_some(end)
    }
}
