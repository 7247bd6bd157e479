//! Bad input gets a clear status and JSON error — never a panic, a hang or a dead server.

use crate::support::gateway;
use bytes::Bytes;
use fanout_testkit::*;
use http::Method;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - path: /echo
        method: "*"
        body: '{body: $request.body}'
"#;

const GATEWAY: &str = r#"
server:
  max_body_bytes: 1024
  max_header_bytes: 8192
backends:
  a: { url: "http://${A_ADDR}" }
routes:
  - path: /items/{id}
    method: POST
    flow:
      e: { http: { backend: a, method: POST, path: '"/echo"', body: '{id: $request.params.id, in: $request.body}' } }
    respond: { body: '$e.body' }
  - path: /items/{id}
    method: GET
    flow: {}
    respond: { body: '{id: $request.params.id}' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_request_gets_its_status_and_a_json_error() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = format!("http://{}/items/7", gw.addr);

    let ok = send(&c, Method::POST, &url, &[], r#"{"a":1}"#).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json(), serde_json::json!({"id": "7", "in": {"a": 1}}));

    type Case<'a> = (
        &'a str,
        Method,
        String,
        Vec<(&'a str, &'a str)>,
        Bytes,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            Method::POST,
            url.clone(),
            vec![],
            Bytes::from_static(b"{\"a\":"),
            400,
            "invalid_json",
        ),
        (
            "oversized body",
            Method::POST,
            url.clone(),
            vec![],
            Bytes::from(vec![b' '; 4096]),
            413,
            "body_too_large",
        ),
        (
            "bad deadline header",
            Method::GET,
            url.clone(),
            vec![("x-request-timeout", "soon")],
            Bytes::new(),
            400,
            "bad_header",
        ),
        (
            "bad grpc-timeout",
            Method::GET,
            url.clone(),
            vec![("grpc-timeout", "1x")],
            Bytes::new(),
            400,
            "bad_header",
        ),
        (
            "unknown route",
            Method::GET,
            format!("http://{}/nope", gw.addr),
            vec![],
            Bytes::new(),
            404,
            "not_found",
        ),
        (
            "wrong method",
            Method::DELETE,
            url.clone(),
            vec![],
            Bytes::new(),
            405,
            "method_not_allowed",
        ),
    ];
    for (what, method, u, headers, body, status, code) in cases {
        let r = send(&c, method, &u, &headers, body).await;
        assert_eq!(
            r.status.as_u16(),
            status,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.code(), code, "{what}");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        if status == 405 {
            assert_eq!(r.headers["allow"], "POST, GET");
        }
    }
    // A chunked body without Content-Length is limited while streaming.
    let big =
        futures_util::stream::iter((0..64).map(|_| {
            Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![b' '; 64])))
        }));
    let req = http::Request::post(&url)
        .body(http_body_util::StreamBody::new(big))
        .unwrap();
    let raw = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::StreamBody<_>>();
    let resp = raw.request(req).await.unwrap();
    assert_eq!(resp.status(), 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_garbage_and_huge_headers_do_not_hurt_the_server() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let garbage: [&[u8]; 5] = [
        b"\x00\x01\x02\x03garbage\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /items/1 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /items/1 HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x09\x00\x00\x00\x00\x00garbage-frame",
    ];
    for g in garbage {
        let mut sock = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        sock.write_all(g).await.unwrap();
        let mut buf = Vec::new();
        // The server answers 400 or closes; either way it must not hang.
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            sock.read_to_end(&mut buf),
        )
        .await
        .expect("server closed or answered garbage within 5 s");
    }
    let huge = "x".repeat(20_000);
    let r = send(
        &client(false),
        Method::GET,
        &format!("http://{}/items/1", gw.addr),
        &[("x-big", &huge)],
        "",
    )
    .await;
    assert_eq!(r.status, 431, "oversized headers are refused");
    // Still healthy.
    let ok = get(&format!("http://{}/items/1", gw.addr)).await;
    assert_eq!(ok.status, 200);
}

/// HTTP/1.1 and h2c share the port, so a connection is HTTP/1 unless it starts with the HTTP/2
/// preface. One whose first line is neither (h2spec 3.5/2's invalid preface, a preface broken
/// after its first line, another version, garbage) is closed without an HTTP/1.1 answer: its
/// client does not speak HTTP/1 (RFC 9113 §3.4). An HTTP/1 request line after leading empty
/// lines, or sent byte by byte, is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_is_neither_http1_nor_http2_is_closed_without_an_answer() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let exchange = async |parts: &[&[u8]]| -> Vec<u8> {
        let mut sock = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        for p in parts {
            sock.write_all(p).await.unwrap();
        }
        let mut buf = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            sock.read_to_end(&mut buf),
        )
        .await
        .expect("the server closes in time");
        // closed with a FIN (what the client sent was read first), not a reset
        read.unwrap();
        buf
    };
    for not_http in [
        &b"INVALID CONNECTION PREFACE\r\n\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
        b"GET /items/1 HTTP/2.0\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5garbage\r\n\r\n",
    ] {
        let got = exchange(&[not_http]).await;
        assert!(
            got.is_empty(),
            "{:?} got an answer: {:?}",
            String::from_utf8_lossy(not_http),
            String::from_utf8_lossy(&got)
        );
    }
    let bytes: Vec<[u8; 1]> = b"GET /items/7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        .iter()
        .map(|b| [*b])
        .collect();
    let parts: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
    for parts in [
        &[&b"\r\nGET /items/7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..]][..],
        &parts,
    ] {
        let got = String::from_utf8(exchange(parts).await).unwrap();
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.ends_with(r#"{"id":"7"}"#), "{got}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_ten_thousand_random_requests_without_a_panic() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x00fa_4007);
    let alphabet: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-._~%/{}[]:,\"' \\\n\t\x00\xff";
    let url_safe: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-._~%/";
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let n = 10_000;
    for i in 0..n {
        let len = rng.random_range(0..64);
        let path: String = (0..len)
            .map(|_| url_safe[rng.random_range(0..url_safe.len())] as char)
            .collect();
        let path = match i % 4 {
            0 => format!("/items/{path}"),
            1 => format!("/{path}"),
            _ => "/items/fz".to_string(),
        };
        let blen = rng.random_range(0..200);
        let body: Vec<u8> = if i % 3 == 0 {
            // Structured-looking JSON with random breakage.
            let mut b = format!("{{\"k\":[{},\"{}\"]", rng.random::<u32>(), i).into_bytes();
            if rng.random_bool(0.5) {
                b.push(b'}');
            }
            b
        } else {
            (0..blen)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect()
        };
        let method = if i % 2 == 0 {
            Method::POST
        } else {
            Method::GET
        };
        let url = format!("http://{}{}", gw.addr, path);
        let Ok(uri) = url.parse::<http::Uri>() else {
            continue;
        };
        let r = send(&c, method, &uri.to_string(), &[], body).await;
        assert!(
            matches!(r.status.as_u16(), 200 | 400 | 404 | 405 | 413),
            "unexpected {} for {path}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        if r.status != 200 {
            assert!(!r.code().is_empty(), "error bodies are JSON with a code");
        }
        *statuses.entry(r.status.as_u16()).or_default() += 1;
    }
    assert!(
        statuses.values().sum::<usize>() >= n * 9 / 10,
        "{statuses:?}"
    );
    assert!(
        statuses.len() >= 3,
        "the fuzz reached several outcomes: {statuses:?}"
    );
    let ok = get(&format!("http://{}/items/1", gw.addr)).await;
    assert_eq!(ok.status, 200);
}
