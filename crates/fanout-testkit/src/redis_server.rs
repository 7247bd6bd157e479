//! A real `redis-server` per test, on an ephemeral port, killed when the guard is dropped; and a
//! few direct commands to look at (or tamper with) what the gateway stored.
//!
//! `redis-server` must be installed (Debian: `apt-get install redis-server`; `.ci/run` does it).
//! The port is found by binding `127.0.0.1:0` and releasing it; should another process take it in
//! between, the server is started again on another one (the server that answers is checked to be
//! ours by its process id).

use redis::aio::MultiplexedConnection;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A running `redis-server` (no persistence), killed on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// Start a server on a free port and wait until it answers `PING`.
    pub async fn start() -> RedisServer {
        for _ in 0..5 {
            if let Some(s) = RedisServer::try_start().await {
                return s;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    async fn try_start() -> Option<RedisServer> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "fanout-redis-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting redis-server ({e}): install it, e.g. `apt-get install redis-server`"
                )
            });
        let mut s = RedisServer { child, port, dir };
        let until = tokio::time::Instant::now() + crate::PATIENCE;
        while tokio::time::Instant::now() < until {
            if s.child.try_wait().ok().flatten().is_some() {
                return None; // exited: most likely the port was taken
            }
            if let Ok(mut c) = s.try_conn().await {
                let pid: redis::RedisResult<String> =
                    redis::cmd("INFO").arg("server").query_async(&mut c).await;
                let ours = format!("process_id:{}", s.child.id());
                return pid
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == ours))
                    .then_some(s);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its URL (RESP3), for a gateway's `redis.url`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/?protocol=resp3", self.port)
    }

    async fn try_conn(&self) -> redis::RedisResult<MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        client.get_multiplexed_async_connection().await
    }

    /// A direct connection (panics when the server does not answer).
    pub async fn conn(&self) -> MultiplexedConnection {
        self.try_conn()
            .await
            .unwrap_or_else(|e| panic!("connect to redis on port {}: {e}", self.port))
    }

    /// `KEYS pattern`, sorted.
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut self.conn().await)
            .await
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// `PTTL key`: milliseconds left, -1 without expiry, -2 when absent.
    pub async fn pttl(&self, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut self.conn().await)
            .await
            .expect("PTTL")
    }

    /// `GET key`.
    pub async fn get(&self, key: &str) -> Option<Vec<u8>> {
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut self.conn().await)
            .await
            .expect("GET")
    }

    /// `SET key value` (no expiry).
    pub async fn set(&self, key: &str, value: &[u8]) {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query_async::<()>(&mut self.conn().await)
            .await
            .expect("SET");
    }

    /// Any command, e.g. `["RPUSH", key, "x"]` (panics when Redis answers an error).
    pub async fn command(&self, args: &[&str]) {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async::<redis::Value>(&mut self.conn().await)
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }

    /// Kill the server (SIGKILL) and wait for it to exit: what a crashed or evicted Redis does.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freeze (`SIGSTOP`) or thaw (`SIGCONT`) the server: a Redis that accepts but never answers.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("kill {sig}: {e}"));
        assert!(status.success(), "kill {sig} failed");
    }
}
