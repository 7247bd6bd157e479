//! Memory held while decoding (its own test binary: a counting global allocator, and nothing
//! else running in the process while it measures). The bound under test: decoding holds at most
//! `limit` decoded bytes (plus a small constant) besides the codec's own state — for a bomb that
//! decodes to far more than the limit, and for an answer of exactly the limit.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use fanout_compress::{ALL, Coding, Error, decode, encode};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes allocated and not yet freed (`LIVE`) and their highest value (`PEAK`). A
/// reallocation counts as the new block allocated before the old one is freed (the copy an
/// allocator makes when it cannot grow a block in place).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::SeqCst) + n;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to `System` unchanged; the counts are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's contract is `System::alloc_zeroed`'s.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        // SAFETY: the caller's contract is `System::realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            LIVE.fetch_sub(new_size, Ordering::SeqCst);
        } else {
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `f`'s result and the most bytes it held at once beyond what was held before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}

const MIB: usize = 1 << 20;
/// `max_response_bytes` in these tests.
const LIMIT: usize = 4 * MIB;
/// What decoding may hold besides the limit and the codec's state (a chunk, small buffers).
const SLACK: usize = 128 << 10;

/// `n` MiB of zeros in `coding`: one encoded MiB repeated (gzip members and zstd frames
/// concatenate), brotli encoded whole.
fn bomb(coding: Coding, n: usize) -> Vec<u8> {
    match coding {
        Coding::Br => encode(coding, 1, &vec![0u8; n * MIB]).unwrap(),
        _ => encode(coding, coding.default_level(), &vec![0u8; MIB])
            .unwrap()
            .repeat(n),
    }
}

/// `len` bytes of JSON-like text that compresses but not to nothing.
fn answer(len: usize) -> Vec<u8> {
    let mut s = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while s.len() < len {
        s.extend_from_slice(
            format!(r#"{{"id":{i},"name":"item {}"}},"#, i * 7919 % 10007).as_bytes(),
        );
        i += 1;
    }
    s.truncate(len);
    s
}

#[test]
fn decoding_holds_at_most_the_limit_beside_the_codec_state() {
    let mut report = Vec::new();
    let mut over = Vec::new();
    for c in ALL {
        let bomb = bomb(c, 16);
        // The codec's own state: the same data decoded with a limit of 0 keeps nothing decoded.
        let (r, codec) = peak_during(|| decode(c, &bomb, 0));
        assert!(matches!(r, Err(Error::TooLarge { limit: 0 })), "{c}");

        // A bomb: decodes to 16 MiB, refused at the 4 MiB limit.
        let (r, held) = peak_during(|| decode(c, &bomb, LIMIT));
        assert!(matches!(r, Err(Error::TooLarge { limit: LIMIT })), "{c}");
        report.push(format!("{c} bomb: {held} bytes (codec {codec})"));
        if held > codec + LIMIT + SLACK {
            over.push(format!("{c} bomb: {held} > {codec} + {LIMIT} + {SLACK}"));
        }

        // An answer of exactly the limit: decoded whole, held once.
        let plain = answer(LIMIT);
        let enc = encode(c, c.default_level(), &plain).unwrap();
        let (r, held) = peak_during(|| decode(c, &enc, LIMIT));
        let decoded = r.unwrap();
        assert!(decoded == plain, "{c}");
        drop(decoded);
        let (_, codec) = peak_during(|| decode(c, &enc, 0));
        report.push(format!(
            "{c} answer of the limit: {held} bytes (codec {codec})"
        ));
        if held > codec + LIMIT + SLACK {
            over.push(format!("{c} answer: {held} > {codec} + {LIMIT} + {SLACK}"));
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(over.is_empty(), "{over:#?}\n{report:#?}");
}
