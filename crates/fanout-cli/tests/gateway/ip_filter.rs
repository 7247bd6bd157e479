//! IP allow and deny lists (docs/config.md#ip_filter--ip-allow-and-deny-lists): the edge stage
//! `ip_filter`, per route and in `defaults`, on the client address as `server.trusted_proxies`
//! resolves it; a refusal is 403 `ip_denied` (gRPC `PERMISSION_DENIED`) before any backend call,
//! counted by route.

use crate::support::gateway;
use fanout_testkit::*;

const STUBS: &str = r#"
services:
  api:
    listen: "127.0.0.1:0"
    routes:
      - path: /data
        body: '{ok: true}'
"#;

fn yaml() -> String {
    r#"
server:
  trusted_proxies: [127.0.0.1]
backends:
  api: { url: "http://${API_ADDR}" }
defaults:
  stages:
    ip_filter: { allow: [127.0.0.0/8, "::1"] }
routes:
  - path: /open
    flow: { d: { http: { backend: api, path: '"/data"' } } }
    respond: { body: '$d' }
  - path: /lan
    stages: { ip_filter: { allow: [10.0.0.0/8], deny: [10.9.0.0/16] } }
    flow: { d: { http: { backend: api, path: '"/data"' } } }
    respond: { body: '$d' }
  - path: /off
    stages: { ip_filter: {} }
    respond: { body: '{off: true}' }
"#
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_and_deny_lists_decide_on_the_resolved_client_address() {
    let s = stubs(STUBS).await;
    let gw = gateway(&yaml(), &s).await;
    let c = client(false);
    let at = |p: &str| format!("http://{}{p}", gw.addr);
    let ask = |p: &'static str, xff: Option<&'static str>| {
        let (c, url) = (c.clone(), at(p));
        async move {
            let h: Vec<(&str, &str)> = xff.map(|v| ("x-forwarded-for", v)).into_iter().collect();
            send(&c, http::Method::GET, &url, &h, "").await
        }
    };
    // The defaults' list: loopback is allowed.
    assert_eq!(ask("/open", None).await.status, 200);
    // The route's own list replaces it: loopback is not in 10/8.
    let r = ask("/lan", None).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "ip_denied");
    assert!(
        !r.text().contains("127.0.0.1"),
        "the client is not told its address: {}",
        r.text()
    );
    // Through the trusted proxy (the peer, 127.0.0.1): the forwarded client decides.
    assert_eq!(ask("/lan", Some("10.1.2.3")).await.status, 200);
    assert_eq!(ask("/lan", Some("10.9.0.5")).await.status, 403, "deny wins");
    assert_eq!(ask("/open", Some("192.0.2.1")).await.status, 403);
    // `{}` turns the filter off for the route.
    assert_eq!(ask("/off", Some("192.0.2.1")).await.status, 200);
    assert_eq!(
        calls(&s, "api"),
        2,
        "no refused request reached the backend"
    );

    let admin = gw.admin_addr.unwrap();
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    for line in [
        r#"fanout_ip_filter_requests_total{route="GET /lan",decision="denied"} 2"#,
        r#"fanout_ip_filter_requests_total{route="GET /lan",decision="allowed"} 1"#,
        r#"fanout_ip_filter_requests_total{route="GET /open",decision="denied"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains(r#"route="GET /off""#), "{metrics}");
    let status = get(&format!("http://{admin}/__fanout/status")).await.json();
    assert_eq!(status["ip_filter"]["routes"]["GET /lan"]["denied"], 2);
    assert_eq!(status["ip_filter"]["routes"]["GET /open"]["allowed"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_route_is_filtered_like_an_http_one() {
    let s = stubs(&crate::grpc::example("stubs.yaml")).await;
    let yaml = crate::grpc::example("fanout.yaml")
        + "defaults: {stages: {ip_filter: {deny: [127.0.0.0/8, '::1']}}}\n";
    let gw = gateway(&yaml, &s).await;
    let e = crate::grpc::get_profile(gw.addr, "u1", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(
        e.metadata().get("x-fanout-error-code").unwrap(),
        "ip_denied"
    );
    assert_eq!(calls(&s, "users"), 0);
}

#[test]
fn a_bad_block_is_a_config_error_at_its_line() {
    let text = yaml().replace("10.9.0.0/16", "10.9.0.0/40");
    let lookup = |_: &str| Some("127.0.0.1:1".to_string());
    let err = fanout::load_gateway("fanout.yaml", &text, &lookup)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains(
            "routes[1].stages.ip_filter.deny: `10.9.0.0/40` is not an address or CIDR block"
        ),
        "{err}"
    );
    let line = text
        .lines()
        .position(|l| l.contains("10.9.0.0/40"))
        .unwrap()
        + 1;
    assert!(
        err.contains(&format!("fanout.yaml:{line}:")),
        "line {line}: {err}"
    );
}

/// `fanout explain` names each route's stages in the order they run, with their lists.
#[test]
fn explain_prints_each_routes_stages_in_order() {
    let dir = tempfile_dir();
    let path = dir.join("fanout.yaml");
    std::fs::write(&path, yaml()).unwrap();
    let lookup = |_: &str| Some("127.0.0.1:1".to_string());
    let text = fanout::explain::explain_file_at(
        path.to_str().unwrap(),
        &lookup,
        Some("GET /lan"),
        fanout::explain::Format::Text,
        None,
    )
    .unwrap();
    assert!(
        text.contains("edge stages, in order (each may refuse before the body is read): ip_filter\n  ip_filter: allow 10.0.0.0/8; deny 10.9.0.0/16; otherwise 403 ip_denied"),
        "{text}"
    );
    let off = fanout::explain::explain_file_at(
        path.to_str().unwrap(),
        &lookup,
        Some("GET /off"),
        fanout::explain::Format::Text,
        None,
    )
    .unwrap();
    assert!(!off.contains("edge stages"), "{off}");
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fanout-ip-filter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// With `on_connection` the defaults' lists also judge connections at accept — the connection
/// phase: a refused peer's connection is closed before any byte of HTTP (or a TLS handshake),
/// counted; a trusted proxy's connection is let in and its requests judged one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_connection_closes_a_refused_peer_at_accept_and_lets_a_trusted_proxy_in() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = stubs(STUBS).await;
    let routes = "routes:\n  - path: /open\n    respond: { body: '{ok: true}' }\n";
    let deny = "defaults: { stages: { ip_filter: { deny: [127.0.0.0/8, '::1'], on_connection: true } } }\n";
    let gw = gateway(&format!("{deny}{routes}"), &s).await;
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    // The write may fail (closed already) or succeed; the answer is the connection's end.
    let _ = conn
        .write_all(b"GET /open HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        conn.read_to_end(&mut buf),
    )
    .await
    .expect("the connection ends");
    assert!(
        buf.is_empty(),
        "no HTTP answer: {read:?} {}",
        String::from_utf8_lossy(&buf)
    );
    let admin = gw.admin_addr.unwrap();
    let status = get(&format!("http://{admin}/__fanout/status")).await.json();
    assert_eq!(status["ip_filter"]["connections_refused"], 1, "{status}");
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert!(
        metrics.contains("fanout_ip_filter_connections_refused_total 1"),
        "{metrics}"
    );

    // Behind a trusted proxy (the peer): in, and each request judged on its forwarded client.
    let trusted = format!("server: {{ trusted_proxies: [127.0.0.1] }}\n{deny}{routes}");
    let gw = gateway(&trusted, &s).await;
    let c = client(false);
    let url = format!("http://{}/open", gw.addr);
    let ok = send(
        &c,
        http::Method::GET,
        &url,
        &[("x-forwarded-for", "192.0.2.1")],
        "",
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let no = send(
        &c,
        http::Method::GET,
        &url,
        &[("x-forwarded-for", "127.0.0.9")],
        "",
    )
    .await;
    assert_eq!(no.json()["error"]["code"], "ip_denied");
    let status = get(&format!(
        "http://{}/__fanout/status",
        gw.admin_addr.unwrap()
    ))
    .await
    .json();
    assert_eq!(status["ip_filter"]["connections_refused"], 0);
}

#[test]
fn on_connection_is_for_the_defaults_and_a_route_list_beside_it_is_warned_about() {
    let lookup = |_: &str| Some("127.0.0.1:1".to_string());
    let on_route = "routes:\n  - path: /a\n    stages: { ip_filter: { deny: [10.0.0.0/8], on_connection: true } }\n    respond: { body: '1' }\n";
    let err = fanout::load_gateway("fanout.yaml", on_route, &lookup)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("fanout.yaml:3:")
            && err.contains("routes[0].stages.ip_filter.on_connection: connections are judged before any route is known"),
        "{err}"
    );
    let beside = "defaults: { stages: { ip_filter: { deny: [10.0.0.0/8], on_connection: true } } }\nroutes:\n  - path: /a\n    stages: { ip_filter: { allow: [10.1.0.0/16] } }\n    respond: { body: '1' }\n";
    let dir = std::env::temp_dir().join(format!("fanout-ip-conn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fanout.yaml");
    std::fs::write(&path, beside).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["validate", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let want = format!(
        "{}:4:15: warning: routes[0].stages.ip_filter: the defaults' lists close refused connections",
        path.display()
    );
    assert!(
        text.lines().any(|l| l.starts_with(&want)),
        "{want}\nin:\n{text}"
    );
}
