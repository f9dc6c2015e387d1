//! Request ids: every request carries one, from its arrival to its access-log line.
//!
//! A client's `x-request-id` is kept when it is 1 to [`MAX_LEN`] bytes of visible ASCII
//! (`!` to `~`: no spaces, no control characters, nothing a log line or a header could be
//! forged with); anything else is replaced by a generated id. The id is sent upstream as
//! `x-request-id` (so an engine's own log can be joined with Pronto's), returned on every
//! response — errors included — and named in the request's log lines.
//!
//! A generated id is 32 lowercase hex digits: a random 64-bit prefix drawn once per process,
//! then a counter passed through a 64-bit bijection (splitmix64's finaliser) keyed by a second
//! random word, so ids never repeat within a process, are unlikely to collide across
//! replicas, and do not reveal how many requests the gateway has served.

use std::sync::atomic::{AtomicU64, Ordering};

/// The request-id header.
pub const HEADER: &str = "x-request-id";

/// Longest client-supplied request id kept, in bytes.
pub const MAX_LEN: usize = 128;

/// Where a request's id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// The client's `x-request-id`.
    Client,
    /// Generated: the client sent none.
    Generated,
    /// Generated: the client's was not a valid id (too long, empty, not visible ASCII).
    Replaced,
}

/// Whether `v` is an acceptable request id: 1..=[`MAX_LEN`] bytes, each visible ASCII.
pub fn is_valid(v: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&v.len()) && v.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// Generates request ids (see the module docs).
#[derive(Debug)]
pub struct RequestIds {
    prefix: u64,
    key: u64,
    next: AtomicU64,
}

impl RequestIds {
    /// A generator from two random words.
    pub fn new(prefix: u64, key: u64) -> RequestIds {
        RequestIds {
            prefix,
            key,
            next: AtomicU64::new(0),
        }
    }

    /// A generator seeded from the operating system's random source (falling back to the
    /// clock and process id where that fails).
    pub fn from_entropy() -> RequestIds {
        let mut bytes = [0u8; 16];
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes[..8].copy_from_slice(&t.to_le_bytes());
            bytes[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        }
        let [a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7] = bytes;
        let prefix = u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]);
        let key = u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]);
        RequestIds::new(prefix, mix(key))
    }

    /// A fresh id.
    pub fn generate(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:016x}", self.prefix, mix(n ^ self.key))
    }

    /// The id of a request with `headers`: the client's when valid, else a fresh one.
    pub fn for_request(&self, headers: &http::HeaderMap) -> (String, IdSource) {
        match headers.get(HEADER) {
            Some(v) if is_valid(v.as_bytes()) => {
                // Visible ASCII is UTF-8.
                let id = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (id, IdSource::Client)
            }
            Some(_) => (self.generate(), IdSource::Replaced),
            None => (self.generate(), IdSource::Generated),
        }
    }
}

/// splitmix64's finaliser: a bijection on `u64` that spreads every input bit.
pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &[u8]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(HEADER, http::HeaderValue::from_bytes(v).unwrap());
        h
    }

    #[test]
    fn valid_ids_are_bounded_visible_ascii() {
        assert!(is_valid(b"abc-123_XYZ:/.="));
        assert!(is_valid(&[b'a'; MAX_LEN]));
        assert!(!is_valid(&[b'a'; MAX_LEN + 1]));
        assert!(!is_valid(b""));
        assert!(!is_valid(b"has space"));
        assert!(!is_valid(b"tab\there"));
        assert!(!is_valid("é".as_bytes()));
        assert!(!is_valid(b"nul\0"));
    }

    #[test]
    fn a_valid_client_id_is_kept_and_anything_else_replaced() {
        let ids = RequestIds::new(1, 2);
        assert_eq!(
            ids.for_request(&headers(b"client-id-7")),
            ("client-id-7".to_string(), IdSource::Client)
        );
        let (id, source) = ids.for_request(&headers(b"two words"));
        assert_eq!(source, IdSource::Replaced);
        assert!(is_valid(id.as_bytes()) && id != "two words");
        let long = vec![b'x'; MAX_LEN + 1];
        assert_eq!(ids.for_request(&headers(&long)).1, IdSource::Replaced);
        assert_eq!(
            ids.for_request(&headers("ünï".as_bytes())).1,
            IdSource::Replaced
        );
        assert_eq!(
            ids.for_request(&http::HeaderMap::new()).1,
            IdSource::Generated
        );
    }

    #[test]
    fn generated_ids_are_distinct_hex_and_hide_the_counter() {
        let ids = RequestIds::new(0xabc, 0x1234);
        let a: Vec<String> = (0..1000).map(|_| ids.generate()).collect();
        let mut sorted = a.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), a.len(), "no repeats");
        for id in &a {
            assert_eq!(id.len(), 32);
            assert!(id.starts_with("0000000000000abc"));
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
        // Consecutive ids share no obvious suffix (the counter is mixed).
        assert_ne!(a[0][16..24], a[1][16..24]);
        let other = RequestIds::from_entropy();
        assert_ne!(other.generate(), RequestIds::from_entropy().generate());
    }
}
