//! fanout's content codings (docs/config.md#compression): gzip (flate2 on miniz_oxide), br
//! (brotli) and zstd, with
//!
//! - [`encode`] (and [`gzip`]): a whole body at a level;
//! - [`decode`] (and [`gunzip`]): a whole encoded body under a limit on the **decoded** size —
//!   decoding stops at `limit + 1` bytes ([`Error::TooLarge`]) and its buffer never grows past
//!   the limit (an answer too large for one pass is decoded twice, the second time into a
//!   buffer of its exact size), so a small body that would decode to gigabytes never takes more
//!   than the limit (zstd frames asking for a window over 8 MiB, RFC 9659's bound for HTTP, are
//!   refused as corrupt);
//! - [`negotiate`]: the coding of an answer from the client's `Accept-Encoding` (q-values,
//!   `identity;q=0`, `*`), with the server's preference on ties.
//!
//! Knows nothing of HTTP bodies or the config: the gateway and the client call it with bytes.
//! No codec is written here.

#![forbid(unsafe_code)]

use std::io::{self, Read, Write};

/// A content coding fanout can encode and decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coding {
    /// `gzip` (RFC 1952; `x-gzip` is read as it).
    Gzip,
    /// `br` (brotli, RFC 7932).
    Br,
    /// `zstd` (RFC 8878, with RFC 9659's window bound).
    Zstd,
}

/// Every coding, in fanout's default order of preference.
pub const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

/// The largest zstd window accepted when decoding: 2^23 = 8 MiB (RFC 9659).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;

impl Coding {
    /// The token in `Content-Encoding` / `Accept-Encoding`.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }

    /// The coding a token names (without case; `x-gzip` is gzip), `None` for any other.
    pub fn from_token(token: &str) -> Option<Coding> {
        let t = token.trim();
        if t.eq_ignore_ascii_case("gzip") || t.eq_ignore_ascii_case("x-gzip") {
            Some(Coding::Gzip)
        } else if t.eq_ignore_ascii_case("br") {
            Some(Coding::Br)
        } else if t.eq_ignore_ascii_case("zstd") {
            Some(Coding::Zstd)
        } else {
            None
        }
    }

    /// The levels each coding accepts: gzip 1–9, br 0–11, zstd 1–19 (fanout's bound; 20–22
    /// need windows over RFC 9659's).
    pub fn levels(self) -> std::ops::RangeInclusive<i32> {
        match self {
            Coding::Gzip => 1..=9,
            Coding::Br => 0..=11,
            Coding::Zstd => 1..=19,
        }
    }

    /// A low, latency-friendly level: gzip 1, br 3, zstd 1.
    pub fn default_level(self) -> i32 {
        match self {
            Coding::Gzip => 1,
            Coding::Br => 3,
            Coding::Zstd => 1,
        }
    }
}

impl std::fmt::Display for Coding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What encoding or decoding can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The decoded data would exceed the limit (decoding stopped there).
    #[error("the decoded body exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit on the decoded size, in bytes.
        limit: usize,
    },
    /// The data is not valid for its coding (or is cut short).
    #[error("the {coding} data does not decode: {source}")]
    Corrupt {
        /// The coding it claimed.
        coding: Coding,
        /// What the decoder said.
        source: io::Error,
    },
    /// The level is outside [`Coding::levels`].
    #[error("{coding} level {level} is outside {min}..={max}")]
    Level {
        /// The coding.
        coding: Coding,
        /// The level given.
        level: i32,
        /// The lowest level.
        min: i32,
        /// The highest level.
        max: i32,
    },
    /// Encoding failed (only an allocation failure of the codec can cause it).
    #[error("{coding} encoding failed: {source}")]
    Encode {
        /// The coding.
        coding: Coding,
        /// What the encoder said.
        source: io::Error,
    },
}

fn check_level(coding: Coding, level: i32) -> Result<(), Error> {
    let r = coding.levels();
    if r.contains(&level) {
        Ok(())
    } else {
        Err(Error::Level {
            coding,
            level,
            min: *r.start(),
            max: *r.end(),
        })
    }
}

/// Encode `data` whole with `coding` at `level` (checked against [`Coding::levels`]).
pub fn encode(coding: Coding, level: i32, data: &[u8]) -> Result<Vec<u8>, Error> {
    check_level(coding, level)?;
    let enc_err = |source| Error::Encode { coding, source };
    // A JSON answer compresses to well under half its size: start at a quarter.
    let out = || Vec::with_capacity(data.len() / 4 + 64);
    match coding {
        Coding::Gzip => {
            let mut e =
                flate2::write::GzEncoder::new(out(), flate2::Compression::new(level as u32));
            e.write_all(data).map_err(enc_err)?;
            e.finish().map_err(enc_err)
        }
        Coding::Br => {
            // Window 2^22 (4 MiB): brotli's default; smaller bodies use less.
            let mut e = brotli::CompressorWriter::new(out(), 4096, level as u32, 22);
            e.write_all(data).map_err(enc_err)?;
            e.flush().map_err(enc_err)?;
            Ok(e.into_inner())
        }
        Coding::Zstd => zstd_encode(level, data).map_err(enc_err),
    }
}

thread_local! {
    /// Each thread's zstd context and the level it is set to: made once per thread (its
    /// creation is most of the cost of encoding a small answer), then reused. A context holds
    /// no data between calls.
    static ZSTD: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// One zstd frame (with its content size) on this thread's reused context.
fn zstd_encode(level: i32, data: &[u8]) -> io::Result<Vec<u8>> {
    ZSTD.with(|cell| {
        // Re-entered (cannot happen: nothing here calls back) or poisoned: a context of its own.
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return zstd::bulk::compress(data, level);
        };
        match slot.as_mut() {
            Some((l, c)) if *l == level => c.compress(data),
            _ => {
                let mut c = zstd::bulk::Compressor::new(level)?;
                let out = c.compress(data);
                *slot = Some((level, c));
                out
            }
        }
    })
}

/// Data that declares no usable size (brotli; gzip or zstd whose declared size is wrong or over
/// the limit) and decodes to at most this much is decoded once, into a buffer that grows; more
/// is decoded twice: once to count its size (nothing kept), then into a buffer of exactly that
/// size.
pub const ONE_PASS_BYTES: usize = 256 << 10;

/// The decoded bytes read from a decoder at a time.
const CHUNK: usize = 16 << 10;

/// Decode `data`, encoded with `coding`, refusing to produce more than `limit` bytes
/// ([`Error::TooLarge`]); cut or corrupt data is [`Error::Corrupt`].
///
/// What is held is bounded by the limit from the start, never by doubling past it: the decoded
/// bytes go into a buffer of the size the data declares (a single zstd frame's content size, a
/// gzip trailer's) when that is within the limit, else into one growing to at most
/// [`ONE_PASS_BYTES`]. Data that decodes to more than that buffer is decoded on counting only,
/// to its end or to `limit + 1` bytes (a bomb stops there, having held nothing more), then, if
/// within the limit, once more into a buffer of exactly its size. So decoding holds at most
/// `max(limit, ONE_PASS_BYTES)` decoded bytes (the returned buffer's capacity is its length
/// within 16 KiB), plus the codec's own state (gzip ~80 KiB; br its window, up to 16 MiB; zstd
/// its window, up to 8 MiB, in the C library's allocations).
pub fn decode(coding: Coding, data: &[u8], limit: usize) -> Result<Vec<u8>, Error> {
    let declared = declared_size(coding, data).filter(|n| *n <= limit);
    let first = declared.unwrap_or(limit.min(ONE_PASS_BYTES));
    let mut chunk = [0u8; CHUNK];
    let mut out = Vec::new();
    if let Some(n) = declared {
        out.reserve_exact(n);
    }
    let mut r = decoder(coding, data)?;
    let mut total = loop {
        let n = read_some(&mut r, &mut chunk, coding)?;
        if n == 0 {
            if out.capacity() - out.len() > CHUNK {
                // Declared larger than it is.
                out.shrink_to_fit();
            }
            return Ok(out);
        }
        if out.len() + n > first {
            break out.len() + n;
        }
        if out.capacity() - out.len() < n {
            // Doubling, but never past `first` (`out.len() + n <= first` holds).
            let want = (2 * out.capacity())
                .max(out.len() + n)
                .max(CHUNK)
                .min(first);
            out.reserve_exact(want - out.len());
        }
        out.extend_from_slice(chunk.get(..n).unwrap_or_default());
    };
    // More than the first buffer holds: counted to the end or past the limit, nothing kept.
    drop(out);
    while total <= limit {
        let n = read_some(&mut r, &mut chunk, coding)?;
        if n == 0 {
            drop(r);
            return decode_exactly(coding, data, total, &mut chunk);
        }
        total += n;
    }
    Err(Error::TooLarge { limit })
}

/// Decode `data` again, its decoded size known to be `size`, into a buffer of exactly that.
fn decode_exactly(
    coding: Coding,
    data: &[u8],
    size: usize,
    chunk: &mut [u8],
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(size);
    let mut r = decoder(coding, data)?;
    loop {
        let n = read_some(&mut r, chunk, coding)?;
        if n == 0 {
            return Ok(out);
        }
        if n > size - out.len() {
            // The same bytes decoded to more the second time: never a bigger buffer.
            return Err(Error::Corrupt {
                coding,
                source: io::Error::other("the data decoded to more the second time"),
            });
        }
        out.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// A reader of `data` decoded.
fn decoder<'a>(coding: Coding, data: &'a [u8]) -> Result<Box<dyn Read + 'a>, Error> {
    let corrupt = |source| Error::Corrupt { coding, source };
    Ok(match coding {
        Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
        Coding::Br => Box::new(Brotli(brotli::Decompressor::new(data, 4096))),
        Coding::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(data).map_err(corrupt)?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(corrupt)?;
            Box::new(d)
        }
    })
}

/// brotli's reader, refusing bytes after the end of the stream (as gzip's and zstd's readers
/// refuse bytes after their last member or frame that do not start another).
struct Brotli<'a>(brotli::Decompressor<&'a [u8]>);

impl Read for Brotli<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        // At the end: a second read fails on bytes left in the decoder's buffer; what it has
        // not read yet must be nothing.
        if n == 0 && !buf.is_empty() && (self.0.read(buf)? != 0 || !self.0.get_ref().is_empty()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "data after the end of the brotli stream",
            ));
        }
        Ok(n)
    }
}

/// The next decoded bytes into `chunk` (0: the end).
fn read_some(r: &mut dyn Read, chunk: &mut [u8], coding: Coding) -> Result<usize, Error> {
    loop {
        match r.read(chunk) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(Error::Corrupt { coding, source }),
        }
    }
}

/// The decoded size `data` declares, if any: the content size of its zstd frame (when it is
/// one frame), or the gzip trailer's (the size modulo 2^32 of the last member). Only a hint for the first buffer:
/// decoding never relies on it.
fn declared_size(coding: Coding, data: &[u8]) -> Option<usize> {
    match coding {
        Coding::Zstd => {
            // One frame only (several: no hint).
            let one = zstd::zstd_safe::find_frame_compressed_size(data).ok()? == data.len();
            let n = zstd::zstd_safe::get_frame_content_size(data).ok()??;
            one.then(|| usize::try_from(n).ok())?
        }
        Coding::Gzip => {
            let trailer = data.get(data.len().checked_sub(4)?..)?;
            let size: [u8; 4] = trailer.try_into().ok()?;
            usize::try_from(u32::from_le_bytes(size)).ok()
        }
        Coding::Br => None,
    }
}

/// gzip `data` at `level` (1–9).
pub fn gzip(data: &[u8], level: i32) -> Result<Vec<u8>, Error> {
    encode(Coding::Gzip, level, data)
}

/// Decode gzip `data` to at most `limit` bytes (see [`decode`]).
pub fn gunzip(data: &[u8], limit: usize) -> Result<Vec<u8>, Error> {
    decode(Coding::Gzip, data, limit)
}

/// The outcome of [`negotiate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Encode with this coding.
    Encode(Coding),
    /// Send the body as it is (the client accepts it, or did not say).
    Identity,
    /// The client refuses every coding offered and `identity` too (`identity;q=0` or `*;q=0`
    /// with nothing offered acceptable). A server may answer 406; fanout sends the body as it
    /// is (RFC 9110 §12.5.3 allows it).
    NotAcceptable,
}

/// One `Accept-Encoding` element's weight in thousandths (`q=0.5` → 500), `None` when its
/// q is malformed (the element is ignored, as if absent).
fn weight(params: &str) -> Option<u16> {
    let mut q = 1000;
    for p in params.split(';') {
        let p = p.trim();
        if p.is_empty() {
            continue;
        }
        let (k, v) = p.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("q") {
            continue;
        }
        q = parse_q(v.trim())?;
    }
    Some(q)
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )` in thousandths.
fn parse_q(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = 0;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1].get(i).copied().unwrap_or(0);
    }
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// What a `Content-Encoding` header lists (all its values, comma-separated; `identity` and empty
/// entries left out; a value that is not text is a coding no one knows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed<'a> {
    /// No coding: the body is as it is.
    None,
    /// One coding, as written (see [`Coding::from_token`]).
    One(&'a str),
    /// Several codings, applied in turn: fanout decodes one at most.
    Several,
}

/// The codings `values` (each `Content-Encoding` header's value) list.
pub fn listed_coding<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Listed<'a> {
    let mut codings = values
        .into_iter()
        .flat_map(|v| std::str::from_utf8(v).unwrap_or("\u{0}").split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("identity"));
    match (codings.next(), codings.next()) {
        (None, _) => Listed::None,
        (Some(one), None) => Listed::One(one),
        (Some(_), Some(_)) => Listed::Several,
    }
}

/// Choose the coding of an answer: `accept` is the request's `Accept-Encoding` (`None` when
/// absent: [`Choice::Identity`]); `offered` the codings the server may use, most preferred
/// first. The offered coding with the highest q above 0 wins (a coding not named takes the q of
/// `*` if present, else is not acceptable), the server's order breaking ties; it is not used
/// when the client names `identity` with a higher q. Unknown codings and malformed elements
/// are ignored.
pub fn negotiate(accept: Option<&str>, offered: &[Coding]) -> Choice {
    let Some(accept) = accept else {
        return Choice::Identity;
    };
    let mut star: Option<u16> = None;
    let mut identity: Option<u16> = None;
    // The q of each offered coding the client names (index as in `offered`).
    let mut named: [Option<u16>; 3] = [None; 3];
    for element in accept.split(',') {
        let (token, params) = element.split_once(';').unwrap_or((element, ""));
        let token = token.trim();
        if token.is_empty() {
            continue;
        }
        let Some(q) = weight(params) else { continue };
        if token == "*" {
            star = Some(star.map_or(q, |s| s.max(q)));
        } else if token.eq_ignore_ascii_case("identity") {
            identity = Some(identity.map_or(q, |s| s.max(q)));
        } else if let Some(c) = Coding::from_token(token)
            && let Some(i) = offered.iter().position(|o| *o == c)
            && let Some(slot) = named.get_mut(i)
        {
            *slot = Some(slot.map_or(q, |s| s.max(q)));
        }
    }
    let mut best: Option<(Coding, u16)> = None;
    for (i, c) in offered.iter().enumerate() {
        let q = named.get(i).copied().flatten().or(star).unwrap_or(0);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((*c, q));
        }
    }
    // identity is acceptable unless refused by name, or by `*;q=0` without being named; it
    // is preferred only when named with a higher q than the best coding.
    let identity_ok = identity.or(star).is_none_or(|q| q > 0);
    match best {
        Some((c, q)) if identity.is_none_or(|i| q >= i) => Choice::Encode(c),
        Some(_) => Choice::Identity,
        None if identity_ok => Choice::Identity,
        None => Choice::NotAcceptable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(n: usize) -> Vec<u8> {
        let mut s = String::from("[");
        for i in 0..n {
            s.push_str(&format!(
                r#"{{"id":{i},"name":"product {i}","price":{}.99,"tags":["a","b"]}},"#,
                i % 97
            ));
        }
        s.push_str("{}]");
        s.into_bytes()
    }

    #[test]
    fn content_encoding_lists_none_one_or_several() {
        let l = |vals: &[&'static str]| listed_coding(vals.iter().map(|v| v.as_bytes()));
        assert_eq!(l(&[]), Listed::None);
        assert_eq!(l(&["identity", " , "]), Listed::None);
        assert_eq!(l(&[" gzip "]), Listed::One("gzip"));
        assert_eq!(l(&["identity, br"]), Listed::One("br"));
        assert_eq!(l(&["gzip, br"]), Listed::Several);
        assert_eq!(l(&["gzip", "zstd"]), Listed::Several);
        assert_eq!(listed_coding([&b"\xff"[..]]), Listed::One("\u{0}"));
    }

    #[test]
    fn every_coding_round_trips_at_every_level_bound() {
        let data = json(2000);
        for c in ALL {
            for level in [*c.levels().start(), c.default_level(), *c.levels().end()] {
                let enc = encode(c, level, &data).unwrap();
                if level == c.default_level() {
                    assert!(enc.len() < data.len() / 4, "{c} {level}: {}", enc.len());
                }
                assert_eq!(decode(c, &enc, data.len()).unwrap(), data, "{c} {level}");
            }
        }
        assert_eq!(gunzip(&gzip(b"hi", 1).unwrap(), 2).unwrap(), b"hi");
    }

    #[test]
    fn levels_out_of_range_are_refused() {
        assert!(encode(Coding::Gzip, 0, b"x").is_err());
        assert!(matches!(
            encode(Coding::Gzip, 10, b"x"),
            Err(Error::Level { max: 9, .. })
        ));
        assert!(encode(Coding::Br, 12, b"x").is_err());
        assert!(encode(Coding::Zstd, 0, b"x").is_err());
        assert!(encode(Coding::Zstd, 20, b"x").is_err());
    }

    #[test]
    fn the_limit_is_on_the_decoded_size() {
        let data = vec![b'a'; 100_000];
        for c in ALL {
            let enc = encode(c, c.default_level(), &data).unwrap();
            assert!(enc.len() < 1000);
            assert_eq!(decode(c, &enc, 100_000).unwrap().len(), 100_000);
            assert!(
                matches!(
                    decode(c, &enc, 99_999),
                    Err(Error::TooLarge { limit: 99_999 })
                ),
                "{c}"
            );
            assert!(matches!(decode(c, &enc, 0), Err(Error::TooLarge { .. })));
        }
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 64 MiB of zeros, ~64 KiB encoded (gzip's best ratio is ~1000:1).
        let data = vec![0u8; 64 << 20];
        for c in ALL {
            let enc = encode(c, c.default_level(), &data).unwrap();
            let err = decode(c, &enc, 1 << 20).unwrap_err();
            assert!(
                matches!(err, Error::TooLarge { limit } if limit == 1 << 20),
                "{c}"
            );
        }
    }

    #[test]
    fn answers_past_one_pass_and_wrong_declared_sizes_decode_whole() {
        // Over ONE_PASS_BYTES, declared or not (br; gzip members and zstd frames concatenated
        // declare only the last or none): decoded twice, the second time into its exact size.
        let data = json(20_000);
        assert!(data.len() > 2 * ONE_PASS_BYTES);
        let half = data.len() / 2;
        for c in ALL {
            let mut encoded = vec![encode(c, c.default_level(), &data).unwrap()];
            if c != Coding::Br {
                // (brotli streams do not concatenate)
                let mut joined = encode(c, c.default_level(), &data[..half]).unwrap();
                joined.extend(encode(c, c.default_level(), &data[half..]).unwrap());
                encoded.push(joined);
            }
            for enc in &encoded {
                let d = decode(c, enc, data.len()).unwrap();
                assert!(d == data, "{c}");
                assert_eq!(d.capacity(), data.len(), "{c}: exactly its size");
                assert!(matches!(
                    decode(c, enc, data.len() - 1),
                    Err(Error::TooLarge { .. })
                ));
            }
        }
        // A gzip trailer declaring more (or less) than the data holds: a hint only.
        let mut gz = gzip(&data, 1).unwrap();
        let n = gz.len();
        for declared in [u32::MAX, 16 << 20, 10, 0] {
            gz[n - 4..].copy_from_slice(&declared.to_le_bytes());
            match decode(Coding::Gzip, &gz, 32 << 20) {
                // flate2 checks the trailer's size: a wrong one is corrupt data.
                Err(Error::Corrupt { .. }) => {}
                other => panic!("declared {declared}: {:?}", other.map(|d| d.len())),
            }
        }
        let small = gzip(b"{}", 1).unwrap();
        let d = decode(Coding::Gzip, &small, 1 << 20).unwrap();
        assert_eq!((d.as_slice(), d.capacity()), (&b"{}"[..], 2));
    }

    #[test]
    fn concatenated_members_decode_whole_and_trailing_garbage_is_refused() {
        let (a, b) = (json(50), json(70));
        let whole = [a.clone(), b.clone()].concat();
        for c in [Coding::Gzip, Coding::Zstd] {
            // gzip members, zstd frames: one after the other, each decoded.
            let joined = [
                encode(c, c.default_level(), &a).unwrap(),
                encode(c, c.default_level(), &b).unwrap(),
            ]
            .concat();
            assert!(decode(c, &joined, 1 << 20).unwrap() == whole, "{c}");
        }
        for c in ALL {
            for junk in [&b"junk"[..], &[0u8; 8], &[0x1f], &[7u8; 10_000]] {
                let mut enc = encode(c, c.default_level(), &a).unwrap();
                enc.extend_from_slice(junk);
                assert!(
                    matches!(decode(c, &enc, 1 << 20), Err(Error::Corrupt { .. })),
                    "{c} followed by {junk:?}"
                );
            }
        }
    }

    #[test]
    fn cut_or_corrupt_data_is_refused() {
        let data = json(500);
        for c in ALL {
            let enc = encode(c, c.default_level(), &data).unwrap();
            let cut = &enc[..enc.len() / 2];
            assert!(
                matches!(decode(c, cut, 1 << 20), Err(Error::Corrupt { .. })),
                "{c} cut"
            );
            assert!(
                matches!(
                    decode(c, b"this is not encoded at all", 1 << 20),
                    Err(Error::Corrupt { .. })
                ),
                "{c} garbage"
            );
        }
    }

    #[test]
    fn zstd_frames_with_a_window_over_8_mib_are_refused() {
        let data = vec![7u8; 1 << 16];
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        e.window_log(27).unwrap();
        e.include_contentsize(false).unwrap();
        e.long_distance_matching(true).unwrap();
        e.write_all(&data).unwrap();
        let enc = e.finish().unwrap();
        assert!(matches!(
            decode(Coding::Zstd, &enc, 1 << 20),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn tokens() {
        assert_eq!(Coding::from_token("GZIP"), Some(Coding::Gzip));
        assert_eq!(Coding::from_token("x-gzip"), Some(Coding::Gzip));
        assert_eq!(Coding::from_token(" br "), Some(Coding::Br));
        assert_eq!(Coding::from_token("zstd"), Some(Coding::Zstd));
        assert_eq!(Coding::from_token("deflate"), None);
        for c in ALL {
            assert_eq!(Coding::from_token(c.name()), Some(c));
        }
    }

    use Choice::{Encode, Identity, NotAcceptable};
    use Coding::{Br, Gzip, Zstd};

    #[test]
    fn negotiation() {
        let pref = [Zstd, Br, Gzip];
        let n = |a: &str| negotiate(Some(a), &pref);
        assert_eq!(negotiate(None, &pref), Identity);
        assert_eq!(n(""), Identity);
        assert_eq!(n("gzip"), Encode(Gzip));
        assert_eq!(
            n("gzip, deflate, br, zstd"),
            Encode(Zstd),
            "server order on ties"
        );
        assert_eq!(n("gzip, deflate, br"), Encode(Br));
        assert_eq!(n("gzip;q=1.0, br;q=0.5"), Encode(Gzip), "q-values win");
        assert_eq!(n("br;q=0.1, gzip;q=0.2, zstd;q=0.15"), Encode(Gzip));
        assert_eq!(n("gzip;q=0"), Identity, "q=0 refuses");
        assert_eq!(n("deflate, compress"), Identity, "unknown codings");
        assert_eq!(n("*"), Encode(Zstd));
        assert_eq!(n("*;q=0.5, zstd;q=0"), Encode(Br), "named q beats *");
        assert_eq!(n("gzip;q=0.5, identity"), Identity, "identity preferred");
        assert_eq!(n("gzip;q=0.5, identity;q=0.5"), Encode(Gzip), "tie: encode");
        assert_eq!(n("identity;q=0, gzip;q=0.1"), Encode(Gzip));
        assert_eq!(n("identity;q=0"), NotAcceptable);
        assert_eq!(n("*;q=0"), NotAcceptable);
        assert_eq!(n("*;q=0, identity"), Identity);
        assert_eq!(n("GZip;Q=0.8"), Encode(Gzip), "no case");
        assert_eq!(n("gzip;q=2"), Identity, "malformed q ignored");
        assert_eq!(n("gzip;q=0.0001"), Identity, "malformed q ignored");
        assert_eq!(n("gzip;q=abc, br"), Encode(Br));
        assert_eq!(n(" , ,gzip ; q=0.3 ,"), Encode(Gzip));
        assert_eq!(n("x-gzip"), Encode(Gzip));
        assert_eq!(n("gzip;level=1;q=0.4"), Encode(Gzip), "other params");
        // Only what is offered.
        assert_eq!(negotiate(Some("br"), &[Gzip]), Identity);
        assert_eq!(negotiate(Some("br, gzip"), &[Gzip, Br]), Encode(Gzip));
        assert_eq!(negotiate(Some("identity;q=0"), &[]), NotAcceptable);
    }

    #[test]
    fn q_values() {
        assert_eq!(parse_q("1"), Some(1000));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("1.001"), None);
        assert_eq!(parse_q("0"), Some(0));
        assert_eq!(parse_q("0.5"), Some(500));
        assert_eq!(parse_q("0.05"), Some(50));
        assert_eq!(parse_q("0.123"), Some(123));
        assert_eq!(parse_q("0."), Some(0));
        assert_eq!(parse_q(".5"), None);
        assert_eq!(parse_q("-1"), None);
    }
}
