//! One log event, one line: the writer of `fanout`'s log escapes whatever in an event could
//! start a line of its own or rewrite the terminal — a line break, a carriage return, another
//! control character, U+0085, U+2028, U+2029 — wherever it comes from (a field a request
//! chose, a backend's message, a parser's error that quotes its input). A log reader or shipper
//! that splits on lines can then never be handed a forged line (issue 69 §3).
//!
//! `tracing-subscriber` formats each event into one buffer and writes it with one `write_all`,
//! so [`OneLine`] sees the whole event: its final `\n` is kept, every other one escaped.

use std::io::Write;

/// The log's [`tracing_subscriber::fmt::MakeWriter`]: standard error, one line per event.
#[derive(Clone, Copy)]
pub struct OneLine {
    /// Text with ANSI colours: the formatter's own escape sequences are kept.
    pub ansi: bool,
    /// JSON lines: serde already escaped control characters; U+2028/U+2029 become `\u2028`.
    pub json: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for OneLine {
    type Writer = OneLineWriter<std::io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter {
            mode: *self,
            out: std::io::stderr(),
        }
    }
}

/// The writer of one event ([`OneLine`]).
pub struct OneLineWriter<W> {
    mode: OneLine,
    out: W,
}

impl<W: Write> OneLineWriter<W> {
    /// A writer of events to `out`.
    pub fn new(mode: OneLine, out: W) -> OneLineWriter<W> {
        OneLineWriter { mode, out }
    }
}

impl<W: Write> Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !body
            .iter()
            .any(|&b| b < 0x20 || b == 0x7f || b == 0xc2 || b == 0xe2)
        {
            self.out.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut v = Vec::with_capacity(buf.len() + 16);
        escape(body, self.mode, &mut v);
        if body.len() < buf.len() {
            v.push(b'\n');
        }
        self.out.write_all(&v)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// `body` (one event without its final line break) with what could break the line escaped.
fn escape(body: &[u8], mode: OneLine, v: &mut Vec<u8>) {
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        // U+0085 (C2 85), U+2028 and U+2029 (E2 80 A8/A9): line breaks to some readers.
        let wide = match (b, body.get(i + 1), body.get(i + 2)) {
            (0xc2, Some(0x85), _) => Some((2, 0x85)),
            (0xe2, Some(0x80), Some(0xa8)) => Some((3, 0x2028)),
            (0xe2, Some(0x80), Some(0xa9)) => Some((3, 0x2029)),
            _ => None,
        };
        if let Some((len, cp)) = wide {
            if mode.json {
                v.extend_from_slice(format!("\\u{cp:04x}").as_bytes());
            } else {
                v.extend_from_slice(format!("\\u{{{cp:x}}}").as_bytes());
            }
            i += len;
            continue;
        }
        match b {
            b'\n' => v.extend_from_slice(b"\\n"),
            b'\r' => v.extend_from_slice(b"\\r"),
            b'\t' => v.push(b),
            0x1b if mode.ansi => v.push(b),
            b if b < 0x20 || b == 0x7f => {
                if mode.json {
                    v.extend_from_slice(format!("\\u{b:04x}").as_bytes());
                } else {
                    v.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes());
                }
            }
            _ => v.push(b),
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(mode: OneLine, event: &[u8]) -> String {
        let mut out = Vec::new();
        let mut w = OneLineWriter::new(mode, &mut out);
        w.write_all(event).unwrap();
        String::from_utf8(out).unwrap()
    }

    const TEXT: OneLine = OneLine {
        ansi: false,
        json: false,
    };

    #[test]
    fn an_event_is_one_line_whatever_its_fields_hold() {
        let forged = "2026 WARN x: detail=RS256\n2026-01-01T00:00:00Z  INFO fanout: FORGED\r\x1b[2J\u{2028}x\u{85}\n";
        let out = written(TEXT, forged.as_bytes());
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(out.ends_with('\n'));
        assert_eq!(
            out,
            "2026 WARN x: detail=RS256\\n2026-01-01T00:00:00Z  INFO fanout: FORGED\\r\\u{1b}[2J\\u{2028}x\\u{85}\n"
        );
        // A plain event is written as it is; a colour sequence of the formatter's is kept.
        assert_eq!(written(TEXT, b"plain\tline\n"), "plain\tline\n");
        let ansi = OneLine {
            ansi: true,
            json: false,
        };
        assert_eq!(
            written(ansi, b"\x1b[32mINFO\x1b[0m a\nb\n"),
            "\x1b[32mINFO\x1b[0m a\\nb\n"
        );
        // JSON: valid JSON escapes.
        let json = OneLine {
            ansi: false,
            json: true,
        };
        let out = written(json, "{\"m\":\"a\u{2028}b\"}\n".as_bytes());
        assert_eq!(out, "{\"m\":\"a\\u2028b\"}\n");
        let v: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(v["m"], "a\u{2028}b");
    }
}
