//! The JSON reader (`fanout_expr::json::parse_limited`: request bodies, backend answers): any
//! bytes are a value or a `ParseError`, never a panic, a hang or unbounded memory. What it
//! accepts writes back (`json::write`) to text that reads again as the same value, and it
//! accepts and refuses what serde_json does, but for the two documented differences (numbers
//! beyond f64, which only serde_json refuses; the depth limit, one level apart).

#![no_main]

use fanout_expr::json;
use libfuzzer_sys::fuzz_target;

/// Deep enough for nesting to matter, below serde_json's own limit (127 levels).
const MAX_DEPTH: usize = 100;

fuzz_target!(|data: &[u8]| {
    let ours = json::parse_limited(data, MAX_DEPTH);
    let theirs = serde_json::from_slice::<serde_json::Value>(data);
    match (&ours, &theirs) {
        (Ok(v), _) => {
            let mut text = Vec::new();
            json::write(v, &mut text);
            let again = match json::parse_limited(&text, MAX_DEPTH) {
                Ok(again) => again,
                Err(e) => panic!("its own writing does not read: {e}: {}", show(&text)),
            };
            let mut text2 = Vec::new();
            json::write(&again, &mut text2);
            assert_eq!(
                show(&text),
                show(&text2),
                "parse → write → parse changed the value"
            );
            if let Err(e) = theirs {
                assert!(
                    e.to_string().starts_with("number out of range"),
                    "only serde_json refused: {e}"
                );
            }
        }
        (Err(e), Ok(_)) => assert!(
            e.message().starts_with("JSON nested deeper than"),
            "only ours refused: {e}"
        ),
        (Err(_), Err(_)) => {}
    }
});

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
