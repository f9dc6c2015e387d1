//! The retry budget of one request, as the docs state it: each failed attempt that reached
//! the backend — a connect failure, an I/O failure on a fresh connection, a 5xx or a 429 — is
//! a charged retry and marks that backend tried, so the next attempt goes elsewhere; at most
//! `max_retries` of them. A stale pooled connection is not an attempt: it is resent once on a
//! fresh connection inside the same attempt ([`super::upstream::attempt`]).

use pronto_core::ids::BackendId;

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Try again on another backend.
    Retry,
    /// Give up: no retry left, or no other backend to try.
    GiveUp,
}

/// One request's attempts so far.
#[derive(Debug, Default)]
pub(super) struct Retries {
    /// Backends tried (excluded from later decisions).
    pub tried: Vec<BackendId>,
    /// Retries spent.
    pub spent: u32,
}

impl Retries {
    /// No attempt yet; `excluded` backends may not be tried (they do not serve the request's
    /// model).
    pub fn excluding(excluded: &[BackendId]) -> Retries {
        Retries {
            tried: excluded.to_vec(),
            spent: 0,
        }
    }

    /// An attempt on `backend` failed; `others_left`: the decision saw another eligible
    /// backend.
    pub fn failed(&mut self, backend: BackendId, max_retries: u32, others_left: bool) -> Next {
        if !self.tried.contains(&backend) {
            self.tried.push(backend);
        }
        if self.spent < max_retries && others_left {
            self.spent += 1;
            Next::Retry
        } else {
            Next::GiveUp
        }
    }

    /// Attempts made so far, including the one in progress.
    pub fn attempts(&self) -> u32 {
        self.spent + 1
    }

    /// Whether the attempt about to be made may still pass a 5xx/429 on to a retry.
    pub fn may_retry(&self, max_retries: u32, others_left: bool) -> bool {
        self.spent < max_retries && others_left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_is_charged_and_marks_its_backend_tried() {
        let mut r = Retries::default();
        assert!(r.may_retry(2, true));
        assert_eq!(r.failed(BackendId(1), 2, true), Next::Retry);
        assert_eq!(r.failed(BackendId(2), 2, true), Next::Retry);
        assert!(
            !r.may_retry(2, true),
            "the last attempt passes its answer on"
        );
        assert_eq!(r.failed(BackendId(3), 2, true), Next::GiveUp);
        assert_eq!(r.tried, [BackendId(1), BackendId(2), BackendId(3)]);
        assert_eq!(
            r.attempts(),
            3,
            "max_retries: 2 means three attempts at most"
        );
    }

    #[test]
    fn no_other_backend_means_no_retry() {
        let mut r = Retries::default();
        assert!(!r.may_retry(5, false));
        assert_eq!(r.failed(BackendId(1), 5, false), Next::GiveUp);
        assert_eq!(r.spent, 0);
    }
}
