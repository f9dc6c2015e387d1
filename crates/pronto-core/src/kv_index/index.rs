//! The exact per-backend prefix index, fed by one engine's KV-cache events.
//!
//! What it holds and when it is used: the module docs of [`super`] (`pronto_core::kv_index`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

use super::decode::{decode_message, EngineHash, EventBatch, KvEvent};
use crate::tokens::{chain_hash, BlockHash, BLOCK_TOKENS};

/// Engine blocks tracked per backend at most before the index resyncs.
pub(crate) const MAX_ENGINE_BLOCKS: usize = 1 << 22;

#[derive(Debug, Default)]
struct State {
    live: bool,
    next_seq: Option<u64>,
    by_engine: HashMap<EngineHash, Box<[BlockHash]>>,
    held: HashMap<BlockHash, u32>,
}

impl State {
    fn clear(&mut self) {
        self.by_engine.clear();
        self.held.clear();
    }
}

/// Where an index reports what happens to it (the gateway's metrics). Called with no lock
/// held; must not block.
pub trait IndexSink: Send + Sync + std::fmt::Debug {
    /// `n` more of `what` happened (`received`, `decoded`, `error`, `unmapped_block`,
    /// `resync`).
    fn count(&self, what: &'static str, n: u64);
    /// The index now holds `blocks` distinct Pronto blocks.
    fn blocks(&self, blocks: usize);
}

/// Counts kept on the index itself (tests and the admin view read them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexCounts {
    /// Messages received.
    pub received: u64,
    /// Messages decoded.
    pub decoded: u64,
    /// Messages that failed to decode.
    pub errors: u64,
    /// Stored blocks that could not be mapped onto Pronto hashes.
    pub unmapped: u64,
    /// Resyncs (gaps, restarts, overflows).
    pub resyncs: u64,
}

/// One backend's exact prefix index (see the module docs).
#[derive(Debug)]
pub struct ExactIndex {
    block_size: usize,
    state: RwLock<State>,
    trusted: AtomicBool,
    subscribed: AtomicBool,
    counts: std::sync::Mutex<IndexCounts>,
    sink: Option<Arc<dyn IndexSink>>,
}

impl ExactIndex {
    /// An empty, not yet live index for an engine whose blocks hold `block_size` tokens
    /// (used when an event does not say).
    pub fn new(block_size: usize) -> ExactIndex {
        ExactIndex {
            block_size: block_size.max(1),
            state: RwLock::new(State::default()),
            trusted: AtomicBool::new(false),
            subscribed: AtomicBool::new(false),
            counts: std::sync::Mutex::new(IndexCounts::default()),
            sink: None,
        }
    }

    /// Report every count and the block total to `sink` as well.
    pub fn with_sink(mut self, sink: Arc<dyn IndexSink>) -> ExactIndex {
        self.sink = Some(sink);
        self
    }

    /// The state for reading. A writer that panicked mid-batch leaves it poisoned: the state
    /// is then cleared (a resync: what it held may be half-applied) and used again, so a
    /// routing decision never panics on it.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        let poisoned = match self.state.read() {
            Ok(g) => return g,
            Err(e) => e,
        };
        // The poison error holds a read guard: release it before taking the write lock
        // (holding it there deadlocks).
        drop(poisoned);
        drop(self.write());
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The state for writing; a poisoned lock is recovered as in [`ExactIndex::read`].
    fn write(&self) -> RwLockWriteGuard<'_, State> {
        match self.state.write() {
            Ok(g) => g,
            Err(e) => {
                let mut g = e.into_inner();
                g.clear();
                g.next_seq = None;
                g.live = false;
                self.state.clear_poison();
                tracing::error!("exact prefix index lock was poisoned; index cleared");
                g
            }
        }
    }

    /// Claim the right to run this index's subscriber (true once).
    pub fn claim_subscriber(&self) -> bool {
        !self.subscribed.swap(true, Ordering::AcqRel)
    }

    /// Counters so far.
    pub fn counts(&self) -> IndexCounts {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, what: &'static str, n: u64, f: impl FnOnce(&mut IndexCounts)) {
        f(&mut self.counts.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(s) = &self.sink {
            s.count(what, n);
        }
    }

    /// Whether lookups are answered (live, see the module docs).
    pub fn is_live(&self) -> bool {
        self.read().live
    }

    /// Whether a lookup has shown that the engine's blocks map onto Pronto's hashes.
    pub(crate) fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    /// Distinct Pronto blocks the engine holds.
    pub fn num_blocks(&self) -> usize {
        self.read().held.len()
    }

    /// Leading blocks of `hashes` the engine holds, or `None` when the index must not be
    /// used (not live, or not trusted yet).
    pub fn match_blocks(&self, hashes: &[BlockHash]) -> Option<u32> {
        let st = self.read();
        if !st.live {
            return None;
        }
        let m = hashes
            .iter()
            .take_while(|h| st.held.contains_key(h))
            .count();
        drop(st);
        if m > 0 && !self.trusted.load(Ordering::Relaxed) {
            self.trusted.store(true, Ordering::Relaxed);
        }
        self.is_trusted().then_some(m as u32)
    }

    /// The connection dropped: stop answering until the next batch (state kept; the next
    /// batch's sequence number tells whether anything was missed).
    pub fn suspend(&self) {
        self.write().live = false;
    }

    /// Decode and apply one multipart message; counts errors.
    pub fn on_message<F: AsRef<[u8]>>(&self, frames: &[F]) {
        self.count("received", 1, |c| c.received += 1);
        match decode_message(frames) {
            Ok(batch) => {
                self.count("decoded", 1, |c| c.decoded += 1);
                self.apply(&batch);
            }
            Err(e) => {
                self.count("error", 1, |c| c.errors += 1);
                tracing::debug!(error = %e, "undecodable KV event message");
            }
        }
    }

    /// Apply one batch (resyncing first on a sequence gap).
    pub fn apply(&self, batch: &EventBatch) {
        let mut unmapped = 0u64;
        let mut resynced = false;
        let blocks = {
            let mut st = self.write();
            if st.next_seq.is_some_and(|n| n != batch.seq) {
                st.clear();
                resynced = true;
            }
            st.next_seq = Some(batch.seq.wrapping_add(1));
            st.live = true;
            for ev in &batch.events {
                unmapped += self.apply_event(&mut st, ev);
            }
            if st.by_engine.len() > MAX_ENGINE_BLOCKS {
                st.clear();
                resynced = true;
            }
            st.held.len()
        };
        if resynced {
            tracing::info!(
                seq = batch.seq,
                "KV events: sequence gap, exact index resynced"
            );
            self.count("resync", 1, |c| c.resyncs += 1);
        }
        if unmapped > 0 {
            self.count("unmapped_block", unmapped, |c| c.unmapped += unmapped);
        }
        if let Some(s) = &self.sink {
            s.blocks(blocks);
        }
    }

    /// Apply one event; returns the stored blocks that could not be mapped.
    fn apply_event(&self, st: &mut State, ev: &KvEvent) -> u64 {
        match ev {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
            } => {
                let bs = block_size.unwrap_or(self.block_size);
                let n = block_hashes.len();
                if bs % BLOCK_TOKENS != 0 || token_ids.len() != n * bs {
                    return n as u64;
                }
                let mut prev = match parent {
                    None => None,
                    Some(p) => match st.by_engine.get(p).and_then(|s| s.last()) {
                        Some(&h) => Some(h),
                        None => return n as u64,
                    },
                };
                for (&eh, ids) in block_hashes.iter().zip(token_ids.chunks_exact(bs)) {
                    let subs: Box<[BlockHash]> = ids
                        .chunks_exact(BLOCK_TOKENS)
                        .map(|c| {
                            let h = chain_hash(prev, c);
                            prev = Some(h);
                            h
                        })
                        .collect();
                    if st.by_engine.contains_key(&eh) {
                        continue;
                    }
                    for &h in subs.iter() {
                        *st.held.entry(h).or_insert(0) += 1;
                    }
                    st.by_engine.insert(eh, subs);
                }
                0
            }
            KvEvent::BlockRemoved { block_hashes } => {
                for eh in block_hashes {
                    let Some(subs) = st.by_engine.remove(eh) else {
                        continue;
                    };
                    for h in subs.iter() {
                        if let Some(c) = st.held.get_mut(h) {
                            *c -= 1;
                            if *c == 0 {
                                st.held.remove(h);
                            }
                        }
                    }
                }
                0
            }
            KvEvent::AllBlocksCleared => {
                st.clear();
                0
            }
            KvEvent::Other(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::block_hashes;

    fn batch(seq: u64, events: Vec<KvEvent>) -> EventBatch {
        EventBatch {
            seq,
            ts: 0.0,
            events,
            dp_rank: None,
        }
    }

    fn ids(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    /// Engine events storing `ids` as blocks of `bs` tokens, engine hashes `base + i`.
    fn stored(ids: &[u32], bs: usize, base: u64, parent: Option<u64>) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: (0..(ids.len() / bs) as u64).map(|i| base + i).collect(),
            parent,
            token_ids: ids.to_vec(),
            block_size: Some(bs),
        }
    }

    #[test]
    fn stored_blocks_match_prontos_chain_at_any_multiple_of_the_block() {
        let prompt = ids(64, 1);
        let want = block_hashes(&prompt, BLOCK_TOKENS);
        for bs in [16, 32] {
            let ix = ExactIndex::new(bs);
            assert_eq!(ix.match_blocks(&want), None, "not live before events");
            // Two events: the second chains onto the first's last engine block.
            let half = prompt.len() / 2;
            let first_blocks = (half / bs) as u64;
            ix.apply(&batch(
                0,
                vec![
                    stored(&prompt[..half], bs, 100, None),
                    stored(
                        &prompt[half..],
                        bs,
                        100 + first_blocks,
                        Some(99 + first_blocks),
                    ),
                ],
            ));
            assert_eq!(ix.match_blocks(&want), Some(4), "block size {bs}");
            let other = block_hashes(&ids(64, 2), BLOCK_TOKENS);
            assert_eq!(ix.match_blocks(&other), Some(0));
        }
    }

    #[test]
    fn removal_and_clear_follow_the_engine() {
        let prompt = ids(48, 3);
        let want = block_hashes(&prompt, BLOCK_TOKENS);
        let ix = ExactIndex::new(16);
        ix.apply(&batch(0, vec![stored(&prompt, 16, 10, None)]));
        assert_eq!(ix.match_blocks(&want), Some(3));
        ix.apply(&batch(
            1,
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![11],
            }],
        ));
        assert_eq!(ix.match_blocks(&want), Some(1));
        ix.apply(&batch(2, vec![KvEvent::AllBlocksCleared]));
        assert_eq!(ix.match_blocks(&want), Some(0));
        assert_eq!(ix.num_blocks(), 0);
        assert_eq!(ix.counts().resyncs, 0);
    }

    #[test]
    fn a_gap_forgets_and_orphans_are_unmapped() {
        let prompt = ids(32, 5);
        let want = block_hashes(&prompt, BLOCK_TOKENS);
        let ix = ExactIndex::new(16);
        ix.apply(&batch(7, vec![stored(&prompt[..16], 16, 1, None)]));
        assert_eq!(ix.match_blocks(&want), Some(1));
        // seq 8 lost: the next batch resyncs; its block's parent is forgotten.
        ix.apply(&batch(9, vec![stored(&prompt[16..], 16, 2, Some(1))]));
        assert_eq!(ix.counts().resyncs, 1);
        assert_eq!(ix.counts().unmapped, 1);
        assert_eq!(ix.match_blocks(&want), Some(0));
        // A reconnect with continuous numbering keeps the state.
        ix.apply(&batch(10, vec![stored(&prompt[..16], 16, 1, None)]));
        ix.suspend();
        assert_eq!(ix.match_blocks(&want), None, "suspended");
        ix.apply(&batch(11, vec![]));
        assert_eq!(ix.match_blocks(&want), Some(1));
        assert_eq!(ix.counts().resyncs, 1);
    }

    #[test]
    fn untrusted_until_a_lookup_hits_and_bad_sizes_are_unmapped() {
        let ix = ExactIndex::new(16);
        // Token ids that are not Pronto's: nothing a request hashes to ever matches.
        ix.apply(&batch(0, vec![stored(&ids(16, 9), 16, 1, None)]));
        let req = block_hashes(&ids(32, 4), BLOCK_TOKENS);
        assert_eq!(ix.match_blocks(&req), None);
        assert!(!ix.is_trusted());
        // A block size that is not a multiple of Pronto's block cannot be mapped.
        ix.apply(&batch(1, vec![stored(&ids(24, 4), 24, 5, None)]));
        assert_eq!(ix.counts().unmapped, 1);
        ix.apply(&batch(2, vec![stored(&ids(32, 4), 16, 7, None)]));
        assert_eq!(ix.match_blocks(&req), Some(2));
        assert!(ix.is_trusted());
    }

    /// A writer that panics mid-batch poisons the lock; lookups on the routing path still
    /// answer (the half-applied state is dropped: a resync) and the next batch rebuilds.
    #[test]
    fn a_poisoned_index_answers_lookups_and_recovers() {
        let prompt = ids(32, 11);
        let want = block_hashes(&prompt, BLOCK_TOKENS);
        let ix = ExactIndex::new(16);
        ix.apply(&batch(0, vec![stored(&prompt, 16, 1, None)]));
        assert_eq!(ix.match_blocks(&want), Some(2));
        let died = std::thread::scope(|s| {
            s.spawn(|| {
                let mut st = ix.state.write().unwrap();
                st.held.clear();
                panic!("subscriber died mid-batch");
            })
            .join()
        });
        assert!(died.is_err());
        assert!(ix.state.is_poisoned());
        // Each reader entry point answers instead of panicking.
        assert_eq!(ix.match_blocks(&want), None, "not live after the reset");
        assert!(!ix.is_live());
        assert_eq!(ix.num_blocks(), 0);
        assert!(!ix.state.is_poisoned(), "recovered");
        // The next batch is not a gap (the sequence was forgotten) and rebuilds the state.
        ix.apply(&batch(7, vec![stored(&prompt, 16, 1, None)]));
        assert_eq!(ix.match_blocks(&want), Some(2));
        assert_eq!(ix.counts().resyncs, 0);

        // Poisoned again, this time found by a writer first (suspend).
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = ix.state.write().unwrap();
            panic!("again");
        }));
        assert!(ix.state.is_poisoned());
        ix.suspend();
        assert_eq!(ix.match_blocks(&want), None);
        ix.apply(&batch(8, vec![stored(&prompt, 16, 1, None)]));
        assert_eq!(ix.match_blocks(&want), Some(2));

        // A poisoned counts lock does not break counting either.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = ix.counts.lock().unwrap();
            panic!("counts holder died");
        }));
        ix.on_message(&[b"bad".to_vec()]);
        assert_eq!(ix.counts().errors, 1);
    }

    #[test]
    fn messages_are_counted() {
        let ix = ExactIndex::new(16);
        let ok = super::super::decode::encode_message(
            b"",
            0,
            0.0,
            &[KvEvent::AllBlocksCleared],
            super::super::decode::Encoding::Map,
        );
        ix.on_message(&ok);
        ix.on_message(&ok[..1]);
        let c = ix.counts();
        assert_eq!((c.received, c.decoded, c.errors), (2, 1, 1));
        assert!(ix.is_live());
    }
}
