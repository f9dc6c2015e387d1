//! TEMPORARY SSE scanner (replaced by the req branch at merge).
#![allow(missing_docs)]
#[derive(Debug, Default)]
pub struct SseScanner {
    seen: bool,
}
#[derive(Debug, Default, Clone, Copy)]
pub struct ScanUpdate {
    pub first_token: bool,
    pub done: bool,
}
impl SseScanner {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn feed(&mut self, chunk: &[u8]) -> ScanUpdate {
        let s = String::from_utf8_lossy(chunk);
        let tok = s.contains("\"content\":\"") && !s.contains("\"content\":\"\"")
            || s.contains("\"text\":\"");
        let first = tok && !self.seen;
        self.seen |= tok;
        ScanUpdate {
            first_token: first,
            done: s.contains("[DONE]"),
        }
    }
}
