//! The global budget of buffered request bytes.
//!
//! Every request body is read whole before routing and held until the request ends (each
//! attempt sends it again), so bodies are the gateway's main memory. One budget bounds them
//! across all requests: a body is charged as it is read — all of it up front when it declares
//! a `Content-Length` — and released when its request ends. A request that does not fit gets
//! 503 with `Retry-After` (`GatewayError::Busy`) without its body being read, rather than the
//! process growing until the kernel kills it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes currently charged, over all requests.
#[derive(Debug, Default)]
pub struct BufferBudget {
    used: AtomicU64,
}

impl BufferBudget {
    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation against this budget, whose cap is `max` bytes.
    pub fn reservation(&self, max: u64) -> Reservation<'_> {
        Reservation {
            budget: self,
            max,
            bytes: 0,
        }
    }
}

/// One request's share of the budget; released on drop.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a BufferBudget,
    max: u64,
    bytes: u64,
}

impl Reservation<'_> {
    /// Charge `n` more bytes; false (and nothing charged) when the budget cannot take them.
    pub fn grow(&mut self, n: u64) -> bool {
        let ok = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok();
        if ok {
            self.bytes += n;
        }
        ok
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_one_cap_and_release_on_drop() {
        let b = BufferBudget::default();
        let mut r1 = b.reservation(100);
        assert!(r1.grow(60));
        let mut r2 = b.reservation(100);
        assert!(!r2.grow(50), "60 + 50 is over the cap");
        assert!(r2.grow(40));
        assert_eq!(b.used(), 100);
        drop(r1);
        assert_eq!(b.used(), 40);
        assert!(r2.grow(60));
        assert_eq!(b.used(), 100);
        drop(r2);
        assert_eq!(b.used(), 0);
    }
}
