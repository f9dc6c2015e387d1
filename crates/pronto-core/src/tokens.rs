//! The deterministic text → token-id mapping shared by the gateway and the simulator.
//!
//! Pronto does not need a real tokenizer to route: it needs (a) a token count that is close to
//! what an engine would charge and (b) token ids that are *prefix-stable*, so that two prompts
//! with the same leading text produce the same leading KV blocks in the simulator's engine and
//! the same block hashes in the gateway's prefix index.
//!
//! ## The tokenizer
//! A token is a run of at most `MAX_TOKEN_BYTES` bytes. A whitespace byte may only start a
//! token (as in BPE vocabularies, where `" the"` is one token), so a token ends when it is full
//! or when the next byte is whitespace. Scanning is left to right and each boundary depends only
//! on the bytes before it and the one byte after it, so a shared text prefix yields a shared token
//! prefix (all but possibly the last token of the shared part). English text comes out at about
//! 3.5–4 bytes per token; code and JSON at fewer, like real tokenizers.
//!
//! A token's id is the 32-bit FNV-1a hash of its bytes: stable across processes and versions.
//!
//! ## Block hashes
//! KV blocks hold [`BLOCK_TOKENS`] tokens (vLLM's default). A block's hash covers its parent's
//! hash and its own token ids (a chain, as in vLLM's prefix cache), so equal hashes at position
//! `i` mean equal prompts up to the end of block `i`. Only full blocks are hashed.

/// Longest token, in bytes.
pub(crate) const MAX_TOKEN_BYTES: usize = 4;
/// Tokens per KV block (vLLM's default block size on GPU).
pub const BLOCK_TOKENS: usize = 16;

/// A token id.
pub type TokenId = u32;

/// The hash of one KV block, chained over its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// Seed of the first block's chain (stands in for a parent hash).
const ROOT_SEED: u64 = 0x5157_4e54_4f50_524f;

const FNV32_OFFSET: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

#[inline]
fn fnv32(bytes: &[u8]) -> u32 {
    let mut h = FNV32_OFFSET;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(FNV32_PRIME);
    }
    h
}

#[inline]
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

/// Iterator over the tokens of a text, as byte slices.
pub struct Tokens<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let bytes = self.bytes;
        let start = self.pos;
        if start >= bytes.len() {
            return None;
        }
        let mut end = start + 1;
        while end < bytes.len() && end - start < MAX_TOKEN_BYTES && !is_space(bytes[end]) {
            end += 1;
        }
        self.pos = end;
        Some(&bytes[start..end])
    }
}

/// The tokens of `text`, as byte slices (no allocation).
pub fn tokens(text: &[u8]) -> Tokens<'_> {
    Tokens {
        bytes: text,
        pos: 0,
    }
}

/// The id of one token.
#[inline]
pub(crate) fn token_id(token: &[u8]) -> TokenId {
    fnv32(token)
}

/// Token ids of `text`.
pub fn token_ids(text: &[u8]) -> Vec<TokenId> {
    let mut out = Vec::with_capacity(text.len() / 3 + 1);
    out.extend(tokens(text).map(token_id));
    out
}

/// Number of tokens in `text`, without materialising them.
pub fn count_tokens(text: &[u8]) -> usize {
    tokens(text).count()
}

/// splitmix64 finaliser: a fast, well-mixed 64-bit hash step.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hash of a block of token ids chained over its parent's hash.
#[inline]
pub fn chain_hash(parent: Option<BlockHash>, ids: &[TokenId]) -> BlockHash {
    let mut h = mix64(parent.map_or(ROOT_SEED, |p| p.0));
    for &id in ids {
        h = mix64(h ^ u64::from(id));
    }
    BlockHash(h)
}

/// Chained hashes of every full block of `block_tokens` ids in `ids`.
pub fn block_hashes(ids: &[TokenId], block_tokens: usize) -> Vec<BlockHash> {
    assert!(block_tokens > 0, "block_tokens must be positive");
    let mut out = Vec::with_capacity(ids.len() / block_tokens);
    let mut parent = None;
    for block in ids.chunks_exact(block_tokens) {
        let h = chain_hash(parent, block);
        out.push(h);
        parent = Some(h);
    }
    out
}

/// Token count and chained block hashes of `text` in one pass, without storing the token ids.
///
/// Equal to `block_hashes(&token_ids(text), block_tokens)`: [`chain_hash`] is a fold over the
/// ids, so it can be fed one token at a time.
pub fn text_block_hashes(text: &[u8], block_tokens: usize) -> (usize, Vec<BlockHash>) {
    assert!(block_tokens > 0, "block_tokens must be positive");
    let mut hashes = Vec::with_capacity(text.len() / (3 * block_tokens) + 1);
    let mut state = mix64(ROOT_SEED);
    let mut in_block = 0usize;
    let mut count = 0usize;
    for tok in tokens(text) {
        count += 1;
        state = mix64(state ^ u64::from(token_id(tok)));
        in_block += 1;
        if in_block == block_tokens {
            hashes.push(BlockHash(state));
            state = mix64(state);
            in_block = 0;
        }
    }
    (count, hashes)
}

/// Deterministic English-like text of exactly `n_tokens` tokens for a trace block id.
///
/// Every token is a space followed by three lowercase letters, so the text tokenizes to exactly
/// `n_tokens` tokens (4 bytes each) wherever it is placed after a complete token, and equal
/// `(block_id, n_tokens)` give equal text. Used to turn Mooncake `hash_ids` into prompts.
pub fn synthetic_block_text(block_id: u64, n_tokens: usize, out: &mut String) {
    out.reserve(n_tokens * 4);
    for i in 0..n_tokens as u64 {
        let r = mix64(block_id.wrapping_mul(0x1000_0000_01b3) ^ i);
        out.push(' ');
        for k in 0..3 {
            out.push((b'a' + ((r >> (k * 8)) % 26) as u8) as char);
        }
    }
}

/// Token ids of [`synthetic_block_text`] without building the text.
pub fn synthetic_block_ids(block_id: u64, n_tokens: usize, out: &mut Vec<TokenId>) {
    let mut tok = [0u8; 4];
    tok[0] = b' ';
    for i in 0..n_tokens as u64 {
        let r = mix64(block_id.wrapping_mul(0x1000_0000_01b3) ^ i);
        for k in 0..3 {
            tok[k + 1] = b'a' + ((r >> (k * 8)) % 26) as u8;
        }
        out.push(token_id(&tok));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<&str> {
        tokens(s.as_bytes())
            .map(|t| std::str::from_utf8(t).unwrap())
            .collect()
    }

    #[test]
    fn splits_at_whitespace_and_four_bytes() {
        assert_eq!(
            toks("the quick brown fox"),
            ["the", " qui", "ck", " bro", "wn", " fox"]
        );
        assert_eq!(toks(""), Vec::<&str>::new());
        assert_eq!(toks("  a"), [" ", " a"]);
    }

    #[test]
    fn english_is_about_four_bytes_per_token() {
        let text = "Routing by predicted time to first token lets a gateway send each prompt \
                    to the replica that will answer it soonest, given queues and caches.";
        let ratio = text.len() as f64 / count_tokens(text.as_bytes()) as f64;
        assert!((3.0..=4.0).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn non_utf8_and_multibyte_are_fine() {
        let bytes = [0xff, 0xfe, b' ', 0xc3, 0xa9, 0xc3, 0xa9, 0xc3];
        let n = count_tokens(&bytes);
        assert_eq!(n, 3);
    }

    #[test]
    fn shared_prefix_gives_shared_blocks() {
        let base = "You are a helpful assistant. ".repeat(40);
        let a = format!("{base}{}", "Tell me about GPUs. ".repeat(10));
        let b = format!("{base}{}", "What is a KV cache? ".repeat(10));
        let ha = block_hashes(&token_ids(a.as_bytes()), BLOCK_TOKENS);
        let hb = block_hashes(&token_ids(b.as_bytes()), BLOCK_TOKENS);
        let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
        let base_blocks = count_tokens(base.as_bytes()) / BLOCK_TOKENS;
        assert!(shared >= base_blocks, "{shared} < {base_blocks}");
        assert_ne!(ha.last(), hb.last());
    }

    #[test]
    fn one_pass_hashes_equal_two_pass() {
        let text = "lorem ipsum dolor sit amet, consectetur adipiscing elit ".repeat(50);
        for bt in [1, 7, 16, 64, 100, 512] {
            let ids = token_ids(text.as_bytes());
            let (n, h) = text_block_hashes(text.as_bytes(), bt);
            assert_eq!(n, ids.len());
            assert_eq!(h, block_hashes(&ids, bt), "block_tokens {bt}");
        }
    }

    #[test]
    fn synthetic_text_has_exact_token_count_and_matching_ids() {
        let mut s = String::new();
        synthetic_block_text(42, 512, &mut s);
        synthetic_block_text(7, 512, &mut s);
        assert_eq!(s.len(), 4096);
        let ids = token_ids(s.as_bytes());
        assert_eq!(ids.len(), 1024);
        let mut direct = Vec::new();
        synthetic_block_ids(42, 512, &mut direct);
        synthetic_block_ids(7, 512, &mut direct);
        assert_eq!(ids, direct);
    }
}
