//! Per-message compression of inbound gRPC (docs/grpc.md#compression): the request's
//! `grpc-encoding` (gzip or identity; another is UNIMPLEMENTED with `grpc-accept-encoding`),
//! its message inflated within `server.grpc.max_message_bytes` (RESOURCE_EXHAUSTED past it,
//! inflating stops there), and the answer message gzip-compressed for a client whose
//! `grpc-accept-encoding` lists gzip (`server.grpc.compress_answers`, `compress_min_bytes`).
//! Never HTTP `Content-Encoding`.
//!
//! Work beyond `server.compute.offload_bytes` — inflating past that many bytes, compressing a
//! message that large — runs on the compute pool, not on the worker.

use crate::answer::ApiError;
use bytes::Bytes;
use fanout_config::GrpcServer;
use fanout_grpc::compression::{self, Encoding, Gunzip, UnsupportedEncoding};
use fanout_grpc::frame::{self, Frame, FrameError};
use fanout_runtime::compute::ComputePool;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// `grpc-encoding`.
pub(crate) const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// `grpc-accept-encoding`.
pub(crate) const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");

/// What the gateway accepts, as its answers advertise it.
pub(crate) fn accept_encoding() -> HeaderValue {
    HeaderValue::from_static(compression::ACCEPT_ENCODING)
}

/// The request's `grpc-encoding`.
pub(crate) fn request_encoding(headers: &HeaderMap) -> Result<Encoding, UnsupportedEncoding> {
    Encoding::from_header(headers.get(&GRPC_ENCODING).map(HeaderValue::as_bytes))
}

/// An encoding the gateway does not support: UNIMPLEMENTED (`unsupported_compression`; every
/// answer says `grpc-accept-encoding`).
pub(crate) fn unsupported(e: UnsupportedEncoding) -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "unsupported_compression",
        format!("{e}: send messages compressed with gzip, or uncompressed"),
    )
}

/// The request frame's message: as it is, or inflated within `limit` — the first `offload`
/// bytes on this thread, the rest on the compute pool. `Err` is the refusal's frame error, or
/// the pool's (full).
pub(crate) async fn request_message(
    compute: &ComputePool,
    frame: Frame,
    encoding: Encoding,
    limit: usize,
    offload: usize,
) -> Result<Bytes, Inflate> {
    match (frame.compressed, encoding) {
        (false, _) => return Ok(frame.message),
        (true, Encoding::Identity) => return Err(Inflate::Frame(FrameError::Compressed)),
        (true, Encoding::Gzip) => {}
    }
    let mut g = Gunzip::new(frame.message, limit);
    if !g.step(offload).map_err(|e| Inflate::Frame(e.into()))? {
        g = compute
            .run(move || g.step(usize::MAX).map(|_| g))
            .await
            .map_err(|_| Inflate::Overloaded)?
            .map_err(|e| Inflate::Frame(e.into()))?;
    }
    Ok(g.into_message())
}

/// Why a request message could not be had.
pub(crate) enum Inflate {
    /// The frame or its compression.
    Frame(FrameError),
    /// The compute pool's queue is full.
    Overloaded,
}

/// The 503 of a full compute pool.
pub(crate) fn overloaded() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "the gateway's compute queue is full; retry later".to_string(),
    )
}

/// Whether the answer to a request with these headers is compressed: the client lists gzip in
/// `grpc-accept-encoding` and `server.grpc.compress_answers` is on.
pub(crate) fn wants_gzip(cfg: &GrpcServer, headers: &HeaderMap) -> bool {
    cfg.compress_answers
        && compression::accepts_gzip(
            headers
                .get(&GRPC_ACCEPT_ENCODING)
                .map(HeaderValue::as_bytes),
        )
}

/// The answer's frame: `framed` (one uncompressed frame) recompressed with gzip when the client
/// takes gzip and the message is at least `compress_min_bytes` — on the compute pool when it
/// is at least `offload` bytes (a full pool: sent uncompressed). `true` when compressed.
pub(crate) async fn answer_frame(
    compute: &ComputePool,
    cfg: &GrpcServer,
    gzip: bool,
    framed: Bytes,
    offload: usize,
) -> (Bytes, bool) {
    let len = framed.len().saturating_sub(frame::HEADER_LEN);
    if !gzip || len < cfg.compress_min_bytes {
        return (framed, false);
    }
    let compressed = if len >= offload {
        let f = framed.clone();
        compute
            .run(move || compression::gzip_framed(&f))
            .await
            .ok()
            .flatten()
    } else {
        compression::gzip_framed(&framed)
    };
    match compressed {
        Some(c) => (c, true),
        None => (framed, false),
    }
}
