//! The Java thread-per-request baseline (`bench/baselines/java-threads`): compiled with `javac`
//! when its classes are missing or older than its sources, and started with the JVM flags of a
//! typical small container deployment.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// JVM flags: what a 2-CPU / ~1 GiB container runs. `-XX:+UseSerialGC` is what the JVM's own
/// ergonomics pick below 2 CPUs or 1792 MB (stated explicitly so the choice does not depend on
/// the host); `-Xmx512m` a typical heap for such a pod; `-Xss256k` the reduced thread stack many
/// deployments with big thread pools set (400 pool threads here).
pub const JVM_FLAGS: [&str; 3] = ["-Xss256k", "-XX:+UseSerialGC", "-Xmx512m"];

/// Debian's PostgreSQL JDBC driver (package `libpostgresql-jdbc-java`), put on the class path when
/// it is installed: the `pool-overload` scenario's route uses it.
pub const JDBC_DRIVER: &str = "/usr/share/java/postgresql.jar";

/// The class with `main`.
pub const MAIN_CLASS: &str = "Main";

/// Why the baseline could not be built.
#[derive(Debug, thiserror::Error)]
pub enum JavaError {
    /// No sources where they should be.
    #[error(
        "the Java baseline's sources are not at {0} (the lab reads them from the repository it was built from)"
    )]
    NoSources(String),
    /// `javac` is not installed.
    #[error(
        "`{0}` could not be started ({1}); install a JDK ≥ 17 (Debian: apt-get install default-jdk-headless)"
    )]
    NoJavac(String, std::io::Error),
    /// Compilation failed.
    #[error("javac failed:\n{0}")]
    Compile(String),
    /// File system.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// `bench/baselines/java-threads/src` of the repository this crate was built from.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/baselines/java-threads/src")
}

/// Where to put the classes: `<cargo target dir>/java-threads` when `fanout_bin` lives in a cargo
/// target directory (one marked by `CACHEDIR.TAG`), else `<out>/java-threads`.
pub fn build_dir(fanout_bin: &Path, out: &Path) -> PathBuf {
    fanout_bin
        .ancestors()
        .skip(1)
        .take(4)
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map(|d| d.join("java-threads"))
        .unwrap_or_else(|| out.join("java-threads"))
}

fn jdk_tool(name: &str) -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .map(|h| PathBuf::from(h).join("bin").join(name))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The `java` executable (`$JAVA_HOME/bin/java`, else from `PATH`).
pub fn java_bin() -> PathBuf {
    jdk_tool("java")
}

fn sources(src: &Path) -> Result<Vec<PathBuf>, JavaError> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| JavaError::Io(d.display().to_string(), e))?;
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "java") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// What the classes were built from: every source's path and a hash of its contents.
fn fingerprint(files: &[PathBuf]) -> String {
    use std::hash::{Hash, Hasher};
    files
        .iter()
        .map(|f| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::fs::read(f).unwrap_or_default().hash(&mut h);
            format!("{:016x} {}\n", h.finish(), f.display())
        })
        .collect()
}

/// Compile `src` into `<dir>/classes` unless it is up to date: a stamp file newer than every
/// source and naming the same sources with the same contents. Returns the classes directory
/// (the `-cp` value).
pub fn ensure_built(src: &Path, dir: &Path) -> Result<PathBuf, JavaError> {
    let files = sources(src).map_err(|_| JavaError::NoSources(src.display().to_string()))?;
    if files.is_empty() {
        return Err(JavaError::NoSources(src.display().to_string()));
    }
    let classes = dir.join("classes");
    let stamp = classes.join(".built-from");
    let listing = fingerprint(&files);
    let newest = files.iter().filter_map(|f| mtime(f)).max();
    let fresh = match (mtime(&stamp), newest) {
        (Some(built), Some(newest)) => {
            built >= newest
                && std::fs::read_to_string(&stamp).is_ok_and(|s| s == listing)
                && classes.join(format!("{MAIN_CLASS}.class")).is_file()
        }
        _ => false,
    };
    if fresh {
        return Ok(classes);
    }
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| JavaError::Io(p, e)
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    // Compile into a fresh directory, then swap it in: a concurrent or interrupted build never
    // leaves a half-written classes directory behind.
    let tmp = dir.join(format!("classes.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let javac = jdk_tool("javac");
    let out = Command::new(&javac)
        .arg("-encoding")
        .arg("UTF-8")
        .arg("-d")
        .arg(&tmp)
        .args(&files)
        .output()
        .map_err(|e| JavaError::NoJavac(javac.display().to_string(), e))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(JavaError::Compile(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::write(tmp.join(".built-from"), &listing).map_err(io(&tmp))?;
    let _ = std::fs::remove_dir_all(&classes);
    if let Err(e) = std::fs::rename(&tmp, &classes) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another lab built the same sources in the meantime: use its classes.
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s == listing) {
            return Ok(classes);
        }
        return Err(JavaError::Io(classes.display().to_string(), e));
    }
    Ok(classes)
}

/// Arguments of `java` for the baseline listening on `listen`.
pub fn args(classes: &Path, listen: SocketAddr) -> Vec<String> {
    let mut a: Vec<String> = JVM_FLAGS.iter().map(|s| s.to_string()).collect();
    // The PostgreSQL JDBC driver, when installed, for `GET /report/{id}` (pool-overload).
    let mut cp = classes.display().to_string();
    if Path::new(JDBC_DRIVER).is_file() {
        cp.push(':');
        cp.push_str(JDBC_DRIVER);
    }
    a.extend([
        "-cp".into(),
        cp,
        MAIN_CLASS.into(),
        "--listen".into(),
        listen.to_string(),
    ]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_dir_prefers_the_cargo_target_dir() {
        let root = std::env::temp_dir().join(format!("fanout-java-dir-{}", std::process::id()));
        let bin = root.join("target/release/fanout");
        std::fs::create_dir_all(root.join("target/release")).unwrap_or_default();
        let out = root.join("out");
        assert_eq!(build_dir(&bin, &out), out.join("java-threads"));
        std::fs::write(root.join("target/CACHEDIR.TAG"), "x").unwrap_or_default();
        assert_eq!(build_dir(&bin, &out), root.join("target/java-threads"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn builds_once_and_again_when_a_source_changes() {
        let root = std::env::temp_dir().join(format!("fanout-java-build-{}", std::process::id()));
        let src = root.join("src");
        std::fs::create_dir_all(&src).unwrap_or_default();
        let main = src.join("Main.java");
        let write = |body: &str| {
            std::fs::write(&main, format!("public class Main {{ {body} }}")).unwrap_or_default()
        };
        write("");
        let Ok(classes) = ensure_built(&src, &root.join("out")) else {
            // No JDK here: the lab reports that as an error; nothing more to check.
            let _ = std::fs::remove_dir_all(&root);
            return;
        };
        let stamp = || std::fs::read_to_string(classes.join(".built-from")).unwrap_or_default();
        let first = stamp();
        assert!(classes.join("Main.class").is_file());
        assert!(ensure_built(&src, &root.join("out")).is_ok());
        assert_eq!(stamp(), first, "up to date: not rebuilt");
        write("static int x;");
        assert!(ensure_built(&src, &root.join("out")).is_ok());
        assert_ne!(stamp(), first, "a changed source is rebuilt");
        write("syntax error");
        assert!(matches!(
            ensure_built(&src, &root.join("out")),
            Err(JavaError::Compile(_))
        ));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn sources_are_found() {
        let files = sources(&source_dir()).unwrap_or_default();
        assert!(files.iter().any(|f| f.ends_with("Main.java")), "{files:?}");
    }
}
