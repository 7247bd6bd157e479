//! Server-Sent Events routes (`sse:` on a route; docs/stubs.md#event-streams): a
//! `text/event-stream` answer whose events — each encoded once when the config loads — are sent
//! one by one, each after its delay, the list `repeat` times, numbered when `ids` is set (and
//! then resumed after a numeric `Last-Event-ID`), and after the last event the answer ends or is
//! held open. The route counts its open streams and those the client left before their end.

use crate::config::{SseConfig, SseThen};
use bytes::Bytes;
use fanout_config::ConfigError;
use fanout_config::Pos;
use hyper::body::Frame;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// A route's event stream, compiled.
#[derive(Debug)]
pub struct EventPlan {
    /// Each event: its delay and its text (blank line included; no `id:` unless written).
    events: Vec<(Duration, Bytes, bool)>,
    /// Times the list is sent (0: for ever).
    repeat: u64,
    /// Number the events.
    ids: bool,
    /// `retry: MS` and its blank line, sent first.
    retry: Option<Bytes>,
    /// Hold the answer open after the last event.
    hold: bool,
}

impl EventPlan {
    /// Compile `cfg` (at `pos`), or push its errors.
    pub(crate) fn compile(
        cfg: &SseConfig,
        pos: Pos,
        errs: &mut Vec<ConfigError>,
    ) -> Option<EventPlan> {
        let before = errs.len();
        let mut events = Vec::with_capacity(cfg.events.len());
        for (i, e) in cfg.events.iter().enumerate() {
            let mut text = String::new();
            for (field, v) in [("id", &e.id), ("event", &e.event)] {
                if v.as_ref().is_some_and(|v| v.contains(['\n', '\r'])) {
                    errs.push(
                        ConfigError::at(pos, format!("`sse.events[{i}].{field}` is one line"))
                            .hint("only `data` and `comment` may have several lines"),
                    );
                }
            }
            if let Some(c) = &e.comment {
                for l in c.lines() {
                    text.push_str(&format!(":{}{l}\n", if l.is_empty() { "" } else { " " }));
                }
            }
            if let Some(id) = &e.id {
                text.push_str(&format!("id: {id}\n"));
            }
            if let Some(ev) = &e.event {
                text.push_str(&format!("event: {ev}\n"));
            }
            if let Some(d) = &e.data {
                // Every line of the text its own `data:` line (an empty text is one empty line).
                let d = d.replace("\r\n", "\n").replace('\r', "\n");
                for l in d.split('\n') {
                    text.push_str(&format!("data: {l}\n"));
                }
            }
            if text.is_empty() {
                errs.push(
                    ConfigError::at(pos, format!("`sse.events[{i}]` sends nothing"))
                        .hint("give it `data`, `comment`, `event` or `id`"),
                );
            }
            text.push('\n');
            events.push((
                e.delay.map_or(Duration::ZERO, |d| d.0),
                Bytes::from(text),
                e.id.is_some(),
            ));
        }
        if events.is_empty() && cfg.repeat != 1 {
            errs.push(
                ConfigError::at(pos, "`sse.repeat` repeats no events")
                    .hint("list the events under `sse.events`"),
            );
        }
        (errs.len() == before).then(|| EventPlan {
            events,
            repeat: cfg.repeat,
            ids: cfg.ids,
            retry: cfg.retry.map(|ms| Bytes::from(format!("retry: {ms}\n\n"))),
            hold: cfg.then == SseThen::Hold,
        })
    }
}

impl EventPlan {
    /// A `chunks:` answer: each chunk's text as written, after its delay, once.
    pub(crate) fn chunks(chunks: &[crate::config::ChunkConfig]) -> EventPlan {
        EventPlan {
            events: chunks
                .iter()
                .map(|c| {
                    (
                        c.delay.map_or(Duration::ZERO, |d| d.0),
                        Bytes::from(c.data.clone()),
                        false,
                    )
                })
                .collect(),
            repeat: 1,
            ids: false,
            retry: None,
            hold: false,
        }
    }
}

/// A route's event streams.
#[derive(Debug, Default)]
pub(crate) struct StreamCounters {
    /// Open now.
    pub(crate) open: AtomicU64,
    /// Ended by the client (the answer dropped before its end).
    pub(crate) left: AtomicU64,
}

/// One event stream being sent.
pub(crate) struct EventsBody {
    plan: Arc<EventPlan>,
    /// The next event's number (from 0, across repeats).
    n: u64,
    retry: Option<Bytes>,
    /// Whether the next event's delay is running.
    armed: bool,
    sleep: Pin<Box<Sleep>>,
    counters: Arc<StreamCounters>,
    done: bool,
}

impl EventsBody {
    /// A stream of `plan` for a request whose `Last-Event-ID` is `last_id`.
    pub(crate) fn new(
        plan: Arc<EventPlan>,
        last_id: Option<&[u8]>,
        counters: Arc<StreamCounters>,
    ) -> EventsBody {
        let n = match plan.ids {
            true => last_id
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0),
            false => 0,
        };
        counters.open.fetch_add(1, Relaxed);
        EventsBody {
            retry: plan.retry.clone(),
            plan,
            n,
            armed: false,
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            counters,
            done: false,
        }
    }

    /// The stream's end (counted once).
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.counters.open.fetch_sub(1, Relaxed);
        }
    }

    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame<Bytes>>> {
        if let Some(r) = self.retry.take() {
            return Poll::Ready(Some(Frame::data(r)));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let len = self.plan.events.len() as u64;
        let total = len.saturating_mul(self.plan.repeat);
        if len == 0 || (self.plan.repeat != 0 && self.n >= total) {
            if self.plan.hold {
                // Held open: nothing more, until the client leaves.
                return Poll::Pending;
            }
            self.finish();
            return Poll::Ready(None);
        }
        let Some((delay, text, own_id)) = self.plan.events.get((self.n % len) as usize) else {
            self.finish();
            return Poll::Ready(None);
        };
        if !self.armed {
            self.armed = true;
            self.sleep.as_mut().reset(Instant::now() + *delay);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.armed = false;
        self.n += 1;
        if self.plan.ids && !own_id {
            let mut out = format!("id: {}\n", self.n).into_bytes();
            out.extend_from_slice(text);
            return Poll::Ready(Some(Frame::data(Bytes::from(out))));
        }
        Poll::Ready(Some(Frame::data(text.clone())))
    }
}

impl Drop for EventsBody {
    fn drop(&mut self) {
        if !self.done {
            self.counters.left.fetch_add(1, Relaxed);
            self.finish();
        }
    }
}
