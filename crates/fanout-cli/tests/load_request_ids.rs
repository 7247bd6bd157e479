//! `fanout load --distinct-request-ids`: every request carries its own `x-request-id` (as distinct
//! clients would), seen by a hand-written hyper server that records each request's id; and an
//! `x-request-id` given with -H beside the flag is refused before anything is sent.
//!
//! Counts and exit codes only, no timings (a loaded 2-core machine): a run the generator could
//! not keep on schedule exits 3 instead of 0, which is accepted.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// An HTTP/1.1 server answering 200 to everything, recording each request's `x-request-id`
/// (`-` when it had none).
async fn recording_server() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let ids = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ids = ids.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let id = req
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_string();
                    ids.lock().unwrap().push(id);
                    async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

async fn load(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("load")
        .args(args)
        .output()
        .await
        .expect("run fanout load")
}

#[tokio::test]
async fn every_request_has_its_own_request_id() {
    let (addr, seen) = recording_server().await;
    let url = format!("http://{addr}/x");
    // 300 requests over 1.5 s from up to 16 connections: fewer than the 1 024 ids sent in turn.
    let out = load(&[
        &url,
        "--schedule",
        "const(200,1500ms)",
        "--connections",
        "16",
        "--distinct-request-ids",
    ])
    .await;
    let code = out.status.code();
    assert!(
        matches!(code, Some(0) | Some(3)),
        "exit {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = seen.lock().unwrap().clone();
    assert_eq!(ids.len(), 300, "requests the server saw");
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "every request its own x-request-id"
    );
    assert!(ids.iter().all(|id| id.starts_with("load-")), "{ids:?}");

    // Without the flag: no x-request-id at all (the generator adds none of its own).
    seen.lock().unwrap().clear();
    let out = load(&[&url, "--schedule", "const(100,200ms)", "--connections", "4"]).await;
    assert!(matches!(out.status.code(), Some(0) | Some(3)));
    let ids = seen.lock().unwrap().clone();
    assert_eq!(ids.len(), 20);
    assert!(ids.iter().all(|id| id == "-"), "{ids:?}");
}

#[tokio::test]
async fn a_request_id_header_beside_the_flag_is_refused() {
    let (addr, seen) = recording_server().await;
    let url = format!("http://{addr}/x");
    let out = load(&[
        &url,
        "--schedule",
        "const(10,1s)",
        "--distinct-request-ids",
        "-H",
        "X-Request-Id: mine",
    ])
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--distinct-request-ids"), "{err}");
    assert!(seen.lock().unwrap().is_empty(), "nothing is sent");
}
