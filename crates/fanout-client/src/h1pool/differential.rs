//! Differential test of [`H1Pool`] against hyper-util's legacy client (issue 47 §4), which the
//! pool replaces for plain-`http` HTTP/1.1 backends: a scripted raw-TCP server on 127.0.0.1
//! answers each request with exact bytes (then keeps the connection or closes it), and the same
//! sequence of requests goes through the pool and through the legacy client, each against a
//! fresh server with the same script. Both must give the same outcomes — status and body bytes,
//! or the same class of failure (no answer head, or a broken body) — and the server must have
//! accepted the same number of TCP connections.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use super::*;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the server does after writing an answer's bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Then {
    /// Keep the connection for the next request.
    Keep,
    /// Close the connection.
    Close,
    /// Keep the connection until the test says (a [`Step::ServerCloses`]), then close it: the
    /// client has it idle in its pool by then.
    CloseWhenTold,
}

/// The server's answers, one per request in the order requests arrive (whatever their
/// connection); a request beyond the script closes its connection.
type Script = Vec<(&'static [u8], Then)>;

/// What the server saw.
struct Seen {
    accepted: AtomicUsize,
    requests: AtomicUsize,
    /// Connections the server closed (by its script).
    closed: AtomicUsize,
    /// Connections answered with [`Then::CloseWhenTold`] (closed or waiting to be).
    holding: AtomicUsize,
    /// One permit per [`Step::ServerCloses`].
    close_now: tokio::sync::Semaphore,
}

async fn server(script: Script) -> (Authority, Arc<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
    let seen = Arc::new(Seen {
        accepted: AtomicUsize::new(0),
        requests: AtomicUsize::new(0),
        closed: AtomicUsize::new(0),
        holding: AtomicUsize::new(0),
        close_now: tokio::sync::Semaphore::new(0),
    });
    let answers = Arc::new(Mutex::new(VecDeque::from(script)));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            s.accepted.fetch_add(1, Ordering::SeqCst);
            let (s, answers) = (s.clone(), answers.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request head (the requests have no body).
                    let end = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end;
                        }
                        let mut chunk = [0u8; 1024];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    buf.drain(..end + 4);
                    s.requests.fetch_add(1, Ordering::SeqCst);
                    let next = answers.lock().unwrap().pop_front();
                    let Some((bytes, then)) = next else {
                        s.closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    if then == Then::CloseWhenTold {
                        s.holding.fetch_add(1, Ordering::SeqCst);
                    }
                    if sock.write_all(bytes).await.is_err() {
                        return;
                    }
                    if then == Then::CloseWhenTold {
                        s.close_now.acquire().await.unwrap().forget();
                    }
                    if then != Then::Keep {
                        let _ = sock.shutdown().await;
                        s.closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
    });
    (authority, seen)
}

/// How one request ended, as a caller of either client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Status and body bytes.
    Answer(u16, Bytes),
    /// No answer head (the exchange failed).
    NoHead,
    /// A head, then a body that broke off.
    BrokenBody(u16),
}

/// A step of a scenario: a request, or waiting until the server has closed this many
/// connections, or telling the server to close a connection held by
/// [`Then::CloseWhenTold`] (then waiting until it has).
#[derive(Clone, Copy, Debug)]
enum Step {
    Get,
    AfterServerClosed(usize),
    ServerCloses,
}

/// The two clients, one interface.
enum Caller {
    Pool(Arc<H1Pool>),
    Legacy(Box<Client<HttpConnector, CallBody>>, Authority),
}

impl Caller {
    async fn get(&self) -> Outcome {
        let (resp, conn) = match self {
            Caller::Pool(p) => {
                let req = Request::builder()
                    .uri("/x")
                    .header("host", "test")
                    .body(CallBody::new(Bytes::new()))
                    .unwrap();
                match p.send(req).await {
                    Ok((resp, conn)) => (resp, Some(conn)),
                    Err(_) => return Outcome::NoHead,
                }
            }
            Caller::Legacy(c, a) => {
                let req = Request::builder()
                    .uri(format!("http://{a}/x"))
                    .body(CallBody::new(Bytes::new()))
                    .unwrap();
                match c.request(req).await {
                    Ok(resp) => (resp, None),
                    Err(_) => return Outcome::NoHead,
                }
            }
        };
        let status = resp.status().as_u16();
        let out = match resp.into_body().collect().await {
            Ok(b) => Outcome::Answer(status, b.to_bytes()),
            Err(_) => Outcome::BrokenBody(status),
        };
        if let (Caller::Pool(p), Some(conn), Outcome::Answer(..)) = (self, conn, &out) {
            // As `client.rs` does: the connection goes back after its answer was read.
            p.put(conn);
        }
        out
    }
}

/// Let the clients' own tasks run: hyper-util gives an HTTP/1 connection back to its pool from
/// a spawned task once the answer's end was read, and the connection tasks notice a closed
/// socket. No I/O is waited for here — only tasks already woken — so on the test's
/// single-threaded runtime this is deterministic, not a timing guess.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Wait (bounded) until `cond` holds.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The outcomes of `steps` through one client against a fresh server, and the connections the
/// server accepted.
async fn play(script: &Script, steps: &[Step], legacy: bool) -> (Vec<Outcome>, usize) {
    let (a, seen) = server(script.clone()).await;
    let caller = if legacy {
        let mut b = Client::builder(TokioExecutor::new());
        b.pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(8)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new());
        Caller::Legacy(Box::new(b.build_http()), a)
    } else {
        Caller::Pool(H1Pool::new(
            &a,
            8,
            Duration::from_secs(60),
            Duration::from_secs(5),
        ))
    };
    let mut out = Vec::new();
    let mut closes = 0;
    for step in steps {
        match step {
            Step::Get => {
                out.push(caller.get().await);
                settle().await;
            }
            Step::ServerCloses => {
                // (Counted before the answer is written: a client that has its answer sees it.)
                if seen.holding.load(Ordering::SeqCst) <= closes {
                    // The last request never reached the server: nothing to close (the
                    // outcomes differ, which the comparison reports).
                    continue;
                }
                closes += 1;
                let n = seen.closed.load(Ordering::SeqCst);
                seen.close_now.add_permits(1);
                wait_until("the server closed the idle connection", || {
                    seen.closed.load(Ordering::SeqCst) > n
                })
                .await;
                settle().await;
            }
            Step::AfterServerClosed(n) => {
                wait_until("the server closed its connections", || {
                    seen.closed.load(Ordering::SeqCst) >= *n
                })
                .await;
                settle().await;
            }
        }
    }
    (out, seen.accepted.load(Ordering::SeqCst))
}

/// Run a scenario through both clients: equal outcomes and connection counts, which are
/// returned (the pool's).
async fn same(name: &str, script: Script, steps: &[Step]) -> (Vec<Outcome>, usize) {
    let pool = play(&script, steps, false).await;
    let legacy = play(&script, steps, true).await;
    assert_eq!(
        pool, legacy,
        "{name}: the pool (left) against hyper-util (right)"
    );
    pool
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
const CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbye";

fn answer(status: u16, body: &'static [u8]) -> Outcome {
    Outcome::Answer(status, Bytes::from_static(body))
}

use Step::{AfterServerClosed, Get, ServerCloses};
use Then::{Close, CloseWhenTold, Keep};

#[tokio::test]
async fn keep_alive_connections_are_reused() {
    let (out, conns) = same("keep-alive", vec![(OK, Keep); 3], &[Get, Get, Get]).await;
    assert_eq!(out, vec![answer(200, b"hello"); 3]);
    assert_eq!(conns, 1);
}

#[tokio::test]
async fn connection_close_is_not_reused() {
    let (out, conns) = same(
        "connection: close",
        vec![(CLOSE, Close); 3],
        &[Get, Get, Get],
    )
    .await;
    assert_eq!(out, vec![answer(200, b"bye"); 3]);
    assert_eq!(conns, 3);
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_replaced() {
    // The server answers as keep-alive; once the connection is idle in the client's pool, the
    // server closes it; the next request goes on a new connection.
    let script = vec![(OK, CloseWhenTold), (OK, CloseWhenTold), (OK, Keep)];
    let steps = [Get, ServerCloses, Get, ServerCloses, Get];
    let (out, conns) = same("closed while idle", script, &steps).await;
    assert_eq!(out, vec![answer(200, b"hello"); 3]);
    assert_eq!(conns, 3);
}

#[tokio::test]
async fn a_connection_closed_right_after_its_answer_is_not_reused() {
    // Closed with the answer's last bytes, without `connection: close`.
    let script = vec![(OK, Close), (OK, Close), (OK, Keep)];
    let steps = [Get, AfterServerClosed(1), Get, AfterServerClosed(2), Get];
    let (out, conns) = same("closed after the answer", script, &steps).await;
    assert_eq!(out, vec![answer(200, b"hello"); 3]);
    assert_eq!(conns, 3);
}

#[tokio::test]
async fn a_request_the_server_read_and_dropped_is_not_sent_again() {
    // The server reads the next request on a kept connection, then closes it without answering
    // (as a server whose idle timeout fires as the request arrives). Neither client sends again
    // a request the server may have acted on: both fail it; the next request takes a new
    // connection (which the server drops the same way).
    let script = vec![(OK, Keep)];
    let (out, conns) = same("closed on the next request", script, &[Get, Get, Get]).await;
    assert_eq!(
        out,
        vec![answer(200, b"hello"), Outcome::NoHead, Outcome::NoHead]
    );
    assert_eq!(conns, 2);
}

#[tokio::test]
async fn a_body_cut_short_fails_and_the_connection_is_not_reused() {
    let script = vec![
        (
            &b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhell"[..],
            Close,
        ),
        (OK, Keep),
    ];
    let (out, conns) = same("close mid-body", script, &[Get, Get]).await;
    assert_eq!(out, vec![Outcome::BrokenBody(200), answer(200, b"hello")]);
    assert_eq!(conns, 2);
}

#[tokio::test]
async fn chunked_and_content_length_bodies_share_a_connection() {
    let chunked: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
    let script = vec![(chunked, Keep), (OK, Keep), (chunked, Keep)];
    let (out, conns) = same("chunked", script, &[Get, Get, Get]).await;
    assert_eq!(
        out,
        vec![
            answer(200, b"abcdefg"),
            answer(200, b"hello"),
            answer(200, b"abcdefg")
        ]
    );
    assert_eq!(conns, 1);
}

#[tokio::test]
async fn answers_without_a_body_keep_the_connection() {
    // A 304's content-length is the resource's, not a body's: nothing follows it.
    let script = vec![
        (&b"HTTP/1.1 204 No Content\r\n\r\n"[..], Keep),
        (
            &b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"[..],
            Keep,
        ),
        (OK, Keep),
    ];
    let (out, conns) = same("204 and 304", script, &[Get, Get, Get]).await;
    assert_eq!(
        out,
        vec![answer(204, b""), answer(304, b""), answer(200, b"hello")]
    );
    assert_eq!(conns, 1);
}

#[tokio::test]
async fn an_http_1_0_answer_ends_its_connection() {
    let script = vec![
        // HTTP/1.0 without keep-alive: not reused (the server leaves it open; the client ends it).
        (&b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nv0"[..], Keep),
        // HTTP/1.0 without a length: the body runs to the close.
        (&b"HTTP/1.0 200 OK\r\n\r\nto the end"[..], Close),
        (OK, Keep),
    ];
    let (out, conns) = same("HTTP/1.0", script, &[Get, Get, Get]).await;
    assert_eq!(
        out,
        vec![
            answer(200, b"v0"),
            answer(200, b"to the end"),
            answer(200, b"hello")
        ]
    );
    assert_eq!(conns, 3);
}

#[tokio::test]
async fn a_100_continue_before_the_answer_is_skipped() {
    let script = vec![
        (
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"[..],
            Keep,
        ),
        (OK, Keep),
    ];
    let (out, conns) = same("100-continue", script, &[Get, Get]).await;
    assert_eq!(out, vec![answer(200, b"hello"); 2]);
    assert_eq!(conns, 1);
}

#[tokio::test]
async fn a_garbage_status_line_fails_and_the_connection_is_dropped() {
    let script = vec![(&b"HELLO WORLD\r\n\r\n"[..], Keep), (OK, Keep)];
    let (out, conns) = same("garbage status line", script, &[Get, Get]).await;
    assert_eq!(out, vec![Outcome::NoHead, answer(200, b"hello")]);
    assert_eq!(conns, 2);
}

#[tokio::test]
async fn a_body_that_runs_to_the_close_is_read_whole() {
    let script = vec![
        (&b"HTTP/1.1 200 OK\r\n\r\nuntil close"[..], Close),
        (OK, Keep),
    ];
    let (out, conns) = same("body to the close", script, &[Get, Get]).await;
    assert_eq!(
        out,
        vec![answer(200, b"until close"), answer(200, b"hello")]
    );
    assert_eq!(conns, 2);
}
