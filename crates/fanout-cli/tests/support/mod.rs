//! The gateway half of the test harness: a real gateway from YAML text, started in this process
//! against running stubs. The rest (stubs, client, waits, logs) is `fanout_testkit`, which does
//! not depend on the gateway; this file is a module of every test binary that starts gateways.
#![allow(dead_code)]

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

/// A `fanout serve` process (the built binary, JSON logs to a file) on ephemeral ports, for tests
/// that look at the process itself (its threads, its `/metrics`); killed when dropped.
pub struct ServeProcess {
    pub child: std::process::Child,
    /// The client listener's port.
    pub port: u16,
    /// The admin listener's port.
    pub admin: u16,
    dir: std::path::PathBuf,
}

impl ServeProcess {
    /// Write `config` to a directory of its own (`name` tells tests of one binary apart), start
    /// `fanout serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0` on it with `args` and `envs`
    /// added, and wait until it logs its listeners' addresses; panics with its log if it exits
    /// first.
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
        use std::process::{Command, Stdio};
        let dir = std::env::temp_dir().join(format!("fanout-serve-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("fanout.yaml");
        std::fs::write(&file, config).unwrap();
        let log = dir.join("stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .args(["--log-format", format, "serve", "--listen", "127.0.0.1:0"])
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(args)
            .arg("--config")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut p = ServeProcess {
            child,
            port: 0,
            admin: 0,
            dir,
        };
        // Both listeners bind port 0; their addresses are in the `fanout serving` log line.
        let mut ports = None;
        fanout_testkit::wait_until("the gateway to log its addresses", || {
            if let Ok(Some(status)) = p.child.try_wait() {
                let err = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("fanout serve exited ({status}):\n{err}");
            }
            ports = serving_ports(&std::fs::read_to_string(&log).unwrap_or_default());
            ports.is_some()
        })
        .await;
        (p.port, p.admin) = ports.unwrap();
        p
    }
}

impl ServeProcess {
    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The ports of the client and admin listeners, from the `fanout serving` log line (JSON or
/// text: `… fanout serving addr=127.0.0.1:N admin=127.0.0.1:M`).
fn serving_ports(log: &str) -> Option<(u16, u16)> {
    let text = log
        .lines()
        .find(|l| l.contains("fanout serving addr="))
        .and_then(|l| {
            let port = |k: &str| -> Option<u16> {
                let v = l
                    .split(&format!(" {k}="))
                    .nth(1)?
                    .split_whitespace()
                    .next()?;
                v.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
            };
            Some((port("addr")?, port("admin")?))
        });
    if text.is_some() {
        return text;
    }
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "fanout serving")
        .and_then(|v| {
            let port = |k: &str| -> Option<u16> {
                let addr: std::net::SocketAddr = v["fields"][k].as_str()?.parse().ok()?;
                Some(addr.port())
            };
            Some((port("addr")?, port("admin")?))
        })
}
