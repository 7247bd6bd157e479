//! The gateway half of the test harness: a real gateway from YAML text, started in this process
//! against running stubs. The rest (stubs, client, waits, logs) is `fanout_testkit`, which does
//! not depend on the gateway; this file is a module of every test binary that starts gateways.
#![allow(dead_code)]

pub mod python;

use fanout::{RunningGateway, addr_var, load_gateway, start_gateway};
use fanout_stub::StubServer;
use std::collections::HashMap;

/// Variables pointing a gateway config at running stubs (`SEARCH_ADDR` → the search stub).
pub fn stub_vars(stubs: &StubServer) -> HashMap<String, String> {
    stubs
        .services()
        .into_iter()
        .map(|(n, a)| (addr_var(&n), a.to_string()))
        .collect()
}

/// Start a gateway from YAML text against running stubs, on an ephemeral port; panics (showing
/// the error) when the config does not load or the port cannot be bound.
pub async fn gateway(yaml: &str, stubs: &StubServer) -> RunningGateway {
    gateway_with(yaml, stubs, &[]).await
}

/// A loaded config from YAML text against running stubs (for reloads); panics on errors.
pub fn config(yaml: &str, stubs: &StubServer) -> fanout_config::Config {
    let vars = stub_vars(stubs);
    let lookup = |n: &str| vars.get(n).cloned();
    fanout_config::Config::from_yaml("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"))
}

/// [`gateway`] with more variables than the stubs' addresses (e.g. `REDIS_URL`).
pub async fn gateway_with(
    yaml: &str,
    stubs: &StubServer,
    extra: &[(&str, String)],
) -> RunningGateway {
    let mut vars = stub_vars(stubs);
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let lookup = |n: &str| vars.get(n).cloned();
    let gw = load_gateway("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .expect("bind gateway")
}

/// The first of `names` that runs (`NAME --version` succeeds); panics naming the Debian
/// `package` to install (`./scripts/test` installs it) when none does.
pub fn find_tool(names: &[&'static str], package: &str) -> &'static str {
    names
        .iter()
        .copied()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .unwrap_or_else(|| {
            panic!(
                "{} is needed: `apt-get install {package}` (./scripts/test installs it)",
                names.first().copied().unwrap_or("a tool")
            )
        })
}

/// A `fanout serve` process (the built binary, its log in a file) on ephemeral ports, for tests
/// that look at the process itself: its threads, memory, `/metrics`, signals, reloads of its
/// config file. [`ServeProcess::launch`] with [`Launch::stub`] starts a `fanout stub` instead.
/// Killed when dropped.
pub struct ServeProcess {
    pub child: std::process::Child,
    /// The client listener's port (a stub's: its service's).
    pub port: u16,
    /// The admin listener's port (0 for a stub).
    pub admin: u16,
    dir: std::path::PathBuf,
}

/// How long a process may take to log its listeners: generous, a start on a loaded machine
/// (the wait ends as soon as the line is there).
const START_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// What [`ServeProcess::launch`] starts: arguments, environment, files beside the config, the
/// log's format, `fanout stub` instead of `fanout serve`; then [`Launch::start`] (async tests)
/// or [`Launch::start_blocking`].
pub struct Launch<'a> {
    name: &'a str,
    config: &'a str,
    args: Vec<&'a str>,
    envs: Vec<(&'a str, std::ffi::OsString)>,
    files: Vec<(&'a str, &'a str)>,
    format: &'a str,
    stub: bool,
}

impl<'a> Launch<'a> {
    /// More arguments after `serve` (or `stub`).
    pub fn args(mut self, args: &[&'a str]) -> Self {
        self.args.extend_from_slice(args);
        self
    }

    /// An environment variable of the process.
    pub fn env(mut self, key: &'a str, value: impl Into<std::ffi::OsString>) -> Self {
        self.envs.push((key, value.into()));
        self
    }

    /// A file written beside the config (which names it relative to its own directory).
    pub fn file(mut self, name: &'a str, text: &'a str) -> Self {
        self.files.push((name, text));
        self
    }

    /// The log in `format` (`json`, the default, or `text`).
    pub fn log_format(mut self, format: &'a str) -> Self {
        self.format = format;
        self
    }

    /// `fanout stub --config FILE` (the config is a stubs file with one service on port 0)
    /// instead of `fanout serve`.
    pub fn stub(mut self) -> Self {
        self.stub = true;
        self
    }

    /// Start it and wait until it logs its listeners' addresses; panics with its log if it
    /// exits first.
    pub async fn start(self) -> ServeProcess {
        let mut p = self.spawn();
        let mut ports = None;
        fanout_testkit::wait_within("the process to log its addresses", START_PATIENCE, || {
            ports = p.listening();
            ports.is_some()
        })
        .await;
        (p.port, p.admin) = ports.unwrap();
        p
    }

    /// [`Launch::start`] for tests without a runtime: polls from this thread.
    pub fn start_blocking(self) -> ServeProcess {
        let mut p = self.spawn();
        let ports = fanout_testkit::poll_blocking(START_PATIENCE, || p.listening());
        (p.port, p.admin) =
            ports.unwrap_or_else(|| panic!("the process did not log its addresses:\n{}", p.log()));
        p
    }

    fn spawn(self) -> ServeProcess {
        use std::process::{Command, Stdio};
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "fanout-serve-{}-{}-{n}",
            std::process::id(),
            self.name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fanout.yaml"), self.config).unwrap();
        for (name, text) in &self.files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fanout"));
        cmd.envs(self.envs.iter().map(|(k, v)| (k, v)))
            .args(["--log-format", self.format]);
        if self.stub {
            cmd.arg("stub");
        } else {
            cmd.args(["serve", "--listen", "127.0.0.1:0"])
                .args(["--admin-listen", "127.0.0.1:0"]);
        }
        let child = cmd
            .args(&self.args)
            .arg("--config")
            .arg(dir.join("fanout.yaml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .unwrap();
        ServeProcess {
            child,
            port: 0,
            admin: 0,
            dir,
        }
    }
}

impl ServeProcess {
    /// Write `config` to a directory of its own (`name` tells the processes of a test apart in
    /// `/tmp`) to start `fanout serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0` on it:
    /// set the options, then [`Launch::start`].
    pub fn launch<'a>(name: &'a str, config: &'a str) -> Launch<'a> {
        Launch {
            name,
            config,
            args: Vec::new(),
            envs: Vec::new(),
            files: Vec::new(),
            format: "json",
            stub: false,
        }
    }

    /// [`ServeProcess::launch`] with `args` and `envs` added, started (JSON logs).
    pub async fn start(
        name: &str,
        config: &str,
        args: &[&str],
        envs: &[(&str, std::path::PathBuf)],
    ) -> ServeProcess {
        Self::start_logging(name, config, args, envs, "json").await
    }

    /// [`ServeProcess::start`] with the log in `format` (`json` or `text`), read back with
    /// [`ServeProcess::log`].
    pub async fn start_logging(
        name: &str,
        config: &str,
        args: &[&str],
        envs: &[(&str, std::path::PathBuf)],
        format: &str,
    ) -> ServeProcess {
        envs.iter()
            .fold(Self::launch(name, config).args(args), |l, (k, v)| {
                l.env(k, v)
            })
            .log_format(format)
            .start()
            .await
    }

    /// The ports it listens on once its log says so (a stub: its service's, admin 0); panics
    /// with its log if it exited.
    fn listening(&mut self) -> Option<(u16, u16)> {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("fanout exited ({status}):\n{}", self.log());
        }
        let log = self.log();
        let port = |message: &str, key: &str| -> Option<u16> {
            let addr: std::net::SocketAddr = log_field(&log, message, key)?.parse().ok()?;
            Some(addr.port())
        };
        if port("stub service listening", "addr").is_some() {
            return Some((port("stub service listening", "addr")?, 0));
        }
        Some((
            port("fanout serving", "addr")?,
            port("fanout serving", "admin")?,
        ))
    }

    /// The client listener's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.admin).into()
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// The file its log is written to (to read it while the process is borrowed mutably).
    pub fn log_file(&self) -> std::path::PathBuf {
        self.dir.join("stderr.log")
    }

    /// The `fields` of every JSON log line whose message is `message`, in order.
    pub fn logged(&self, message: &str) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| v["fields"].clone())
            .filter(|f| f["message"] == message)
            .collect()
    }

    /// How many JSON log lines have a message starting with `prefix`.
    pub fn logged_starting(&self, prefix: &str) -> usize {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(prefix))
            })
            .count()
    }

    /// Replace the text of its config file (then [`ServeProcess::signal`] `-HUP`, or `--watch`).
    pub fn write_config(&self, text: &str) {
        std::fs::write(self.dir.join("fanout.yaml"), text).unwrap();
    }

    /// Send it a signal with `kill SIG PID` (`-HUP`, `-TERM`, `-STOP`, `-CONT`).
    pub fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("kill {sig}: {e}"));
        assert!(status.success(), "kill {sig} failed");
    }

    /// Resident memory of the process in KiB (`VmRSS` of /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS")
    }

    /// Peak resident memory of the process in KiB (`VmHWM` of /proc/PID/status).
    pub fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM")
    }

    fn proc_status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_else(|e| panic!("read /proc status: {e}"));
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of field `key` of the first log line with `message`, JSON or text (`… MESSAGE
/// key=VALUE …`).
fn log_field(log: &str, message: &str, key: &str) -> Option<String> {
    log.lines().find_map(|l| {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(l) {
            let f = &v["fields"];
            return (f["message"] == message).then(|| f[key].as_str().map(str::to_string))?;
        }
        let (_, after) = l.split_once(message)?;
        let v = after
            .split(&format!(" {key}="))
            .nth(1)?
            .split_whitespace()
            .next()?;
        Some(v.to_string())
    })
}
