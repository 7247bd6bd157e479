//! The backend-call layer: the one interface every step kind's I/O goes through.
//!
//! A [`Backend`] takes a fully built [`CallRequest`] and returns a [`CallResponse`]. Each backend
//! protocol's client in `fanout-proxy` implements it (HTTP and gRPC, databases); hedging,
//! retries, bulkheads, breakers, dedup and caches are layers (`Arc<dyn Backend>` around
//! `Arc<dyn Backend>`), stacked per backend by `fanout-proxy/src/stack.rs` — the executor does
//! not change. What counts as a failure is decided once, in the `outcome` module.

use bytes::Bytes;
use futures_util::future::BoxFuture;
pub use http::uri::PathAndQuery;
use http::{HeaderMap, Method, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub use crate::error::{CallError, CallErrorKind, RejectReason, ServerTimeout};

/// A call, ready to send: what its protocol sends ([`Call`]) and what every layer needs to know
/// of it (its time, whether it may be sent twice, its trace).
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// What is sent, in the shape of the backend's protocol.
    pub call: Call,
    /// Time this call may take: min(step timeout, remaining request budget).
    pub timeout: Duration,
    /// The request's deadline (the backend may forward the remaining budget).
    pub deadline: Instant,
    /// Whether sending the call twice is harmless (GET/HEAD, batch lookups, read-only statements,
    /// or steps marked `idempotent: true`): only such calls are retried or hedged.
    pub idempotent: bool,
    /// The call's trace context, when the request is traced or its attempts counted (set by the
    /// executor, annotated by the layers, recorded by the protocol client). Not part of the
    /// call's identity: a shared call carries its first caller's context. Inline, not boxed: a
    /// call of every request carries one while the live page records steps.
    pub trace: Option<crate::trace::CallTrace>,
}

/// What a call sends, per protocol. Each shape defines its identity ([`Call::key`]) and whether
/// it only reads ([`Call::is_safe`]); the layers (dedup, caches, retries, breakers) use nothing
/// else of it, so they apply to every protocol unchanged.
#[derive(Debug, Clone)]
pub enum Call {
    /// An HTTP request (HTTP/1.1, HTTP/2; gRPC is an HTTP/2 POST whose body is the framed
    /// message).
    Http(HttpCall),
    /// One SQL statement with its parameters (a database backend, `sql` steps).
    Sql(SqlCall),
}

/// An HTTP request of a call.
#[derive(Debug, Clone)]
pub struct HttpCall {
    /// HTTP method.
    pub method: Method,
    /// Path and query, starting with `/`, relative to the backend's base URL: checked once when
    /// the call is built (a constant path once per config), cloned without copying.
    pub path_and_query: PathAndQuery,
    /// Headers set by the step (the backend adds its static headers).
    pub headers: HeaderMap,
    /// Request body (empty for none).
    pub body: Bytes,
}

/// The parameters of a [`SqlCall`].
pub type SqlParams = smallvec::SmallVec<[fanout_expr::Val; 4]>;

/// A SQL statement of a call: the text is the config's (never built from request data), the
/// parameters are values, typed by the prepared statement when they are sent.
#[derive(Debug, Clone)]
pub struct SqlCall {
    /// The statement, exactly as written in the config.
    pub statement: Arc<str>,
    /// `$1`, `$2`, …: JSON values of the flow (inline up to four: no allocation per call).
    pub params: SqlParams,
    /// Whether the statement only reads (`read_only`): shared by dedup and cached like a GET.
    pub read_only: bool,
    /// The answer is the rows alone (`[...]`) instead of `{"rows": [...], "rows_affected": N}`:
    /// what every mode but `exec` takes, without a wrapper object made and taken apart per call.
    /// Part of the call's identity (the answers differ).
    pub rows_only: bool,
    /// With `rows_only`: an answer of exactly one row is that row alone (an object), not an
    /// array of one — what `one` and `optional` take, without an array made and taken apart per
    /// call; none or several rows are still the array. Part of the call's identity.
    pub single_row: bool,
    /// Deepest nesting of the answer as a value (`server.expressions.max_depth`): a json/jsonb
    /// column nested deeper is refused like a backend's answer would be. Not part of the call's
    /// identity (one setting for the whole config).
    pub max_depth: usize,
}

/// The identity of a call: everything it sends — for HTTP, the method, path with query, every
/// header the step set (sorted by name, so their order does not matter) and the body; for SQL,
/// the statement and its parameters with their JSON types. Anything shared between requests
/// (in-flight dedup, answer caches) is keyed by it (within one backend, which fixes the address
/// and the database role), so two calls share an answer only when they would have sent the same
/// bytes. Time budgets are not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallKey(Bytes);

impl CallKey {
    /// The key's bytes (for tests and diagnostics).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The operation of a gRPC call to a method without side effects (`idempotency_level =
/// NO_SIDE_EFFECTS`, or a step marked `idempotent`): HTTP's `QUERY` — safe, idempotent, with a
/// body — so that dedup and caches share such calls like GETs. The gRPC client sends every call
/// as POST, whatever this says; other gRPC calls are `POST`.
pub fn query_method() -> Method {
    Method::from_bytes(b"QUERY").unwrap_or(Method::POST)
}

impl CallRequest {
    /// An HTTP call with the given parts; no time budget yet (the executor sets it when the call
    /// starts), not idempotent, no trace.
    pub fn http(method: Method, path_and_query: PathAndQuery) -> CallRequest {
        CallRequest::new(Call::Http(HttpCall {
            method,
            path_and_query,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }))
    }

    /// A call of the given shape; no time budget yet, not idempotent, no trace.
    pub fn new(call: Call) -> CallRequest {
        CallRequest {
            call,
            timeout: Duration::ZERO,
            deadline: Instant::now(),
            idempotent: false,
            trace: None,
        }
    }

    /// The HTTP request, when the call is one.
    pub fn as_http(&self) -> Option<&HttpCall> {
        match &self.call {
            Call::Http(h) => Some(h),
            Call::Sql(_) => None,
        }
    }

    /// The HTTP request, when the call is one (mutable).
    pub fn as_http_mut(&mut self) -> Option<&mut HttpCall> {
        match &mut self.call {
            Call::Http(h) => Some(h),
            Call::Sql(_) => None,
        }
    }

    /// Whether the call reads without side effects (see [`Call::is_safe`]).
    pub fn is_safe(&self) -> bool {
        self.call.is_safe()
    }

    /// This call's identity (see [`CallKey`]).
    pub fn key(&self) -> CallKey {
        self.call.key()
    }
}

impl Call {
    /// Whether the call reads without side effects — GET, HEAD, a gRPC call to a method that has
    /// none (`QUERY`, [`query_method`]), a read-only statement: only such calls are shared by
    /// dedup and cached.
    pub fn is_safe(&self) -> bool {
        match self {
            Call::Http(h) => {
                h.method == Method::GET || h.method == Method::HEAD || h.method.as_str() == "QUERY"
            }
            Call::Sql(s) => s.read_only,
        }
    }

    /// The call's identity (see [`CallKey`]).
    pub fn key(&self) -> CallKey {
        match self {
            Call::Http(h) => h.key(),
            Call::Sql(s) => s.key(),
        }
    }

    /// The call for a log line or a span: `GET /path`, or `SQL` and the statement's first line.
    pub fn describe(&self) -> String {
        match self {
            Call::Http(h) => format!("{} {}", h.method, h.path_and_query),
            Call::Sql(s) => format!("SQL {}", s.statement.lines().next().unwrap_or("")),
        }
    }
}

/// Length-prefixed fields: no choice of bytes in one field can imitate another field.
fn field(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

impl HttpCall {
    fn key(&self) -> CallKey {
        let mut headers: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        headers.sort_unstable();
        let len = self.method.as_str().len()
            + self.path_and_query.as_str().len()
            + headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 16)
                .sum::<usize>()
            + self.body.len()
            + 32;
        let mut out = Vec::with_capacity(len);
        field(&mut out, self.method.as_str().as_bytes());
        field(&mut out, self.path_and_query.as_str().as_bytes());
        field(&mut out, &(headers.len() as u64).to_le_bytes());
        for (k, v) in headers {
            field(&mut out, k.as_bytes());
            field(&mut out, v);
        }
        field(&mut out, &self.body);
        CallKey(Bytes::from(out))
    }
}

impl SqlCall {
    fn key(&self) -> CallKey {
        let mut out = Vec::with_capacity(self.statement.len() + 64);
        // A tag no HTTP method can be (methods are tokens: no spaces).
        field(&mut out, b"SQL statement");
        field(&mut out, self.statement.as_bytes());
        field(
            &mut out,
            match (self.rows_only, self.single_row) {
                (true, true) => &b"row"[..],
                (true, false) => b"rows",
                (false, _) => b"answer",
            },
        );
        let mut params = Vec::with_capacity(32);
        for p in &self.params {
            params.clear();
            fanout_expr::json::write(p, &mut params);
            field(&mut out, &params);
        }
        CallKey(Bytes::from(out))
    }
}

/// A backend's answer.
#[derive(Debug, Clone)]
pub struct CallResponse {
    /// Status code.
    pub status: StatusCode,
    /// Body bytes (already size-limited by the backend); empty when the protocol answered a
    /// value instead ([`CallResponse::value`]).
    pub body: Bytes,
    /// The answer as a value, when the protocol client built one from its wire format (a
    /// database's rows): the step takes it as is instead of parsing JSON text. Caches
    /// and dedup share it like bytes; what must store bytes (the shared cache) asks
    /// [`CallResponse::bytes`].
    pub value: Option<fanout_expr::Val>,
    /// The answer's parsed value, made once for every caller that shares this answer: set (empty)
    /// by the dedup layer on a shared call, filled by the first caller that parses the body, then
    /// taken by the others instead of parsing it again. `None` (nothing to share) elsewhere;
    /// never kept by the caches (they count bytes, not values).
    pub parsed: Option<Arc<ParsedOnce>>,
}

/// See [`CallResponse::parsed`]: the value and the depth limit it was parsed under (a caller
/// with another limit parses for itself).
pub type ParsedOnce = std::sync::OnceLock<(usize, fanout_expr::Val)>;

impl CallResponse {
    /// The answer as JSON bytes: the body, or the value's JSON text when the answer is a value.
    pub fn bytes(&self) -> Bytes {
        match &self.value {
            Some(v) if self.body.is_empty() => {
                let mut out = Vec::with_capacity(256);
                fanout_expr::json::write(v, &mut out);
                Bytes::from(out)
            }
            _ => self.body.clone(),
        }
    }
}

/// Something that answers calls: a protocol client (HTTP/1.1, HTTP/2, gRPC) and the policy
/// layers that wrap it. Implementations must be cheap to call concurrently. What a
/// backend is called and how its statuses reach clients are properties of its stack (the
/// config), not of each layer.
pub trait Backend: Send + Sync + 'static {
    /// Perform one call. Dropping the future cancels the call (the connection or stream is closed).
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>>;

    /// Open one streamed call (pass-through routes, [`crate::stream`]): the request's body is
    /// sent as the transport takes it, the answer comes back once its head has arrived, its body
    /// still to be read. A protocol that cannot carry one answers
    /// [`CallErrorKind::Invalid`](crate::CallErrorKind::Invalid) (the default); every layer
    /// passes it down, applying what it can to a stream.
    fn open(
        &self,
        req: crate::stream::StreamRequest,
    ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
        let _ = req;
        Box::pin(async { Err(crate::stream::not_streaming()) })
    }
}

impl crate::trace::AnswerStatus for CallResponse {
    fn status(&self) -> StatusCode {
        self.status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_expr::Val;

    fn sql(params: &[Val], rows_only: bool) -> CallKey {
        sql_shaped(params, rows_only, false)
    }

    fn sql_shaped(params: &[Val], rows_only: bool, single_row: bool) -> CallKey {
        Call::Sql(SqlCall {
            statement: "SELECT name FROM users WHERE id = $1".into(),
            params: params.iter().cloned().collect(),
            read_only: true,
            rows_only,
            single_row,
            max_depth: 64,
        })
        .key()
    }

    #[test]
    fn a_statements_identity_is_its_text_its_typed_parameters_and_the_answer_it_asks_for() {
        let one = [Val::from(1usize)];
        assert_eq!(sql(&one, true), sql(&one, true));
        // The rows alone and `{rows, rows_affected}` are different answers: never shared.
        assert_ne!(sql(&one, true), sql(&one, false));
        // Nor the one row alone and the rows.
        assert_ne!(sql_shaped(&one, true, true), sql(&one, true));
        assert_eq!(sql_shaped(&one, true, true), sql_shaped(&one, true, true));
        assert_ne!(sql(&one, true), sql(&[Val::from(2usize)], true));
        // 1 and "1" are different parameters.
        assert_ne!(
            sql(&one, true),
            sql(&[fanout_expr::json::str_val("1")], true)
        );
    }
}
