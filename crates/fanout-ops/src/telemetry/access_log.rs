//! The access log: one JSON object per line per request (`telemetry.access_log`), written by a
//! thread of its own so that no worker ever waits on stdout or a disk: lines go through a
//! bounded queue, and when it is full the line is dropped and counted (status endpoint,
//! `access_log.dropped`). The edge stage that writes it is `fanout_edge::access_log`.
//!
//! A line: `{"time", "request_id", "method", "route", "path", "status", "duration_ms",
//! "bytes_in", "bytes_out", "error"?, "error_step"?, "partial": [{"step", "code", "cause"}]}` —
//! `partial` names each step of a degraded answer and why it fell back (its error code, and the
//! detail the client does not see).

use fanout_config::AccessLogConfig;
use serde::Serialize;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::SystemTime;

/// The access log's writer and counters.
pub struct AccessLog {
    tx: SyncSender<String>,
    stats: Arc<LogStats>,
    /// Share of requests logged.
    pub sample_ratio: f64,
    /// Degraded and 5xx answers are always logged.
    pub always_log_degraded: bool,
}

#[derive(Default)]
struct LogStats {
    queued: AtomicU64,
    written: AtomicU64,
    dropped: AtomicU64,
    write_errors: AtomicU64,
}

/// One step of a degraded answer.
#[derive(Serialize)]
pub struct Degraded<'a> {
    /// The step.
    pub step: &'a str,
    /// Its error code (`missing_elements` for a step with elements left out by `missing`).
    pub code: &'a str,
    /// Why (the failure's detail, else its message).
    pub cause: &'a str,
}

/// One request's line.
#[derive(Serialize)]
pub struct Line<'a> {
    /// Arrival time, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// The request id.
    pub request_id: &'a str,
    /// The method.
    pub method: &'a str,
    /// The route's path pattern (`null`: no route matched).
    pub route: Option<&'a str>,
    /// The request path.
    pub path: &'a str,
    /// The client's address: the connection's peer, or what a trusted proxy forwarded
    /// (`server.trusted_proxies`); absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The subject of the client's verified TLS certificate (`tls.client_auth`); absent
    /// without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client: Option<&'a str>,
    /// The answer's status.
    pub status: u16,
    /// From arrival to the answer, in ms.
    pub duration_ms: f64,
    /// Request body bytes read.
    pub bytes_in: u64,
    /// Answer body bytes.
    pub bytes_out: u64,
    /// The error code of an error answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
    /// The step an error answer names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_step: Option<&'a str>,
    /// The steps of a degraded answer and why each fell back.
    pub partial: &'a [Degraded<'a>],
}

impl AccessLog {
    /// Open the output and start the writer thread.
    pub fn start(cfg: &AccessLogConfig) -> Result<AccessLog, String> {
        let out: Box<dyn Write + Send> = match cfg.output.as_str() {
            "stdout" => Box::new(std::io::stdout()),
            "stderr" => Box::new(std::io::stderr()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("telemetry.access_log.output `{path}`: {e}"))?,
            ),
        };
        let (tx, rx) = sync_channel(cfg.queue_size.max(1));
        let stats = Arc::new(LogStats::default());
        let st = stats.clone();
        std::thread::Builder::new()
            .name("fanout-access-log".into())
            .spawn(move || write_lines(rx, out, &st))
            .map_err(|e| format!("starting the access log writer: {e}"))?;
        Ok(AccessLog {
            tx,
            stats,
            sample_ratio: if cfg.sample_ratio.is_finite() {
                cfg.sample_ratio.clamp(0.0, 1.0)
            } else {
                0.0
            },
            always_log_degraded: cfg.always_log_degraded,
        })
    }

    /// Whether a request is in the sample (decided at random per request).
    pub fn sampled(&self) -> bool {
        self.sample_ratio >= 1.0
            || (self.sample_ratio > 0.0 && rand::random::<f64>() < self.sample_ratio)
    }

    /// Queue `line` for writing; dropped (and counted) when the queue is full.
    pub fn write(&self, line: &Line<'_>) {
        let Ok(mut text) = serde_json::to_string(line) else {
            return;
        };
        text.push('\n');
        match self.tx.try_send(text) {
            Ok(()) => {
                self.stats.queued.fetch_add(1, Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// `{queued, written, dropped, write_errors}`: lines put in the queue, written, dropped
    /// because the queue was full, and failed writes.
    pub fn status_json(&self) -> serde_json::Value {
        serde_json::json!({
            "queued": self.stats.queued.load(Relaxed),
            "written": self.stats.written.load(Relaxed),
            "dropped": self.stats.dropped.load(Relaxed),
            "write_errors": self.stats.write_errors.load(Relaxed),
        })
    }
}

/// The writer thread: lines as they come, flushed whenever the queue is empty.
fn write_lines(rx: Receiver<String>, out: Box<dyn Write + Send>, stats: &LogStats) {
    let mut out = std::io::BufWriter::with_capacity(64 << 10, out);
    while let Ok(line) = rx.recv() {
        let mut next = Some(line);
        while let Some(line) = next {
            match out.write_all(line.as_bytes()) {
                Ok(()) => stats.written.fetch_add(1, Relaxed),
                Err(_) => stats.write_errors.fetch_add(1, Relaxed),
            };
            next = rx.try_recv().ok();
        }
        if out.flush().is_err() {
            stats.write_errors.fetch_add(1, Relaxed);
        }
    }
}

/// `t` as RFC 3339 UTC with milliseconds: `2026-11-23T12:02:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 → (year, month, day) (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_003_320_123);
        assert_eq!(rfc3339(t), "2026-11-18T12:02:00.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
