//! gRPC status codes, the `grpc-message` encoding, and the one mapping between gRPC codes and
//! HTTP statuses the gateway uses in both directions:
//!
//! - a gRPC backend's answer becomes a call answer with an HTTP status ([`Code::http_status`]),
//!   so every backend layer (retries, breakers, outlier ejection, caches, `on_status`) classifies
//!   it like an HTTP answer;
//! - a failed gRPC request is answered with the code of its HTTP status and error code
//!   ([`Code::for_answer`]; the gRPC front end's own refusals by their error code:
//!   `unknown_method`, `unsupported_content_type` and `unsupported_compression` are
//!   UNIMPLEMENTED, `message_too_large` RESOURCE_EXHAUSTED, `bad_header` INVALID_ARGUMENT);
//! - an answer to a gRPC call that carries no `grpc-status` (an HTTP answer, not a gRPC one)
//!   has the code a gRPC client reports for its HTTP status ([`Code::for_http_status`], gRPC's
//!   `http-grpc-status-mapping.md`): 400 INTERNAL, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED,
//!   404 UNIMPLEMENTED, 429, 502, 503 and 504 UNAVAILABLE, any other UNKNOWN.
//!
//! | gRPC code | HTTP status | | HTTP status | gRPC code |
//! |---|---|---|---|---|
//! | OK | 200 | | 400, 422 | INVALID_ARGUMENT |
//! | CANCELLED | 499 | | 401 | UNAUTHENTICATED |
//! | UNKNOWN | 500 | | 403 | PERMISSION_DENIED |
//! | INVALID_ARGUMENT | 400 | | 404 | NOT_FOUND |
//! | DEADLINE_EXCEEDED | 504 | | 405, 501 | UNIMPLEMENTED |
//! | NOT_FOUND | 404 | | 408, 504 | DEADLINE_EXCEEDED |
//! | ALREADY_EXISTS | 409 | | 409 | ABORTED |
//! | PERMISSION_DENIED | 403 | | 412 | FAILED_PRECONDITION |
//! | RESOURCE_EXHAUSTED | 429 | | 413, 429, 431 | RESOURCE_EXHAUSTED |
//! | FAILED_PRECONDITION | 400 | | 499 | CANCELLED |
//! | ABORTED | 409 | | 502, 503 | UNAVAILABLE |
//! | OUT_OF_RANGE | 400 | | 503 `overloaded` | RESOURCE_EXHAUSTED |
//! | UNIMPLEMENTED | 501 | | other 4xx | FAILED_PRECONDITION |
//! | INTERNAL | 500 | | other 5xx | INTERNAL |
//! | UNAVAILABLE | 503 | | | |
//! | DATA_LOSS | 500 | | | |
//! | UNAUTHENTICATED | 401 | | | |

use http::StatusCode;
use std::fmt;

/// A gRPC status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    /// 0
    Ok = 0,
    /// 1
    Cancelled = 1,
    /// 2
    Unknown = 2,
    /// 3
    InvalidArgument = 3,
    /// 4
    DeadlineExceeded = 4,
    /// 5
    NotFound = 5,
    /// 6
    AlreadyExists = 6,
    /// 7
    PermissionDenied = 7,
    /// 8
    ResourceExhausted = 8,
    /// 9
    FailedPrecondition = 9,
    /// 10
    Aborted = 10,
    /// 11
    OutOfRange = 11,
    /// 12
    Unimplemented = 12,
    /// 13
    Internal = 13,
    /// 14
    Unavailable = 14,
    /// 15
    DataLoss = 15,
    /// 16
    Unauthenticated = 16,
}

const ALL: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

impl Code {
    /// The code of a number; numbers outside 0–16 are `UNKNOWN` (as the gRPC spec says).
    pub fn from_i32(n: i32) -> Code {
        usize::try_from(n)
            .ok()
            .and_then(|i| ALL.get(i).copied())
            .unwrap_or(Code::Unknown)
    }

    /// The code of a `grpc-status` header value (`UNKNOWN` for a malformed one).
    pub fn from_header(v: &[u8]) -> Code {
        // "0" and the other one-digit codes, as every server sends them.
        if let [d @ b'0'..=b'9'] = v {
            return Code::from_i32(i32::from(d - b'0'));
        }
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .map_or(Code::Unknown, Code::from_i32)
    }

    /// The code by its name (`UNAVAILABLE`, case-insensitive, or its number).
    pub fn from_name(name: &str) -> Option<Code> {
        if let Ok(n) = name.parse::<i32>() {
            return (0..=16).contains(&n).then(|| Code::from_i32(n));
        }
        ALL.iter()
            .copied()
            .find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// The number.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The `grpc-status` header value.
    pub fn header_value(self) -> http::HeaderValue {
        http::HeaderValue::from(self as i32)
    }

    /// The name (`DEADLINE_EXCEEDED`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The HTTP status a gRPC backend's answer with this code counts as (module docs).
    pub fn http_status(self) -> StatusCode {
        let n = match self {
            Code::Ok => 200,
            Code::Cancelled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(n).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The code of a gateway answer with this HTTP status and error `code` (module docs): the
    /// admission's `overloaded` is RESOURCE_EXHAUSTED (back off), a refused backend call
    /// UNAVAILABLE (try again).
    pub fn for_answer(status: StatusCode, code: &str) -> Code {
        match (status.as_u16(), code) {
            (200..=299, _) => Code::Ok,
            (_, "unknown_method" | "unsupported_content_type" | "unsupported_compression") => {
                Code::Unimplemented
            }
            (_, "message_too_large") => Code::ResourceExhausted,
            (_, "bad_header") => Code::InvalidArgument,
            // A step kind's own refusals name their code in their error class.
            (503, "overloaded" | "pool_exhausted") => Code::ResourceExhausted,
            (400 | 422, _) => Code::InvalidArgument,
            (401, _) => Code::Unauthenticated,
            (403, _) => Code::PermissionDenied,
            (404, _) => Code::NotFound,
            (405 | 501, _) => Code::Unimplemented,
            (408 | 504, _) => Code::DeadlineExceeded,
            (409, _) => Code::Aborted,
            (413 | 429 | 431, _) => Code::ResourceExhausted,
            (499, _) => Code::Cancelled,
            (502 | 503, _) => Code::Unavailable,
            (400..=499, _) => Code::FailedPrecondition,
            _ => Code::Internal,
        }
    }

    /// The code a gRPC client reports for an answer to a gRPC call that carries no
    /// `grpc-status` — an HTTP answer with this `status`, not a gRPC one (module docs; gRPC's
    /// `http-grpc-status-mapping.md`). A 200 without a status is `UNKNOWN`.
    pub fn for_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Percent-encode a `grpc-message` (bytes outside printable ASCII, and `%`), cut to `max`
/// bytes of message first (at a character boundary).
pub fn encode_message(msg: &str, max: usize) -> http::HeaderValue {
    let mut cut = msg.len().min(max);
    while !msg.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = String::with_capacity(cut + 8);
    for &b in &msg.as_bytes()[..cut] {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    http::HeaderValue::from_str(&out).unwrap_or_else(|_| http::HeaderValue::from_static(""))
}

/// Decode a `grpc-message` (percent-decoding; invalid sequences are kept as they are, invalid
/// UTF-8 replaced).
pub fn decode_message(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'%'
            && let Some(h) = v.get(i + 1..i + 3)
            && let Ok(s) = std::str::from_utf8(h)
            && let Ok(b) = u8::from_str_radix(s, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(v[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_by_number_name_and_header() {
        for (i, c) in ALL.iter().enumerate() {
            assert_eq!(Code::from_i32(i as i32), *c);
            assert_eq!(Code::from_name(c.name()), Some(*c));
            assert_eq!(Code::from_header(c.header_value().as_bytes()), *c);
        }
        assert_eq!(Code::from_i32(17), Code::Unknown);
        assert_eq!(Code::from_i32(-1), Code::Unknown);
        assert_eq!(Code::from_header(b"x"), Code::Unknown);
        assert_eq!(Code::from_header(b" 14 "), Code::Unavailable);
        assert_eq!(Code::from_header(b"07"), Code::PermissionDenied);
        assert_eq!(Code::from_header(b"17"), Code::Unknown);
        assert_eq!(Code::from_header(b""), Code::Unknown);
        assert_eq!(Code::from_name("unavailable"), Some(Code::Unavailable));
        assert_eq!(Code::from_name("14"), Some(Code::Unavailable));
        assert_eq!(Code::from_name("nope"), None);
    }

    #[test]
    fn answers_map_to_codes() {
        let c = |s: u16, code: &str| Code::for_answer(StatusCode::from_u16(s).unwrap(), code);
        assert_eq!(c(503, "overloaded"), Code::ResourceExhausted);
        assert_eq!(c(503, "backend_rejected"), Code::Unavailable);
        assert_eq!(c(502, "backend_error"), Code::Unavailable);
        assert_eq!(c(504, "deadline_exceeded"), Code::DeadlineExceeded);
        assert_eq!(c(400, "bad_request"), Code::InvalidArgument);
        assert_eq!(c(404, "not_found"), Code::NotFound);
        assert_eq!(c(500, "expression_failed"), Code::Internal);
        assert_eq!(c(413, "body_too_large"), Code::ResourceExhausted);
        assert_eq!(c(418, "teapot"), Code::FailedPrecondition);
        assert_eq!(c(404, "unknown_method"), Code::Unimplemented);
        assert_eq!(c(415, "unsupported_content_type"), Code::Unimplemented);
        assert_eq!(c(400, "bad_header"), Code::InvalidArgument);
        assert_eq!(c(413, "message_too_large"), Code::ResourceExhausted);
        // A backend's code survives the round trip through its HTTP status where it can.
        for code in [
            Code::NotFound,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::Unimplemented,
            Code::ResourceExhausted,
        ] {
            assert_eq!(Code::for_answer(code.http_status(), ""), code, "{code}");
        }
    }

    #[test]
    fn plain_http_answers_map_to_codes() {
        let cases = [
            (200, Code::Unknown),
            (400, Code::Internal),
            (401, Code::Unauthenticated),
            (403, Code::PermissionDenied),
            (404, Code::Unimplemented),
            (429, Code::Unavailable),
            (500, Code::Unknown),
            (502, Code::Unavailable),
            (503, Code::Unavailable),
            (504, Code::Unavailable),
        ];
        for (status, code) in cases {
            assert_eq!(Code::for_http_status(status), code, "{status}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        let v = encode_message("50% done: ошибка\n", 1000);
        assert_eq!(
            v.to_str().unwrap(),
            "50%25 done: %D0%BE%D1%88%D0%B8%D0%B1%D0%BA%D0%B0%0A"
        );
        assert_eq!(decode_message(v.as_bytes()), "50% done: ошибка\n");
        assert_eq!(decode_message(b"100%"), "100%");
        assert_eq!(decode_message(b"%zz"), "%zz");
        assert_eq!(encode_message("ошибка", 3).to_str().unwrap(), "%D0%BE");
    }
}
