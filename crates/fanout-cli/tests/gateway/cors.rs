//! CORS (docs/config.md#cors): preflights answered by the gateway without a flow, the CORS
//! headers on every answer of a CORS route (errors included), `Vary: Origin`, and the configs
//! refused at load. The browser's view is checked in headless Chromium by
//! `crates/fanout-cli/tests/browser.rs` (tier 2).

use crate::support::gateway;
use fanout::load_gateway;
use fanout_testkit::*;
use http::Method;

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - path: /items
        body: '{items: [1, 2]}'
      - path: /fail
        status: 500
        body: '{oops: true}'
"#;

const GATEWAY: &str = r#"
defaults:
  cors:
    origins: [https://app.example.com, "https://*.example.org"]
    headers: [authorization, content-type]
    max_age: 5m
backends:
  a: { url: "http://${A_ADDR}" }
routes:
  - path: /items
    flow:
      s: { http: { backend: a, path: '"/items"' } }
    respond: { body: '$s' }
  - path: /items
    method: POST
    flow: {}
    respond: { body: '{made: true}' }
  - path: /fail
    flow:
      s: { http: { backend: a, path: '"/fail"' } }
    respond: { body: '$s' }
  - path: /private
    cors: { enabled: false }
    flow: {}
    respond: { body: '{private: true}' }
  - path: /open
    cors: { origins: ["*"], methods: [GET] }
    flow: {}
    respond: { body: '{open: true}' }
"#;

fn header<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

fn vary(r: &Resp) -> Vec<String> {
    r.headers
        .get_all("vary")
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_is_answered_by_the_gateway_and_names_what_it_refuses() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = format!("http://{}/items", gw.addr);
    let pre = |origin: &'static str, method: &'static str, headers: &'static str| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let mut h = vec![
                ("origin", origin),
                ("access-control-request-method", method),
            ];
            if !headers.is_empty() {
                h.push(("access-control-request-headers", headers));
            }
            send(&c, Method::OPTIONS, &url, &h, "").await
        }
    };

    let ok = pre(
        "https://app.example.com",
        "POST",
        "Authorization, Content-Type",
    )
    .await;
    assert_eq!(ok.status, 204, "{:?}", ok.headers);
    assert_eq!(
        header(&ok, "access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        header(&ok, "access-control-allow-methods"),
        Some("GET, POST"),
        "the methods of the routes on the path"
    );
    assert_eq!(
        header(&ok, "access-control-allow-headers"),
        Some("authorization, content-type")
    );
    assert_eq!(header(&ok, "access-control-max-age"), Some("300"));
    assert!(vary(&ok).contains(&"origin".to_string()), "{:?}", vary(&ok));
    assert!(ok.body.is_empty());

    let by_pattern = pre("https://eu.example.org", "GET", "").await;
    assert_eq!(by_pattern.status, 204);
    assert_eq!(
        header(&by_pattern, "access-control-allow-origin"),
        Some("https://eu.example.org")
    );

    for (origin, method, headers, words) in [
        (
            "https://evil.example.net",
            "GET",
            "",
            "origin `https://evil.example.net`",
        ),
        ("https://a.b.example.org", "GET", "", "origin"),
        ("https://app.example.com", "DELETE", "", "method `DELETE`"),
        (
            "https://app.example.com",
            "GET",
            "x-secret",
            "request header `x-secret`",
        ),
    ] {
        let r = pre(origin, method, headers).await;
        assert_eq!(r.status, 403, "{origin} {method} {headers}");
        assert_eq!(r.json()["error"]["code"], "cors_refused");
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(msg.contains(words), "{msg}");
        assert_eq!(header(&r, "access-control-allow-origin"), None);
    }

    // No flow ran for any preflight; the status endpoint counts them.
    assert_eq!(calls(&s, "a"), 0);
    let status = send(
        &c,
        Method::GET,
        &format!("http://{}/__fanout/status", gw.addr),
        &[],
        "",
    )
    .await
    .json();
    assert_eq!(status["cors"]["preflights_allowed"], 2);
    assert_eq!(status["cors"]["preflights_refused"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_a_cors_route_carries_the_headers_errors_included() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let base = format!("http://{}", gw.addr);
    let from = [("origin", "https://app.example.com")];

    let ok = send(&c, Method::GET, &format!("{base}/items"), &from, "").await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json(), serde_json::json!({"items": [1, 2]}));
    assert_eq!(
        header(&ok, "access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let exposed = header(&ok, "access-control-expose-headers").unwrap_or("");
    for h in [
        "x-request-id",
        "retry-after",
        "ratelimit",
        "www-authenticate",
    ] {
        assert!(exposed.contains(h), "{exposed}");
    }
    assert_eq!(header(&ok, "access-control-allow-credentials"), None);
    assert!(vary(&ok).contains(&"origin".to_string()));

    // A flow's failure (502), a bad request (400), an unknown path (404, the defaults' policy)
    // and a method the path lacks (405): the page can read each of them.
    for (method, path, hdrs, status) in [
        (Method::GET, "/fail", vec![], 502),
        (
            Method::GET,
            "/items",
            vec![("x-request-timeout", "soon")],
            400,
        ),
        (Method::GET, "/nowhere", vec![], 404),
        (Method::DELETE, "/items", vec![], 405),
    ] {
        let mut h = from.to_vec();
        h.extend(hdrs);
        let r = send(&c, method.clone(), &format!("{base}{path}"), &h, "").await;
        assert_eq!(r.status, status, "{method} {path}");
        assert_eq!(
            header(&r, "access-control-allow-origin"),
            Some("https://app.example.com"),
            "{method} {path} {status}"
        );
    }

    // An origin not allowed: the answer is served (CORS is the browser's to enforce) but
    // without the allow headers; every answer varies by origin.
    let other = send(
        &c,
        Method::GET,
        &format!("{base}/items"),
        &[("origin", "https://evil.example.net")],
        "",
    )
    .await;
    assert_eq!(other.status, 200);
    assert_eq!(header(&other, "access-control-allow-origin"), None);
    assert!(vary(&other).contains(&"origin".to_string()));
    let no_origin = send(&c, Method::GET, &format!("{base}/items"), &[], "").await;
    assert!(vary(&no_origin).contains(&"origin".to_string()));
    assert_eq!(header(&no_origin, "access-control-allow-origin"), None);

    // A route that turns the defaults off, and one open to any origin (`*`, no credentials).
    let private = send(&c, Method::GET, &format!("{base}/private"), &from, "").await;
    assert_eq!(private.status, 200);
    assert_eq!(header(&private, "access-control-allow-origin"), None);
    let pre = send(
        &c,
        Method::OPTIONS,
        &format!("{base}/private"),
        &[
            ("origin", "https://app.example.com"),
            ("access-control-request-method", "GET"),
        ],
        "",
    )
    .await;
    assert_eq!(pre.status, 405, "no CORS on the route: routing answers");
    let open = send(
        &c,
        Method::GET,
        &format!("{base}/open"),
        &[("origin", "https://anyone.test")],
        "",
    )
    .await;
    assert_eq!(header(&open, "access-control-allow-origin"), Some("*"));
}

#[test]
fn configs_browsers_would_refuse_are_refused_at_load() {
    let no_env = |_: &str| None;
    for (what, cors, words) in [
        (
            "any origin with credentials",
            "{origins: ['*'], credentials: true}",
            "with `credentials: true`",
        ),
        (
            "any header with credentials",
            "{origins: ['https://a.test'], headers: ['*'], credentials: true}",
            "`cors.headers: *`",
        ),
        (
            "an origin with a path",
            "{origins: ['https://a.test/app']}",
            "is not an origin",
        ),
        (
            "a partial wildcard",
            "{origins: ['https://a*.test']}",
            "whole label",
        ),
        ("no origins", "{origins: []}", "`cors.origins` is empty"),
        (
            "a bad method",
            "{origins: ['https://a.test'], methods: ['GE T']}",
            "not an HTTP method",
        ),
        (
            "max_age over a day",
            "{origins: ['https://a.test'], max_age: 48h}",
            "over 24h",
        ),
    ] {
        let yaml =
            format!("routes:\n  - path: /a\n    cors: {cors}\n    respond: {{ body: '1' }}\n");
        let err = match load_gateway("f.yaml", &yaml, &no_env) {
            Ok(_) => panic!("{what}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(words), "{what}: {err}");
    }
}

// ---- tier 2: a real browser ---------------------------------------------------------------------

/// Serve `html` to every request on 127.0.0.1 (another origin than the gateway's: another port).
async fn page_server(html: String) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let html = html.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    html.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(html.as_bytes()).await;
            });
        }
    });
    addr
}

fn chromium() -> &'static str {
    crate::support::find_tool(
        &["chromium", "chromium-browser", "google-chrome"],
        "chromium",
    )
}

const BROWSER_GATEWAY: &str = r#"
backends:
  a: { url: "http://${A_ADDR}" }
routes:
  - path: /items
    cors: { origins: ["${PAGE_ORIGIN}"], headers: [authorization] }
    flow:
      s: { http: { backend: a, path: '"/items"' } }
    respond: { body: '$s' }
  - path: /fail
    cors: { origins: ["${PAGE_ORIGIN}"], headers: [authorization] }
    flow:
      s: { http: { backend: a, path: '"/fail"' } }
    respond: { body: '$s' }
  - path: /elsewhere
    cors: { origins: ["https://other.example.com"], headers: [authorization] }
    flow: {}
    respond: { body: '{secret: true}' }
  - path: /plain
    flow: {}
    respond: { body: '{plain: true}' }
"#;

/// A page served from another origin, in headless Chromium: it calls an allowed route (with an
/// `Authorization` header, so the browser sends a preflight first) and reads the answer, reads a
/// 502 from an allowed route (the error carries the CORS headers), and is blocked by the browser
/// on a route that allows another origin and on one without CORS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
async fn a_page_on_another_origin_in_chromium_calls_only_the_routes_that_allow_it() {
    let chrome = chromium();
    let s = stubs(STUBS).await;
    // The page's address is needed in the gateway's config and the gateway's in the page: bind
    // the page's port first, with a page that learns the gateway's address from its own URL.
    let html = r#"<!doctype html><html><body><pre id="out">pending</pre><script>
const gw = new URLSearchParams(location.search).get("gw");
async function call(path) {
  try {
    const r = await fetch("http://" + gw + path, {headers: {"authorization": "Bearer t"}});
    return r.status + " " + (await r.text());
  } catch (e) {
    return "blocked " + e.name;
  }
}
(async () => {
  const out = {};
  for (const p of ["/items", "/fail", "/elsewhere", "/plain"]) out[p] = await call(p);
  document.getElementById("out").textContent = "RESULT" + JSON.stringify(out) + "END";
})();
</script></body></html>"#;
    let page = page_server(html.to_string()).await;
    let gw = crate::support::gateway_with(
        BROWSER_GATEWAY,
        &s,
        &[("PAGE_ORIGIN", format!("http://{page}"))],
    )
    .await;
    let url = format!("http://{page}/?gw={}", gw.addr);
    let profile = std::env::temp_dir().join(format!("fanout-cors-chromium-{}", page.port()));
    let out = tokio::process::Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=20000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", &url])
        .output()
        .await
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    let json = dom
        .split_once("RESULT")
        .and_then(|(_, rest)| rest.split_once("END"))
        .map(|(j, _)| j.replace("&quot;", "\""))
        .unwrap_or_else(|| {
            panic!(
                "the page did not finish: {dom}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let _ = std::fs::remove_dir_all(&profile);
    let got: serde_json::Value = serde_json::from_str(&json).expect("the page's JSON");
    let text = |p: &str| got[p].as_str().unwrap_or("").to_string();
    assert!(text("/items").starts_with("200 "), "{got}");
    assert!(text("/items").contains("\"items\""), "{got}");
    assert!(
        text("/fail").starts_with("502 "),
        "the page reads the error: {got}"
    );
    assert!(text("/fail").contains("\"error\""), "{got}");
    assert!(text("/elsewhere").starts_with("blocked"), "{got}");
    assert!(text("/plain").starts_with("blocked"), "{got}");
    // The browser sent preflights: the allowed ones were answered, the other origin's refused.
    let status = send(
        &client(false),
        Method::GET,
        &format!("http://{}/__fanout/status", gw.addr),
        &[],
        "",
    )
    .await
    .json();
    assert!(
        status["cors"]["preflights_allowed"].as_u64() >= Some(2),
        "{status}"
    );
    assert!(
        status["cors"]["preflights_refused"].as_u64() >= Some(1),
        "{status}"
    );
}

const EDGE_GATEWAY: &str = r#"
auth:
  providers:
    p:
      issuer: https://idp.test
      hmac_secret: "0123456789abcdef0123456789abcdef-lab-secret"
      algorithms: [HS256]
rate_limits:
  once:
    rate: 1/h
    burst: 1
    key: '"all"'
defaults:
  cors:
    origins: [https://app.example.com]
    headers: [authorization]
routes:
  - path: /secure
    auth: { provider: p }
    flow: {}
    respond: { body: '{secret: true}' }
  - path: /admin
    auth: { provider: p, scopes: [admin] }
    flow: {}
    respond: { body: '{admin: true}' }
  - path: /limited
    rate_limit: [once]
    flow: {}
    respond: { body: '{ok: true}' }
"#;

/// The refusals of authentication and rate limits are answers of the route like any other: a
/// page can read them (a browser hides an error whose answer lacks the CORS headers). A
/// preflight carries no credentials, so it is answered before authentication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_refused_by_authentication_or_a_rate_limit_carry_the_cors_headers() {
    let s = stubs(STUBS).await;
    let gw = gateway(EDGE_GATEWAY, &s).await;
    let c = client(false);
    let base = format!("http://{}", gw.addr);
    let from = ("origin", "https://app.example.com");

    let pre = send(
        &c,
        Method::OPTIONS,
        &format!("{base}/secure"),
        &[
            from,
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "authorization"),
        ],
        "",
    )
    .await;
    assert_eq!(pre.status, 204, "a preflight needs no token");

    let no_token = send(&c, Method::GET, &format!("{base}/secure"), &[from], "").await;
    assert_eq!(no_token.status, 401);
    assert_eq!(no_token.json()["error"]["code"], "unauthenticated");
    let bad_token = send(
        &c,
        Method::GET,
        &format!("{base}/secure"),
        &[from, ("authorization", "Bearer not.a.token")],
        "",
    )
    .await;
    assert_eq!(bad_token.status, 401);
    for r in [&no_token, &bad_token] {
        assert_eq!(
            header(r, "access-control-allow-origin"),
            Some("https://app.example.com")
        );
        assert!(
            header(r, "access-control-expose-headers")
                .is_some_and(|e| e.contains("www-authenticate")),
            "the page can read the challenge"
        );
        assert!(header(r, "www-authenticate").is_some());
    }

    // A valid token without the route's scope: 403, readable by the page too.
    let token = fanout_testkit::jwt::hmac_signed(
        b"0123456789abcdef0123456789abcdef-lab-secret",
        "k",
        &fanout_testkit::jwt::claims("https://idp.test", "api", "ann"),
    );
    let bearer = format!("Bearer {token}");
    let ok = send(
        &c,
        Method::GET,
        &format!("{base}/secure"),
        &[from, ("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    let forbidden = send(
        &c,
        Method::GET,
        &format!("{base}/admin"),
        &[from, ("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(forbidden.status, 403);
    assert_eq!(forbidden.json()["error"]["code"], "forbidden");
    assert_eq!(
        header(&forbidden, "access-control-allow-origin"),
        Some("https://app.example.com")
    );

    let first = send(&c, Method::GET, &format!("{base}/limited"), &[from], "").await;
    assert_eq!(first.status, 200);
    let limited = send(&c, Method::GET, &format!("{base}/limited"), &[from], "").await;
    assert_eq!(limited.status, 429);
    assert_eq!(
        header(&limited, "access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let exposed = header(&limited, "access-control-expose-headers").unwrap_or("");
    for h in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert!(exposed.split(", ").any(|e| e == h), "{exposed}");
    }
    assert!(header(&limited, "retry-after").is_some());
}
