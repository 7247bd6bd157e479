//! The HTTP/1 pool's answer parsing (`fanout_client::fuzzing::h1_answer`: hyper's HTTP/1 client
//! with the pool's options, the body read within a limit and decoded by its
//! `Content-Encoding`): any bytes from a backend are an answer or a typed `CallError`, never a
//! panic, a hang or unbounded memory, and an answer's body is never over the limit.
//!
//! Input: the first byte chooses the request's method (bit 7: `HEAD`, else `GET`) and the size
//! of the pieces the answer arrives in (the low 7 bits + 1; 128: all at once); the rest is
//! what the backend sends before it closes the connection.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// `max_response_bytes` here: small, so that inputs of a few KiB reach it (with or without a
/// content coding).
const LIMIT: usize = 2048;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, answer)) = data.split_first() else {
        return;
    };
    let head = first & 0x80 != 0;
    let piece = match first & 0x7f {
        0x7f => 1 << 16,
        n => usize::from(n) + 1,
    };
    let got = runtime().block_on(fanout_client::fuzzing::h1_answer(
        answer, head, piece, LIMIT,
    ));
    if let Ok((_, body)) = got {
        assert!(body.len() <= LIMIT, "a body of {} bytes", body.len());
    }
});
