//! WebSocket routes against an independent implementation (tier 2: issue 71's acceptance): a
//! Python `websockets` echo server behind `fanout serve` and a Python `websockets` client in
//! front of it (`tests/gateway/py/ws_echo.py`, `ws_client.py`). 10 000 messages echoed exact
//! and in order (text and binary, empty to exactly the route's limit, one frame or fragmented);
//! a frame and a fragmented message over the limit closed with 1009 on both sides; SIGTERM
//! closing an open WebSocket with 1001 on both sides. `websockets` is installed once from PyPI
//! into a venv under `$FANOUT_TOOLS_DIR` (default `~/.cache/fanout-tools`) by the tests' venv
//! helper (`support/python.rs`); `scripts/ws-idle-memory` uses the same venv.

use crate::support::{ServeProcess, python};
use fanout_testkit::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) const WEBSOCKETS_VERSION: &str = "17.4";

/// A client run's bound: its own waits are bounded (60 s each); this ends a hung one.
const LIMIT: Duration = Duration::from_secs(300);

/// The route's message limit: messages go up to exactly this, one byte more is 1009.
const MAX: usize = 65536;

fn py_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/py")
}

/// The venv's python with `websockets` (made once, `support::python`); panics when python3 is
/// missing (`./scripts/test` installs it) or the install fails.
fn python() -> PathBuf {
    python::venv_or_panic(
        &[&format!("websockets=={WEBSOCKETS_VERSION}")],
        &["websockets.asyncio.client"],
    )
}

/// The Python echo server: its port, and the JSON lines it printed after it (one per
/// connection ended, with the close frame it got).
struct EchoServer {
    child: Child,
    port: u16,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl EchoServer {
    async fn start(py: &Path) -> EchoServer {
        let mut child = Command::new(py)
            .arg(py_dir().join("ws_echo.py"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    l.lock().unwrap().push(v);
                }
            }
        });
        let mut server = EchoServer {
            child,
            port: 0,
            lines,
        };
        let port = wait_for(
            "the echo server to print its port",
            Duration::from_secs(60),
            || server.lines.lock().unwrap().first()?["port"].as_u64(),
        )
        .await;
        server.port = u16::try_from(port).unwrap();
        server
    }

    /// How many connections ended with a close frame of `code` received (`None`: none).
    fn closes(&self, code: Option<u64>) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v.get("closed").is_some() && v["closed"].as_u64() == code)
            .count()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python client in `args`' mode, to its end; its last JSON line.
async fn client(py: &Path, args: &[&str]) -> Value {
    let out = tokio::time::timeout(
        LIMIT,
        tokio::process::Command::new(py)
            .arg(py_dir().join("ws_client.py"))
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client ends in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Python client {args:?} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs python3 (websockets from PyPI)"]
async fn python_websockets_client_and_server_through_fanout() {
    let py = tokio::task::spawn_blocking(python).await.unwrap();
    let server = EchoServer::start(&py).await;
    // A peer that sends each message as one frame (Python `websockets`, browsers) needs the
    // frame limit as large as the message limit.
    let yaml = format!(
        r#"
backends:
  py: {{ url: "http://127.0.0.1:{}" }}
routes:
  - path: /echo
    websocket: {{ backend: py, max_message_bytes: {MAX}, max_frame_bytes: {MAX} }}
"#,
        server.port
    );
    let proc = ServeProcess::launch("ws-python", &yaml).start().await;
    let uri = format!("ws://{}/echo", proc.addr());

    // 10 000 messages, each echoed exact and in order.
    let got = client(&py, &["echo", &uri, "10000", &MAX.to_string()]).await;
    assert_eq!(got["exact"], 10000, "{got}");
    assert_eq!(
        (got["text"].as_u64(), got["binary"].as_u64()),
        (Some(5000), Some(5000)),
        "{got}"
    );
    assert!(got["empty"].as_u64().unwrap() > 0, "{got}");
    assert!(got["fragmented"].as_u64().unwrap() > 0, "{got}");
    assert_eq!(got["largest_frame"], MAX, "{got}");
    assert_eq!(got["largest_message"], MAX, "{got}");
    wait_until("the echo connection ended at the server", || {
        server.closes(Some(1000)) == 1
    })
    .await;
    let route = get(&format!("http://{}/__fanout/status", proc.admin_addr()))
        .await
        .json()["websockets"]["routes"]["/echo"]
        .clone();
    assert_eq!(route["messages"]["in"], 10000, "{route}");
    assert_eq!(route["messages"]["out"], 10000, "{route}");

    // One byte over the limit: in one frame, and in frames under it.
    let over = (MAX + 1).to_string();
    for (how, frag) in [("frame", "0"), ("message", "16384")] {
        let got = client(&py, &["over", &uri, how, &over, frag]).await;
        assert_eq!(got["close"], 1009, "{how}: {got}");
    }
    wait_until("the server closed with 1009 twice too", || {
        server.closes(Some(1009)) == 2
    })
    .await;

    // SIGTERM with a WebSocket open: 1001 `going away` to both sides.
    let mut hold = tokio::process::Command::new(&py)
        .arg(py_dir().join("ws_client.py"))
        .args(["hold", &uri])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(hold.stdout.take().unwrap()));
    let mut line = async || -> Value {
        let l = tokio::time::timeout(LIMIT, lines.next_line())
            .await
            .expect("the client says in time")
            .unwrap()
            .expect("a line from the client");
        serde_json::from_str(&l).unwrap()
    };
    assert_eq!(line().await["ready"], true);
    proc.signal("-TERM");
    let got = line().await;
    assert_eq!(
        (got["close"].as_u64(), got["reason"].as_str()),
        (Some(1001), Some("going away")),
        "{got}"
    );
    wait_until("the server got 1001 too", || server.closes(Some(1001)) == 1).await;
    assert_eq!(
        server.closes(None),
        0,
        "every connection closed with a close frame"
    );
    drop(hold);
}
