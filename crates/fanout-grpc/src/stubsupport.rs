//! What a unary gRPC server answers besides messages (used by `fanout stub`): the status code
//! of a request body that is not one acceptable message, and the `grpc-status` /
//! `grpc-message` fields of trailers (or of a trailers-only answer).

use crate::frame::FrameError;
use crate::status::{Code, encode_message};
use http::HeaderMap;
use http::header::HeaderName;

/// The `grpc-status` header or trailer.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The `grpc-message` header or trailer.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// The `grpc-accept-encoding` header: the message encodings a server accepts.
pub const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");

/// Longest `grpc-message` written, in bytes of message (before percent-encoding).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// The status a server answers a request body with when it is not exactly one acceptable
/// message: a compressed message UNIMPLEMENTED (no compression was negotiated; send
/// `grpc-accept-encoding: identity` with it), a message over the limit RESOURCE_EXHAUSTED,
/// anything else (truncated, a bad flag, no message, several) INVALID_ARGUMENT; a compressed
/// message that inflates past the limit RESOURCE_EXHAUSTED, one that does not inflate INTERNAL
/// (what grpc-go answers).
pub fn frame_error_code(e: &FrameError) -> Code {
    match e {
        FrameError::Compressed => Code::Unimplemented,
        FrameError::TooLarge { .. } | FrameError::InflatedTooLarge { .. } => {
            Code::ResourceExhausted
        }
        FrameError::BadCompression(_) => Code::Internal,
        FrameError::Truncated { .. }
        | FrameError::BadFlag(_)
        | FrameError::Empty
        | FrameError::Several => Code::InvalidArgument,
    }
}

/// Set `grpc-status: CODE` and, when `message` is not empty, `grpc-message` (percent-encoded,
/// cut to [`MAX_STATUS_MESSAGE_BYTES`]) in `headers` — the trailers of an answer, or the
/// headers of a trailers-only answer.
pub fn set_status(headers: &mut HeaderMap, code: Code, message: &str) {
    headers.insert(GRPC_STATUS, code.header_value());
    if message.is_empty() {
        headers.remove(GRPC_MESSAGE);
    } else {
        headers.insert(
            GRPC_MESSAGE,
            encode_message(message, MAX_STATUS_MESSAGE_BYTES),
        );
    }
}

/// Trailers carrying `code` and `message` (see [`set_status`]).
pub fn status_trailers(code: Code, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(2);
    set_status(&mut h, code, message);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_errors_map_to_codes_and_statuses_to_trailers() {
        assert_eq!(
            frame_error_code(&FrameError::Compressed),
            Code::Unimplemented
        );
        assert_eq!(
            frame_error_code(&FrameError::TooLarge { len: 9, limit: 1 }),
            Code::ResourceExhausted
        );
        assert_eq!(
            frame_error_code(&FrameError::Several),
            Code::InvalidArgument
        );
        let t = status_trailers(Code::Unavailable, "down 100%");
        assert_eq!(t.get(GRPC_STATUS).map(|v| v.as_bytes()), Some(&b"14"[..]));
        assert_eq!(
            t.get(GRPC_MESSAGE).map(|v| v.as_bytes()),
            Some(&b"down 100%25"[..])
        );
        let mut t = t;
        set_status(&mut t, Code::Ok, "");
        assert_eq!(t.get(GRPC_STATUS).map(|v| v.as_bytes()), Some(&b"0"[..]));
        assert!(t.get(GRPC_MESSAGE).is_none());
    }
}
