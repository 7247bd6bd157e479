//! The command line as a new user meets it (issue 22, §5): logs redirected to a file carry no
//! colour escapes, a closed pipe ends a command quietly, every command that reads a config takes
//! it as `FILE` or `--config FILE`, a stubs config is validated as one, a busy address names the
//! flags that choose another, `fanout stub` logs each service once, and `fanout load` against a
//! port where nothing listens exits non-zero naming the whole URL.
//!
//! Every wait polls for a condition (a log line, the exit), up to a generous limit.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn fanout() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fanout"));
    c.env_remove("NO_COLOR").env_remove("RUST_LOG");
    c
}

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(ext: &str, text: &str) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "fanout-cli-{}-{}.{ext}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&p, text).unwrap();
        TempFile(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const GATEWAY: &str = "routes:\n  - path: /ping\n    respond: { body: '{pong: true}' }\n";
const STUBS: &str = "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        body: '{a: 1}'\n  b:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /y\n        body: '{b: 2}'\n";

/// Wait until `cond` holds on the file's text, up to 60 s.
fn wait_for_file(path: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if cond(&text) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}; file holds:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn logs_redirected_to_a_file_have_no_escape_codes_and_each_stub_service_is_logged_once() {
    let stubs = TempFile::new("yaml", STUBS);
    let log = TempFile::new("log", "");
    let mut child = fanout()
        .args(["stub", "--config", stubs.path()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log.path()).unwrap())
        .spawn()
        .unwrap();
    let text = wait_for_file(log.path(), "both services' log lines", |t| {
        t.matches("listening").count() >= 2
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(log.path()).unwrap_or(text);
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in a log file:\n{text:?}"
    );
    assert!(
        text.contains("service=a") && text.contains("service=b"),
        "{text}"
    );
    assert_eq!(
        text.matches("listening").count(),
        2,
        "each service is logged once:\n{text}"
    );
}

#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    for args in [&["schema"][..], &["schema", "--stubs"]] {
        let mut child = fanout()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `| head -c 0`: the reader is gone before anything is written
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            status.success() || status.code().is_none(),
            "{args:?}: {status:?} {err}"
        );
    }
}

#[test]
fn every_command_that_reads_a_config_takes_file_or_config_file() {
    let gw = TempFile::new("yaml", GATEWAY);
    for cmd in ["validate", "explain"] {
        let a = fanout().args([cmd, gw.path()]).output().unwrap();
        let b = fanout()
            .args([cmd, "--config", gw.path()])
            .output()
            .unwrap();
        assert!(a.status.success(), "{cmd} FILE: {a:?}");
        assert!(b.status.success(), "{cmd} --config FILE: {b:?}");
        assert_eq!(a.stdout, b.stdout, "{cmd}: the same either way");
        let none = fanout().arg(cmd).output().unwrap();
        assert_eq!(none.status.code(), Some(2), "{cmd} without a file");
        let both = fanout()
            .args([cmd, gw.path(), "--config", gw.path()])
            .output()
            .unwrap();
        assert_eq!(both.status.code(), Some(2), "{cmd} with both");
    }
    let stubs = TempFile::new("yaml", STUBS);
    for form in [
        &["stub", stubs.path()][..],
        &["stub", "--config", stubs.path()],
    ] {
        let log = TempFile::new("log", "");
        let mut child = fanout()
            .args(form)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log.path()).unwrap())
            .spawn()
            .unwrap();
        wait_for_file(log.path(), "the stub to listen", |t| {
            t.matches("listening").count() >= 2
        });
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn validate_recognises_and_checks_a_stubs_config() {
    let stubs = TempFile::new("yaml", STUBS);
    let ok = fanout().args(["validate", stubs.path()]).output().unwrap();
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{ok:?}");
    assert!(out.contains("ok (stubs config)"), "{out}");

    let broken = TempFile::new(
        "yaml",
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        bdoy: '{a: 1}'\n",
    );
    let bad = fanout().args(["validate", broken.path()]).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("{}:6:", broken.path())), "{err}");
    assert!(err.contains("bdoy"), "{err}");

    let serve = fanout()
        .args(["serve", stubs.path(), "--admin-listen", "off"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is a stubs config") && err.contains("fanout stub"),
        "{err}"
    );
}

#[test]
fn a_busy_address_names_the_flags_that_choose_another() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let gw = TempFile::new("yaml", GATEWAY);
    for args in [
        vec![
            "serve",
            gw.path(),
            "--listen",
            &addr,
            "--admin-listen",
            "off",
        ],
        vec![
            "serve",
            gw.path(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            &addr,
        ],
    ] {
        let out = fanout().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("Address already in use"), "{err}");
        assert!(
            err.contains("hint:") && err.contains("--listen") && err.contains("--admin-listen"),
            "{args:?}: {err}"
        );
    }
    let out = fanout().args(["demo", "--listen", &addr]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("hint:") && err.contains("--listen"), "{err}");
}

#[test]
fn load_where_nothing_listens_exits_non_zero_and_names_the_whole_url() {
    // a port that was free a moment ago: nothing listens there
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/some/path?q=1");
    let out = fanout()
        .args([
            "load",
            &url,
            "--schedule",
            "const(20,500ms)",
            "--timeout",
            "2s",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
    assert!(stdout.contains("NO REQUEST SUCCEEDED"), "{stdout}");
    assert!(stdout.contains("/some/path?q=1"), "{stdout}");
}

/// `validate` and `explain` load the models of `models.dir` as the server does: the example's
/// model steps are valid and `explain` names each model's kind, width and version.
#[test]
fn validate_and_explain_read_the_models_directory() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/antispam/fanout.yaml"
    );
    let v = fanout().args(["validate", cfg]).output().unwrap();
    assert!(v.status.success(), "validate: {v:?}");
    let e = fanout().args(["explain", cfg]).output().unwrap();
    assert!(e.status.success(), "explain: {e:?}");
    let text = String::from_utf8_lossy(&e.stdout);
    assert!(text.contains("features, version "), "{text}");
    assert!(text.contains("on the compute pool"), "{text}");
}
