//! HTTP compression (docs/config.md#compression): answers encoded by what the client accepts
//! (q-values, `identity;q=0`, `*`, unknown codings), only above `min_bytes` and for compressible
//! types, never on a route with `compression: off`, always with `Vary: Accept-Encoding`; curl
//! decodes each coding to the plain answer; request bodies decoded under the decoded-size
//! limit (415 when not accepted, 413 for a bomb, with the RSS of a `fanout serve` child bounded);
//! backend answers decoded with `max_response_bytes` on the decoded size and `Accept-Encoding`
//! sent only when configured.

use crate::support::{ServeProcess, gateway};
use fanout_compress::Coding;
use fanout_testkit::*;
use http::Method;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// A realistic JSON answer (a product list) of about 60 KB, made by the flow itself.
const ITEMS: &str = r#"'[range(0; 400) | {id: ("p-" + tostring), name: "Product number \(.)", price: ((. * 37) % 1000 + 0.99), currency: "EUR", stock: {available: ((. % 3) != 0), quantity: ((. * 13) % 50)}, tags: ["garden", "tools", "outdoor"], media: {thumbnail: "https://cdn.example.com/img/\(.)/thumb.jpg"}}]'"#;

/// One idle stub (the harness wants one).
const NO_STUBS: &str = r#"
services:
  idle:
    listen: "${IDLE_ADDR}"
    routes:
      - path: /
        body: '{}'
"#;

fn gateway_yaml() -> String {
    format!(
        r#"
compression:
  response:
    enabled: true
    min_bytes: 1024
    compute_above_bytes: 20000
  request:
    decode: [gzip, br, zstd]
server:
  max_body_bytes: 2097152
routes:
  - path: /items
    flow: {{}}
    respond: {{ body: {ITEMS} }}
  - path: /small
    flow: {{}}
    respond: {{ body: '{{ok: true}}' }}
  - path: /picture
    flow: {{}}
    respond:
      body: {ITEMS}
      headers: {{ content-type: '"image/png"' }}
  - path: /secret
    compression: off
    flow: {{}}
    respond: {{ body: {ITEMS} }}
  - path: /cors
    cors: {{ origins: [https://app.example.com] }}
    flow: {{}}
    respond: {{ body: {ITEMS} }}
  - path: /tagged
    flow: {{}}
    respond:
      body: '[range(0; 100) | {{id: ., name: "item \(.)"}}]'
      headers: {{ etag: '"\"v1\""' }}
  - path: /no-transform
    flow: {{}}
    respond:
      body: {ITEMS}
      headers: {{ cache-control: '"public, no-transform"' }}
  - path: /echo
    method: POST
    flow: {{}}
    respond: {{ body: '{{got: $request.body}}' }}
"#
    )
}

fn vary(r: &Resp) -> Vec<String> {
    r.headers
        .get_all("vary")
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect()
}

async fn get_with(c: &TestClient, url: &str, accept: Option<&str>) -> Resp {
    let h: Vec<(&str, &str)> = accept.map(|a| ("accept-encoding", a)).into_iter().collect();
    send(c, Method::GET, url, &h, "").await
}

/// The body of `r` decoded by its `Content-Encoding` (as it is without one).
fn decoded(r: &Resp) -> Vec<u8> {
    match r.header("content-encoding") {
        None => r.body.to_vec(),
        Some(c) => {
            let c = Coding::from_token(c).unwrap_or_else(|| panic!("coding {c}"));
            fanout_compress::decode(c, &r.body, 1 << 30).unwrap()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_compressed_by_what_the_client_accepts() {
    let s = stubs(NO_STUBS).await;
    let gw = gateway(&gateway_yaml(), &s).await;
    let c = client(false);
    let url = format!("http://{}/items", gw.addr);

    let plain = get_with(&c, &url, None).await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("content-encoding"), None, "no header: plain");
    assert!(vary(&plain).contains(&"accept-encoding".to_string()));
    assert!(plain.body.len() > 40_000, "{}", plain.body.len());
    let plain_json = plain.json();

    let cases: &[(&str, Option<&str>)] = &[
        ("gzip", Some("gzip")),
        ("br", Some("br")),
        ("zstd", Some("zstd")),
        ("gzip, deflate, br, zstd", Some("zstd")),
        ("gzip, br", Some("br")),
        ("br;q=0.5, gzip;q=0.8", Some("gzip")),
        ("zstd;q=0.1, br;q=0.2, gzip;q=0.15", Some("br")),
        ("*", Some("zstd")),
        ("*;q=0.5, zstd;q=0", Some("br")),
        ("identity;q=0, gzip", Some("gzip")),
        ("gzip;q=0.5, identity", None),
        ("identity;q=0", None),
        ("gzip;q=0", None),
        ("deflate, compress", None),
        ("", None),
    ];
    for (accept, want) in cases {
        let r = get_with(&c, &url, Some(accept)).await;
        assert_eq!(r.status, 200, "{accept}");
        assert_eq!(
            r.header("content-encoding"),
            *want,
            "Accept-Encoding: {accept}"
        );
        assert!(
            vary(&r).contains(&"accept-encoding".to_string()),
            "{accept}: Vary"
        );
        let body = decoded(&r);
        assert_eq!(body, plain.body, "{accept}: byte-identical after decoding");
        if want.is_some() {
            assert!(
                r.body.len() * 4 <= plain.body.len(),
                "{accept}: {} of {}",
                r.body.len(),
                plain.body.len()
            );
            assert_eq!(
                r.header("content-length"),
                Some(r.body.len().to_string().as_str()),
                "{accept}: the length sent is the encoded one"
            );
        }
    }
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&decoded(
            &get_with(&c, &url, Some("gzip")).await
        ))
        .unwrap(),
        plain_json
    );

    // Below min_bytes, a type that is not compressible, a route with `compression: off`, HEAD:
    // as they are (and no Vary where nothing depends on Accept-Encoding).
    let all = Some("gzip, br, zstd");
    let small = get_with(&c, &format!("http://{}/small", gw.addr), all).await;
    assert_eq!(small.header("content-encoding"), None);
    assert_eq!(small.json()["ok"], true);
    let pic = get_with(&c, &format!("http://{}/picture", gw.addr), all).await;
    assert_eq!(pic.header("content-type"), Some("image/png"));
    assert_eq!(pic.header("content-encoding"), None);
    assert_eq!(pic.body, plain.body);
    let secret = get_with(&c, &format!("http://{}/secret", gw.addr), all).await;
    assert_eq!(secret.header("content-encoding"), None, "compression: off");
    assert!(!vary(&secret).contains(&"accept-encoding".to_string()));
    assert_eq!(secret.body, plain.body);
    let head = send(&c, Method::HEAD, &url, &[("accept-encoding", "gzip")], "").await;
    assert_eq!(head.header("content-encoding"), None, "HEAD");

    // `Cache-Control: no-transform`: as it is. A strong ETag becomes weak when the answer is
    // encoded (this one, ~3 KB, inline: under compute_above_bytes).
    let nt = get_with(&c, &format!("http://{}/no-transform", gw.addr), all).await;
    assert_eq!(nt.header("content-encoding"), None, "no-transform");
    assert_eq!(nt.body, plain.body);
    let tagged_url = format!("http://{}/tagged", gw.addr);
    let tagged = get_with(&c, &tagged_url, Some("gzip")).await;
    assert_eq!(tagged.header("content-encoding"), Some("gzip"));
    assert_eq!(tagged.header("etag"), Some(r#"W/"v1""#));
    assert_eq!(
        decoded(&tagged),
        get_with(&c, &tagged_url, None).await.body,
        "the small answer decodes to the plain one"
    );
    assert_eq!(
        get_with(&c, &tagged_url, None).await.header("etag"),
        Some(r#""v1""#),
        "plain: the strong ETag as it is"
    );

    // A CORS route: Vary names both.
    let cors = send(
        &c,
        Method::GET,
        &format!("http://{}/cors", gw.addr),
        &[
            ("accept-encoding", "br"),
            ("origin", "https://app.example.com"),
        ],
        "",
    )
    .await;
    assert_eq!(cors.header("content-encoding"), Some("br"));
    let v = vary(&cors);
    assert!(v.contains(&"origin".to_string()), "{v:?}");
    assert!(v.contains(&"accept-encoding".to_string()), "{v:?}");
    assert_eq!(decoded(&cors), plain.body);

    // Counted by coding, before and after.
    let status = gw.gateway.status_json();
    let comp = &status["compression"];
    assert!(comp["answers"]["zstd"].as_u64().unwrap() >= 3, "{comp}");
    assert!(comp["answers"]["br"].as_u64().unwrap() >= 3, "{comp}");
    assert!(comp["answers"]["gzip"].as_u64().unwrap() >= 3, "{comp}");
    let before = comp["bytes_before"]["gzip"].as_u64().unwrap();
    let after = comp["bytes_after"]["gzip"].as_u64().unwrap();
    assert!(after * 4 <= before, "{comp}");
    // The large answers (~60 KB, over compute_above_bytes) were encoded on the compute pool.
    let compute = &status["runtime"]["compute"];
    assert!(compute["done"].as_u64().unwrap() >= 9, "{compute}");
}

/// Issue 69 §9: repeated `Accept-Encoding` lines are one list (RFC 9110 §5.3), on HTTP/1.1
/// and HTTP/2 — not the first line alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_accept_encoding_lines_are_one_list() {
    let s = stubs(NO_STUBS).await;
    let gw = gateway(&gateway_yaml(), &s).await;
    let url = format!("http://{}/items", gw.addr);
    let cases: &[(&[&str], Option<&str>)] = &[
        (&["gzip;q=0.1", "br"], Some("br")),
        (&["gzip;q=0", "br;q=0.5"], Some("br")),
        (&["identity", "zstd;q=0.5", "gzip"], Some("gzip")),
        (&["deflate", "gzip;q=0"], None),
        (&["br;q=0", "gzip, zstd;q=0"], Some("gzip")),
    ];
    for h2 in [false, true] {
        let c = client(h2);
        for (lines, want) in cases {
            let h: Vec<(&str, &str)> = lines.iter().map(|l| ("accept-encoding", *l)).collect();
            let r = send(&c, Method::GET, &url, &h, "").await;
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-encoding"), *want, "h2 {h2}: {lines:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_decodes_every_coding_to_the_plain_answer() {
    let s = stubs(NO_STUBS).await;
    let gw = gateway(&gateway_yaml(), &s).await;
    let url = format!("http://{}/items", gw.addr);
    let plain = get(&url).await.body;
    for coding in ["gzip", "br", "zstd"] {
        let url = url.clone();
        let (headers, body) = tokio::task::spawn_blocking(move || {
            let out = Command::new("curl")
                .args(["-sS", "-D", "-", "--compressed", "-H"])
                .arg(format!("Accept-Encoding: {coding}"))
                .arg(&url)
                .output()
                .expect("curl runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = out.stdout;
            let split = text
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("headers end");
            (
                String::from_utf8_lossy(&text[..split]).to_ascii_lowercase(),
                text[split + 4..].to_vec(),
            )
        })
        .await
        .unwrap();
        assert!(
            headers.contains(&format!("content-encoding: {coding}")),
            "{coding}: {headers}"
        );
        assert_eq!(body, plain, "{coding}: curl decodes to the plain answer");
    }
    // Python's gzip module too, for gzip.
    let r = get_with(&client(false), &url, Some("gzip")).await;
    let gz = r.body.to_vec();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import sys, gzip; sys.stdout.buffer.write(gzip.decompress(sys.stdin.buffer.read()))",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&gz).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success());
    assert_eq!(
        out.stdout, plain,
        "python's gzip decodes to the plain answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_decoded_when_configured() {
    let s = stubs(NO_STUBS).await;
    let gw = gateway(&gateway_yaml(), &s).await;
    let c = client(false);
    let url = format!("http://{}/echo", gw.addr);
    let json = br#"{"products": ["a", "b"], "n": 42}"#;
    for coding in [Coding::Gzip, Coding::Br, Coding::Zstd] {
        let body = fanout_compress::encode(coding, coding.default_level(), json).unwrap();
        let r = send(
            &c,
            Method::POST,
            &url,
            &[("content-encoding", coding.name())],
            body,
        )
        .await;
        assert_eq!(r.status, 200, "{coding}: {}", r.text());
        assert_eq!(r.json()["got"]["n"], 42, "{coding}");
    }
    // identity is no coding.
    let r = send(
        &c,
        Method::POST,
        &url,
        &[("content-encoding", "identity")],
        &json[..],
    )
    .await;
    assert_eq!(r.json()["got"]["n"], 42);
    // Not valid gzip: 400.
    let r = send(
        &c,
        Method::POST,
        &url,
        &[("content-encoding", "gzip")],
        &json[..],
    )
    .await;
    assert_eq!((r.status.as_u16(), r.code()), (400, "bad_encoding".into()));
    // A coding not accepted: 415, naming what is.
    let r = send(
        &c,
        Method::POST,
        &url,
        &[("content-encoding", "deflate")],
        &json[..],
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.code()),
        (415, "unsupported_encoding".into())
    );
    assert_eq!(r.header("accept-encoding"), Some("gzip, br, zstd"));

    // A gateway that accepts none: 415 for any coding.
    let none = gateway(
        r#"
routes:
  - path: /echo
    method: POST
    flow: {}
    respond: { body: '{got: $request.body}' }
"#,
        &s,
    )
    .await;
    let gz = fanout_compress::gzip(json, 1).unwrap();
    let r = send(
        &c,
        Method::POST,
        &format!("http://{}/echo", none.addr),
        &[("content-encoding", "gzip")],
        gz,
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.code()),
        (415, "unsupported_encoding".into())
    );
}

/// `n` MiB of zeros in `coding`, made of one encoded MiB repeated (gzip members and zstd frames
/// concatenate): a bomb of about `n` KiB (gzip) that decodes to `n` MiB.
fn bomb(coding: Coding, n: usize) -> Vec<u8> {
    let level = *coding.levels().end();
    let one = fanout_compress::encode(coding, level, &vec![0u8; 1 << 20]).unwrap();
    one.repeat(n)
}

/// A decompression bomb in a request body: 1 MB of gzip that decodes to 1 GB is refused with
/// 413 (the limit named) by a `fanout serve` process whose resident memory grows by less than
/// 50 MB; zstd the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_bomb_is_refused_with_bounded_memory() {
    let gz = bomb(Coding::Gzip, 1024);
    assert!(gz.len() < 1_200_000 && gz.len() > 900_000, "{}", gz.len());
    let zst = bomb(Coding::Zstd, 1024);
    let child = ServeProcess::launch(
        "compression-body-bomb",
        r#"
compression:
  request: { decode: [gzip, zstd] }
server:
  max_body_bytes: 2097152
routes:
  - path: /echo
    method: POST
    flow: {}
    respond: { body: '{got: ($request.body | length)}' }
"#,
    )
    .start()
    .await;
    let url = format!("http://{}/echo", child.addr());
    let c = client(false);
    // Warm up (the first request's allocations).
    let ok = send(&c, Method::POST, &url, &[], r#"{"a": 1}"#).await;
    assert_eq!(ok.status, 200);
    let before = child.peak_rss_kib();
    for (coding, body) in [("gzip", gz), ("zstd", zst)] {
        let r = send(
            &c,
            Method::POST,
            &url,
            &[("content-encoding", coding)],
            body,
        )
        .await;
        assert_eq!(r.status, 413, "{coding}: {}", r.text());
        assert_eq!(r.code(), "body_too_large");
        assert!(r.text().contains("2097152"), "{}", r.text());
    }
    let after = child.peak_rss_kib();
    eprintln!("peak RSS of fanout serve: {before} KiB before the bombs, {after} KiB after");
    assert!(
        after.saturating_sub(before) < 50 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
}

/// Each request's path and the `Accept-Encoding` it carried.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A backend that answers encoded bodies and records the `Accept-Encoding` it was sent.
struct EncodingBackend {
    addr: std::net::SocketAddr,
    accept: Seen,
}

/// The JSON every encoded answer decodes to.
const BACKEND_JSON: &str = r#"{"items": [1, 2, 3], "name": "encoded answer"}"#;

impl EncodingBackend {
    async fn start() -> EncodingBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept: Seen = Arc::default();
        let seen = accept.clone();
        let gz_bomb = bytes::Bytes::from(bomb(Coding::Gzip, 1024));
        let zst_bomb = bytes::Bytes::from(bomb(Coding::Zstd, 1024));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (seen, gz_bomb, zst_bomb) = (seen.clone(), gz_bomb.clone(), zst_bomb.clone());
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let path = req.uri().path().to_string();
                    let ae = req
                        .headers()
                        .get("accept-encoding")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    seen.lock().unwrap().push((path.clone(), ae));
                    let json = BACKEND_JSON.as_bytes();
                    let (coding, body): (Option<&str>, bytes::Bytes) = match path.as_str() {
                        "/gzip" => (Some("gzip"), fanout_compress::gzip(json, 6).unwrap().into()),
                        "/br" => (
                            Some("br"),
                            fanout_compress::encode(Coding::Br, 5, json).unwrap().into(),
                        ),
                        "/zstd" => (
                            Some("zstd"),
                            fanout_compress::encode(Coding::Zstd, 3, json)
                                .unwrap()
                                .into(),
                        ),
                        "/bomb-gzip" => (Some("gzip"), gz_bomb.clone()),
                        "/bomb-zstd" => (Some("zstd"), zst_bomb.clone()),
                        "/deflate" => (Some("deflate"), bytes::Bytes::from_static(b"xx")),
                        "/corrupt" => (Some("gzip"), bytes::Bytes::from_static(b"not gzip")),
                        _ => (None, bytes::Bytes::from_static(BACKEND_JSON.as_bytes())),
                    };
                    async move {
                        let mut resp = http::Response::new(Full::new(body));
                        let h = resp.headers_mut();
                        h.insert("content-type", "application/json".parse().unwrap());
                        if let Some(c) = coding {
                            h.insert("content-encoding", c.parse().unwrap());
                        }
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        EncodingBackend { addr, accept }
    }

    fn accept_encoding_of(&self, path: &str) -> Vec<Option<String>> {
        self.accept
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, a)| a.clone())
            .collect()
    }
}

fn backend_gateway_yaml(addr: std::net::SocketAddr) -> String {
    format!(
        r#"
backends:
  enc: {{ url: "http://{addr}", accept_encoding: [gzip, br, zstd], max_response_bytes: 4194304 }}
  plain: {{ url: "http://{addr}", max_response_bytes: 4194304 }}
routes:
  - path: /enc/{{kind}}
    flow:
      s: {{ http: {{ backend: enc, path: '"/" + $request.params.kind' }} }}
    respond: {{ body: '$s' }}
  - path: /plain/{{kind}}
    flow:
      s: {{ http: {{ backend: plain, path: '"/" + $request.params.kind' }} }}
    respond: {{ body: '$s' }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_answers_are_decoded_and_bombs_refused() {
    let b = EncodingBackend::start().await;
    let s = stubs(NO_STUBS).await;
    let gw = gateway(&backend_gateway_yaml(b.addr), &s).await;
    let c = client(false);
    let want: serde_json::Value = serde_json::from_str(BACKEND_JSON).unwrap();
    for kind in ["gzip", "br", "zstd", "identity"] {
        let r = get_with(&c, &format!("http://{}/enc/{kind}", gw.addr), None).await;
        assert_eq!(r.status, 200, "{kind}: {}", r.text());
        assert_eq!(r.json(), want, "{kind}");
    }
    // Decoded whatever was asked: the backend without accept_encoding too.
    let r = get_with(&c, &format!("http://{}/plain/gzip", gw.addr), None).await;
    assert_eq!(r.json(), want);
    // Accept-Encoding is sent only where configured.
    assert_eq!(
        b.accept_encoding_of("/gzip"),
        vec![Some("gzip, br, zstd".to_string()), None]
    );
    assert_eq!(
        b.accept_encoding_of("/identity"),
        vec![Some("gzip, br, zstd".to_string())]
    );
    // A bomb (1 MB decoding to 1 GB) against max_response_bytes (4 MiB), an unknown coding,
    // corrupt data: 502 bad_backend_answer, nothing of the backend's in the message.
    for kind in ["bomb-gzip", "bomb-zstd", "deflate", "corrupt"] {
        let r = get_with(&c, &format!("http://{}/enc/{kind}", gw.addr), None).await;
        assert_eq!(r.status, 502, "{kind}: {}", r.text());
        assert_eq!(r.code(), "bad_backend_answer", "{kind}");
        assert!(!r.text().contains("127.0.0.1"), "{}", r.text());
    }
}

/// A backend's bomb with the gateway in its own process: the RSS of `fanout serve` grows by
/// less than 50 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_bomb_is_refused_with_bounded_memory() {
    let b = EncodingBackend::start().await;
    let child = ServeProcess::launch("compression-bomb", &backend_gateway_yaml(b.addr))
        .start()
        .await;
    let c = client(false);
    let base = format!("http://{}", child.addr());
    let ok = get_with(&c, &format!("{base}/enc/gzip"), None).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let before = child.peak_rss_kib();
    for kind in ["bomb-gzip", "bomb-zstd"] {
        let r = get_with(&c, &format!("{base}/enc/{kind}"), None).await;
        assert_eq!(r.status, 502, "{kind}: {}", r.text());
        assert_eq!(r.code(), "bad_backend_answer");
    }
    let after = child.peak_rss_kib();
    eprintln!("peak RSS of fanout serve: {before} KiB before the bombs, {after} KiB after");
    assert!(
        after.saturating_sub(before) < 50 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
}

/// gRPC answers never get an HTTP `Content-Encoding`, even with compression on for every
/// `application/*` type and a client that accepts gzip; the same route called with JSON is
/// compressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_answers_are_never_http_compressed() {
    use crate::grpc::{Profile, ProfileRequest, example};
    let stubs = stubs(&example("stubs.yaml")).await;
    let config = format!(
        "{}\ncompression:\n  response: {{ enabled: true, min_bytes: 1, content_types: [\"application/*\"] }}\n",
        example("fanout.yaml")
    );
    let gw = gateway(&config, &stubs).await;
    let path = "/demo.v1.ProfileGateway/GetProfile";

    // A gRPC client that says it accepts gzip: a plain gRPC answer it decodes.
    let origin: http::Uri = format!("http://{}", gw.addr).parse().unwrap();
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<tonic::body::Body>();
    let mut grpc = tonic::client::Grpc::with_origin(h2, origin);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(ProfileRequest {
        user_id: "u1".into(),
    });
    req.metadata_mut()
        .insert("accept-encoding", "gzip, br, zstd".parse().unwrap());
    let resp = grpc
        .unary(
            req,
            http::uri::PathAndQuery::from_static("/demo.v1.ProfileGateway/GetProfile"),
            tonic_prost::ProstCodec::<ProfileRequest, Profile>::default(),
        )
        .await
        .unwrap();
    assert!(resp.metadata().get("content-encoding").is_none());
    let p = resp.into_inner();
    assert_eq!(p.user.unwrap().id, "u1");
    assert_eq!(p.orders.len(), 2);

    // The same route called with JSON: compressed.
    let r = send(
        &client(false),
        Method::POST,
        &format!("http://{}{path}", gw.addr),
        &[
            ("content-type", "application/json"),
            ("accept-encoding", "gzip"),
        ],
        r#"{"user_id": "u1"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let v: serde_json::Value = serde_json::from_slice(&decoded(&r)).unwrap();
    assert_eq!(v["user"]["id"], "u1", "{v}");
}
