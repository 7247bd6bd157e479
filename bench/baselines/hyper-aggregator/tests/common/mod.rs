//! Test harness: the examples' files and the aggregator on an ephemeral 127.0.0.1 port in this
//! process (stubs and the HTTP client come from `fanout_testkit`).
#![allow(dead_code)]

use fanout_stub::StubServer;
use hyper_aggregator::Config;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `examples/<name>` of the workspace.
pub fn example_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../examples")
        .join(name)
}

/// A file of an example, as text.
pub fn example_file(example: &str, file: &str) -> String {
    let path = example_dir(example).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A config pointing at running stubs (`search` → `SEARCH_ADDR`); `extra` overrides variables.
pub fn config(stubs: &StubServer, extra: &[(&str, String)]) -> Config {
    let mut vars: HashMap<String, String> = stubs
        .services()
        .into_iter()
        .map(|(n, a)| (format!("{}_ADDR", n.to_uppercase()), a.to_string()))
        .collect();
    for (k, v) in extra {
        vars.insert(k.to_string(), v.clone());
    }
    Config::from_lookup(|var| vars.get(var).cloned())
}

/// The aggregator serving in a background task.
pub struct Running {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Signal shutdown and wait for `serve` to return.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
            .expect("serve result");
    }
}

/// Start the aggregator with `config` on an ephemeral port.
pub async fn start(config: Config) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(hyper_aggregator::serve(config, listener, async move {
        let _ = rx.await;
    }));
    Running { addr, stop, task }
}

/// An address nothing listens on.
pub async fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    addr.to_string()
}
