//! A sequence-locked cell of `N` words: wait-free reads of a consistent snapshot on the routing
//! hot path, for small `Copy` state published by rarer writers.
//!
//! A routing decision reads every backend's TTFT model and engine sample. Through an
//! `ArcSwap` each read costs a guard (thread-local debt slot) and a pointer chase, about a
//! third of a 64-backend decision; here it is `N + 2` relaxed loads. Writers bump the version
//! to odd (compare-and-swap, so concurrent writers serialise by spinning briefly), store the
//! words, and publish the next even version with `Release`; readers retry when the version
//! was odd or changed under them (the classic seqlock, with every word an atomic so there is
//! no data race and no `unsafe`). A read never blocks a writer.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// `N` words read and written as one snapshot.
#[derive(Debug)]
pub(crate) struct SeqCell<const N: usize> {
    version: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> SeqCell<N> {
    /// A cell holding `init`.
    pub(crate) fn new(init: [u64; N]) -> Self {
        SeqCell {
            version: AtomicU64::new(0),
            words: init.map(AtomicU64::new),
        }
    }

    /// A consistent snapshot of the words.
    #[inline]
    pub(crate) fn load(&self) -> [u64; N] {
        loop {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 & 1 == 0 {
                let out = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == v1 {
                    return out;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Replace the words.
    pub(crate) fn store(&self, words: [u64; N]) {
        let mut v = self.version.load(Ordering::Relaxed);
        loop {
            if v & 1 == 0 {
                match self.version.compare_exchange_weak(
                    v,
                    v + 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(cur) => v = cur,
                }
            } else {
                std::hint::spin_loop();
                v = self.version.load(Ordering::Relaxed);
            }
        }
        fence(Ordering::Release);
        for (w, x) in self.words.iter().zip(words) {
            w.store(x, Ordering::Relaxed);
        }
        self.version.store(v + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reads_what_was_stored() {
        let c = SeqCell::new([1, 2, 3]);
        assert_eq!(c.load(), [1, 2, 3]);
        c.store([4, 5, 6]);
        assert_eq!(c.load(), [4, 5, 6]);
    }

    #[test]
    fn readers_never_see_a_torn_snapshot_under_concurrent_writers() {
        let c = Arc::new(SeqCell::new([0u64; 4]));
        let writers: Vec<_> = (1..=2u64)
            .map(|w| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let x = w << 32 | i;
                        c.store([x, x, x, x]);
                    }
                })
            })
            .collect();
        let reader = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                for _ in 0..50_000 {
                    let s = c.load();
                    assert!(s.iter().all(|&x| x == s[0]), "torn read {s:?}");
                }
            })
        };
        for w in writers {
            w.join().unwrap();
        }
        reader.join().unwrap();
        let s = c.load();
        assert!(s.iter().all(|&x| x == s[0]) && s[0] & 0xffff_ffff == 19_999);
    }
}
