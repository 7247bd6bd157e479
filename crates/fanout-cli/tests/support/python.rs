//! The tools tier-2 tests install once: a Python venv per requirement set (pinned pip
//! requirements) and a folder of node packages per lockfile, under `$FANOUT_TOOLS_DIR` (default
//! `~/.cache/fanout-tools`, where `scripts/ws-idle-memory`, `scripts/schemathesis` and
//! `scripts/check-deploy` keep theirs too: a venv a test made serves the scripts, and survives
//! `cargo clean`).
//!
//! Each install happens once: a test binary checks a venv once per run (later calls answer from
//! memory), tests of one binary wait for each other (one install at a time: the machine is
//! shared), and processes wait for each other through a lock file beside the venv (two worktrees'
//! test runs, a script). A venv is ready when every module the caller names imports; a half-made
//! one (an interrupted install) is made again. Every command runs with a bound
//! ([`INSTALL_LIMIT`]); a failing `pip install` names its requirements and shows pip's last lines.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bound of one install command (a venv, `pip install`, `npm ci`): a hung registry ends the
/// test instead of hanging CI.
pub const INSTALL_LIMIT: Duration = Duration::from_secs(15 * 60);

/// Where the tests keep the tools they install once (`FANOUT_TOOLS_DIR`, else the user's cache).
pub fn tools_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FANOUT_TOOLS_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("fanout-tools")
}

/// Run `cmd` to its end (at most [`INSTALL_LIMIT`]): its stdout, or an error naming `what` with
/// its status and output.
pub fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    run_bounded(cmd, what, INSTALL_LIMIT)
}

/// [`run`] with its own bound: the process is killed when it runs longer.
pub fn run_bounded(cmd: &mut Command, what: &str, limit: Duration) -> Result<String, String> {
    let out = output_bounded(cmd, what, limit)?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            tail(&stdout),
            tail(&stderr)
        ))
    }
}

/// `cmd`'s status and whole output, whatever its status; `Err` when it cannot start or runs
/// longer than `limit` (then it is killed).
pub fn output_bounded(
    cmd: &mut Command,
    what: &str,
    limit: Duration,
) -> Result<std::process::Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("{what}: still running after {limit:?}; killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => break Err(format!("{what}: {e}")),
        }
    };
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    match status {
        Ok(status) => Ok(std::process::Output {
            status,
            stdout,
            stderr,
        }),
        Err(e) => Err(format!(
            "{e}\n{}{}",
            tail(&String::from_utf8_lossy(&stdout)),
            tail(&String::from_utf8_lossy(&stderr))
        )),
    }
}

/// The last lines of a command's output (pip's error is at the end).
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(30);
    let mut s = lines[from..].join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

/// Why a venv is not there.
#[derive(Debug)]
pub enum VenvError {
    /// No Python 3 with venv on this machine (`./scripts/test` installs it).
    NoPython(String),
    /// The venv or the install failed (the message names the requirements).
    Install(String),
}

impl std::fmt::Display for VenvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VenvError::NoPython(m) | VenvError::Install(m) => f.write_str(m),
        }
    }
}

/// The venvs this test binary has found ready, by directory name; held while one is made, so
/// the tests of a binary install one at a time.
static READY: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// The python of a venv with `requirements` (pinned pip requirements, e.g.
/// `["gql[requests]==4.4.0", "graphql-core==3.3.2"]`) installed; `imports` (Python module
/// names) must import. Made once (see the module's docs).
pub fn venv(requirements: &[&str], imports: &[&str]) -> Result<PathBuf, VenvError> {
    let name = venv_name(requirements);
    let mut ready = READY.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(py) = ready.get_or_insert_with(HashMap::new).get(&name) {
        return Ok(py.clone());
    }
    let dir = tools_dir();
    let venv = dir.join(&name);
    let py = venv.join("bin/python");
    let check = format!("import {}", imports.join(", "));
    let imports_ok = |py: &Path| {
        run_bounded(
            Command::new(py).args(["-c", &check]),
            "import",
            Duration::from_secs(120),
        )
        .is_ok()
    };
    if !imports_ok(&py) {
        std::fs::create_dir_all(&dir).map_err(|e| {
            VenvError::Install(format!("cannot make the tools dir {}: {e}", dir.display()))
        })?;
        let _lock =
            FileLock::take(&dir.join(format!(".{name}.lock"))).map_err(VenvError::Install)?;
        // Another process may have made it while this one waited for the lock.
        if !imports_ok(&py) {
            make_venv(&venv, &py, requirements)?;
            if !imports_ok(&py) {
                return Err(VenvError::Install(format!(
                    "`{check}` fails in {} after pip install {}",
                    venv.display(),
                    requirements.join(" ")
                )));
            }
        }
    }
    ready
        .get_or_insert_with(HashMap::new)
        .insert(name, py.clone());
    Ok(py)
}

/// [`venv`], panicking with its error: for tests that need nothing but it (a tier-2 test never
/// passes without its tool).
pub fn venv_or_panic(requirements: &[&str], imports: &[&str]) -> PathBuf {
    venv(requirements, imports).unwrap_or_else(|e| panic!("this test needs a Python venv: {e}"))
}

fn make_venv(venv: &Path, py: &Path, requirements: &[&str]) -> Result<(), VenvError> {
    let python3 = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    if Command::new(&python3).arg("--version").output().is_err() {
        return Err(VenvError::NoPython(format!(
            "{python3:?} is needed: `apt-get install python3 python3-venv` (./scripts/test installs it)"
        )));
    }
    eprintln!(
        "installing {} into {} (once)",
        requirements.join(" "),
        venv.display()
    );
    let _ = std::fs::remove_dir_all(venv);
    run(
        Command::new(&python3).args(["-m", "venv"]).arg(venv),
        &format!("{python3:?} -m venv {}", venv.display()),
    )
    .map_err(|e| {
        VenvError::Install(format!(
            "{e}(Debian: `apt-get install python3-venv`; ./scripts/test installs it)"
        ))
    })?;
    run(
        Command::new(py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(requirements),
        &format!("pip install {}", requirements.join(" ")),
    )
    .map_err(VenvError::Install)?;
    Ok(())
}

/// The directory name of a requirement set: `py-` and each requirement with `==` and other
/// punctuation as `-` (`websockets==17.4` → `py-websockets-17.4`, as `scripts/ws-idle-memory`
/// finds it; `gql[requests]==4.4.0` → `gql-requests-4.4.0`), joined by `_`; a long set is cut
/// and a hash of the whole added.
pub fn venv_name(requirements: &[&str]) -> String {
    let parts: Vec<String> = requirements
        .iter()
        .map(|r| {
            r.replace("==", "-")
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                        c
                    } else {
                        '-'
                    }
                })
                .collect::<String>()
                .split('-')
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join("-")
        })
        .collect();
    let name = format!("py-{}", parts.join("_"));
    if name.len() <= 80 {
        return name;
    }
    // FNV-1a: stable across Rust versions (a name must not change with the toolchain)
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in requirements.join("\n").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let cut: String = name.chars().take(60).collect();
    format!("{cut}-{h:016x}")
}

/// An exclusive lock on a file, held until dropped (processes installing the same tool wait
/// for each other).
pub struct FileLock(#[allow(dead_code)] std::fs::File);

impl FileLock {
    /// Wait (at most [`INSTALL_LIMIT`]) for the lock on `path`.
    pub fn take(path: &Path) -> Result<FileLock, String> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
        let start = Instant::now();
        let mut said = false;
        loop {
            match f.try_lock() {
                Ok(()) => return Ok(FileLock(f)),
                Err(std::fs::TryLockError::WouldBlock) => {
                    if start.elapsed() > INSTALL_LIMIT {
                        return Err(format!(
                            "{} stayed locked for {INSTALL_LIMIT:?} (another install hung?)",
                            path.display()
                        ));
                    }
                    if !said {
                        eprintln!("waiting for another install ({})", path.display());
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(format!("cannot lock {}: {e}", path.display()));
                }
            }
        }
    }
}

/// A folder of node packages installed with `npm ci` from `source`'s `package.json` and
/// `package-lock.json` (copied under the tools dir, named after `name` and a hash of the
/// lockfile, so a changed lockfile makes a new one); made once like a venv. Panics when node or
/// npm is missing (`./scripts/test` installs them) or `npm ci` fails.
pub fn npm_ci(name: &str, source: &Path) -> PathBuf {
    let read = |f: &str| {
        std::fs::read(source.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", source.join(f).display()))
    };
    let (package, lock) = (read("package.json"), read("package-lock.json"));
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in package.iter().chain(&lock) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let key = format!("node-{name}-{h:016x}");
    let mut ready = READY.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = ready.get_or_insert_with(HashMap::new).get(&key) {
        return d.clone();
    }
    let tools = tools_dir();
    let dir = tools.join(&key);
    let done = dir.join(".installed");
    if !done.is_file() {
        for tool in ["node", "npm"] {
            assert!(
                Command::new(tool)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success()),
                "{tool} is needed: `apt-get install nodejs npm` (./scripts/test installs them)"
            );
        }
        std::fs::create_dir_all(&tools).unwrap();
        let _lock = FileLock::take(&tools.join(format!(".{key}.lock"))).unwrap();
        if !done.is_file() {
            eprintln!(
                "installing {} (npm ci) into {} (once)",
                source.display(),
                dir.display()
            );
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("package.json"), &package).unwrap();
            std::fs::write(dir.join("package-lock.json"), &lock).unwrap();
            run(
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
                    .current_dir(&dir),
                &format!("npm ci ({})", source.display()),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(&done, "").unwrap();
        }
    }
    ready
        .get_or_insert_with(HashMap::new)
        .insert(key, dir.clone());
    dir
}
