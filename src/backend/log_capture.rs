//! Test helper: the log lines emitted on this thread, to check that loops log transitions
//! and not probes. Works with `#[tokio::test]`'s current-thread runtime (every task runs on
//! the test's thread).

use std::io;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

/// Everything logged while the guard of [`capture`] lives.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

/// Start capturing this thread's log (debug and up) until the guard drops.
pub fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let c = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(c.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    (c, tracing::subscriber::set_default(subscriber))
}

impl Captured {
    /// Every line so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Lines containing every one of `needles`.
    pub fn count(&self, needles: &[&str]) -> usize {
        self.text()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count()
    }
}

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}
