//! Per-message compression (gRPC's doc/compression.md): `gzip` and `identity`, negotiated by
//! `grpc-encoding` (how the sender's messages are compressed) and `grpc-accept-encoding` (what
//! the sender accepts), never HTTP's `Content-Encoding`. A message with the compressed flag is
//! compressed with the call's `grpc-encoding`; one without it is not, whatever the header says.
//!
//! Inflating is bounded: [`Gunzip`] stops as soon as the message grows past its limit (a
//! "zip bomb" never allocates more than the limit), and inflates in steps so that a caller can
//! do a bounded amount of work where it is and hand the rest to a thread that may block.

use crate::frame::{FrameError, HEADER_LEN};
use bytes::{Buf, Bytes};
use flate2::Compression;
use flate2::read::MultiGzDecoder;
use std::io::{Read, Write};

/// The encodings fanout sends and accepts (`grpc-accept-encoding` of its answers and calls).
pub const ACCEPT_ENCODING: &str = "gzip, identity";

/// The compression level of the messages fanout compresses (gzip level 1: the fastest, most of
/// the gain on the repetitive text protobuf messages usually carry).
const LEVEL: u32 = 1;

/// A message encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Uncompressed.
    #[default]
    Identity,
    /// gzip (RFC 1952).
    Gzip,
}

/// A `grpc-encoding` fanout does not support (its value, for the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grpc-encoding `{0}` is not supported (supported: {ACCEPT_ENCODING})")]
pub struct UnsupportedEncoding(pub String);

impl Encoding {
    /// The encoding a `grpc-encoding` header names (absent: identity).
    pub fn from_header(value: Option<&[u8]>) -> Result<Encoding, UnsupportedEncoding> {
        match value.map(<[u8]>::trim_ascii) {
            None => Ok(Encoding::Identity),
            Some(v) if v.eq_ignore_ascii_case(b"identity") => Ok(Encoding::Identity),
            Some(v) if v.eq_ignore_ascii_case(b"gzip") => Ok(Encoding::Gzip),
            Some(v) => Err(UnsupportedEncoding(String::from_utf8_lossy(v).into_owned())),
        }
    }

    /// Its name, as `grpc-encoding` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
        }
    }
}

/// Whether a `grpc-accept-encoding` value (a comma-separated list) names gzip.
pub fn accepts_gzip(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"gzip"))
    })
}

/// Why a compressed message could not be inflated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    /// The message inflates to more than the limit (inflating stopped there).
    #[error("the message inflates to more than the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// Not a valid gzip stream.
    #[error("the message is not valid gzip: {0}")]
    Corrupt(String),
}

impl From<InflateError> for FrameError {
    fn from(e: InflateError) -> FrameError {
        match e {
            InflateError::TooLarge { limit } => FrameError::InflatedTooLarge { limit },
            InflateError::Corrupt(d) => FrameError::BadCompression(d),
        }
    }
}

/// The size of one read of the inflater (the most it writes past what was asked before the
/// limit is checked: nothing, the buffer is copied only when it fits).
const CHUNK: usize = 8 << 10;

/// A gzip message being inflated, bounded by a limit; `Send + 'static`, so the rest of the
/// work can move to another thread ([`Gunzip::step`]). Every gzip member is inflated, one after
/// the other, into the one message; bytes after the last member that do not start a member are
/// corrupt — as HTTP bodies are decoded (`fanout-compress`).
pub struct Gunzip {
    dec: MultiGzDecoder<bytes::buf::Reader<Bytes>>,
    out: Vec<u8>,
    limit: usize,
    done: bool,
}

impl Gunzip {
    /// Start inflating `compressed`, which may inflate to at most `limit` bytes.
    pub fn new(compressed: Bytes, limit: usize) -> Gunzip {
        let guess = compressed.len().saturating_mul(3).clamp(64, 64 << 10);
        Gunzip {
            dec: MultiGzDecoder::new(compressed.reader()),
            out: Vec::with_capacity(guess.min(limit)),
            limit,
            done: false,
        }
    }

    /// Inflate until the message is whole (`Ok(true)`) or at least `budget` more bytes were
    /// produced (`Ok(false)`: call again, here or elsewhere). More than the limit is an error
    /// as soon as it is seen; the buffer never grows beyond the limit.
    pub fn step(&mut self, budget: usize) -> Result<bool, InflateError> {
        let mut buf = [0u8; CHUNK];
        let mut produced = 0usize;
        while !self.done {
            if produced >= budget {
                return Ok(false);
            }
            let n = match self.dec.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(InflateError::Corrupt(e.to_string())),
            };
            if n == 0 {
                self.done = true;
                break;
            }
            let len = self.out.len();
            if len + n > self.limit {
                return Err(InflateError::TooLarge { limit: self.limit });
            }
            if self.out.capacity() - len < n {
                // Double, but never past the limit (so a bomb never holds more).
                let target = self
                    .out
                    .capacity()
                    .saturating_mul(2)
                    .max(len + n)
                    .min(self.limit);
                self.out.reserve_exact(target - len);
            }
            self.out.extend_from_slice(&buf[..n]);
            produced += n;
        }
        Ok(true)
    }

    /// The inflated message (what was inflated so far if [`Gunzip::step`] did not finish).
    pub fn into_message(self) -> Bytes {
        Bytes::from(self.out)
    }
}

/// Inflate a whole gzip message of at most `limit` bytes.
pub fn gunzip(compressed: Bytes, limit: usize) -> Result<Bytes, InflateError> {
    let mut g = Gunzip::new(compressed, limit);
    g.step(usize::MAX)?;
    Ok(g.into_message())
}

/// One message framed gzip-compressed (compressed flag set); `None` only if the compressor
/// failed (it writes to memory: it does not).
pub fn gzip_frame(message: &[u8]) -> Option<Bytes> {
    let mut out = Vec::with_capacity(HEADER_LEN + message.len() / 2 + 32);
    out.extend_from_slice(&[1, 0, 0, 0, 0]);
    let mut enc = flate2::write::GzEncoder::new(out, Compression::new(LEVEL));
    enc.write_all(message).ok()?;
    let mut out = enc.finish().ok()?;
    let len = u32::try_from(out.len() - HEADER_LEN).ok()?;
    out[1..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    Some(Bytes::from(out))
}

/// An uncompressed frame (as [`crate::frame::encode`] writes it) recompressed with gzip;
/// `None` when `framed` is not one uncompressed frame (it is then sent as it is).
pub fn gzip_framed(framed: &[u8]) -> Option<Bytes> {
    let (&flag, _) = framed.split_first()?;
    let len = crate::frame::announced(framed)?;
    if flag != 0 || framed.len() != HEADER_LEN + len {
        return None;
    }
    gzip_frame(&framed[HEADER_LEN..])
}

/// The message of a frame decoded by [`crate::frame::decode_unary_frame`], for a call whose
/// `grpc-encoding` is `encoding`: as it is when not compressed; inflated within `limit` when
/// compressed with gzip; a compressed flag with `identity` is [`FrameError::Compressed`].
/// (Inflates in the calling thread: see [`Gunzip`] to do it in steps.)
pub fn decode_message(
    frame: crate::frame::Frame,
    encoding: Encoding,
    limit: usize,
) -> Result<Bytes, FrameError> {
    match (frame.compressed, encoding) {
        (false, _) => Ok(frame.message),
        (true, Encoding::Identity) => Err(FrameError::Compressed),
        (true, Encoding::Gzip) => Ok(gunzip(frame.message, limit)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Frame, decode_unary_frame, encode};

    #[test]
    fn encodings_by_header() {
        assert_eq!(Encoding::from_header(None), Ok(Encoding::Identity));
        assert_eq!(
            Encoding::from_header(Some(b"identity")),
            Ok(Encoding::Identity)
        );
        assert_eq!(Encoding::from_header(Some(b"gzip")), Ok(Encoding::Gzip));
        assert_eq!(Encoding::from_header(Some(b" GZIP ")), Ok(Encoding::Gzip));
        assert_eq!(
            Encoding::from_header(Some(b"snappy")),
            Err(UnsupportedEncoding("snappy".into()))
        );
        assert!(accepts_gzip(Some(b"identity, deflate, gzip")));
        assert!(accepts_gzip(Some(b"gzip")));
        assert!(!accepts_gzip(Some(b"identity,deflate")));
        assert!(!accepts_gzip(Some(b"gzipx")));
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn a_gzip_frame_round_trips() {
        let msg = b"hello hello hello hello hello hello hello".repeat(20);
        let f = gzip_frame(&msg).unwrap();
        assert_eq!(f[0], 1, "the compressed flag");
        assert!(f.len() < msg.len() / 4, "{} bytes", f.len());
        let frame = decode_unary_frame(&f, 1 << 20).unwrap();
        assert!(frame.compressed);
        assert_eq!(
            decode_message(frame.clone(), Encoding::Gzip, 1 << 20).unwrap(),
            Bytes::from(msg.clone())
        );
        // Exactly the limit inflates; one byte less is refused.
        assert!(decode_message(frame.clone(), Encoding::Gzip, msg.len()).is_ok());
        assert_eq!(
            decode_message(frame.clone(), Encoding::Gzip, msg.len() - 1),
            Err(FrameError::InflatedTooLarge {
                limit: msg.len() - 1
            })
        );
        // A compressed flag under identity is refused, an uncompressed frame is as it is.
        assert_eq!(
            decode_message(frame, Encoding::Identity, 1 << 20),
            Err(FrameError::Compressed)
        );
        let plain = decode_unary_frame(&encode(b"abc"), 100).unwrap();
        assert_eq!(
            decode_message(plain, Encoding::Gzip, 100).unwrap(),
            Bytes::from_static(b"abc")
        );
        // Recompressing a framed message.
        assert_eq!(gzip_framed(&encode(&msg)), Some(f));
        assert_eq!(gzip_framed(&[1, 0, 0, 0, 0]), None);
        assert_eq!(gzip_framed(&[0, 0, 0, 0, 9]), None);
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 16 MiB of zeros compress to a few KiB; the limit is 1 MiB.
        let zeros = vec![0u8; 16 << 20];
        let f = gzip_frame(&zeros).unwrap();
        assert!(f.len() < 512 << 10, "{}", f.len());
        let limit = 1 << 20;
        let mut g = Gunzip::new(f.slice(HEADER_LEN..), limit);
        assert_eq!(g.step(usize::MAX), Err(InflateError::TooLarge { limit }));
        assert!(
            g.out.capacity() <= limit,
            "the buffer never grows beyond the limit: {}",
            g.out.capacity()
        );
        assert!(g.out.len() <= limit);
    }

    #[test]
    fn inflating_in_steps_gives_the_same_message() {
        let msg: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let f = gzip_frame(&msg).unwrap();
        let mut g = Gunzip::new(f.slice(HEADER_LEN..), msg.len());
        assert_eq!(g.step(10_000), Ok(false), "stops after its budget");
        assert!(g.out.len() >= 10_000 && g.out.len() < msg.len());
        // The rest elsewhere (it is Send).
        let g = std::thread::spawn(move || {
            assert_eq!(g.step(usize::MAX), Ok(true));
            g
        })
        .join()
        .unwrap();
        assert_eq!(g.into_message(), Bytes::from(msg));
    }

    #[test]
    fn every_gzip_member_is_inflated_and_trailing_bytes_are_corrupt() {
        // As HTTP bodies are decoded (fanout-compress): members one after the other make one
        // message; bytes after the last member that are not a member are corrupt.
        let gz = |m: &[u8]| {
            let f = gzip_frame(m).unwrap();
            f.slice(HEADER_LEN..)
        };
        let joined = [gz(b"hello "), gz(b"world")].concat();
        let message = |bytes: Vec<u8>| Frame {
            compressed: true,
            message: Bytes::from(bytes),
        };
        assert_eq!(
            decode_message(message(joined.clone()), Encoding::Gzip, 100),
            Ok(Bytes::from_static(b"hello world"))
        );
        assert_eq!(
            decode_message(message(joined), Encoding::Gzip, 10),
            Err(FrameError::InflatedTooLarge { limit: 10 }),
            "the limit is on the whole message"
        );
        for junk in [&b"junk"[..], &[0u8; 8], &[0x1f]] {
            let with_junk = [&gz(b"hello")[..], junk].concat();
            assert!(
                matches!(
                    decode_message(message(with_junk), Encoding::Gzip, 100),
                    Err(FrameError::BadCompression(_))
                ),
                "followed by {junk:?}"
            );
        }
    }

    #[test]
    fn garbage_is_corrupt() {
        let frame = Frame {
            compressed: true,
            message: Bytes::from_static(b"not gzip at all"),
        };
        assert!(matches!(
            decode_message(frame, Encoding::Gzip, 100),
            Err(FrameError::BadCompression(_))
        ));
        // A truncated stream.
        let f = gzip_frame(&b"abcdef".repeat(100)).unwrap();
        let cut = Frame {
            compressed: true,
            message: f.slice(HEADER_LEN..f.len() - 10),
        };
        assert!(matches!(
            decode_message(cut, Encoding::Gzip, 10_000),
            Err(FrameError::BadCompression(_))
        ));
    }
}
