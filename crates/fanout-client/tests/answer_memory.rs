//! Memory held while an answer over `max_response_bytes` is refused (its own test binary: a
//! counting global allocator, and nothing else running in the process while it measures). A
//! raw HTTP/1.1 server on 127.0.0.1 sends, from buffers made before the measure: a plain answer
//! of 18 MiB announced by `Content-Length`, the same without a length in 64-byte chunks, and
//! 1 MB of gzip decoding to 1 GiB; the limit is 4 MiB. Each is a `BodyTooLarge` call, and the
//! bytes the call held at its peak stay within the limit plus a small constant.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use fanout_client::HttpBackend;
use fanout_layers::backend::{Call, HttpCall};
use fanout_layers::{Backend, CallErrorKind, CallRequest};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counts the bytes allocated and not yet freed (`LIVE`) and their highest value (`PEAK`); a
/// reallocation counts as the new block allocated before the old one is freed.
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

const MIB: usize = 1 << 20;
/// `max_response_bytes`.
const LIMIT: usize = 4 * MIB;
/// What a call may hold besides the limit: the connection's read buffer, a chunk, the call.
const SLACK: usize = MIB;

/// The answers, by path: the head and the body's bytes.
struct Answers {
    plain_length: Vec<u8>,
    plain_chunked: Vec<u8>,
    gzip_bomb: Vec<u8>,
}

/// An HTTP/1.1 server answering each request by its path; writes until the client closes.
async fn server(answers: Arc<Answers>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let answers = answers.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let mut n = 0;
                while !head[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut head[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(m) => n += m,
                    }
                }
                let text = String::from_utf8_lossy(&head[..n]);
                let bytes: &[u8] = if text.starts_with("GET /plain-length ") {
                    &answers.plain_length
                } else if text.starts_with("GET /plain-chunked ") {
                    &answers.plain_chunked
                } else {
                    &answers.gzip_bomb
                };
                let _ = sock.write_all(bytes).await;
            });
        }
    });
    addr
}

fn answers() -> Answers {
    let mut plain_length = b"HTTP/1.1 200 OK\r\ncontent-length: 18874368\r\n\r\n".to_vec();
    plain_length.resize(plain_length.len() + 18 * MIB, b'a');
    // 18 MiB in chunks of 64 bytes, never ended (the client stops first).
    let mut plain_chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    let chunk = [b"40\r\n".as_slice(), &[b'a'; 64], b"\r\n"].concat();
    for _ in 0..(18 * MIB / 64) {
        plain_chunked.extend_from_slice(&chunk);
    }
    let one = fanout_compress::encode(fanout_compress::Coding::Gzip, 9, &vec![0u8; MIB]).unwrap();
    let bomb = one.repeat(1024);
    let mut gzip_bomb = format!(
        "HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
        bomb.len()
    )
    .into_bytes();
    gzip_bomb.extend_from_slice(&bomb);
    Answers {
        plain_length,
        plain_chunked,
        gzip_bomb,
    }
}

fn backend(addr: std::net::SocketAddr) -> HttpBackend {
    let yaml = format!(
        "backends:\n  b: {{ url: 'http://{addr}', max_response_bytes: {LIMIT} }}\nroutes: []\n"
    );
    let cfg = fanout_config::Config::from_yaml("fanout.yaml", &yaml, &|_| None).unwrap();
    HttpBackend::new("b", &cfg.backends["b"], &cfg.defaults).unwrap()
}

fn get(path: &'static str) -> CallRequest {
    let mut req = CallRequest::new(Call::Http(HttpCall {
        method: http::Method::GET,
        path_and_query: http::uri::PathAndQuery::from_static(path),
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::new(),
    }));
    req.timeout = std::time::Duration::from_secs(60);
    req
}

#[tokio::test(flavor = "current_thread")]
async fn an_answer_over_the_limit_holds_at_most_the_limit() {
    let addr = server(Arc::new(answers())).await;
    let b = backend(addr);
    let mut report = Vec::new();
    let mut over = Vec::new();
    for (path, bound) in [
        // Announced over the limit: refused unread.
        ("/plain-length", SLACK),
        // Read up to the limit, then refused.
        ("/plain-chunked", LIMIT + SLACK),
        // 1 MB read, decoding stopped at the limit.
        ("/gzip-bomb", LIMIT + SLACK),
    ] {
        let base = LIVE.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        let r = b.call(get(path)).await;
        let held = PEAK.load(Ordering::SeqCst).saturating_sub(base);
        let e = r.err().unwrap_or_else(|| panic!("{path}: answered"));
        assert_eq!(e.kind, CallErrorKind::BodyTooLarge, "{path}: {e}");
        report.push(format!("{path}: {held} bytes held at the peak"));
        if held > bound {
            over.push(format!("{path}: {held} > {bound}"));
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(over.is_empty(), "{over:#?}\n{report:#?}");
}
