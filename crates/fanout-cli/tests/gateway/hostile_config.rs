//! Any config, however hostile — deep, long, huge, binary, naming endless or blocking files —
//! ends `fanout validate` with exit 1 and a message: never a crash, a hang or unbounded memory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A minimal valid gateway around `respond_body` (an expression), with `extra` backend lines.
fn config(respond_body: &str, backend_extra: &str) -> String {
    format!(
        "backends:\n  b:\n    url: \"http://127.0.0.1:1\"\n{backend_extra}routes:\n  - path: /x\n    flow:\n      s: {{ http: {{ backend: b, path: '\"/\"' }} }}\n    respond:\n      body: '{respond_body}'\n"
    )
}

/// Run `fanout validate` on `path`: it must end by itself with exit 1 and say why.
fn validate_fails(name: &str, path: &Path) -> String {
    match try_validate(name, path) {
        Ok(err) => err,
        Err(e) => panic!("{e}"),
    }
}

/// `Ok(stderr)` when `fanout validate` ended by itself with exit 1 and a message.
fn try_validate(name: &str, path: &Path) -> Result<String, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("validate")
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            let _ = child.kill();
            return Err(format!("{name}: `fanout validate` did not end within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    if status.code() != Some(1) || err.trim().is_empty() {
        return Err(format!(
            "{name}: expected exit 1 with a message, got {status:?}; stderr: {}",
            err.chars().take(500).collect::<String>()
        ));
    }
    Ok(err)
}

fn write(d: &Path, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let p = d.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

#[test]
fn hostile_configs_end_in_exit_1_with_a_message() {
    let d = dir();
    let n = 5000;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // jq nested ~5 000 deep, and a chain of ~5 000 operators.
        (
            "deep-parens",
            config(&format!("{}1{}", "(".repeat(n), ")".repeat(n)), "").into_bytes(),
        ),
        (
            "deep-arrays",
            config(&format!("{}1{}", "[".repeat(n), "]".repeat(n)), "").into_bytes(),
        ),
        (
            "operator-chain",
            config(&format!("1{}", "+1".repeat(n)), "").into_bytes(),
        ),
        (
            "pipe-chain",
            config(&format!(".{}", "|.".repeat(n)), "").into_bytes(),
        ),
        // A 1 MiB expression.
        (
            "long-expression",
            config(&format!("\"{}\"", "a".repeat(1 << 20)), "").into_bytes(),
        ),
        // YAML nested 10 000 deep.
        (
            "deep-yaml",
            format!("routes: {}{}\n", "[".repeat(10_000), "]".repeat(10_000)).into_bytes(),
        ),
        (
            "deep-yaml-default",
            format!(
                "backends: {{b: {{url: \"http://127.0.0.1:1\"}}}}\nroutes:\n  - path: /x\n    flow:\n      s: {{ http: {{ backend: b, path: '\"/\"' }}, optional: true, default: {}1{} }}\n    respond: {{ body: '$s' }}\n",
                "[".repeat(10_000),
                "]".repeat(10_000)
            )
            .into_bytes(),
        ),
        // Billion laughs, inside a field that takes any value (a step's default).
        ("alias-bomb", {
            let mut v = String::from("[&a [x,x,x,x,x,x,x,x,x]");
            for (i, c) in ('b'..='k').enumerate() {
                let p = (b'a' + i as u8) as char;
                v.push_str(&format!(", &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]"));
            }
            v.push(']');
            format!(
                "backends: {{b: {{url: \"http://127.0.0.1:1\"}}}}\nroutes:\n  - path: /x\n    flow:\n      s: {{ http: {{ backend: b, path: '\"/\"' }}, optional: true, default: {v} }}\n    respond: {{ body: '$s' }}\n"
            )
            .into_bytes()
        }),
        // Binary and invalid UTF-8.
        ("binary", (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
        ("nul-bytes", vec![0u8; 4096]),
        // A CA file that never ends, and one that is not a file.
        (
            "ca-dev-zero",
            config("$s", "    tls: { ca_file: /dev/zero }\n").into_bytes(),
        ),
        (
            "ca-directory",
            config("$s", &format!("    tls: {{ ca_file: \"{}\" }}\n", d.display())).into_bytes(),
        ),
    ];
    let mut failures = Vec::new();
    for (name, content) in cases {
        let p = write(&d, &format!("{name}.yaml"), content);
        match try_validate(name, &p) {
            Ok(err) => eprintln!("{name}: {}", err.lines().next().unwrap_or("")),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A config larger than the limit is refused before it is parsed.
    let huge = d.join("huge.yaml");
    {
        let f = std::fs::File::create(&huge).unwrap();
        f.set_len(fanout_config::MAX_CONFIG_BYTES + 1).unwrap();
    }
    let err = validate_fails("huge", &huge);
    assert!(err.contains("limit"), "{err}");
    // A config that is not a regular file (a FIFO would block a plain read forever).
    let fifo = d.join("fifo.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let err = validate_fails("fifo", &fifo);
        assert!(err.contains("regular file"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&d);
}
