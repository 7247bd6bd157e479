//! Keep-alive HTTP/1.1 connections to one plain-`http` address, kept by fanout itself.
//!
//! hyper-util's legacy client costs every call a pool lookup keyed by scheme and authority
//! (SipHash over the authority, byte by byte, and comparisons), a spawned task per HTTP/1 answer
//! to wait for its connection to be reusable, and several moves of its large request future —
//! ~10 % of the instructions of a one-call route. A [`H1Pool`] belongs to one address, so it
//! needs no key: a call takes the most recently idle connection (LIFO: a small hot set carries
//! the load and the rest age out), sends on it, reads the whole answer and gives the connection
//! back. `https` and HTTP/2 addresses keep the legacy client (TLS, ALPN, multiplexing).
//!
//! Guarantees (the legacy pool's, kept):
//! - a connection is reused only when its previous answer was read to the end and the server did
//!   not close it (`Connection: close`, HTTP/1.0, a broken answer: the connection ends and is
//!   dropped); a call dropped before its answer ended closes its connection (hyper's rule);
//! - a request that a reused connection could not send (the server closed it while idle) is
//!   sent again, once, on a new connection — it never reached the server, so this is safe for any
//!   method;
//! - at most `pool_max_idle` idle connections are kept; an idle connection older than
//!   `pool_idle_timeout` is closed (checked when a call looks for one, and by a reaper task that
//!   runs only while connections are idle);
//! - connecting (name resolution and TCP) is bounded by `connect_timeout`.
//!
//! Per core (`server.runtime: per_core`): the idle connections are kept in one shard per core
//! ([`fanout_runtime::cores::shard`]), each with its own `pool_max_idle` and reaper. A
//! connection's task runs on the runtime of the core that made it, and only that core's calls
//! take it, so a call never wakes another core's thread. On the work-stealing runtime every
//! thread uses shard 0: one pool, as before.

use crate::body::CallBody;
use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Why a call on a [`H1Pool`] got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum H1Error {
    /// No connection could be made (resolution, refusal, `connect_timeout`).
    #[error("connecting to {address} failed: {detail}")]
    Connect {
        /// `host:port`.
        address: String,
        /// What failed.
        detail: String,
    },
    /// The connection failed while the request was sent or the answer's head read.
    #[error("{0}")]
    Exchange(#[source] hyper::Error),
}

impl H1Error {
    /// Whether the request never reached a server.
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, H1Error::Connect { .. })
    }
}

/// An idle connection and when it became idle.
struct Idle {
    conn: SendRequest<CallBody>,
    since: Instant,
}

/// Keep-alive HTTP/1.1 connections to one `http://` address.
pub(crate) struct H1Pool {
    /// The host to resolve (IPv6 without brackets) and the port.
    host: String,
    port: u16,
    /// One shard per core ([`fanout_runtime::cores::shard`]).
    shards: Box<[Shard]>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
}

/// The idle connections of one core.
#[derive(Default)]
struct Shard {
    idle: Mutex<Vec<Idle>>,
    /// A reaper task is running on this core (it ends when no connection is idle).
    reaping: AtomicBool,
}

impl Shard {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection taken from (or made for) the pool; [`H1Pool::put`] gives it back.
pub(crate) struct H1Conn(SendRequest<CallBody>);

impl H1Pool {
    /// The pool of an `http://` address (its port 80 when the authority names none).
    pub(crate) fn new(
        authority: &Authority,
        max_idle: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
    ) -> Arc<H1Pool> {
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Arc::new(H1Pool {
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
            shards: (0..fanout_runtime::cores::shard_count())
                .map(|_| Shard::default())
                .collect(),
            max_idle,
            idle_timeout,
            connect_timeout,
        })
    }

    /// This thread's shard; `None` on a thread outside the cores of a per-core gateway (its
    /// calls get a new connection, closed after the call: it is never kept for a core).
    fn shard(&self) -> Option<(usize, &Shard)> {
        let i = fanout_runtime::cores::shard(self.shards.len())?;
        self.shards.get(i).map(|s| (i, s))
    }

    /// Send `req` (its URI in origin form: the path and query) and return the answer's head and
    /// body; the caller reads the body and then gives the connection back with [`H1Pool::put`].
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut req: Request<CallBody>,
    ) -> Result<(Response<Incoming>, H1Conn), H1Error> {
        if let Some(mut conn) = self.take() {
            if !conn.is_ready() && conn.ready().await.is_err() {
                // Closed while settling after its previous answer: a new connection instead.
            } else {
                match conn.try_send_request(req).await {
                    Ok(resp) => return Ok((resp, H1Conn(conn))),
                    Err(mut e) => match e.take_message() {
                        // Not sent (the server closed the idle connection): once more, on a new
                        // connection.
                        Some(r) => req = r,
                        None => return Err(H1Error::Exchange(e.into_error())),
                    },
                }
            }
        }
        let mut conn = self.connect().await?;
        match conn.send_request(req).await {
            Ok(resp) => Ok((resp, H1Conn(conn))),
            Err(e) => Err(H1Error::Exchange(e)),
        }
    }

    /// The most recently idle connection still open and young enough.
    fn take(&self) -> Option<SendRequest<CallBody>> {
        let mut idle = self.shard()?.1.idle();
        while let Some(i) = idle.pop() {
            if !i.conn.is_closed() && i.since.elapsed() < self.idle_timeout {
                return Some(i.conn);
            }
        }
        None
    }

    /// Give a connection back after its answer was read to the end (dropped instead when the
    /// server closed it or `pool_max_idle` are already idle).
    pub(crate) fn put(self: &Arc<Self>, conn: H1Conn) {
        let conn = conn.0;
        if conn.is_closed() || self.max_idle == 0 {
            return;
        }
        let Some((i, shard)) = self.shard() else {
            return;
        };
        {
            let mut idle = shard.idle();
            if idle.len() >= self.max_idle {
                return;
            }
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
        if !shard.reaping.swap(true, Ordering::AcqRel)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(reap(Arc::downgrade(self), i, self.idle_timeout));
        }
    }

    /// A new connection (resolution and TCP within `connect_timeout`), its task spawned.
    async fn connect(&self) -> Result<SendRequest<CallBody>, H1Error> {
        let fail = |detail: String| H1Error::Connect {
            address: format!("{}:{}", self.host, self.port),
            detail,
        };
        let stream = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| {
            fail(format!(
                "no connection within connect_timeout ({} ms)",
                self.connect_timeout.as_millis()
            ))
        })?
        .map_err(|e| fail(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = handshake(stream).await.map_err(|e| fail(e.to_string()))?;
        tokio::spawn(async move {
            // Ends when the server closes, the answer is broken, or every handle is dropped.
            let _ = conn.await;
        });
        Ok(send)
    }
}

/// The HTTP/1 client side of a new connection over `io` (the connection's task is the caller's
/// to run): the one place the pool's HTTP/1 options are set, shared with the fuzz entry
/// ([`crate::fuzzing::h1_answer`]) so that it parses answers as the pool does.
pub(crate) async fn handshake<T>(
    io: T,
) -> hyper::Result<(
    SendRequest<CallBody>,
    hyper::client::conn::http1::Connection<TokioIo<T>, CallBody>,
)>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    hyper::client::conn::http1::handshake(TokioIo::new(io)).await
}

/// Close the idle connections of shard `shard` older than `every` (the idle timeout), checking
/// every `every / 2` (at least 100 ms); ends when none is idle (the next [`H1Pool::put`] starts
/// another) or the pool is gone.
async fn reap(pool: Weak<H1Pool>, shard: usize, every: Duration) {
    let tick = (every / 2).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(tick).await;
        let Some(p) = pool.upgrade() else { return };
        let Some(s) = p.shards.get(shard) else { return };
        let mut idle = s.idle();
        idle.retain(|i| !i.conn.is_closed() && i.since.elapsed() < p.idle_timeout);
        if idle.is_empty() {
            s.reaping.store(false, Ordering::Release);
            return;
        }
    }
}

#[cfg(test)]
mod differential;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the test server saw: connections accepted, connections the client closed.
    #[derive(Default)]
    struct Seen {
        accepted: AtomicUsize,
        closed_by_client: AtomicUsize,
    }

    /// How the test server ends a connection.
    #[derive(Clone, Copy, PartialEq)]
    enum Close {
        /// Keep-alive: never (the client closes).
        Never,
        /// `connection: close` on every answer, then close.
        Header,
        /// Close after every answer without saying so (as a server ends an idle keep-alive
        /// connection).
        Silently,
    }

    /// A minimal HTTP/1.1 server: answers every request `200 ok`, ending connections as `close`
    /// says; `gate` holds every answer until that many connections are open.
    async fn server(close: Close, gate: usize) -> (Authority, Arc<Seen>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                s.accepted.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 1024];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => {
                                s.closed_by_client.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            while s.accepted.load(Ordering::SeqCst) < gate {
                                tokio::task::yield_now().await;
                            }
                            let head = if close == Close::Header {
                                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                            } else {
                                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                            };
                            if sock.write_all(head.as_bytes()).await.is_err()
                                || close != Close::Never
                            {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (authority, seen)
    }

    fn pool(a: &Authority, max_idle: usize, idle_timeout: Duration) -> Arc<H1Pool> {
        H1Pool::new(a, max_idle, idle_timeout, Duration::from_secs(5))
    }

    /// One call: `GET /` in origin form, the body read to the end, the connection given back.
    async fn call(p: &Arc<H1Pool>) -> Result<Bytes, H1Error> {
        let req = Request::builder()
            .uri("/")
            .header("host", "test")
            .body(CallBody::new(Bytes::new()))
            .unwrap();
        let (resp, conn) = p.send(req).await?;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        p.put(conn);
        Ok(body)
    }

    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(
                std::time::Instant::now() < end,
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Per core, a core's calls take only the connections its own calls gave back: a
    /// connection (whose task runs on the runtime that made it) never serves another core.
    #[test]
    fn each_core_keeps_its_own_idle_connections() {
        if fanout_runtime::cores::shard_count() < 2 {
            eprintln!("note: one core on this machine: a single shard, nothing to check");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (authority, seen) = rt.block_on(server(Close::Never, 0));
        let p = pool(&authority, 8, Duration::from_secs(60));
        // A core's thread: marked, one current-thread runtime, `n` sequential calls.
        let on_core = |core: usize, n: usize| {
            let p = p.clone();
            std::thread::spawn(move || {
                fanout_runtime::cores::enter(core);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    for _ in 0..n {
                        assert_eq!(call(&p).await.unwrap(), "ok");
                    }
                    p.shard().unwrap().1.idle().len()
                })
            })
            .join()
            .unwrap()
        };
        // The server runs on a thread of its own for the rest of the test binary.
        std::thread::spawn(move || rt.block_on(std::future::pending::<()>()));
        // Core 1 makes one connection and reuses it; core 0 cannot take it and makes its own.
        assert_eq!(on_core(1, 3), 1);
        assert_eq!(on_core(0, 3), 1);
        assert_eq!(
            seen.accepted.load(Ordering::SeqCst),
            2,
            "one connection per core"
        );
        assert_eq!(p.shards[0].idle().len(), 1);
        assert_eq!(p.shards[1].idle().len(), 1);
    }

    #[tokio::test]
    async fn sequential_calls_share_one_keep_alive_connection() {
        let (a, seen) = server(Close::Never, 0).await;
        let p = pool(&a, 8, Duration::from_secs(60));
        for _ in 0..5 {
            assert_eq!(call(&p).await.unwrap(), "ok");
        }
        assert_eq!(seen.accepted.load(Ordering::SeqCst), 1);
        assert_eq!(p.shard().unwrap().1.idle().len(), 1);
    }

    #[tokio::test]
    async fn an_answer_with_connection_close_is_not_reused() {
        let (a, seen) = server(Close::Header, 0).await;
        let p = pool(&a, 8, Duration::from_secs(60));
        for _ in 0..3 {
            assert_eq!(call(&p).await.unwrap(), "ok");
        }
        assert_eq!(seen.accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn idle_connections_beyond_max_idle_are_closed_and_the_rest_after_the_idle_timeout() {
        // Three calls in flight at once (the server answers when all three are connected).
        let (a, seen) = server(Close::Never, 3).await;
        let p = pool(&a, 1, Duration::from_millis(300));
        let (x, y, z) = tokio::join!(call(&p), call(&p), call(&p));
        for r in [x, y, z] {
            assert_eq!(r.unwrap(), "ok");
        }
        assert_eq!(seen.accepted.load(Ordering::SeqCst), 3);
        // Two are dropped at once (max_idle 1) …
        wait_until("two connections closed", || {
            seen.closed_by_client.load(Ordering::SeqCst) >= 2
        })
        .await;
        // … and the idle one by the reaper, after the idle timeout.
        wait_until("the idle connection closed", || {
            seen.closed_by_client.load(Ordering::SeqCst) == 3
        })
        .await;
        assert!(p.shard().unwrap().1.idle().is_empty());
        assert!(
            !p.shard().unwrap().1.reaping.load(Ordering::SeqCst),
            "the reaper ended"
        );
        // The pool still works: a new connection.
        assert_eq!(call(&p).await.unwrap(), "ok");
        assert_eq!(seen.accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_not_used_again() {
        let (a, seen) = server(Close::Silently, 0).await;
        let p = pool(&a, 8, Duration::from_secs(60));
        assert_eq!(call(&p).await.unwrap(), "ok");
        wait_until("the idle connection seen closed", || {
            p.shard()
                .unwrap()
                .1
                .idle()
                .iter()
                .all(|i| i.conn.is_closed())
        })
        .await;
        assert_eq!(call(&p).await.unwrap(), "ok");
        assert_eq!(seen.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error_naming_the_address() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let a = Authority::try_from(format!("127.0.0.1:{port}")).unwrap();
        let p = pool(&a, 8, Duration::from_secs(60));
        let e = call(&p).await.unwrap_err();
        assert!(e.is_connect(), "{e}");
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
