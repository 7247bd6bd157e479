//! The log of this test process, captured in memory.
//!
//! The capture is a global `tracing` subscriber, so it is per process, not per test: once one
//! test called [`capture_logs`], every gateway of the process logs into the same buffer. Tests
//! find their own lines by something only they use, such as their requests' `x-request-id`.

use std::sync::{Arc, Mutex, OnceLock};

/// The captured log (level info and above) of every gateway in this process.
pub struct Logs(Arc<Mutex<Vec<u8>>>);

#[derive(Clone)]
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Capture the log (level info and above) of this test process; idempotent.
pub fn capture_logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = LogWriter(buf.clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || w.clone())
            .try_init();
        Logs(buf)
    })
}

impl Logs {
    /// Every line logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// The lines that mention `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}
