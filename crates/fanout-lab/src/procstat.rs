//! Sampling a process from `/proc`: CPU time (user+sys), RSS, threads, context switches, open fds.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ProcSample {
    /// Seconds since the sampler started.
    pub t: f64,
    /// Total CPU time consumed so far, in µs: the scheduler's run time summed over the threads
    /// (`/proc/PID/task/*/schedstat`, ns resolution), or utime+stime ticks where unavailable.
    pub cpu_us: u64,
    /// Resident set size in bytes.
    pub rss_bytes: u64,
    /// Number of threads.
    pub threads: u64,
    /// Voluntary + involuntary context switches so far (all threads).
    pub ctx_switches: u64,
    /// Open file descriptors.
    pub fds: u64,
}

/// Clock ticks per second (`USER_HZ`: the unit of `/proc/stat` and `/proc/PID/stat` times).
pub(crate) fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 on error.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Sum of the first field of `/proc/PID/task/*/schedstat` (time spent running, ns).
fn schedstat_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    let mut any = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat"))
            && let Some(ns) = s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        {
            total += ns;
            any = true;
        }
    }
    any.then_some(total)
}

/// Voluntary + involuntary context switches summed over `/proc/PID/task/*/status`.
fn task_ctx_switches(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    Some(total)
}

/// `(utime + stime in ticks, threads)` from `/proc/PID/stat`; `None` when the process is gone.
fn read_stat(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) … utime(11) stime(12) … num_threads(17) … rss(21).
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let threads: u64 = f.get(17)?.parse().ok()?;
    Some((utime + stime, threads))
}

/// A `NAME: value …` line of `/proc/PID/status` as a number (0 when absent).
fn status_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Read a process's current figures; `None` when it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let (ticks, threads) = read_stat(pid)?;
    // Prefer the scheduler's nanosecond run time summed over threads; ticks are 10 ms coarse.
    let cpu_us = schedstat_ns(pid)
        .map(|ns| ns / 1000)
        .unwrap_or(ticks * 1_000_000 / clock_ticks());

    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| status_field(&status, name);
    let rss_bytes = field("VmRSS:") * 1024;
    // /proc/PID/status counts the main thread's switches only; sum over every thread.
    let ctx_switches = task_ctx_switches(pid).unwrap_or_else(|| {
        field("voluntary_ctxt_switches:") + field("nonvoluntary_ctxt_switches:")
    });
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    Some(ProcSample {
        t: 0.0,
        cpu_us,
        rss_bytes,
        threads,
        ctx_switches,
        fds,
    })
}

/// [`sample`] without the per-thread files: threads, RSS and CPU time (`utime + stime`, 10 ms
/// ticks) from `/proc/PID/stat` and `status` only; no context switches, no descriptors. For
/// sampling a process of thousands of threads often (`hh-pools`): [`sample`] reads two files per
/// thread, 16 000 reads for a JVM of 8 000 threads, on the generator's runtime.
pub fn sample_light(pid: u32) -> Option<ProcSample> {
    let (ticks, threads) = read_stat(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        t: 0.0,
        cpu_us: ticks * 1_000_000 / clock_ticks(),
        rss_bytes: status_field(&status, "VmRSS:") * 1024,
        threads,
        ctx_switches: 0,
        fds: 0,
    })
}

/// The CPU time (user+sys, µs) a process has used so far, **threads that exited included**:
/// `utime + stime` of `/proc/PID/stat`, which the kernel keeps for the whole thread group. Ticks
/// (10 ms) are coarser than [`sample`]'s per-thread scheduler time, but that sum forgets a thread
/// once it exits — a JVM whose pools retire idle threads (the JDK HttpClient's cached executor
/// after 60 s) would seem to use less CPU over a window, even none. For windows of seconds.
pub fn cpu_total_us(pid: u32) -> Option<u64> {
    let (ticks, _) = read_stat(pid)?;
    Some(ticks * 1_000_000 / clock_ticks())
}

/// The processes whose parent is `pid` (from `/proc/*/stat`): an nginx master's workers.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // After the name (in parentheses, may hold spaces): state, then the parent's pid.
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat.get(i + 2..))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out.sort_unstable();
    out
}

/// [`cpu_total_us`] summed over `pids` (a master and its workers); `None` when one is gone.
pub fn group_cpu_total_us(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|&p| cpu_total_us(p)).sum()
}

/// Samples a process periodically in a background task until dropped or stopped.
pub struct Sampler {
    samples: std::sync::Arc<std::sync::Mutex<Vec<ProcSample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Start sampling `pid` every `every`.
    pub fn start(pid: u32, every: Duration) -> Sampler {
        Sampler::start_with(pid, every, sample)
    }

    /// Start sampling `pid` every `every` with [`sample_light`].
    pub fn start_light(pid: u32, every: Duration) -> Sampler {
        Sampler::start_with(pid, every, sample_light)
    }

    fn start_with(pid: u32, every: Duration, sample: fn(u32) -> Option<ProcSample>) -> Sampler {
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = samples.clone();
        let task = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let Some(mut s) = sample(pid) else { return };
                s.t = start.elapsed().as_secs_f64();
                if let Ok(mut v) = out.lock() {
                    v.push(s);
                }
            }
        });
        Sampler { samples, task }
    }

    /// Stop and return the samples.
    pub fn finish(self) -> Vec<ProcSample> {
        self.task.abort();
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).expect("own /proc entry");
        assert!(s.threads >= 1);
        assert!(s.rss_bytes > 0);
        assert!(s.fds > 0);
        assert!(sample(u32::MAX - 1).is_none());
        // Spin a little so the process has used at least one tick.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_total_us(std::process::id()).is_some_and(|us| us > 0));
        assert!(cpu_total_us(u32::MAX - 1).is_none());
        let light = sample_light(std::process::id()).expect("own /proc entry");
        assert!(light.threads >= 1 && light.rss_bytes > 0);
        assert!(sample_light(u32::MAX - 1).is_none());
    }
}
