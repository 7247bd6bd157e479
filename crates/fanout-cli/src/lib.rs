//! The `fanout` command: wiring of config, flow engine, HTTP server and stubs into processes.
//! The binary (`main.rs`) only parses arguments; everything runnable lives here so tests and
//! `fanout demo` use the same code paths as `fanout serve`.

pub mod demo;
pub mod explain;
pub mod lab;
pub mod load;
pub mod logline;
pub mod openapi;
pub mod testing;

use fanout_config::{Config, ConfigError, ConfigErrors, VarLookup, env_lookup};
use fanout_proxy::Gateway;
pub use fanout_stub::addr_var;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Load and compile a gateway config from text.
pub fn load_gateway(file: &str, text: &str, vars: VarLookup<'_>) -> Result<Gateway, ConfigErrors> {
    build_checked(Config::from_yaml_checked(file, text, vars)?)
}

/// Load and compile a gateway config file (what `fanout validate` checks).
pub fn load_gateway_file(path: &str, vars: VarLookup<'_>) -> Result<Gateway, ConfigErrors> {
    build_checked(Config::from_file_checked(path, vars)?)
}

/// The gateway of a config read with the structural checks' errors `errs`: built even when
/// there are some, so every section's mistakes are reported at once (an error the build finds
/// again at a place already reported is said once).
fn build_checked((cfg, mut errs): (Config, Vec<ConfigError>)) -> Result<Gateway, ConfigErrors> {
    match Gateway::build(&cfg) {
        Ok(gw) if errs.is_empty() => Ok(gw),
        Ok(_) => Err(ConfigErrors(errs)),
        Err(more) => {
            for e in more.0 {
                let known = errs
                    .iter()
                    .any(|k| *k == e || (e.pos.is_some_and(|p| p.line > 0) && k.pos == e.pos));
                if !known {
                    errs.push(e);
                }
            }
            Err(ConfigErrors(errs))
        }
    }
}

/// Whether the file at `path` is a stubs config (`fanout stub`'s: a top-level `services:` and no
/// top-level `routes:`), so `fanout validate` checks it as one and `serve` can point at `stub`.
/// An unreadable file is not one (loading it reports why).
pub fn looks_like_stubs_config(path: &str) -> bool {
    fanout_config::read_limited(path, fanout_config::MAX_CONFIG_BYTES)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .is_some_and(|t| looks_like_stubs_text(&t))
}

/// [`looks_like_stubs_config`] on text.
pub fn looks_like_stubs_text(text: &str) -> bool {
    let top = |key: &str| text.lines().any(|l| l.starts_with(key));
    top("services:") && !top("routes:")
}

/// A gateway running on a bound port (and its admin listener, if any).
pub struct RunningGateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where the admin listener (`/metrics`, `/healthz`, `/readyz`) listens, if it runs.
    pub admin_addr: Option<SocketAddr>,
    /// The gateway (to reload its config, read its health, metrics and status).
    pub gateway: Arc<Gateway>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    admin: Option<Server>,
}

/// A server task and the sender that stops it (dropping the sender stops it too).
struct Server {
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Serve `gateway`'s admin endpoints on `addr` in a background task.
    async fn admin(gateway: &Arc<Gateway>, addr: &str) -> std::io::Result<(Server, SocketAddr)> {
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(fanout_proxy::admin::serve_admin(
            gateway.clone(),
            listener,
            async move {
                let _ = rx.await;
            },
        ));
        Ok((Server { stop, task }, bound))
    }

    async fn stop(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

impl RunningGateway {
    /// The running gateway (its health flags, metrics, status).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Stop like a gateway behind a load balancer: report not ready and keep serving for
    /// `server.drain_delay` (a second Ctrl-C/SIGTERM cuts it short), then [`RunningGateway::shutdown`].
    pub async fn drain_and_stop(self) -> std::io::Result<()> {
        let delay = self.gateway.drain_delay();
        // Listening for the next signal starts before readiness flips: none is missed.
        let again = stop_signal_from_now();
        self.gateway.health().set_draining();
        if !delay.is_zero() {
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                "stopping: reporting not ready, still serving for server.drain_delay"
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = again => {}
            }
        }
        tracing::info!("shutting down: draining in-flight requests");
        self.shutdown().await
    }

    /// Stop accepting, let in-flight requests finish (within the grace period), wait; the
    /// gateway is not ready from the first moment (`/readyz` answers 503 while it drains), and
    /// the admin listener stops last.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.gateway.health().set_draining();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let served = match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        };
        self.gateway.health().set_listening(false);
        if let Some(admin) = self.admin.take() {
            admin.stop().await?;
        }
        served
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(a) = self.admin.take() {
            let _ = a.stop.send(());
        }
    }
}

/// Serve `gateway` on `addr` in a background task, and its admin endpoints on `admin_addr`
/// (`None`: no admin listener; tests pass `127.0.0.1:0`, `fanout serve` the config's
/// `admin.listen` or `--admin-listen`). The admin listener starts first, so liveness is
/// answered (and readiness says what is missing) while reference data loads; a required
/// dataset that fails to load fails the start.
pub async fn start_gateway(
    gateway: Gateway,
    addr: &str,
    admin_addr: Option<&str>,
) -> std::io::Result<RunningGateway> {
    start_gateway_on(gateway, addr, admin_addr, None).await
}

/// [`start_gateway`] with `cores` serving cores when the config says `server.runtime:
/// per_core` (`None`: one per core of the machine; `fanout serve --workers N` gives N).
pub async fn start_gateway_on(
    gateway: Gateway,
    addr: &str,
    admin_addr: Option<&str>,
    cores: Option<usize>,
) -> std::io::Result<RunningGateway> {
    let gateway = Arc::new(gateway);
    let (admin, admin_bound) = match admin_addr {
        Some(a) => {
            let (s, bound) = Server::admin(&gateway, a)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("admin listener {a}: {e}")))?;
            (Some(s), Some(bound))
        }
        None => (None, None),
    };
    gateway.start().await.map_err(std::io::Error::other)?;
    let (tx, rx) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = rx.await;
    };
    let (bound, task) = match gateway.runtime_kind() {
        fanout_config::RuntimeKind::WorkStealing => {
            let listener = TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            let task = tokio::spawn(fanout_proxy::serve(gateway.clone(), listener, stopped));
            (bound, task)
        }
        fanout_config::RuntimeKind::PerCore => {
            let n = cores
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let listeners = fanout_transport::cores::bind_reuseport(addr, n.max(1))?;
            let bound = match listeners.first() {
                Some(l) => l.local_addr()?,
                None => return Err(std::io::Error::other("no listener")),
            };
            let task = tokio::spawn(fanout_proxy::serve_per_core(
                gateway.clone(),
                listeners,
                stopped,
            )?);
            (bound, task)
        }
    };
    gateway.health().set_listening(true);
    Ok(RunningGateway {
        addr: bound,
        admin_addr: admin_bound,
        gateway,
        stop: Some(tx),
        task,
        admin,
    })
}

/// How `fanout serve` reloads its config: on SIGHUP always, and when `watch` is set, whenever
/// the file's content changes (looked at every `watch` interval; content, not timestamps, so
/// the symlink swap of a Kubernetes ConfigMap update is seen too).
#[derive(Debug, Clone)]
pub struct ReloadTriggers {
    /// The config file.
    pub path: String,
    /// Look at the file this often (`None`: SIGHUP only).
    pub watch: Option<Duration>,
    /// The digest of the file's content taken *before* the serving config was read from it
    /// ([`config_digest`]): a change made at any time after that is seen by the first look,
    /// even one made before serving began (`None`: the file's digest when serving begins).
    pub loaded: Option<u64>,
}

/// The digest of a config file's content now (blocking: call it before the runtime starts, and
/// before the config is read, for [`ReloadTriggers::loaded`]). `None` when unreadable.
pub fn config_digest(path: &str) -> Option<u64> {
    std::fs::read(path).ok().map(|b| digest(&b))
}

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// Serve until Ctrl-C or SIGTERM, reloading `gateway`'s config on the [`ReloadTriggers`]. A
/// refused reload is logged and counted; the old config keeps serving.
pub async fn run_until_stopped(gateway: Arc<Gateway>, triggers: ReloadTriggers) {
    let stop = stop_signal_from_now();
    tokio::pin!(stop);
    let mut hup = hangups();
    let mut last = match triggers.loaded {
        Some(d) => Some(d),
        None => file_digest(&triggers.path).await,
    };
    let mut tick = triggers.watch.map(|every| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let watched = async {
            match tick.as_mut() {
                Some(t) => t.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            Some(()) = next_hangup(&mut hup) => {
                tracing::info!(config = %triggers.path, "SIGHUP: reloading the config");
                let _ = gateway.reload_file(&triggers.path, env_lookup).await;
                last = file_digest(&triggers.path).await;
            }
            _ = watched => {
                let now = file_digest(&triggers.path).await;
                if now.is_some() && now != last {
                    last = now;
                    tracing::info!(config = %triggers.path, "the config file changed: reloading");
                    let _ = gateway.reload_file(&triggers.path, env_lookup).await;
                }
            }
        }
    }
}

/// A digest of the file's content (read on the blocking pool), `None` when unreadable.
async fn file_digest(path: &str) -> Option<u64> {
    let path = path.to_string();
    let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
        .await
        .ok()?
        .ok()?;
    Some(digest(&bytes))
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

/// The SIGHUP stream (`None` when it cannot be installed: logged).
fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "cannot handle SIGHUP: a SIGHUP will stop the process");
                None
            }
        }
    }
}

/// The next SIGHUP (never, without a stream).
async fn next_hangup(hup: &mut Hangups) -> Option<()> {
    #[cfg(unix)]
    match hup.as_mut() {
        Some(h) => h.recv().await,
        None => std::future::pending().await,
    }
    #[cfg(not(unix))]
    {
        let _ = hup;
        std::future::pending().await
    }
}

/// Resolves on a SIGTERM (or Ctrl-C) that arrives after this returns: the SIGTERM handler is
/// registered now, not at the first poll.
fn stop_signal_from_now() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Resolves when the process gets Ctrl-C or SIGTERM (`fanout stub`, `fanout demo`).
///
/// SIGHUP (by default fatal) is logged and ignored while this waits: these commands have no
/// config to reload, and `kill -HUP` out of habit must not take them down.
pub async fn shutdown_signal() {
    let stop = stop_signal_from_now();
    tokio::pin!(stop);
    let mut hup = hangups();
    loop {
        tokio::select! {
            _ = &mut stop => return,
            Some(()) = next_hangup(&mut hup) => {
                tracing::warn!("SIGHUP received: this command has no config to reload; ignoring");
            }
        }
    }
}
