//! The request body stage: read completely *before* admission, under the reader cap, the
//! memory budget, the size limit and the read time; refusals drain a bounded part of the rest
//! first so that the client sees its answer, not a broken pipe.

use crate::Gateway;
use crate::answer::{ApiError, BodyRefusal};
use crate::bodies::{Reservation, parsed_size_estimate, value_overhead};
use crate::telemetry::RequestTelemetry;
use bytes::Bytes;
use fanout_expr::{Val, json};
use http::HeaderMap;
use http::header::CONTENT_LENGTH;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::time::Duration;
use tokio::time::Instant;

impl Gateway {
    /// Read body: read completely *before* admission, so a body that trickles in holds a reader
    /// permit (bounded), never a flow slot; requests without a body skip all of it. Refused early
    /// by `Content-Length`, under the reader cap, the memory budget, the size limit while
    /// streaming and the read time ([`BodyRefusal`]; the refusals that may leave a client writing
    /// drain a bounded part of the rest first, with the permit and memory still held). Returns
    /// `$request.body` and the memory it holds, counted against the budget until the request ends.
    pub(crate) async fn read_body(
        &self,
        live: &crate::Live,
        headers: &HeaderMap,
        body: Incoming,
        start: Instant,
        deadline: Instant,
        tel: &mut RequestTelemetry<'_>,
    ) -> Result<(Val, Option<Reservation>), ApiError> {
        let limit = self.limits.max_body_bytes;
        let (bytes, mut memory) = self
            .read_bytes(headers, body, start, deadline, tel, limit)
            .await?;
        let Some(held) = memory.as_mut() else {
            return Ok((Val::Null, None));
        };
        // The edge stages' body phase (the `compression` stage decodes a `Content-Encoding`
        // body, the limit applying to its decoded size); a body a stage replaced counts against
        // the memory budget too.
        let bytes = if live.stages.has_body_phase() {
            let tools = fanout_edge::Tools {
                compute: &self.compute,
            };
            let read = (bytes.as_ptr() as usize, bytes.len());
            let body = live
                .stages
                .on_body(headers, bytes, limit, tools)
                .await
                .map_err(ApiError::from)?;
            if (body.as_ptr() as usize, body.len()) != read
                && held.grow(parsed_size_estimate(&body)).is_err()
            {
                let budget = self.bodies.budget();
                return Err(BodyRefusal::MemoryBudget { budget }.into());
            }
            body
        } else {
            bytes
        };
        Ok((self.parse_body(&bytes)?, memory))
    }

    /// [`Gateway::read_body`] without parsing: the body's bytes (at most `limit`) and the memory
    /// they hold (`None` for a request without a body).
    pub(crate) async fn read_bytes(
        &self,
        headers: &HeaderMap,
        mut body: Incoming,
        start: Instant,
        deadline: Instant,
        tel: &mut RequestTelemetry<'_>,
        limit: usize,
    ) -> Result<(Bytes, Option<Reservation>), ApiError> {
        if hyper::body::Body::is_end_stream(&body) {
            return Ok((Bytes::new(), None));
        }
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|len| len.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit as u64) {
            return Err(refuse(BodyRefusal::TooLarge { limit }, &mut body, deadline).await);
        }
        let Some(reader) = self.bodies.reader() else {
            let max_readers = self.bodies.max_readers();
            return Err(refuse(
                BodyRefusal::ReadersFull { max_readers },
                &mut body,
                deadline,
            )
            .await);
        };
        let mut memory = self.bodies.reservation();
        let declared = declared.map(|n| n as usize);
        let received = self
            .receive(&mut body, &mut memory, declared, start, deadline, limit)
            .await;
        let bytes = match received {
            Ok(bytes) => bytes,
            Err(refusal) => return Err(refuse(refusal, &mut body, deadline).await),
        };
        drop(reader);
        tel.bytes_in = bytes.len() as u64;
        Ok((bytes, Some(memory)))
    }

    /// The body's bytes, all of them, within the time allowance ([`Gateway::read_allowance`]),
    /// the size limit (`server.max_body_bytes`) and the memory budget (`memory`).
    async fn receive(
        &self,
        body: &mut Incoming,
        memory: &mut Reservation,
        declared: Option<usize>,
        start: Instant,
        deadline: Instant,
        limit: usize,
    ) -> Result<Bytes, BodyRefusal> {
        let budget_exhausted = || BodyRefusal::MemoryBudget {
            budget: self.bodies.budget(),
        };
        // A declared length takes its bytes (the part of the estimate known before reading)
        // at once: under contention requests are refused whole, instead of all of them taking
        // part of the budget and none completing. The per-value part is added as data arrives.
        if let Some(n) = declared
            && memory.grow(n.saturating_mul(2)).is_err()
        {
            return Err(budget_exhausted());
        }
        let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0));
        loop {
            let until = self.read_allowance(buf.len(), start, deadline);
            let frame = match tokio::time::timeout_at(until, body.frame()).await {
                Err(_) => {
                    self.bodies.timed_out();
                    return Err(self.too_slow(buf.len(), until, start, deadline));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(BodyRefusal::Broken(e)),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() + data.len() > limit {
                return Err(BodyRefusal::TooLarge { limit });
            }
            let cost = if declared.is_some() {
                value_overhead(&data)
            } else {
                parsed_size_estimate(&data)
            };
            if memory.grow(cost).is_err() {
                return Err(budget_exhausted());
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf.freeze())
    }

    /// Time allowed for the first `received` bytes: `server.bodies.read_timeout`, one more
    /// second per `min_bytes_per_sec` bytes, never past the deadline.
    fn read_allowance(&self, received: usize, start: Instant, deadline: Instant) -> Instant {
        let cfg = &self.limits.bodies;
        let min_rate = cfg.min_bytes_per_sec;
        let extra = if min_rate == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(received as f64 / min_rate as f64)
        };
        (start + cfg.read_timeout.0 + extra).min(deadline)
    }

    /// The refusal of a body that had `received` bytes when its allowance `until` was up.
    fn too_slow(
        &self,
        received: usize,
        until: Instant,
        start: Instant,
        deadline: Instant,
    ) -> BodyRefusal {
        if until >= deadline {
            return BodyRefusal::PastDeadline;
        }
        let cfg = &self.limits.bodies;
        BodyRefusal::TooSlow {
            received,
            allowed: until.saturating_duration_since(start),
            read_timeout: cfg.read_timeout,
            min_bytes_per_sec: cfg.min_bytes_per_sec,
        }
    }

    /// The complete body parsed once, with the depth limit (`server.expressions.max_depth`);
    /// whitespace only is `null`.
    fn parse_body(&self, bytes: &[u8]) -> Result<Val, BodyRefusal> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Val::Null);
        }
        json::parse_limited(bytes, self.limits.expressions.max_depth)
            .map_err(BodyRefusal::InvalidJson)
    }
}

/// Refuse a body: drain a bounded part of the rest first when the refusal says so
/// ([`BodyRefusal::drains`]), then answer.
async fn refuse(refusal: BodyRefusal, body: &mut Incoming, deadline: Instant) -> ApiError {
    if refusal.drains() {
        drain_rejected_body(body, deadline).await;
    }
    refusal.into()
}

/// How much of an oversized body is read and discarded before the 413 is sent, and for how long.
/// A client that is still writing its body when the server answers and closes would otherwise get
/// a broken pipe instead of the 413 (the "lingering close" of nginx and Envoy); past these bounds
/// the connection is closed anyway, so a huge upload costs at most this much.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_TIME: Duration = Duration::from_millis(250);

pub(crate) async fn drain_rejected_body(body: &mut Incoming, deadline: Instant) {
    let until = deadline.min(Instant::now() + DRAIN_TIME);
    let mut seen = 0usize;
    let _ = tokio::time::timeout_at(until, async {
        while seen <= DRAIN_BYTES {
            match body.frame().await {
                Some(Ok(f)) => seen += f.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
    })
    .await;
}
