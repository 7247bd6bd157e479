//! Server-Sent Events for tests: a backend whose streams the test writes piece by piece
//! ([`EventBackend`]: HTTP/1.1 and h2c on one port; each stream's request headers kept, and
//! whether the stream was closed by the other side), and a reader of an event stream that
//! hands out its blocks as they arrive ([`EventReader`]). Every wait is bounded by
//! [`PATIENCE`](crate::PATIENCE).

use crate::PATIENCE;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::sync::{Mutex, mpsc};

/// One stream the backend answered (`200`, `text/event-stream`): what the request carried, and
/// the pen of its body.
pub struct Stream {
    /// The request's path and query.
    pub path: String,
    /// The request's headers, as the backend received them.
    pub headers: HeaderMap,
    tx: Option<mpsc::UnboundedSender<Bytes>>,
    closed: Arc<AtomicBool>,
}

impl Stream {
    /// A request header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Send `text` as one frame (nothing happens once the stream is closed).
    pub fn send(&self, text: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Bytes::copy_from_slice(text.as_bytes()));
        }
    }

    /// End the answer cleanly (its last chunk).
    pub fn end(&mut self) {
        self.tx = None;
    }

    /// Whether the body was dropped by the server — the other side closed the connection or
    /// reset the stream (or [`Stream::end`] ended it).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Wait (bounded) until the other side closed the stream.
    pub async fn closed(&self, what: &str) {
        crate::wait_until(what, || self.is_closed()).await;
    }
}

/// The body of a stream: what the test sends, until it ends; marks the stream closed when
/// dropped.
struct Pen {
    rx: mpsc::UnboundedReceiver<Bytes>,
    closed: Arc<AtomicBool>,
}

impl Drop for Pen {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
    }
}

impl Body for Pen {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// A backend of event streams written by the test.
pub struct EventBackend {
    addr: std::net::SocketAddr,
    streams: Mutex<mpsc::UnboundedReceiver<Stream>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventBackend {
    /// Start on an ephemeral port of 127.0.0.1.
    pub async fn start() -> EventBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        EventBackend::serve(listener)
    }

    /// Serve on `listener` (a restarted backend on the same port).
    pub fn serve(listener: tokio::net::TcpListener) -> EventBackend {
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let tx = tx.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let (body_tx, body_rx) = mpsc::unbounded_channel();
                            let closed = Arc::new(AtomicBool::new(false));
                            let _ = tx.send(Stream {
                                path: req
                                    .uri()
                                    .path_and_query()
                                    .map_or("/".into(), |p| p.to_string()),
                                headers: req.headers().clone(),
                                tx: Some(body_tx),
                                closed: closed.clone(),
                            });
                            let resp = Response::builder()
                                .header("content-type", "text/event-stream")
                                .header("cache-control", "no-cache")
                                .body(Pen {
                                    rx: body_rx,
                                    closed,
                                })
                                .unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        EventBackend {
            addr,
            streams: Mutex::new(rx),
            task,
        }
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The next stream a request opened (waits, bounded).
    pub async fn next_stream(&self) -> Stream {
        tokio::time::timeout(PATIENCE, async { self.streams.lock().await.recv().await })
            .await
            .expect("a request reaches the event backend")
            .expect("the event backend runs")
    }
}

impl Drop for EventBackend {
    fn drop(&mut self) {
        // The accept loop and (with it, its JoinSet) every connection.
        self.task.abort();
    }
}

/// What a reader got next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// A block of lines up to a blank line (an event, or comments), without that blank line.
    Lines(String),
    /// The stream ended cleanly (with the rest, if any, that did not end in a blank line).
    End(String),
    /// The stream broke off (an aborted body).
    Cut(String),
}

/// Reads an event stream (`\n` line ends) block by block as it arrives, every wait bounded.
pub struct EventReader<B> {
    body: B,
    buf: String,
    /// Every byte received, as text.
    pub raw: String,
}

impl<B> EventReader<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    /// A reader of `body`.
    pub fn new(body: B) -> EventReader<B> {
        EventReader {
            body,
            buf: String::new(),
            raw: String::new(),
        }
    }

    /// The next block (waits, bounded).
    pub async fn next(&mut self) -> Block {
        tokio::time::timeout(PATIENCE, self.next_unbounded())
            .await
            .expect("the next block of the event stream within the test's patience")
    }

    async fn next_unbounded(&mut self) -> Block {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block = self.buf[..i].to_string();
                self.buf.drain(..i + 2);
                return Block::Lines(block);
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        let text = String::from_utf8_lossy(&d);
                        self.raw.push_str(&text);
                        self.buf.push_str(&text);
                    }
                }
                Some(Err(e)) => return Block::Cut(e.to_string()),
                None => return Block::End(std::mem::take(&mut self.buf)),
            }
        }
    }

    /// Read until the bytes received contain `needle` (waits, bounded); false if the stream
    /// ended or broke first.
    pub async fn read_until(&mut self, needle: &str) -> bool {
        tokio::time::timeout(PATIENCE, async {
            while !self.raw.contains(needle) {
                match self.body.frame().await {
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            let text = String::from_utf8_lossy(&d);
                            self.raw.push_str(&text);
                            self.buf.push_str(&text);
                        }
                    }
                    _ => return false,
                }
            }
            true
        })
        .await
        .expect("the awaited bytes of the event stream within the test's patience")
    }

    /// The next block that is not a comment (waits, bounded); `comments` counts those skipped.
    pub async fn next_event(&mut self, comments: &mut u64) -> Block {
        loop {
            match self.next().await {
                Block::Lines(l) if l.lines().all(|l| l.starts_with(':')) => *comments += 1,
                b => return b,
            }
        }
    }
}
