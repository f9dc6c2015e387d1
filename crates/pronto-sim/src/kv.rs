//! Paged KV-cache block pool with prefix caching, as in vLLM V1's `BlockPool`.
//!
//! The pool owns `num_blocks` blocks. Each block has a reference count (how many running
//! requests hold it) and, once a request has filled it with computed prompt tokens, a
//! [`BlockHash`] under which it is registered in the prefix cache.
//!
//! Unreferenced blocks live in one *free queue* ordered least recently used first. A freed
//! block keeps its hash: it stays reusable by a later request with the same prefix until the
//! allocator needs it. Allocation pops the queue's head (the LRU block) and, if that block was
//! cached, drops its hash (eviction). Touching a cached block that is in the free queue
//! (a prefix hit) unlinks it from the queue in O(1) — the queue is an intrusive doubly linked
//! list over block indices.
//!
//! Freeing a request's blocks appends them in *reverse* order (tail blocks of the sequence
//! first), so that under pressure the ends of prompts are evicted before their shared heads —
//! the same order vLLM uses.

use std::collections::HashMap;

use pronto_core::tokens::BlockHash;

/// Index of a block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_free: bool,
}

/// A fixed pool of KV blocks with an LRU free queue and a hash → block prefix cache.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, BlockId>,
    evictions: u64,
    /// Hashes evicted since the last [`BlockPool::take_evicted`], when logging is on.
    evicted_log: Option<Vec<BlockHash>>,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks, all free.
    pub fn new(num_blocks: usize) -> BlockPool {
        assert!(num_blocks < NIL as usize, "too many KV blocks");
        let mut pool = BlockPool {
            blocks: Vec::with_capacity(num_blocks),
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: HashMap::new(),
            evictions: 0,
            evicted_log: None,
        };
        for i in 0..num_blocks {
            pool.blocks.push(Block {
                ref_cnt: 0,
                hash: None,
                prev: NIL,
                next: NIL,
                in_free: false,
            });
            pool.push_free(i as BlockId);
        }
        pool
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be allocated now (unreferenced, cached or not).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks referenced by at least one request.
    pub fn num_used(&self) -> usize {
        self.blocks.len() - self.num_free
    }

    /// Cached blocks evicted so far to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Number of blocks registered in the prefix cache (referenced or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// The cached block holding `hash`, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Number of leading hashes of `hashes` that are cached (a prefix hit, in blocks).
    pub fn longest_prefix(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Whether any request holds `id`.
    pub fn is_referenced(&self, id: BlockId) -> bool {
        self.blocks[id as usize].ref_cnt > 0
    }

    /// Take a reference on a cached block found by [`BlockPool::lookup`].
    pub fn touch(&mut self, id: BlockId) {
        if self.blocks[id as usize].in_free {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_cnt += 1;
    }

    /// Allocate one fresh block (evicting the LRU cached block if needed); `None` when every
    /// block is referenced.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        let b = &mut self.blocks[id as usize];
        if let Some(h) = b.hash.take() {
            self.cached.remove(&h);
            self.evictions += 1;
            if let Some(log) = &mut self.evicted_log {
                log.push(h);
            }
        }
        b.ref_cnt = 1;
        Some(id)
    }

    /// Register a full, computed block under `hash` so later prompts can reuse it. If another
    /// block already holds that hash (two requests computed the same prefix concurrently), the
    /// existing entry is kept and this block stays anonymous. Returns whether `hash` entered
    /// the cache.
    pub fn cache(&mut self, id: BlockId, hash: BlockHash) -> bool {
        if self.blocks[id as usize].hash.is_some() {
            return false;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(id);
            self.blocks[id as usize].hash = Some(hash);
            return true;
        }
        false
    }

    /// Start logging evicted hashes (for KV-cache events).
    pub fn log_evictions(&mut self) {
        self.evicted_log.get_or_insert_with(Vec::new);
    }

    /// Hashes evicted since the last call, oldest first (empty when logging is off).
    pub fn take_evicted(&mut self) -> Vec<BlockHash> {
        self.evicted_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Drop one reference on each block, tail of the sequence first; blocks reaching zero
    /// join the free queue (keeping their hash).
    pub fn free(&mut self, ids: &[BlockId]) {
        for &id in ids.iter().rev() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_cnt > 0, "double free of block {id}");
            b.ref_cnt -= 1;
            if b.ref_cnt == 0 {
                self.push_free(id);
            }
        }
    }

    /// Forget every cached hash (a crash: the cache is lost). Referenced blocks stay allocated.
    /// Evictions logged so far are dropped (the cache is cleared as a whole).
    pub fn clear_cache(&mut self) {
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.cached.clear();
        if let Some(log) = &mut self.evicted_log {
            log.clear();
        }
    }

    fn push_free(&mut self, id: BlockId) {
        let tail = self.tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NIL;
            b.in_free = true;
        }
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.in_free);
            b.in_free = false;
            (
                std::mem::replace(&mut b.prev, NIL),
                std::mem::replace(&mut b.next, NIL),
            )
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u64) -> BlockHash {
        BlockHash(x)
    }

    #[test]
    fn allocate_until_exhausted_then_free() {
        let mut p = BlockPool::new(3);
        let a: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(p.allocate(), None);
        assert_eq!(p.num_used(), 3);
        p.free(&a);
        assert_eq!(p.num_free(), 3);
    }

    #[test]
    fn freed_cached_block_is_reused_until_evicted_lru_first() {
        let mut p = BlockPool::new(2);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        p.cache(a, h(1));
        p.cache(b, h(2));
        // Freed in reverse: b then a, so b is least recently used.
        p.free(&[a, b]);
        assert_eq!(p.longest_prefix(&[h(1), h(2)]), 2);
        // A hit on h(1) takes it out of the free queue.
        let hit = p.lookup(h(1)).unwrap();
        p.touch(hit);
        assert_eq!(p.num_free(), 1);
        // Allocating evicts the only free block, which holds h(2).
        let c = p.allocate().unwrap();
        assert_eq!(c, b);
        assert_eq!(p.lookup(h(2)), None);
        assert_eq!(p.evictions(), 1);
        assert_eq!(p.lookup(h(1)), Some(a));
    }

    #[test]
    fn duplicate_hash_keeps_first_block() {
        let mut p = BlockPool::new(2);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        p.cache(a, h(7));
        p.cache(b, h(7));
        assert_eq!(p.lookup(h(7)), Some(a));
        assert_eq!(p.num_cached(), 1);
    }

    #[test]
    fn evictions_are_logged_when_asked() {
        let mut p = BlockPool::new(1);
        let a = p.allocate().unwrap();
        assert!(p.cache(a, h(3)));
        p.free(&[a]);
        p.log_evictions();
        let b = p.allocate().unwrap();
        assert_eq!(p.lookup(h(3)), None);
        p.free(&[b]);
        assert_eq!(p.take_evicted(), [h(3)]);
        assert!(p.take_evicted().is_empty());
    }

    #[test]
    fn clear_cache_forgets_hashes() {
        let mut p = BlockPool::new(2);
        let a = p.allocate().unwrap();
        p.cache(a, h(1));
        p.free(&[a]);
        p.clear_cache();
        assert_eq!(p.lookup(h(1)), None);
        assert_eq!(p.num_free(), 2);
    }
}
