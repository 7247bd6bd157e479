//! One gRPC backend: a `tonic::client::Grpc` over a shared hyper-util HTTP/2 (h2c) client — no
//! tonic transport, no tower. A call waits min(call timeout, time left before the request
//! deadline), tells the backend that budget in `grpc-timeout`, and maps every failure to the
//! aggregate's status: DEADLINE_EXCEEDED for a timeout, UNAVAILABLE for anything else.

use http::Uri;
use http::uri::PathAndQuery;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;
use tokio::time::Instant;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// The HTTP client every backend shares: HTTP/2 only with prior knowledge (h2c), `TCP_NODELAY`,
/// and keepalive PINGs as fanout's gRPC backends have them by default (a PING after 1 s without
/// a frame, 1 s to answer it, idle connections too: the lesson of seed 004, where a frozen peer
/// hung calls for 20 s), so the two do the same work per call. Each backend address gets one
/// multiplexed connection from its pool, as with a tonic `Channel`.
pub(crate) type HttpClient = Client<HttpConnector, tonic::body::Body>;

/// Build the shared client.
pub(crate) fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_millis(500)));
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(Some(Duration::from_secs(1)))
        .http2_keep_alive_timeout(Duration::from_secs(1))
        .http2_keep_alive_while_idle(true)
        .build(connector)
}

/// `http://addr` for `addr` = `host:port`; anything else is an error naming `what` (the backend
/// or its variable).
pub(crate) fn origin(what: &str, addr: &str) -> Result<Uri, String> {
    let invalid = |why: &dyn std::fmt::Display| format!("{what}: invalid address `{addr}`: {why}");
    let origin: Uri = format!("http://{addr}").parse().map_err(|e| invalid(&e))?;
    let host_and_port = origin.host().is_some_and(|h| !h.is_empty()) && origin.port().is_some();
    if !host_and_port || origin.path() != "/" || origin.query().is_some() {
        return Err(invalid(&"expected host:port"));
    }
    Ok(origin)
}

/// A named backend: its origin and its per-call timeout.
pub(crate) struct Backend {
    /// For error messages: `users`, `orders`, `recs`.
    name: &'static str,
    grpc: tonic::client::Grpc<HttpClient>,
    timeout: Duration,
}

impl Backend {
    /// A backend at `addr` (`host:port`, plain h2c). No network I/O: the connection opens on
    /// first use.
    pub(crate) fn new(
        name: &'static str,
        client: HttpClient,
        addr: &str,
        timeout: Duration,
    ) -> Result<Backend, String> {
        Ok(Backend {
            name,
            grpc: tonic::client::Grpc::with_origin(
                client,
                origin(&format!("backend `{name}`"), addr)?,
            ),
            timeout,
        })
    }

    /// Call unary method `path` with `message`, answered before the call timeout and the request
    /// `deadline` (if the client sent one).
    pub(crate) async fn call<Req, Resp>(
        &self,
        path: &'static str,
        message: Req,
        deadline: Option<Instant>,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let timeout = match deadline {
            Some(d) => self
                .timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => self.timeout,
        };
        if timeout.is_zero() {
            return Err(self.timed_out(path, timeout));
        }
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        // `unary` takes `&mut self`; the clone is two `Arc`s and the origin.
        let mut grpc = self.grpc.clone();
        let call = async move {
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            grpc.unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Req, Resp>::default(),
            )
            .await
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.failed(path, &status)),
            Err(_) => Err(self.timed_out(path, timeout)),
        }
    }

    /// A non-OK answer (or a transport failure tonic reports as a status): the backend's own
    /// DEADLINE_EXCEEDED (it enforced the budget we sent) stays a deadline, anything else is
    /// UNAVAILABLE. The backend's code and message go into ours.
    fn failed(&self, path: &str, status: &Status) -> Status {
        let message = format!(
            "backend `{}` ({path}) answered {:?}: {}",
            self.name,
            status.code(),
            status.message()
        );
        match status.code() {
            Code::DeadlineExceeded => Status::deadline_exceeded(message),
            _ => Status::unavailable(message),
        }
    }

    fn timed_out(&self, path: &str, waited: Duration) -> Status {
        let what = if waited < self.timeout {
            "the request deadline passed"
        } else {
            "its timeout passed"
        };
        Status::deadline_exceeded(format!(
            "backend `{}` ({path}): {what} after {:.1} ms without an answer",
            self.name,
            waited.as_secs_f64() * 1000.0
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(addr: &str) -> Result<Backend, String> {
        Backend::new("users", http_client(), addr, Duration::from_secs(1))
    }

    #[test]
    fn addresses_are_host_and_port() {
        let ok = |a: &str| origin("users", a).map(|u| u.to_string());
        assert_eq!(ok("127.0.0.1:9301").unwrap(), "http://127.0.0.1:9301/");
        assert!(ok("localhost:80").is_ok());
        assert!(ok("[::1]:80").is_ok());
        assert!(ok("").is_err());
        assert!(ok("bad").is_err());
        assert!(ok(":80").is_err());
        assert!(ok("a b:1").is_err());
        assert!(ok("127.0.0.1:9301/path").is_err());
        assert!(ok("127.0.0.1:9301?x").is_err());
    }

    #[tokio::test]
    async fn failures_map_to_unavailable_or_deadline() {
        let b = backend("127.0.0.1:1").unwrap();
        let s = b.failed(crate::proto::GET_USER, &Status::not_found("no such user"));
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().contains("NotFound: no such user"), "{s:?}");
        let s = b.failed(crate::proto::GET_USER, &Status::deadline_exceeded("late"));
        assert_eq!(s.code(), Code::DeadlineExceeded);
        let s = b.timed_out(crate::proto::GET_USER, Duration::from_millis(3));
        assert_eq!(s.code(), Code::DeadlineExceeded);
        assert!(s.message().contains("request deadline"), "{s:?}");
    }
}
