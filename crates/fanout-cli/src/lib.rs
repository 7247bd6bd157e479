//! The `fanout` command: wiring of config, flow engine, HTTP server and stubs into processes.
//! The binary (`main.rs`) only parses arguments; everything runnable lives here so tests and
//! `fanout demo` use the same code paths as `fanout serve`.

pub mod demo;
pub mod explain;
pub mod load;

use fanout_config::{Config, ConfigErrors, VarLookup};
use fanout_proxy::Gateway;
pub use fanout_stub::addr_var;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Load and compile a gateway config from text.
pub fn load_gateway(file: &str, text: &str, vars: VarLookup<'_>) -> Result<Gateway, ConfigErrors> {
    let cfg = Config::from_yaml(file, text, vars)?;
    Gateway::build(&cfg)
}

/// Load and compile a gateway config file (what `fanout validate` checks).
pub fn load_gateway_file(path: &str, vars: VarLookup<'_>) -> Result<Gateway, ConfigErrors> {
    let cfg = Config::from_file(path, vars)?;
    Gateway::build(&cfg)
}

/// A gateway running on a bound port.
pub struct RunningGateway {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningGateway {
    /// Stop accepting, let in-flight requests finish (within the grace period), wait.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Bind `addr` and serve `gateway` in a background task.
/// Reference data is loaded first: a required dataset that cannot be loaded fails the start.
pub async fn start_gateway(gateway: Gateway, addr: &str) -> std::io::Result<RunningGateway> {
    gateway.start().await.map_err(std::io::Error::other)?;
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(fanout_proxy::serve(
        Arc::new(gateway),
        listener,
        async move {
            let _ = rx.await;
        },
    ));
    Ok(RunningGateway {
        addr: bound,
        stop: Some(tx),
        task,
    })
}

/// Resolves when the process gets Ctrl-C or SIGTERM.
///
/// SIGHUP (by default fatal) is logged and ignored while this waits: config reload does not
/// exist yet, and `kill -HUP` out of habit must not take the gateway down.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "cannot handle SIGHUP: it will stop the process");
                None
            }
        };
        let stop = async {
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {},
                        _ = term.recv() => {},
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        };
        tokio::pin!(stop);
        loop {
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                Some(()) = hangup => {
                    tracing::warn!("SIGHUP received: config reload is not supported yet; ignoring");
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
