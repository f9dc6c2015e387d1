//! A vLLM V1-like inference engine on a virtual clock.
//!
//! The engine is pure and synchronous: [`Engine::step`] schedules one batch, returns how long
//! it would take on the profiled GPU ([`Profile::step_seconds`]) and the events visible when it
//! ends. Callers own time — the live fleet sleeps `duration_s × scale`, the offline evaluator
//! advances a virtual clock. Nothing here is random, so runs are reproducible.
//!
//! ## Scheduling one step (vLLM V1's `Scheduler.schedule`, no priorities)
//! A token budget of `max_num_batched_tokens` is shared by every request in the step.
//! 1. *Running* requests, in admission order, each take what they still need: one token for a
//!    decode, the rest of the prompt (capped by the remaining budget) for a chunked prefill.
//!    Their new tokens need KV slots; when the pool has too few free blocks, the most recently
//!    admitted running request is *preempted* (recompute mode: its blocks are freed, it keeps
//!    its generated tokens and goes back to the front of the waiting queue) until the
//!    allocation fits — or the request being scheduled is itself the victim.
//! 2. If nothing was preempted, *waiting* requests are admitted FCFS while the batch is below
//!    `max_num_seqs`, budget remains and the pool can hold their next chunk. Admission looks
//!    up the longest cached prefix of full blocks (at most `len − 1` tokens, so the last token
//!    is always computed, as in vLLM): those blocks are shared (refcount +1) and skip prefill.
//!    A waiting request that does not fit blocks the queue (strict FCFS).
//!
//! When a request's computed tokens reach its length, the step samples a token: the first one
//! emits [`EngineEvent::FirstToken`], later ones [`EngineEvent::Token`]; at `max_tokens` the
//! request emits [`EngineEvent::Finished`] and frees its blocks (they stay cached, see
//! [`super::kv`]). Full prompt blocks are registered in the prefix cache as soon as they are
//! computed, so a request arriving mid-prefill of a shared prefix reuses what is done.
//! Generated tokens occupy blocks but are not cached (their ids are not known to clients).
//!
//! A request whose prompt plus `max_tokens` can never fit in the whole pool is finished at the
//! next step with `output_tokens: 0` and no first token (vLLM rejects such requests).
//!
//! ## KV-cache events
//! After [`Engine::enable_kv_events`] the engine logs what vLLM's publisher would send
//! ([`Engine::take_kv_events`]): per step, one `BlockRemoved` with the cached blocks evicted
//! to make room, then per request one `BlockStored` per contiguous run of prompt blocks it
//! registered (engine hashes are the blocks' [`BlockHash`]es; the parent is the previous
//! block's; the token ids are the blocks' prompt ids); a crash logs `AllBlocksCleared`.
//! The engine then keeps each request's prompt ids (only then).
//!
//! ## Counters
//! `prefix_queries_tokens` / `prefix_hits_tokens` add, per admission, the request's tokens and
//! its cache hit (vLLM's `prefix_cache_queries` / `_hits`); `kv_usage` is referenced blocks /
//! all blocks (free-but-cached blocks count as free, as in vLLM).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::kv::{BlockId, BlockPool};
use super::profile::{Profile, StepWork};
use pronto_core::kv_index::KvEvent;
use pronto_core::tokens::{block_hashes, BlockHash, TokenId};

/// Engine limits, cache size and timing profile.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Cap on the running batch (vLLM `--max-num-seqs`, default 256).
    pub max_num_seqs: usize,
    /// Per-step token budget (vLLM `--max-num-batched-tokens`, default 8192).
    pub max_num_batched_tokens: usize,
    /// KV blocks in the pool.
    pub num_kv_blocks: usize,
    /// Tokens per KV block (16 on GPU).
    pub block_size: usize,
    /// Step-time model.
    pub profile: Profile,
}

impl EngineConfig {
    /// The profile's defaults for every limit.
    pub fn from_profile(profile: Profile) -> EngineConfig {
        EngineConfig {
            max_num_seqs: profile.max_num_seqs,
            max_num_batched_tokens: profile.max_num_batched_tokens,
            num_kv_blocks: profile.num_kv_blocks,
            block_size: profile.block_size,
            profile,
        }
    }
}

/// A request as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Caller-chosen id, unique among requests in the engine.
    pub id: u64,
    /// Prompt token ids.
    pub prompt: Vec<TokenId>,
    /// Tokens to generate (at least 1 is generated).
    pub max_tokens: u32,
}

/// Something that became visible at the end of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineEvent {
    /// first generated token of `id` produced by the step that just ended
    FirstToken {
        /// Request id.
        id: u64,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: u32,
        /// Prompt tokens.
        prompt_tokens: u32,
    },
    /// a later output token
    Token {
        /// Request id.
        id: u64,
    },
    /// `id` produced its last token (max_tokens reached) and left the engine
    Finished {
        /// Request id.
        id: u64,
        /// Tokens generated (0 when the request was rejected as too large).
        output_tokens: u32,
    },
}

/// One engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Simulated duration, seconds: the profile's step time of `work`.
    pub duration_s: f64,
    /// What the step computed (`pronto calibrate` replays schedules from it).
    pub work: StepWork,
    /// Events visible at the step's end, in scheduling order.
    pub events: Vec<EngineEvent>,
}

/// Gauges and counters, as a vLLM `/metrics` would expose them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Requests in the running batch.
    pub running: usize,
    /// Requests in the waiting queue.
    pub waiting: usize,
    /// Referenced KV blocks / all blocks.
    pub kv_usage: f64,
    /// Tokens looked up in the prefix cache (per admission).
    pub prefix_queries_tokens: u64,
    /// Tokens found in the prefix cache (per admission).
    pub prefix_hits_tokens: u64,
    /// Prompt tokens of requests that produced a first token.
    pub prompt_tokens_total: u64,
    /// Generated tokens.
    pub generation_tokens_total: u64,
    /// Preemptions.
    pub preemptions_total: u64,
}

#[derive(Debug, Clone)]
struct Req {
    prompt_len: u32,
    hashes: Arc<[BlockHash]>,
    max_tokens: u32,
    output: u32,
    computed: u32,
    /// Prompt tokens prefilled so far (cache hits excluded, recomputation after a preemption
    /// included): the work an abort throws away.
    prefilled: u32,
    blocks: Vec<BlockId>,
    /// Prompt blocks already registered in the prefix cache.
    registered: usize,
    cached_tokens: u32,
    first_sent: bool,
    /// Prompt ids, kept only while KV events are logged.
    ids: Option<Arc<[TokenId]>>,
}

impl Req {
    fn total(&self) -> u32 {
        self.prompt_len + self.output
    }
}

/// The simulated engine. `Clone` gives an independent copy (the evaluator's oracle uses it).
#[derive(Debug, Clone)]
pub struct Engine {
    cfg: EngineConfig,
    pool: BlockPool,
    reqs: HashMap<u64, Req>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    rejected: Vec<u64>,
    stats: EngineStats,
    kv_events: Option<Vec<KvEvent>>,
}

/// `BlockStored` for prompt blocks `start..end`.
fn stored_event(
    hashes: &[BlockHash],
    ids: &[TokenId],
    start: usize,
    end: usize,
    bs: usize,
) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes[start..end].iter().map(|h| h.0).collect(),
        parent: start.checked_sub(1).map(|p| hashes[p].0),
        token_ids: ids[start * bs..end * bs].to_vec(),
        block_size: Some(bs),
    }
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(cfg: EngineConfig) -> Engine {
        assert!(cfg.block_size > 0, "block_size must be positive");
        assert!(cfg.max_num_seqs > 0, "max_num_seqs must be positive");
        assert!(
            cfg.max_num_batched_tokens > 0,
            "max_num_batched_tokens must be positive"
        );
        Engine {
            pool: BlockPool::new(cfg.num_kv_blocks),
            cfg,
            reqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            rejected: Vec::new(),
            stats: EngineStats::default(),
            kv_events: None,
        }
    }

    /// Log KV-cache events from now on (see the module docs).
    pub fn enable_kv_events(&mut self) {
        self.pool.log_evictions();
        self.kv_events.get_or_insert_with(Vec::new);
    }

    /// Whether KV-cache events are logged ([`Engine::enable_kv_events`]).
    pub fn logs_kv_events(&self) -> bool {
        self.kv_events.is_some()
    }

    /// KV-cache events logged since the last call, in order.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.flush_evictions();
        self.kv_events
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn flush_evictions(&mut self) {
        let evicted = self.pool.take_evicted();
        if let (Some(log), false) = (&mut self.kv_events, evicted.is_empty()) {
            log.push(KvEvent::BlockRemoved {
                block_hashes: evicted.into_iter().map(|h| h.0).collect(),
            });
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queue a request (FCFS). An id already in the engine is ignored.
    pub fn add_request(&mut self, req: SimRequest) {
        let hashes = self.prompt_hashes(&req.prompt);
        let len = req.prompt.len() as u32;
        let ids = self.kv_events.is_some().then(|| Arc::from(req.prompt));
        self.add_with_ids(req.id, len, hashes, req.max_tokens, ids);
    }

    /// Chained hashes of the full blocks of `prompt` at this engine's block size.
    pub fn prompt_hashes(&self, prompt: &[TokenId]) -> Arc<[BlockHash]> {
        block_hashes(prompt, self.cfg.block_size).into()
    }

    /// [`Engine::add_request`] with the prompt given as its length and its
    /// [`Engine::prompt_hashes`] (callers that try one prompt on many engines hash it once).
    pub fn add_hashed(
        &mut self,
        id: u64,
        prompt_len: u32,
        hashes: Arc<[BlockHash]>,
        max_tokens: u32,
    ) {
        self.add_with_ids(id, prompt_len, hashes, max_tokens, None);
    }

    fn add_with_ids(
        &mut self,
        id: u64,
        prompt_len: u32,
        hashes: Arc<[BlockHash]>,
        max_tokens: u32,
        ids: Option<Arc<[TokenId]>>,
    ) {
        if self.reqs.contains_key(&id) {
            return;
        }
        debug_assert_eq!(hashes.len(), prompt_len as usize / self.cfg.block_size);
        let max_tokens = max_tokens.max(1);
        let r = Req {
            prompt_len,
            hashes,
            max_tokens,
            output: 0,
            computed: 0,
            prefilled: 0,
            blocks: Vec::new(),
            registered: 0,
            cached_tokens: 0,
            first_sent: false,
            ids,
        };
        let need = (prompt_len as usize + max_tokens as usize).div_ceil(self.cfg.block_size);
        self.reqs.insert(id, r);
        if prompt_len == 0 || need > self.pool.num_blocks() {
            self.rejected.push(id);
        } else {
            self.waiting.push_back(id);
        }
    }

    /// Drop a request wherever it is and free its blocks; unknown ids are ignored.
    pub fn abort(&mut self, id: u64) {
        let Some(r) = self.reqs.remove(&id) else {
            return;
        };
        self.pool.free(&r.blocks);
        if let Some(i) = self.running.iter().position(|&x| x == id) {
            self.running.remove(i);
        } else if let Some(i) = self.waiting.iter().position(|&x| x == id) {
            self.waiting.remove(i);
        } else if let Some(i) = self.rejected.iter().position(|&x| x == id) {
            self.rejected.remove(i);
        }
    }

    /// Prompt tokens `id` had prefilled by the end of the last scheduled step (its cache hits
    /// excluded, recomputation after a preemption included); `None` when it is not in the
    /// engine.
    pub fn prefilled_tokens(&self, id: u64) -> Option<u32> {
        self.reqs.get(&id).map(|r| r.prefilled)
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.rejected.is_empty()
    }

    /// Schedule and run one engine step: returns its simulated duration and the events that
    /// become visible at its END. None when there is no work.
    pub fn step(&mut self) -> Option<Step> {
        if !self.has_work() {
            return None;
        }
        let mut events = Vec::new();
        for id in std::mem::take(&mut self.rejected) {
            self.reqs.remove(&id);
            events.push(EngineEvent::Finished {
                id,
                output_tokens: 0,
            });
        }
        if self.running.is_empty() && self.waiting.is_empty() {
            return Some(Step {
                duration_s: 0.0,
                work: StepWork::default(),
                events,
            });
        }
        let scheduled = self.schedule();
        let mut work = StepWork::default();
        for &(id, n) in &scheduled {
            let r = &self.reqs[&id];
            if r.first_sent && n == 1 && r.computed + 1 == r.total() {
                work.decode_seqs += 1;
                work.decode_ctx_tokens += u64::from(r.computed) + 1;
            } else {
                let (n, p) = (f64::from(n), f64::from(r.computed));
                work.prefill_tokens += n as u64;
                work.prefill_pairs += n * (p + n / 2.0);
            }
        }
        let duration_s = self.cfg.profile.step_seconds(&work);
        self.flush_evictions();
        for (id, n) in scheduled {
            self.apply(id, n, &mut events);
        }
        Some(Step {
            duration_s,
            work,
            events,
        })
    }

    /// Current gauges and counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.pool.num_used() as f64 / self.pool.num_blocks().max(1) as f64,
            ..self.stats
        }
    }

    /// Crash/restart: the prefix cache is lost (blocks held by live requests stay allocated).
    pub fn clear_cache(&mut self) {
        self.pool.clear_cache();
        if let Some(log) = &mut self.kv_events {
            log.push(KvEvent::AllBlocksCleared);
        }
        for r in self.reqs.values_mut() {
            r.registered = usize::MAX;
        }
    }

    /// exact prefix-cache hit (tokens) this prompt would get now — for the oracle
    pub fn cached_prefix_tokens(&self, prompt: &[TokenId]) -> u32 {
        let hashes = block_hashes(prompt, self.cfg.block_size);
        self.cached_prefix_tokens_hashed(prompt.len() as u32, &hashes)
    }

    /// [`Engine::cached_prefix_tokens`] of a prompt given as its length and block hashes.
    pub fn cached_prefix_tokens_hashed(&self, prompt_len: u32, hashes: &[BlockHash]) -> u32 {
        if prompt_len == 0 {
            return 0;
        }
        let bs = self.cfg.block_size;
        let max_blocks = ((prompt_len as usize - 1) / bs).min(hashes.len());
        (self.pool.longest_prefix(&hashes[..max_blocks]) * bs) as u32
    }

    /// Requests in the engine (waiting, running or about to be rejected).
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.pool.evictions()
    }

    // === scheduling ===

    /// Pick this step's `(request, new tokens)` pairs and reserve their KV blocks.
    fn schedule(&mut self) -> Vec<(u64, u32)> {
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.max_num_batched_tokens as u32;
        let mut out = Vec::with_capacity(self.running.len() + 4);
        let mut preempted = false;
        let mut i = 0;
        'running: while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let r = &self.reqs[&id];
            let n = (r.total() - r.computed).min(budget);
            loop {
                let r = &self.reqs[&id];
                let need = (r.computed + n).div_ceil(bs as u32) as usize;
                let extra = need.saturating_sub(r.blocks.len());
                if extra <= self.pool.num_free() {
                    let r = self.reqs.get_mut(&id).expect("running request");
                    for _ in 0..extra {
                        r.blocks.push(self.pool.allocate().expect("free block"));
                    }
                    break;
                }
                let victim = self.running.pop().expect("running is non-empty");
                self.preempt(victim);
                preempted = true;
                if victim == id {
                    break 'running;
                }
            }
            out.push((id, n));
            budget -= n;
            i += 1;
        }
        if preempted {
            return out;
        }
        while let Some(&id) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_num_seqs || budget == 0 {
                break;
            }
            let r = &self.reqs[&id];
            let total = r.total();
            let max_hit = (((total - 1) as usize) / bs).min(r.hashes.len());
            let hit_blocks = self.pool.longest_prefix(&r.hashes[..max_hit]);
            let hit_tokens = (hit_blocks * bs) as u32;
            let n = (total - hit_tokens).min(budget);
            let need = (hit_tokens + n).div_ceil(bs as u32) as usize;
            let hits_in_free = r.hashes[..hit_blocks]
                .iter()
                .filter(|&&h| {
                    let b = self.pool.lookup(h).expect("cached");
                    !self.pool_block_referenced(b)
                })
                .count();
            if need - hit_blocks + hits_in_free > self.pool.num_free() {
                break;
            }
            self.waiting.pop_front();
            let hashes = Arc::clone(&r.hashes);
            let mut blocks = Vec::with_capacity(need);
            for h in &hashes[..hit_blocks] {
                let b = self.pool.lookup(*h).expect("cached");
                self.pool.touch(b);
                blocks.push(b);
            }
            for _ in hit_blocks..need {
                blocks.push(self.pool.allocate().expect("free block"));
            }
            let r = self.reqs.get_mut(&id).expect("waiting request");
            r.blocks = blocks;
            r.computed = hit_tokens;
            r.registered = hit_blocks;
            r.cached_tokens = hit_tokens;
            self.stats.prefix_queries_tokens += u64::from(total);
            self.stats.prefix_hits_tokens += u64::from(hit_tokens);
            self.running.push(id);
            out.push((id, n));
            budget -= n;
        }
        out
    }

    fn pool_block_referenced(&self, b: BlockId) -> bool {
        self.pool.is_referenced(b)
    }

    /// Recompute-mode preemption: free the request's blocks, back to the queue's front.
    fn preempt(&mut self, id: u64) {
        let r = self.reqs.get_mut(&id).expect("running request");
        self.pool.free(&r.blocks);
        r.blocks.clear();
        r.computed = 0;
        r.registered = 0;
        self.waiting.push_front(id);
        self.stats.preemptions_total += 1;
    }

    /// Account `n` computed tokens of `id`; sample a token if it caught up.
    fn apply(&mut self, id: u64, n: u32, events: &mut Vec<EngineEvent>) {
        let bs = self.cfg.block_size;
        let r = self.reqs.get_mut(&id).expect("scheduled request");
        let before = r.computed.min(r.prompt_len);
        r.computed += n;
        r.prefilled += r.computed.min(r.prompt_len) - before;
        let full = (r.computed.min(r.prompt_len) as usize / bs).min(r.hashes.len());
        let mut run: Option<usize> = None;
        while r.registered < full {
            let i = r.registered;
            let stored = self.pool.cache(r.blocks[i], r.hashes[i]);
            r.registered += 1;
            if let (Some(log), Some(ids)) = (&mut self.kv_events, &r.ids) {
                if stored && run.is_none() {
                    run = Some(i);
                }
                if let Some(start) = run.filter(|_| !stored || r.registered == full) {
                    let end = if stored { i + 1 } else { i };
                    log.push(stored_event(&r.hashes, ids, start, end, bs));
                    run = None;
                }
            }
        }
        if r.computed < r.total() {
            return;
        }
        r.output += 1;
        self.stats.generation_tokens_total += 1;
        if r.first_sent {
            events.push(EngineEvent::Token { id });
        } else {
            r.first_sent = true;
            self.stats.prompt_tokens_total += u64::from(r.prompt_len);
            events.push(EngineEvent::FirstToken {
                id,
                cached_tokens: r.cached_tokens,
                prompt_tokens: r.prompt_len,
            });
        }
        if r.output >= r.max_tokens {
            let output_tokens = r.output;
            let r = self.reqs.remove(&id).expect("scheduled request");
            self.pool.free(&r.blocks);
            if let Some(i) = self.running.iter().position(|&x| x == id) {
                self.running.remove(i);
            }
            events.push(EngineEvent::Finished { id, output_tokens });
        }
    }
}
