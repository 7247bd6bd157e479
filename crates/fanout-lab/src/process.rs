//! Child processes of a lab run (stubs, systems under test): start, wait until ready, stop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::process::{Child, Command};

/// Errors starting a child.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The executable could not be started.
    #[error("cannot start `{name}` ({bin}): {source}")]
    Spawn {
        /// Role in the lab.
        name: String,
        /// Executable.
        bin: String,
        /// Cause.
        source: std::io::Error,
    },
    /// It started but never answered.
    #[error("`{name}` did not become ready on {addr} within {secs} s (exited: {exited})")]
    NotReady {
        /// Role in the lab.
        name: String,
        /// Address probed.
        addr: SocketAddr,
        /// Wait time.
        secs: u64,
        /// Whether the process had exited.
        exited: bool,
    },
}

/// A running child; killed when dropped.
pub struct Proc {
    /// Role in the lab (`fanout`, `stubs`, …).
    pub name: String,
    child: Child,
}

impl Proc {
    /// Start `bin args…` with `env`, stdout/stderr to `log` (a file in the output directory).
    pub fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        env: &HashMap<String, String>,
        log: &Path,
    ) -> Result<Proc, ProcessError> {
        let err = |source| ProcessError::Spawn {
            name: name.to_string(),
            bin: bin.display().to_string(),
            source,
        };
        let out = std::fs::File::create(log).map_err(err)?;
        let errf = out.try_clone().map_err(err)?;
        let child = Command::new(bin)
            .args(args)
            .envs(env)
            // start-up lines (addresses, "fanout serving") and every warning; per-request info
            // lines (partial answers) stay out of the measurement
            .env("RUST_LOG", "warn,fanout=info,fanout_stub=info")
            .stdout(out)
            .stderr(errf)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(err)?;
        Ok(Proc {
            name: name.to_string(),
            child,
        })
    }

    /// The OS process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Wait until `addr` answers an HTTP request (any status).
    pub async fn wait_ready(
        &mut self,
        addr: SocketAddr,
        path: &str,
        within: Duration,
    ) -> Result<(), ProcessError> {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if crate::http::get(addr, path).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(ProcessError::NotReady {
            name: self.name.clone(),
            addr,
            secs: within.as_secs(),
            exited: matches!(self.child.try_wait(), Ok(Some(_))),
        })
    }

    /// Wait until `addr` accepts a TCP connection (a server that answers no HTTP/1.1 probe).
    pub async fn wait_listening(
        &mut self,
        addr: SocketAddr,
        within: Duration,
    ) -> Result<(), ProcessError> {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(ProcessError::NotReady {
            name: self.name.clone(),
            addr,
            secs: within.as_secs(),
            exited: matches!(self.child.try_wait(), Ok(Some(_))),
        })
    }

    /// Stop the process (SIGKILL) and reap it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// Ask the process to stop (SIGTERM) and wait for it up to `within`, then SIGKILL it: for a
    /// master that stops its own workers (nginx), which a SIGKILL would leave running.
    pub async fn terminate(mut self, within: Duration) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) with a pid of our own child, not yet reaped (so not reused).
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            if tokio::time::timeout(within, self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// A free 127.0.0.1 port for a child to listen on (bound then released). Taken below the
/// kernel's ephemeral range (`net.ipv4.ip_local_port_range`) when it can be: a port from that
/// range, released, can be taken by any outgoing connection on the machine (the load generator
/// opens many) before the child binds it — the child then exits with "address in use". Below the
/// range only another listener can take it, and the port is tried by binding first.
pub fn free_addr() -> std::io::Result<SocketAddr> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const FROM: u16 = 10_000;
    if low > FROM + 1000 {
        let span = u64::from(low - FROM);
        // Different processes and calls start at different points (the standard library's
        // random hasher keys); consecutive tries walk on from there.
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.finish()
        };
        for i in 0..64u64 {
            let port = FROM + ((seed.wrapping_add(i.wrapping_mul(7919))) % span) as u16;
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                return l.local_addr();
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}
