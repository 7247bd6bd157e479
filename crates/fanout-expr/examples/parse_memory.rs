//! The memory a JSON text costs once parsed, per shape, measured with a counting allocator: the
//! figures behind the memory budget's estimate (`fanout_flow::memory::parsed_size_estimate`,
//! docs/resilience.md, "The memory estimate"). Run:
//! `cargo run --release -p fanout-expr --example parse_memory`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // measuring code: a failed unwrap is a failed run
use fanout_expr::json;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: a block of ours, with its layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `2 × bytes + per_value × (number of , : [ {)`.
fn estimate(text: &[u8], per_value: usize) -> usize {
    let marks = text
        .iter()
        .filter(|&&b| matches!(b, b',' | b':' | b'[' | b'{'))
        .count();
    text.len() * 2 + marks * per_value
}

fn main() {
    let n = 100_000;
    let join = |f: &dyn Fn(usize) -> String| {
        let items: Vec<String> = (0..n).map(f).collect();
        format!("[{}]", items.join(","))
    };
    let shapes: Vec<(&str, String)> = vec![
        (
            "database rows {\"g\":N}",
            join(&|i| format!(r#"{{"g":{}}}"#, 1_000_000 + i)),
        ),
        (
            "database rows {\"g\":N,\"name\":\"row N\"}",
            join(&|i| format!(r#"{{"g":{i},"name":"row {i}"}}"#)),
        ),
        (
            "objects of short fields",
            join(&|i| format!(r#"{{"id":{i},"name":"item{i}","tags":["a","b"]}}"#)),
        ),
        ("array of short strings", join(&|_| "\"a\"".into())),
        ("array of small ints", join(&|_| "1".into())),
        ("[{},{},…]", join(&|_| "{}".into())),
        ("[[],[],…]", join(&|_| "[]".into())),
        ("one long string", format!("\"{}\"", "x".repeat(n * 10))),
    ];
    println!("| shape | real | estimate (64 per value) | estimate (96 per value) |");
    println!("|---|---|---|---|");
    for (name, text) in shapes {
        let bytes = text.into_bytes();
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let v = json::parse(&bytes).unwrap();
        // Raw text + the value, as a request holds both while it parses.
        let real = PEAK.load(Ordering::Relaxed) - before + bytes.len();
        drop(v);
        let len = bytes.len() as f64;
        println!(
            "| {name} | {:.1}× | {:.1}× | {:.1}× |",
            real as f64 / len,
            estimate(&bytes, 64) as f64 / len,
            estimate(&bytes, 96) as f64 / len,
        );
    }
}
