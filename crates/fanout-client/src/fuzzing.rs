//! Entry points for the coverage-guided fuzz targets (`fuzz/`, docs/ARCHITECTURE.md "Fuzzing"):
//! not part of the client's API, and never on a call's path.

use crate::body::CallBody;
use bytes::Bytes;
use fanout_layers::backend::{CallError, CallErrorKind};
use http::header::HOST;
use http::{HeaderValue, Method, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Read `answer` as a backend's HTTP/1.1 answer to a `GET /` (`HEAD /` when `head`), as a call
/// on the HTTP/1 pool reads one ([`crate::h1pool`]): hyper's HTTP/1 client with the pool's
/// options parses the status line, headers and body framing, the body is read within `limit`
/// bytes ([`crate::client::read_body`]) and decoded by its `Content-Encoding`. The bytes arrive
/// in pieces of at most `piece` bytes (at least 1) through an in-memory pipe, and the pipe ends
/// after them, as if the backend closed the connection.
///
/// Every answer must come back as `Ok` or a typed [`CallError`]: no panic, no hang.
pub async fn h1_answer(
    answer: &[u8],
    head: bool,
    piece: usize,
    limit: usize,
) -> Result<(StatusCode, Bytes), CallError> {
    let (client_io, server_io) = tokio::io::duplex(piece.max(1));
    let (mut server_rd, mut server_wr) = tokio::io::split(server_io);
    let backend = async move {
        // The answer follows the request's head, as from a server (hyper refuses bytes that
        // come before a request was sent).
        let mut head = Vec::new();
        let mut sink = [0u8; 256];
        while !head.ends_with(b"\r\n\r\n") {
            match server_rd.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&sink[..n]),
            }
        }
        let write = async {
            let _ = server_wr.write_all(answer).await;
            let _ = server_wr.shutdown().await;
        };
        // The rest is read (and dropped) while the answer is written, until the client closes.
        let drain = async {
            while let Ok(n) = server_rd.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::join!(write, drain);
    };
    let reset = |what: &str, e: &dyn std::fmt::Display| {
        CallError::new(CallErrorKind::Reset, format!("{what}: {e}"))
    };
    let call = async move {
        let (mut send, conn) = crate::h1pool::handshake(client_io)
            .await
            .map_err(|e| reset("handshake", &e))?;
        let mut req = Request::new(CallBody::new(Bytes::new()));
        if head {
            *req.method_mut() = Method::HEAD;
        }
        req.headers_mut()
            .insert(HOST, HeaderValue::from_static("backend"));
        let exchange = async move {
            let resp = send
                .send_request(req)
                .await
                .map_err(|e| reset("no answer", &e))?;
            let (parts, body) = resp.into_parts();
            let body = crate::client::read_body(body, limit).await?;
            let body = crate::decode::decode_answer(&parts.headers, body, limit).await?;
            // `send` is dropped here: the connection's task ends once the answer is read.
            Ok((parts.status, body))
        };
        let (answer, _) = tokio::join!(exchange, conn);
        answer
    };
    let ((), answer) = tokio::join!(backend, call);
    answer
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
    use super::*;

    const LIMIT: usize = 1 << 16;

    #[tokio::test]
    async fn an_answer_with_a_length_is_read_whole_in_pieces_of_any_size() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        for piece in [1, 2, 7, 64, 4096] {
            let (status, body) = h1_answer(answer, false, piece, LIMIT).await.unwrap();
            assert_eq!(
                (status.as_u16(), &body[..]),
                (200, &b"hello"[..]),
                "{piece}"
            );
        }
    }

    #[tokio::test]
    async fn chunked_and_read_to_close_bodies_are_read() {
        let chunked =
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n1\r\nd\r\n0\r\n\r\n";
        let (status, body) = h1_answer(chunked, false, 3, LIMIT).await.unwrap();
        assert_eq!((status.as_u16(), &body[..]), (201, &b"abcd"[..]));
        let to_close = b"HTTP/1.1 200 OK\r\n\r\nuntil the end";
        let (_, body) = h1_answer(to_close, false, 5, LIMIT).await.unwrap();
        assert_eq!(&body[..], b"until the end");
    }

    #[tokio::test]
    async fn a_head_answer_has_no_body_whatever_its_length_says() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n";
        let (status, body) = h1_answer(answer, true, 16, LIMIT).await.unwrap();
        assert_eq!((status.as_u16(), body.len()), (200, 0));
    }

    #[tokio::test]
    async fn broken_answers_are_typed_errors() {
        let cases: [(&[u8], CallErrorKind); 5] = [
            (b"", CallErrorKind::Reset),
            (b"garbage\r\n\r\n", CallErrorKind::Reset),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
                CallErrorKind::Reset,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 9999999\r\n\r\n",
                CallErrorKind::BodyTooLarge,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nxyz",
                CallErrorKind::BadEncoding,
            ),
        ];
        for (answer, kind) in cases {
            let e = h1_answer(answer, false, 8, LIMIT).await.unwrap_err();
            assert_eq!(e.kind, kind, "{}: {e}", String::from_utf8_lossy(answer));
        }
    }
}
