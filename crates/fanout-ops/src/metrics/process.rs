//! The standard process metrics (`process_*`), read from `/proc/self` at scrape time. Linux
//! only: elsewhere (or when `/proc` cannot be read) they are absent from `/metrics`.

/// What `/proc` says about this process now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident memory, bytes.
    pub resident_bytes: f64,
    /// Threads.
    pub threads: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit of open file descriptors, if known.
    pub max_fds: Option<f64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time: f64,
}

/// Clock ticks per second of the times in `/proc/*/stat` (`USER_HZ`: 100 on every Linux
/// architecture's user ABI).
const USER_HZ: f64 = 100.0;

/// Read the process's stats (blocking file reads of `/proc`: off the runtime's workers).
pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    // The fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // `fields[0]` is field 3 (state) of proc(5): field N is `fields[N - 3]`.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    let cpu_seconds = (field(14)? + field(15)?) / USER_HZ;
    let start_ticks = field(22)?;
    let btime: f64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let status_kb = |key: &str| -> Option<f64> {
        let v = status.lines().find_map(|l| l.strip_prefix(key))?;
        v.split_whitespace().next()?.parse().ok()
    };
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    Some(ProcessStats {
        cpu_seconds,
        resident_bytes: status_kb("VmRSS:")? * 1024.0,
        threads: status_kb("Threads:")?,
        open_fds,
        max_fds: max_fds(),
        start_time: btime + start_ticks / USER_HZ,
    })
}

/// The soft `Max open files` limit from `/proc/self/limits`.
fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_plausibly() {
        let p = super::read().expect("/proc readable on Linux");
        assert!(p.threads >= 1.0);
        assert!(p.open_fds >= 3.0, "{p:?}");
        assert!(p.resident_bytes > 1024.0 * 1024.0, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            p.start_time <= now + 1.0 && p.start_time > now - 86_400.0,
            "{p:?}"
        );
        assert!(p.cpu_seconds >= 0.0);
    }
}
