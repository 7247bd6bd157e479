//! Merged streams (`stream.merge` on a streamed route; docs/config.md#merged-streams): several
//! backends' event streams — Server-Sent Events, or NDJSON (any other content type is read as
//! lines) — opened with the route's request through each backend's stack (`Backend::open`:
//! breaker, bulkhead, retries of an unsent call) and read **only when the client's answer asks
//! for more**: one event per source per poll, at most `max_event_bytes` (plus the frame being
//! read) buffered per source, so a slow client slows the sources instead of filling memory.
//! Each source has its idle limit and its event cap; a source that fails is an `error` event
//! naming it; the merged stream ends when every source has ended (`end: all`) or the first one
//! has (`end: first`). Dropping [`Sources`] closes every source's stream.

use bytes::Bytes;
use fanout_config::{MergeEnd, MergeStreams};
use fanout_flow::Backend;
use fanout_layers::stream::{BodySlot, StreamBody, StreamRequest, StreamResponse};
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Method};
use hyper::body::Body as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// What a source gave.
pub(crate) enum Got {
    /// One event: its source, its `id:` (SSE sources), its data (lines joined by `\n`).
    Event {
        source: Arc<str>,
        id: Option<String>,
        data: String,
    },
    /// The source failed: its name, the code and the message of the `error` event.
    Failed {
        source: Arc<str>,
        code: &'static str,
        message: String,
    },
}

enum State {
    Opening(BoxFuture<'static, Result<StreamResponse, fanout_layers::error::CallError>>),
    Reading {
        body: StreamBody,
        sse: bool,
        buf: Vec<u8>,
        ended: bool,
    },
    Done,
}

struct Source {
    name: Arc<str>,
    state: State,
    events: u64,
    idle: Pin<Box<Sleep>>,
}

/// The sources of one merged answer.
pub(crate) struct Sources {
    sources: Vec<Source>,
    /// The source polled first next time (each poll starts one further, so none starves).
    next: usize,
    idle: Duration,
    max_events: u64,
    max_bytes: usize,
    end: MergeEnd,
    /// `end: first` and a source ended: the merged stream ends.
    over: bool,
}

impl Sources {
    /// Open every source of `m` through `backends` (a source whose backend has no stack fails
    /// at once), each exchange ending by `deadline`.
    pub(crate) fn open(
        m: &MergeStreams,
        backends: &std::collections::HashMap<String, Arc<dyn Backend>>,
        deadline: Instant,
    ) -> Sources {
        let now = Instant::now();
        let sources = m
            .sources
            .iter()
            .map(|(name, src)| {
                let name: Arc<str> = Arc::from(name.as_str());
                let state = match (
                    backends.get(&src.backend.value),
                    http::uri::PathAndQuery::try_from(src.path.value.as_str()),
                    Method::from_bytes(src.method.as_bytes()),
                ) {
                    (Some(b), Ok(pq), Ok(method)) => {
                        let mut headers = HeaderMap::new();
                        headers.insert(
                            http::header::ACCEPT,
                            HeaderValue::from_static("text/event-stream, application/x-ndjson"),
                        );
                        let idempotent = method.is_idempotent();
                        State::Opening(b.open(StreamRequest {
                            method,
                            path_and_query: pq,
                            headers,
                            body: BodySlot::empty(),
                            timeout: deadline.saturating_duration_since(now),
                            deadline,
                            idempotent,
                            trace: None,
                        }))
                    }
                    _ => State::Done,
                };
                Source {
                    name,
                    state,
                    events: 0,
                    idle: Box::pin(tokio::time::sleep_until(now + m.idle_timeout.0)),
                }
            })
            .collect();
        Sources {
            sources,
            next: 0,
            idle: m.idle_timeout.0,
            max_events: m.max_events,
            max_bytes: m.max_event_bytes,
            end: m.end,
            over: false,
        }
    }

    /// Whether the merged stream is over: every source done, or (`end: first`) one of them.
    pub(crate) fn done(&self) -> bool {
        self.over || self.sources.iter().all(|s| matches!(s.state, State::Done))
    }

    /// At most one event (or failure) from each source that has one ready, into `out`.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, out: &mut Vec<Got>) {
        let n = self.sources.len();
        if n == 0 || self.over {
            return;
        }
        let start = self.next % n;
        self.next = self.next.wrapping_add(1);
        for k in 0..n {
            let i = (start + k) % n;
            let (idle, max_events, max_bytes) = (self.idle, self.max_events, self.max_bytes);
            let Some(src) = self.sources.get_mut(i) else {
                continue;
            };
            let was_open = !matches!(src.state, State::Done);
            if let Some(got) = src.poll(cx, idle, max_events, max_bytes) {
                out.push(got);
            }
            if was_open && matches!(src.state, State::Done) && self.end == MergeEnd::First {
                self.over = true;
                return;
            }
        }
    }
}

impl Source {
    fn fail(&mut self, code: &'static str, message: String) -> Option<Got> {
        self.state = State::Done;
        Some(Got::Failed {
            source: self.name.clone(),
            code,
            message,
        })
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        idle: Duration,
        max_events: u64,
        max_bytes: usize,
    ) -> Option<Got> {
        loop {
            match &mut self.state {
                State::Done => return None,
                State::Opening(f) => match f.as_mut().poll(cx) {
                    Poll::Pending => return self.idle_check(cx, idle),
                    Poll::Ready(Err(e)) => {
                        let _ = e; // its detail names addresses: not for the client
                        return self.fail(
                            "backend_unavailable",
                            "the source's stream could not be opened".to_string(),
                        );
                    }
                    Poll::Ready(Ok(resp)) if !resp.status.is_success() => {
                        let status = resp.status.as_u16();
                        return self
                            .fail("backend_status", format!("the source answered {status}"));
                    }
                    Poll::Ready(Ok(resp)) => {
                        let sse = resp
                            .headers
                            .get(http::header::CONTENT_TYPE)
                            .is_some_and(|v| fanout_pass::sse::media_is_event_stream(v.as_bytes()));
                        self.state = State::Reading {
                            body: resp.body,
                            sse,
                            buf: Vec::new(),
                            ended: false,
                        };
                        self.touch(idle);
                    }
                },
                State::Reading {
                    body,
                    sse,
                    buf,
                    ended,
                } => {
                    if let Some(item) = take_item(buf, *sse, *ended) {
                        self.events += 1;
                        if self.events > max_events {
                            return self.fail(
                                "too_many_events",
                                format!(
                                    "the source sent more than {max_events} events \
                                     (stream.merge.max_events)"
                                ),
                            );
                        }
                        match item {
                            Item::Event { id, data } => {
                                return Some(Got::Event {
                                    source: self.name.clone(),
                                    id,
                                    data,
                                });
                            }
                            Item::Nothing => continue,
                        }
                    }
                    if *ended {
                        self.state = State::Done;
                        return None;
                    }
                    if buf.len() > max_bytes {
                        return self.fail(
                            "event_too_large",
                            format!(
                                "an event of the source is larger than {max_bytes} bytes \
                                 (stream.merge.max_event_bytes)"
                            ),
                        );
                    }
                    match Pin::new(body).poll_frame(cx) {
                        Poll::Ready(Some(Ok(f))) => {
                            if let Ok(d) = f.into_data() {
                                buf.extend_from_slice(&d);
                            }
                            self.touch(idle);
                        }
                        Poll::Ready(Some(Err(_))) => {
                            return self.fail(
                                "backend_reset",
                                "the source's stream broke off".to_string(),
                            );
                        }
                        Poll::Ready(None) => *ended = true,
                        Poll::Pending => return self.idle_check(cx, idle),
                    }
                }
            }
        }
    }

    /// A byte came: the idle clock starts again.
    fn touch(&mut self, idle: Duration) {
        self.idle.as_mut().reset(Instant::now() + idle);
    }

    fn idle_check(&mut self, cx: &mut Context<'_>, idle: Duration) -> Option<Got> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => self.fail(
                "source_idle",
                format!(
                    "the source sent nothing for {} ms (stream.merge.idle_timeout)",
                    idle.as_millis()
                ),
            ),
            Poll::Pending => None,
        }
    }
}

/// What the front of a source's buffer holds.
enum Item {
    Event {
        id: Option<String>,
        data: String,
    },
    /// A block or line that carries no data (a comment, a blank line): consumed, nothing sent.
    Nothing,
}

/// Take the next complete event (SSE: up to a blank line) or line (NDJSON) off `buf`; at the
/// stream's end (`ended`) a last line without its newline counts.
fn take_item(buf: &mut Vec<u8>, sse: bool, ended: bool) -> Option<Item> {
    if sse {
        let end = find_blank_line(buf)?;
        let block: Vec<u8> = buf.drain(..end.1).collect();
        let text = String::from_utf8_lossy(&block[..end.0]);
        let mut id = None;
        let mut data: Option<String> = None;
        for line in text.lines() {
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "id" => id = Some(value.to_string()),
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                _ => {}
            }
        }
        return Some(match data {
            Some(data) => Item::Event { id, data },
            None => Item::Nothing,
        });
    }
    let line_end = match buf.iter().position(|&b| b == b'\n') {
        Some(i) => i + 1,
        None if ended && !buf.is_empty() => buf.len(),
        None => return None,
    };
    let line: Vec<u8> = buf.drain(..line_end).collect();
    let text = String::from_utf8_lossy(&line).trim().to_string();
    Some(match text.is_empty() {
        true => Item::Nothing,
        false => Item::Event {
            id: None,
            data: text,
        },
    })
}

/// Where the first blank line is: (the block's end, the end of the blank line).
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        match (buf[i], buf[i + 1]) {
            (b'\n', b'\n') => return Some((i, i + 2)),
            (b'\r', b'\n') if buf.get(i + 2..i + 4) == Some(b"\r\n") => return Some((i, i + 4)),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The data of a source's event as the merged event's JSON: its text as it came when it is
/// one JSON value on one line (numbers keep their digits), else a JSON string of it.
pub(crate) fn data_json(data: &str) -> Bytes {
    let text = data.trim();
    match !text.contains('\n') && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
        true => Bytes::copy_from_slice(text.as_bytes()),
        false => Bytes::from(serde_json::Value::from(data).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks_and_ndjson_lines_are_taken_whole() {
        let mut b = b": hi\n\nid: 3\ndata: {\"a\":1}\n\ndata: par".to_vec();
        assert!(matches!(
            take_item(&mut b, true, false),
            Some(Item::Nothing)
        ));
        match take_item(&mut b, true, false) {
            Some(Item::Event { id, data }) => {
                assert_eq!(id.as_deref(), Some("3"));
                assert_eq!(data, "{\"a\":1}");
            }
            _ => panic!("an event"),
        }
        assert!(take_item(&mut b, true, false).is_none());
        let mut l = b"{\"n\":1}\n{\"n\":2}".to_vec();
        assert!(matches!(
            take_item(&mut l, false, false),
            Some(Item::Event { .. })
        ));
        assert!(take_item(&mut l, false, false).is_none());
        assert!(matches!(
            take_item(&mut l, false, true),
            Some(Item::Event { .. })
        ));
    }
}
