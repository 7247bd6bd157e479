//! Compressed backend answers (docs/config.md#compression): the `Accept-Encoding` a backend's
//! `accept_encoding` asks for, and the decoding of an answer with a `Content-Encoding` — gzip,
//! br or zstd, whether asked for or not — with `max_response_bytes` applying to the decoded
//! size: decoding stops at the limit, into a buffer that never grows past it
//! ([`fanout_compress::decode`]: a decompression bomb holds far less than the limit, and fails
//! the call as `BodyTooLarge`); any other coding, or data that does not decode, is
//! `BadEncoding`. Both are 502 `bad_backend_answer` for the client.

use bytes::Bytes;
use fanout_compress::Coding;
use fanout_config::ContentCoding;
use fanout_layers::backend::{CallError, CallErrorKind};
use http::HeaderMap;
use http::HeaderValue;
use http::header::CONTENT_ENCODING;

/// Encoded answers smaller than this are decoded inline, larger ones on a blocking thread (a
/// small body can still decode to the limit: the work is bounded by it either way).
const INLINE_BYTES: usize = 1024;

/// The `Accept-Encoding` of a backend's `accept_encoding` (`None` for none).
pub(crate) fn accept_encoding(codings: &[ContentCoding]) -> Option<HeaderValue> {
    if codings.is_empty() {
        return None;
    }
    let names: Vec<&str> = codings
        .iter()
        .map(|c| match c {
            ContentCoding::Gzip => "gzip",
            ContentCoding::Br => "br",
            ContentCoding::Zstd => "zstd",
        })
        .collect();
    HeaderValue::from_str(&names.join(", ")).ok()
}

/// The answer's body decoded by its `Content-Encoding` (none or `identity`: as it is), at most
/// `limit` bytes decoded.
pub(crate) async fn decode_answer(
    headers: &HeaderMap,
    body: Bytes,
    limit: usize,
) -> Result<Bytes, CallError> {
    let listed = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .map(|v| v.as_bytes());
    let bad = |message: String| CallError::new(CallErrorKind::BadEncoding, message);
    let first = match fanout_compress::listed_coding(listed) {
        fanout_compress::Listed::None => return Ok(body),
        fanout_compress::Listed::One(first) => first,
        fanout_compress::Listed::Several => {
            return Err(bad(
                "the answer has several content codings; fanout decodes one".into(),
            ));
        }
    };
    let Some(coding) = Coding::from_token(first) else {
        return Err(bad(format!(
            "the answer's Content-Encoding `{}` is not one fanout decodes (gzip, br, zstd)",
            first.chars().take(64).collect::<String>()
        )));
    };
    if body.is_empty() {
        return Ok(body);
    }
    let decoded = if body.len() <= INLINE_BYTES {
        fanout_compress::decode(coding, &body, limit)
    } else {
        tokio::task::spawn_blocking(move || fanout_compress::decode(coding, &body, limit))
            .await
            .map_err(|e| bad(format!("decoding the answer failed: {e}")))?
    };
    match decoded {
        Ok(d) => Ok(Bytes::from(d)),
        Err(fanout_compress::Error::TooLarge { limit }) => Err(CallError::new(
            CallErrorKind::BodyTooLarge,
            format!("the {coding} answer decodes to more than max_response_bytes ({limit})"),
        )),
        Err(e) => Err(bad(format!("the {coding} answer does not decode: {e}"))),
    }
}
