//! Streamed answers in `fanout test` (a case's `stream:`; docs/testing.md#streamed-answers):
//! the body read as it arrives, up to the events the case reads, and compared in order with the
//! Server-Sent Events, NDJSON lines or chunks the case expects.

use super::cases::{ExpectedEvent, ExpectedStream};
use super::diff;
use bytes::Bytes;
use http_body_util::BodyExt;

/// One Server-Sent Event as read: `event`, `id`, `data` (lines joined by `\n`).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Event {
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
}

/// The events of `text` that ended (a blank line after them); comment-only blocks skipped.
pub(crate) fn events(text: &str) -> Vec<Event> {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut blocks: Vec<&str> = text.split("\n\n").collect();
    blocks.pop(); // not ended by a blank line (or empty)
    let mut out = Vec::new();
    for b in blocks {
        let mut e = Event::default();
        let mut any = false;
        for line in b.lines() {
            if line.starts_with(':') || line.is_empty() {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            any = true;
            match field {
                "event" => e.event = Some(value.to_string()),
                "id" => e.id = Some(value.to_string()),
                "data" => match &mut e.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => e.data = Some(value.to_string()),
                },
                _ => {}
            }
        }
        if any {
            out.push(e);
        }
    }
    out
}

/// How many events (or lines) `text` holds so far, in the case's form.
fn count(want: &ExpectedStream, text: &str) -> usize {
    if want.lines.is_some() {
        text.matches('\n').count()
    } else {
        events(text).len()
    }
}

/// Read `body` as it arrives: to its end, or until `want.max_events` events (lines) came, or
/// (chunks) every expected text is in it. The answer is then dropped.
pub(crate) async fn read<B>(want: &ExpectedStream, mut body: B) -> Result<Bytes, String>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut got: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the streamed answer: {e}"))?;
        if let Ok(d) = frame.into_data() {
            got.extend_from_slice(&d);
        }
        let text = String::from_utf8_lossy(&got);
        if let Some(max) = want.max_events
            && want.chunks.is_none()
            && count(want, &text) >= max
        {
            break;
        }
        if let Some(chunks) = &want.chunks
            && missing_chunk(chunks, &text).is_none()
        {
            break;
        }
    }
    Ok(Bytes::from(got))
}

/// The first expected chunk not found in order in `text`.
fn missing_chunk<'c>(chunks: &'c [String], text: &str) -> Option<&'c str> {
    let mut at = 0;
    for c in chunks {
        match text.get(at..).and_then(|rest| rest.find(c.as_str())) {
            Some(i) => at += i + c.len(),
            None => return Some(c),
        }
    }
    None
}

/// Compare what was read with what the case expects; a failure per difference.
pub(crate) fn check(want: &ExpectedStream, body: &[u8], fails: &mut Vec<String>) {
    let text = String::from_utf8_lossy(body);
    if let Some(chunks) = &want.chunks {
        if let Some(c) = missing_chunk(chunks, &text) {
            fails.push(format!(
                "stream.chunks: {c:?} not found (in order) in the answer: {}",
                diff::clip(&text, 400)
            ));
        }
        return;
    }
    if let Some(lines) = &want.lines {
        let got: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let got = match want.max_events {
            Some(m) => &got[..got.len().min(m)],
            None => &got[..],
        };
        if got.len() != lines.len() {
            fails.push(format!(
                "stream.lines: expected {} lines, got {}: {}",
                lines.len(),
                got.len(),
                diff::clip(&text, 400)
            ));
        }
        for (i, (w, g)) in lines.iter().zip(got).enumerate() {
            match serde_json::from_str::<serde_json::Value>(g) {
                Ok(v) if diff::json_eq(w, &v) => {}
                Ok(v) => fails.push(format!("stream.lines[{i}] differs:\n{}", diff::show(w, &v))),
                Err(_) => fails.push(format!("stream.lines[{i}]: expected JSON, got {g:?}")),
            }
        }
        return;
    }
    let expected = want.events.as_deref().unwrap_or_default();
    let mut got = events(&text);
    if let Some(m) = want.max_events {
        got.truncate(m);
    }
    if got.len() != expected.len() {
        fails.push(format!(
            "stream.events: expected {} events, got {}: {}",
            expected.len(),
            got.len(),
            diff::clip(&text, 400)
        ));
    }
    for (i, (w, g)) in expected.iter().zip(&got).enumerate() {
        if let Some(m) = event_misses(w, g) {
            fails.push(format!("stream.events[{i}]: {m}"));
        }
    }
}

/// How `g` differs from `w` in the fields `w` gives.
fn event_misses(w: &ExpectedEvent, g: &Event) -> Option<String> {
    let mut misses = Vec::new();
    for (field, want, got) in [("event", &w.event, &g.event), ("id", &w.id, &g.id)] {
        if want.is_some() && want != got {
            misses.push(format!("{field}: expected {want:?}, got {got:?}"));
        }
    }
    if let Some(want) = &w.data {
        let got = g.data.as_deref().unwrap_or("");
        let same = match serde_json::from_str::<serde_json::Value>(got) {
            Ok(v) => diff::json_eq(want, &v) || want.as_str() == Some(got),
            Err(_) => want.as_str() == Some(got),
        };
        if !same {
            misses.push(format!("data: expected {want}, got {got:?}"));
        }
    }
    (!misses.is_empty()).then(|| misses.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_with_their_fields_and_comments_skipped() {
        let text =
            ": hi\n\nevent: a\nid: 1\ndata: {\"x\":1}\n\ndata: two\ndata: lines\n\ndata: unended";
        let got = events(text);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].event.as_deref(), Some("a"));
        assert_eq!(got[0].id.as_deref(), Some("1"));
        assert_eq!(got[1].data.as_deref(), Some("two\nlines"));
    }

    #[test]
    fn chunks_are_found_in_order() {
        let chunks = vec!["a".to_string(), "b".to_string()];
        assert_eq!(missing_chunk(&chunks, "xxaxxb"), None);
        assert_eq!(missing_chunk(&chunks, "bxa"), Some("b"));
    }
}
