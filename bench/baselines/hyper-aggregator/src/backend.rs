//! One backend: a pooled HTTP/1.1 keep-alive client and the call timeout of the examples'
//! `fanout.yaml`. A call waits min(timeout, time left before the request deadline), tells the
//! backend that budget in `x-request-timeout`, and yields the answer parsed as JSON.

use crate::DEADLINE_HEADER;
use crate::error::Error;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::Value;
use std::time::Duration;
use tokio::time::Instant;

/// Largest accepted backend answer (fanout's default `max_response_bytes`).
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// A named backend with its own connection pool.
pub(crate) struct Backend {
    /// fanout's backend name, for error bodies.
    pub(crate) name: &'static str,
    /// `http://host:port`
    origin: String,
    /// Per-call timeout.
    timeout: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Backend {
    /// A backend at `addr` (`host:port`). No network I/O: connections open on first use.
    pub(crate) fn new(name: &'static str, addr: &str, timeout: Duration) -> Backend {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(500)));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        Backend {
            name,
            origin: format!("http://{addr}"),
            timeout,
            client,
        }
    }

    /// `GET path_and_query` on behalf of flow step `step`, answered before the call timeout and
    /// the request `deadline`. An empty answer is `null`.
    pub(crate) async fn get(
        &self,
        path_and_query: &str,
        step: &'static str,
        deadline: Instant,
    ) -> Result<Value, Error> {
        let timeout = self
            .timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let budget_ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let uri = format!("{}{path_and_query}", self.origin);
        let request = Request::get(&uri)
            .header(DEADLINE_HEADER, budget_ms)
            .body(Empty::new())
            .map_err(|e| {
                self.error(
                    StatusCode::BAD_GATEWAY,
                    "backend_unavailable",
                    step,
                    format!("invalid request to `{uri}`: {e}"),
                )
            })?;
        let (status, body) = match tokio::time::timeout(timeout, self.fetch(request, step)).await {
            Ok(answer) => answer?,
            Err(_) => return Err(self.timed_out(step, timeout)),
        };
        if !status.is_success() {
            let snippet = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            let sep = if snippet.is_empty() { "" } else { ": " };
            return Err(self.error(
                StatusCode::BAD_GATEWAY,
                "backend_status",
                step,
                format!("answered {}{sep}{snippet}", status.as_u16()),
            ));
        }
        if body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|e| {
            self.error(
                StatusCode::BAD_GATEWAY,
                "bad_backend_answer",
                step,
                format!("answered invalid JSON: {e}"),
            )
        })
    }

    /// Send the request and read the whole answer.
    async fn fetch(
        &self,
        request: Request<Empty<Bytes>>,
        step: &'static str,
    ) -> Result<(StatusCode, Bytes), Error> {
        let resp = self.client.request(request).await.map_err(|e| {
            let code = if e.is_connect() {
                "backend_unavailable"
            } else {
                "backend_reset"
            };
            self.error(StatusCode::BAD_GATEWAY, code, step, describe(&e))
        })?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    self.error(
                        StatusCode::BAD_GATEWAY,
                        "bad_backend_answer",
                        step,
                        format!("answer larger than {MAX_RESPONSE_BYTES} bytes"),
                    )
                } else {
                    self.error(
                        StatusCode::BAD_GATEWAY,
                        "backend_reset",
                        step,
                        format!("reading the answer failed: {}", describe(&*e)),
                    )
                }
            })?
            .to_bytes();
        Ok((parts.status, body))
    }

    /// 504: the call's own timeout (`backend_timeout`) or, when the request deadline cut the
    /// wait short, `deadline_exceeded`.
    fn timed_out(&self, step: &'static str, waited: Duration) -> Error {
        let waited_ms = format!("{:.1} ms", waited.as_secs_f64() * 1000.0);
        let (code, message) = if waited < self.timeout {
            (
                "deadline_exceeded",
                format!(
                    "step `{step}`: the request deadline passed after waiting {waited_ms} for backend `{}`",
                    self.name
                ),
            )
        } else {
            (
                "backend_timeout",
                format!(
                    "step `{step}`: backend `{}` did not answer within its timeout ({waited_ms})",
                    self.name
                ),
            )
        };
        Error::call(StatusCode::GATEWAY_TIMEOUT, code, step, self.name, message)
    }

    fn error(
        &self,
        status: StatusCode,
        code: &'static str,
        step: &'static str,
        what: String,
    ) -> Error {
        let message = format!("step `{step}`: backend `{}`: {what}", self.name);
        Error::call(status, code, step, self.name, message)
    }
}

/// An error with its chain of causes (`connection refused` is usually a source, not the top).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
