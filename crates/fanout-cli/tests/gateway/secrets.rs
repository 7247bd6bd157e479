//! Credentials never shown (issue 69 §1): a password in a backend's URL (`http://user:pass@host`)
//! is the address's `Authorization: Basic` — as curl, Go and Python send it — and appears
//! nowhere the gateway shows an address: the status endpoint, the live page's data, `/metrics`,
//! the log line of a failed call, `fanout explain`.

use crate::support::gateway;
use fanout_testkit::*;

const STUBS: &str = r#"
services:
  users:
    listen: "${USERS_ADDR}"
    routes:
      - path: /who
        body: '{auth: $request.headers.authorization}'
"#;

fn yaml(down: std::net::SocketAddr) -> String {
    format!(
        r#"
server: {{ error_log_per_second: 100000 }}
backends:
  users: {{ url: "http://ann:s3cr%40t@${{USERS_ADDR}}", timeout: 2s }}
  down: {{ url: "http://bob:p4ssw0rd@{down}/api", timeout: 1s }}
  other: {{ url: "http://${{USERS_ADDR}}", headers: {{ authorization: "Bearer own" }} }}
routes:
  - path: /who
    flow: {{ who: {{ http: {{ backend: users, path: '"/who"' }} }} }}
    respond: {{ body: '$who' }}
  - path: /own
    flow: {{ who: {{ http: {{ backend: other, path: '"/who"' }} }} }}
    respond: {{ body: '$who' }}
  - path: /down
    flow: {{ d: {{ http: {{ backend: down, path: '"/x"' }} }} }}
    respond: {{ body: '$d' }}
"#
    )
}

const SECRETS: [&str; 4] = ["s3cr", "p4ssw0rd", "ann:", "bob:"];

fn assert_no_secret(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows `{s}`:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_a_backend_url_is_sent_as_basic_auth_and_never_shown() {
    let logs = capture_logs();
    let s = stubs(STUBS).await;
    let down = free_addr();
    let gw = gateway(&yaml(down), &s).await;
    let admin = gw.admin_addr.expect("admin listener");

    // Nothing shows it, with no traffic at all.
    assert_no_secret("status", &gw.gateway.status_json().to_string());
    let ui = get(&format!("http://{admin}/ui/api/state")).await;
    assert_eq!(ui.status, 200);
    assert_no_secret("/ui/api/state", &ui.text());
    assert!(
        ui.text().contains(&format!("http://{down}/api")),
        "the address is still named: {}",
        ui.text()
    );

    // The backend gets the userinfo as Basic credentials (percent-decoded), unless the backend
    // sets its own Authorization.
    let r = get(&format!("http://{}/who", gw.addr)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["auth"], "Basic YW5uOnMzY3JAdA==", "ann:s3cr@t");
    let r = get(&format!("http://{}/own", gw.addr)).await;
    assert_eq!(r.json()["auth"], "Bearer own");

    // A failed call: its log line names the address, not the password.
    let r = send(
        &client(false),
        http::Method::GET,
        &format!("http://{}/down", gw.addr),
        &[("x-request-id", "secrets-down-1")],
        "",
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_no_secret("the answer", &r.text());
    let lines = logs.lines_with("secrets-down-1");
    assert!(!lines.is_empty(), "the failure is logged");
    assert_no_secret("the log", &lines.join("\n"));

    for (what, url) in [
        ("status", format!("http://{admin}/__fanout/status")),
        ("/ui/api/state", format!("http://{admin}/ui/api/state")),
        ("/metrics", format!("http://{admin}/metrics")),
    ] {
        let r = get(&url).await;
        assert_eq!(r.status, 200, "{what}");
        assert_no_secret(what, &r.text());
    }

    // `fanout explain` of the same config.
    let dir = TempDir::new("secrets-explain");
    let cfg = dir.write(
        "fanout.yaml",
        &yaml(down).replace("${USERS_ADDR}", "127.0.0.1:9"),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["explain", "-c", cfg.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_no_secret("explain", &String::from_utf8_lossy(&out.stdout));
    assert_no_secret("explain's log", &String::from_utf8_lossy(&out.stderr));
}
