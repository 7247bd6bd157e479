//! `server.runtime: per_core`: one single-threaded tokio runtime per core, each with a listener
//! of its own on the gateway's port (`SO_REUSEPORT`: the kernel spreads new connections), so a
//! request is accepted, run and answered on one thread, and its backend calls go out on that
//! core's own connections ([`fanout_runtime::cores`]). Nothing on the request path wakes
//! another core's thread; what must be shared (dedup tables, caches, admission, breakers, the
//! connection table) is shared as on the work-stealing runtime.
//!
//! The known weakness of a core per connection is a few connections carrying most of the load.
//! Two measures keep both cores busy there:
//! - **Connections are balanced as they arrive**: a core that accepts a connection while it
//!   has more open connections than the least loaded core (by more than an eighth of that
//!   core's, and at least one) hands the connection to that core before serving it (before
//!   the TLS handshake too). With 2 connections on 2 cores each core serves one, whatever the
//!   kernel's hash chose.
//! - **HTTP/2 streams are handed off under pressure**: each stream of an HTTP/2 connection is a
//!   task of its own ([`Exec`]); when the accepting core runs more streams than twice the least
//!   busy core's plus [`HANDOFF_SLACK`], the new stream runs on that core instead. One gRPC
//!   client's thousand streams on one connection then use both cores, while at moderate load
//!   (few streams in flight) every stream stays home.
//!
//! The control thread (the runtime `fanout serve` starts with) runs the admin listener,
//! reloads, signals and background refreshes; it serves no client connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::TcpStream;
use tokio::runtime::Handle;

/// A core's streams over twice the least busy core's by more than this hand new streams off.
pub const HANDOFF_SLACK: usize = 8;

/// One serving core: its runtime and what it carries now.
struct Core {
    handle: Handle,
    /// Open client connections served on this core.
    conns: AtomicUsize,
    /// HTTP/2 streams running on this core.
    streams: AtomicUsize,
    /// Connections this core handed to another on arrival.
    handed_conns: AtomicUsize,
    /// Streams this core handed to another.
    handed_streams: AtomicUsize,
    /// Told when the core gets a connection or stream while it had none: the stall
    /// watchdog's heartbeat on an idle core sleeps until then ([`Cores::until_busy`]).
    busy: tokio::sync::Notify,
}

/// The serving cores of a per-core gateway.
pub struct Cores {
    cores: Box<[Core]>,
}

impl Cores {
    /// The cores whose runtimes are `handles` (core `i` is `handles[i]`).
    pub fn new(handles: Vec<Handle>) -> Cores {
        Cores {
            cores: handles
                .into_iter()
                .map(|handle| Core {
                    handle,
                    conns: AtomicUsize::new(0),
                    streams: AtomicUsize::new(0),
                    handed_conns: AtomicUsize::new(0),
                    handed_streams: AtomicUsize::new(0),
                    busy: tokio::sync::Notify::new(),
                })
                .collect(),
        }
    }

    /// How many cores serve.
    pub fn len(&self) -> usize {
        self.cores.len()
    }

    /// Whether none does (never, once serving).
    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// The core with the fewest of `what`, and that count.
    fn least(&self, what: impl Fn(&Core) -> usize) -> Option<(usize, usize)> {
        self.cores
            .iter()
            .enumerate()
            .map(|(i, c)| (i, what(c)))
            .min_by_key(|&(_, n)| n)
    }

    /// The core a connection accepted on core `me` is served on: `me`, unless `me` has more
    /// open connections than the least loaded core by more than max(1, an eighth of its).
    pub fn core_for_connection(&self, me: usize) -> usize {
        let Some(mine) = self.cores.get(me).map(|c| c.conns.load(Ordering::Relaxed)) else {
            return me;
        };
        match self.least(|c| c.conns.load(Ordering::Relaxed)) {
            Some((j, least)) if j != me && mine >= least + (least / 8).max(1) => j,
            _ => me,
        }
    }

    /// The core a new HTTP/2 stream of a connection on core `me` runs on.
    fn core_for_stream(&self, me: usize) -> usize {
        let Some(mine) = self
            .cores
            .get(me)
            .map(|c| c.streams.load(Ordering::Relaxed))
        else {
            return me;
        };
        match self.least(|c| c.streams.load(Ordering::Relaxed)) {
            Some((j, least)) if j != me && mine > 2 * least + HANDOFF_SLACK => j,
            _ => me,
        }
    }

    /// Count a connection served on core `i` until the guard drops.
    pub fn connection(self: &Arc<Self>, i: usize) -> CoreLoad {
        if let Some(c) = self.cores.get(i)
            && c.conns.fetch_add(1, Ordering::Relaxed) == 0
        {
            c.busy.notify_one();
        }
        CoreLoad {
            cores: self.clone(),
            core: i,
            stream: false,
        }
    }

    /// Record that core `from` handed a connection to another core.
    pub fn handed_connection(&self, from: usize) {
        if let Some(c) = self.cores.get(from) {
            c.handed_conns.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether core `i` serves no connection and runs no stream now.
    pub(crate) fn idle(&self, i: usize) -> bool {
        self.cores.get(i).is_some_and(|c| {
            c.conns.load(Ordering::Relaxed) == 0 && c.streams.load(Ordering::Relaxed) == 0
        })
    }

    /// Resolves once core `i` gets a connection or a stream after having had none (at once
    /// when it got one since the last call; never for a core that does not exist). Call it
    /// after [`Cores::idle`] said so, and look again when it resolves.
    pub(crate) async fn until_busy(&self, i: usize) {
        match self.cores.get(i) {
            Some(c) => c.busy.notified().await,
            None => std::future::pending().await,
        }
    }

    /// Core `i`'s runtime.
    pub fn handle(&self, i: usize) -> Option<&Handle> {
        self.cores.get(i).map(|c| &c.handle)
    }

    /// `/__fanout/status`'s `cores`: per core its open connections, running streams and
    /// hand-offs.
    pub fn status(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.cores
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    serde_json::json!({
                        "core": i,
                        "connections": c.conns.load(Ordering::Relaxed),
                        "streams": c.streams.load(Ordering::Relaxed),
                        "connections_handed_off": c.handed_conns.load(Ordering::Relaxed),
                        "streams_handed_off": c.handed_streams.load(Ordering::Relaxed),
                    })
                })
                .collect(),
        )
    }
}

/// A connection or stream counted on a core while it lives.
pub struct CoreLoad {
    cores: Arc<Cores>,
    core: usize,
    stream: bool,
}

impl Drop for CoreLoad {
    fn drop(&mut self) {
        if let Some(c) = self.cores.cores.get(self.core) {
            let n = if self.stream { &c.streams } else { &c.conns };
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// hyper's executor for the tasks a connection spawns (an HTTP/2 connection's streams): on
/// the work-stealing runtime, `tokio::spawn`; per core, on this core unless it is much busier
/// than another ([`Cores`]).
#[derive(Clone, Default)]
pub struct Exec {
    cores: Option<Arc<Cores>>,
}

impl Exec {
    /// The executor of a per-core gateway's connections.
    pub fn per_core(cores: Arc<Cores>) -> Exec {
        Exec { cores: Some(cores) }
    }
}

impl<F> hyper::rt::Executor<F> for Exec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let (Some(cores), Some(me)) = (&self.cores, fanout_runtime::cores::current()) else {
            tokio::spawn(fut);
            return;
        };
        let target = cores.core_for_stream(me);
        let Some(core) = cores.cores.get(target) else {
            tokio::spawn(fut);
            return;
        };
        if core.streams.fetch_add(1, Ordering::Relaxed) == 0 {
            core.busy.notify_one();
        }
        let load = CoreLoad {
            cores: cores.clone(),
            core: target,
            stream: true,
        };
        let fut = async move {
            let out = fut.await;
            drop(load);
            out
        };
        if target == me {
            tokio::spawn(fut);
        } else {
            if let Some(c) = cores.cores.get(me) {
                c.handed_streams.fetch_add(1, Ordering::Relaxed);
            }
            core.handle.spawn(fut);
        }
    }
}

/// Move an accepted connection to core `to`'s runtime and serve it there with `serve`: its
/// socket leaves this core's reactor and joins the other's. When it cannot (no such core, the
/// socket could not be moved), the socket is closed and `serve` dropped unrun.
pub fn hand_off<F, Fut>(
    cores: &Arc<Cores>,
    to: usize,
    stream: TcpStream,
    peer: SocketAddr,
    serve: F,
) where
    F: FnOnce(TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(handle) = cores.handle(to) else {
        return;
    };
    let stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "a connection could not be handed to another core");
            return;
        }
    };
    handle.spawn(async move {
        match TcpStream::from_std(stream) {
            Ok(s) => serve(s, peer).await,
            Err(e) => tracing::debug!(error = %e, "a connection handed to another core was lost"),
        }
    });
}

/// Bind `n` listening sockets on `addr` sharing its port (`SO_REUSEPORT`), for `n` cores. The
/// address is first bound without `SO_REUSEPORT`, so a port another process listens on is an
/// error (`address in use`) rather than silently shared with it. With port 0, the first
/// socket's port is the others'.
pub fn bind_reuseport(addr: &str, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut addrs = std::net::ToSocketAddrs::to_socket_addrs(addr)?;
    let Some(mut sa) = addrs.next() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr}: no address"),
        ));
    };
    if sa.port() != 0 {
        // Taken by another process (with or without SO_REUSEPORT): refuse, as a plain bind does.
        drop(std::net::TcpListener::bind(sa)?);
    }
    let mut out = Vec::with_capacity(n.max(1));
    for _ in 0..n.max(1) {
        let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&sa.into())?;
        s.listen(1024)?;
        let l: std::net::TcpListener = s.into();
        if sa.port() == 0 {
            sa = l.local_addr()?;
        }
        out.push(l);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cores(n: usize) -> (tokio::runtime::Runtime, Arc<Cores>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = Arc::new(Cores::new(vec![rt.handle().clone(); n]));
        (rt, c)
    }

    #[test]
    fn a_connection_goes_to_the_least_loaded_core_when_its_own_has_more() {
        let (_rt, c) = cores(2);
        // Equal: stays.
        assert_eq!(c.core_for_connection(0), 0);
        let a = c.connection(0);
        // Core 0 has one more than core 1: the next one arriving at core 0 goes to core 1…
        assert_eq!(c.core_for_connection(0), 1);
        // …and one arriving at core 1 stays there.
        assert_eq!(c.core_for_connection(1), 1);
        let b = c.connection(1);
        assert_eq!(c.core_for_connection(0), 0);
        drop((a, b));
        // Many connections: a difference under an eighth stays where it arrived.
        let many: Vec<_> = (0..80)
            .map(|_| c.connection(0))
            .chain((0..75).map(|_| c.connection(1)))
            .collect();
        assert_eq!(c.core_for_connection(0), 0, "80 vs 75: within an eighth");
        let more: Vec<_> = (0..5).map(|_| c.connection(0)).collect();
        assert_eq!(c.core_for_connection(0), 1, "85 vs 75: past an eighth");
        drop((many, more));
        let st = c.status();
        assert!(
            st.as_array().unwrap().iter().all(|s| s["connections"] == 0),
            "{st}"
        );
    }

    #[test]
    fn streams_move_only_when_their_core_runs_more_than_twice_the_other_plus_the_slack() {
        let (_rt, c) = cores(2);
        let hold = |core: usize, n: usize| -> Vec<CoreLoad> {
            (0..n)
                .map(|_| {
                    c.cores[core].streams.fetch_add(1, Ordering::Relaxed);
                    CoreLoad {
                        cores: c.clone(),
                        core,
                        stream: true,
                    }
                })
                .collect()
        };
        let a = hold(0, HANDOFF_SLACK);
        assert_eq!(c.core_for_stream(0), 0, "8 vs 0: stays");
        let b = hold(0, 1);
        assert_eq!(c.core_for_stream(0), 1, "9 vs 0: moves");
        let d = hold(1, 1);
        assert_eq!(c.core_for_stream(0), 0, "9 vs 1: 9 ≤ 2 + 8, stays");
        drop((a, b, d));
        assert_eq!(c.core_for_stream(0), 0);
        assert!(
            c.cores
                .iter()
                .all(|k| k.streams.load(Ordering::Relaxed) == 0)
        );
    }

    #[test]
    fn an_idle_core_is_woken_by_its_first_connection_only() {
        use futures_util::FutureExt;
        let (_rt, c) = cores(2);
        assert!(c.idle(0) && c.idle(1));
        // Nothing arrived: waiting for work does not resolve.
        assert!(c.until_busy(0).now_or_never().is_none());
        // The first connection of core 0 wakes it (the permit is kept for a waiter to come);
        // core 1 is still idle and not woken.
        let a = c.connection(0);
        assert!(!c.idle(0) && c.idle(1));
        assert!(c.until_busy(0).now_or_never().is_some());
        assert!(c.until_busy(1).now_or_never().is_none());
        // A second connection while busy is no new wake-up.
        let b = c.connection(0);
        assert!(c.until_busy(0).now_or_never().is_none());
        drop((a, b));
        assert!(c.idle(0));
        // A stream running on an idle core makes it busy too.
        c.cores[1].streams.fetch_add(1, Ordering::Relaxed);
        let s = CoreLoad {
            cores: c.clone(),
            core: 1,
            stream: true,
        };
        assert!(!c.idle(1));
        drop(s);
        assert!(c.idle(1));
        // A core that does not exist is never idle-woken (and never idle).
        assert!(!c.idle(7));
        assert!(c.until_busy(7).now_or_never().is_none());
    }

    #[test]
    fn reuseport_listeners_share_a_port_and_a_taken_port_is_refused() {
        let ls = bind_reuseport("127.0.0.1:0", 3).unwrap();
        assert_eq!(ls.len(), 3);
        let port = ls[0].local_addr().unwrap().port();
        assert!(ls.iter().all(|l| l.local_addr().unwrap().port() == port));
        // The port is taken (by our own group): a second group is refused, not joined.
        let err = bind_reuseport(&format!("127.0.0.1:{port}"), 2).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    }
}
