//! gRPC message framing: each message is a 1-byte compressed flag, a 4-byte big-endian length and
//! the message bytes. A compressed message (flag 1) is compressed with the call's
//! `grpc-encoding`: [`decode_unary_frame`] gives the frame as it is, and
//! [`crate::compression::decode_message`] inflates it within the limit; [`decode_unary`] takes
//! only an uncompressed message.

use bytes::{BufMut, Bytes, BytesMut};

/// Why a body is not one acceptable gRPC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The body ends inside a frame's 5-byte header or its message.
    #[error("the message frame is truncated: {have} bytes where {need} were announced")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes the frame header announced (header included).
        need: usize,
    },
    /// A message is larger than the limit.
    #[error("the message is {len} bytes, more than the limit of {limit}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The compressed flag is set where no compression was negotiated (`grpc-encoding` absent
    /// or `identity`).
    #[error("the message is compressed, and no compression was negotiated")]
    Compressed,
    /// A compressed message inflates to more than the limit (inflating stopped there).
    #[error("the compressed message inflates to more than the limit of {limit} bytes")]
    InflatedTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A compressed message that does not inflate (not valid for its encoding).
    #[error("the compressed message is invalid: {0}")]
    BadCompression(String),
    /// The flag byte is neither 0 nor 1.
    #[error("invalid frame flag {0}")]
    BadFlag(u8),
    /// No message at all (a unary call needs exactly one).
    #[error("no message was sent")]
    Empty,
    /// More than one message (a unary call takes exactly one).
    #[error("more than one message was sent to a unary method")]
    Several,
}

/// The length of a frame's header.
pub const HEADER_LEN: usize = 5;

/// One message framed, uncompressed.
pub fn encode(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.extend_from_slice(message);
    out.freeze()
}

/// Frame a message written by `write` into a buffer whose first 5 bytes are reserved for the
/// header (no copy of the message).
pub fn encode_with(write: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut out = vec![0u8; HEADER_LEN];
    write(&mut out);
    let len = (out.len() - HEADER_LEN) as u32;
    out[1..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    Bytes::from(out)
}

/// The announced length of the frame at the start of `buf`, when its header is complete
/// (for readers that stop reading once a frame is known to be too large).
pub fn announced(buf: &[u8]) -> Option<usize> {
    let h: [u8; 4] = buf.get(1..HEADER_LEN)?.try_into().ok()?;
    Some(u32::from_be_bytes(h) as usize)
}

/// The one message of a unary call's body: exactly one uncompressed frame of at most `limit`
/// bytes, nothing after it.
pub fn decode_unary(body: &Bytes, limit: usize) -> Result<Bytes, FrameError> {
    let frame = decode_unary_frame(body, limit)?;
    if frame.compressed {
        return Err(FrameError::Compressed);
    }
    Ok(frame.message)
}

/// One frame as it travels: its message, compressed or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The compressed flag.
    pub compressed: bool,
    /// The message bytes (compressed when the flag says so).
    pub message: Bytes,
}

/// The one frame of a unary call's body: exactly one frame whose message (as sent: compressed
/// or not) is at most `limit` bytes, nothing after it.
pub fn decode_unary_frame(body: &Bytes, limit: usize) -> Result<Frame, FrameError> {
    if body.is_empty() {
        return Err(FrameError::Empty);
    }
    let (frame, rest) = decode_one(body, limit)?;
    if rest < body.len() {
        return Err(FrameError::Several);
    }
    Ok(frame)
}

/// The first frame of `body` and the offset after it.
fn decode_one(body: &Bytes, limit: usize) -> Result<(Frame, usize), FrameError> {
    let Some(&flag) = body.first() else {
        return Err(FrameError::Empty);
    };
    let Some(len) = announced(body) else {
        return Err(FrameError::Truncated {
            have: body.len(),
            need: HEADER_LEN,
        });
    };
    let compressed = match flag {
        0 => false,
        1 => true,
        f => return Err(FrameError::BadFlag(f)),
    };
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    let end = HEADER_LEN + len;
    if body.len() < end {
        return Err(FrameError::Truncated {
            have: body.len(),
            need: end,
        });
    }
    let message = body.slice(HEADER_LEN..end);
    Ok((
        Frame {
            compressed,
            message,
        },
        end,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_refusal() {
        let f = encode(b"hello");
        assert_eq!(&f[..5], &[0, 0, 0, 0, 5]);
        assert_eq!(decode_unary(&f, 100).unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(
            encode_with(|v| v.extend_from_slice(b"hello")),
            f,
            "encode_with frames like encode"
        );
        assert_eq!(decode_unary(&encode(b""), 100).unwrap(), Bytes::new());
        assert_eq!(decode_unary(&Bytes::new(), 100), Err(FrameError::Empty));
        assert!(matches!(
            decode_unary(&Bytes::from_static(&[0, 0, 0]), 100),
            Err(FrameError::Truncated { .. })
        ));
        assert!(matches!(
            decode_unary(&Bytes::from_static(&[0, 0, 0, 0, 9, 1, 2]), 100),
            Err(FrameError::Truncated { have: 7, need: 14 })
        ));
        assert_eq!(
            decode_unary(&Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]), 100),
            Err(FrameError::TooLarge {
                len: u32::MAX as usize,
                limit: 100
            })
        );
        assert_eq!(
            decode_unary(&Bytes::from_static(&[1, 0, 0, 0, 0]), 100),
            Err(FrameError::Compressed)
        );
        assert_eq!(
            decode_unary(&Bytes::from_static(&[7, 0, 0, 0, 0]), 100),
            Err(FrameError::BadFlag(7))
        );
        let mut two = f.to_vec();
        two.extend_from_slice(&f);
        assert_eq!(
            decode_unary(&Bytes::from(two), 100),
            Err(FrameError::Several)
        );
    }
}
