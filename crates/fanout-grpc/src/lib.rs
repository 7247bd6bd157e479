//! gRPC without code generation — what the gateway, the stubs and the load generator share.
//!
//! - [`protos`]: `.proto` files compiled in process at start (protox, no `protoc`) into a
//!   [`ProtoSet`]: the descriptor pool, the encoded `FileDescriptorSet` (server reflection), and
//!   method lookup by `pkg.Service/Method` with errors a config can point at.
//! - [`codec`]: one method's messages mapped to and from JSON ([`MessageCodec`]), the proto3 JSON
//!   mapping with the options fanout uses (proto field names, default values written, 64-bit
//!   integers as numbers; both name styles accepted on input, unknown fields refused).
//! - [`frame`]: the length-prefixed message framing of gRPC over HTTP/2 (a size limit, the
//!   compressed flag, exactly one message for unary calls).
//! - [`compression`]: per-message compression (`gzip`, `identity`): `grpc-encoding` and
//!   `grpc-accept-encoding`, inflating bounded by the message limit.
//! - [`status`]: status codes, their names, the `grpc-message` percent-encoding, and the one
//!   mapping between gRPC codes and HTTP statuses used by the gateway in both directions.
//! - [`timeout`]: the `grpc-timeout` header, parsed and written.
//!
//! Nothing here does network I/O; `protos` reads files (at start and on reload only).

#![forbid(unsafe_code)]

pub mod codec;
pub mod compression;
pub mod frame;
pub mod protos;
pub mod status;
pub mod stubsupport;
pub mod timeout;
pub mod value;

pub use codec::{CodecError, FieldInfo, MessageCodec};
pub use frame::FrameError;
pub use protos::{MethodInfo, MethodLookupError, ProtoError, ProtoLimits, ProtoSet};
pub use status::Code;

/// The content type of gRPC requests and answers (`application/grpc`, optionally `+proto`).
pub const CONTENT_TYPE: &str = "application/grpc";

/// Whether a `content-type` value is gRPC's: `application/grpc`, `application/grpc+proto`
/// (`application/grpc+json` and other subtypes are not: fanout speaks protobuf on the wire).
pub fn is_grpc_content_type(v: &[u8]) -> bool {
    v == b"application/grpc" || v == b"application/grpc+proto"
}

/// Whether a `content-type` value starts like gRPC's (any `application/grpc…` subtype), for
/// answering an unsupported subtype with a gRPC status rather than an HTTP error.
pub fn looks_like_grpc(v: &[u8]) -> bool {
    v.starts_with(b"application/grpc")
}
