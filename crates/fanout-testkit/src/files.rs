//! Files of the tests: the repository's root, committed snapshots, temporary directories, and
//! a free port for a child process that must be told its address.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The repository's root directory (examples, docs and snapshots are found from here).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compare `actual` with the committed snapshot `rel` (a path relative to [`repo_root`]); with
/// `UPDATE_SNAPSHOTS` set in the environment, write it instead. A mismatch is returned as a
/// message — the first line that differs, and `rerun`, the command that rewrites the snapshot
/// with `UPDATE_SNAPSHOTS=1` — so a test can report every mismatch before it fails.
pub fn snapshot_mismatch(rel: &str, actual: &str, rerun: &str) -> Option<String> {
    let path = repo_root().join(rel);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("write {rel}: {e}"));
        return None;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == actual {
        return None;
    }
    let (line, want, got) = committed
        .lines()
        .map(Some)
        .chain(std::iter::repeat(None))
        .zip(actual.lines().map(Some).chain(std::iter::repeat(None)))
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map_or((0, None, None), |(i, (a, b))| (i + 1, a, b));
    let show =
        |l: Option<&str>| l.map_or_else(|| "(end of file)".to_string(), |l| format!("{l:?}"));
    Some(format!(
        "{rel} differs from the output (first at line {line}: committed {}, now {}); \
         run `UPDATE_SNAPSHOTS=1 {rerun}`, review the diff and commit it",
        show(want),
        show(got)
    ))
}

/// [`snapshot_mismatch`] that fails the test at once.
pub fn check_snapshot(rel: &str, actual: &str, rerun: &str) {
    if let Some(m) = snapshot_mismatch(rel, actual, rerun) {
        panic!("{m}");
    }
}

/// A fresh directory under the system's temporary directory, removed (with its contents) on
/// drop; its name holds `tag`, the process id and a counter, so tests running at once never
/// share one.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Create it.
    pub fn new(tag: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("fanout-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        TempDir(d)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path of `rel` inside it.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.0.join(rel)
    }

    /// Write `text` to `rel` inside it (creating parent directories); returns the file's path.
    pub fn write(&self, rel: impl AsRef<Path>, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A 127.0.0.1 address whose port was free a moment ago (bound, then released). Only for a
/// child process that must be told its address before it starts: anything started in this
/// process binds `127.0.0.1:0` instead, and another process may take the port first.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("a free port: {e}"))
}
