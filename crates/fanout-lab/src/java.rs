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

/// The first Java release with virtual threads (`java-virtual`).
pub const VIRTUAL_THREADS: u32 = 21;

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

/// A Java runtime found on this machine.
#[derive(Debug, Clone)]
pub struct Jdk {
    /// Its `java` executable.
    pub java: PathBuf,
    /// Feature release (`25` for 25.0.3, `8` for 1.8.0).
    pub major: u32,
    /// The version as `java -version` prints it (`25.0.3`).
    pub version: String,
}

impl Jdk {
    /// `25.0.3 (/usr/lib/jvm/…/bin/java)`, for the report.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.version, self.java.display())
    }
}

/// The version `java -version` reports (`openjdk version "25.0.3" 2026-04-21 LTS`, on stderr):
/// (feature release, version text); `None` when it does not run or says something else.
pub fn java_version(java: &Path) -> Option<(u32, String)> {
    let out = Command::new(java).arg("-version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    parse_version(&text)
}

/// The release of `javac` (`$JAVA_HOME/bin/javac`, else from `PATH`), the compiler the lab
/// builds the baseline with: (feature release, version text); `None` without one.
pub fn javac_version() -> Option<(u32, String)> {
    let out = Command::new(jdk_tool("javac"))
        .arg("-version")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("javac "))?
        .trim()
        .to_string();
    parse_version(&format!("version \"{v}\""))
}

/// The quoted version of `java -version`'s first line that has one: `"25.0.3"` → 25,
/// `"1.8.0_402"` → 8, `"21-ea"` → 21.
fn parse_version(text: &str) -> Option<(u32, String)> {
    let line = text.lines().find(|l| l.contains("version \""))?;
    let v = line.split('"').nth(1)?.to_string();
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let first: u32 = parts.next()?.parse().ok()?;
    let major = if first == 1 {
        parts.next()?.parse().ok()?
    } else {
        first
    };
    Some((major, v))
}

/// Where [`find_jdk`] looks, in order: `$JAVA21_HOME`, `$JAVA_HOME`, then every `bin/java` under
/// `jvm_dir` (`$FANOUT_LAB_JVM_DIR`, else `/usr/lib/jvm`).
#[derive(Debug, Clone)]
pub struct JdkSearch {
    /// `$JAVA21_HOME`.
    pub java21_home: Option<PathBuf>,
    /// `$JAVA_HOME`.
    pub java_home: Option<PathBuf>,
    /// The directory of installed JDKs.
    pub jvm_dir: PathBuf,
}

impl JdkSearch {
    /// From the environment: `$JAVA21_HOME`, `$JAVA_HOME` and `$FANOUT_LAB_JVM_DIR` (default
    /// `/usr/lib/jvm`, where Debian and Ubuntu install JDKs).
    pub fn from_env() -> JdkSearch {
        let var = |n: &str| {
            std::env::var_os(n)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        JdkSearch {
            java21_home: var("JAVA21_HOME"),
            java_home: var("JAVA_HOME"),
            jvm_dir: var("FANOUT_LAB_JVM_DIR").unwrap_or_else(|| PathBuf::from("/usr/lib/jvm")),
        }
    }
}

/// A Java runtime of release `min` or later: `$JAVA21_HOME`, else `$JAVA_HOME` if recent enough,
/// else the newest `bin/java` under the JVM directory that is. `Err` says what was looked at and
/// why none fits (for the report of a target that did not run).
pub fn find_jdk(search: &JdkSearch, min: u32) -> Result<Jdk, String> {
    let mut seen = Vec::new();
    let check = |seen: &mut Vec<String>, what: String, java: PathBuf| -> Option<Jdk> {
        match java_version(&java) {
            Some((major, version)) if major >= min => Some(Jdk {
                java,
                major,
                version,
            }),
            Some((_, version)) => {
                seen.push(format!("{what}: {version}"));
                None
            }
            None => {
                seen.push(format!("{what}: no runnable {}", java.display()));
                None
            }
        }
    };
    for (name, home) in [
        ("$JAVA21_HOME", &search.java21_home),
        ("$JAVA_HOME", &search.java_home),
    ] {
        match home {
            Some(h) => {
                if let Some(j) = check(
                    &mut seen,
                    format!("{name}={}", h.display()),
                    h.join("bin/java"),
                ) {
                    return Ok(j);
                }
            }
            None => seen.push(format!("{name} unset")),
        }
    }
    let mut found: Vec<Jdk> = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&search.jvm_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    for d in dirs {
        let java = d.join("bin/java");
        if java.is_file()
            && let Some(j) = check(&mut seen, d.display().to_string(), java)
        {
            found.push(j);
        }
    }
    if found.is_empty() && !search.jvm_dir.is_dir() {
        seen.push(format!("no {}", search.jvm_dir.display()));
    }
    // The newest: highest release, then the longest version text (25.0.3 over 25).
    found
        .into_iter()
        .max_by(|a, b| {
            (a.major, a.version.len(), &a.version).cmp(&(b.major, b.version.len(), &b.version))
        })
        .ok_or_else(|| {
            format!(
                "no Java {min} or later found ({}); java-virtual needs virtual threads (Java 21+): set JAVA21_HOME to a JDK ≥ 21",
                seen.join("; ")
            )
        })
}

/// Lab targets `java-threads-N`: the baseline with a request pool of N threads and a calls pool
/// of N (`--threads N --call-threads N`), for comparing pool sizes (`hh-pools`).
pub const POOL_PREFIX: &str = "java-threads-";

/// The largest pool a `java-threads-N` target may ask for.
pub const MAX_POOL: u32 = 16_384;

/// The pool size of a `java-threads-N` target (1 ≤ N ≤ [`MAX_POOL`], digits only); `None` for
/// any other name.
pub fn pool_size(target: &str) -> Option<u32> {
    let n = target.strip_prefix(POOL_PREFIX)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|n| (1..=MAX_POOL).contains(n))
}

/// The extra arguments of a `java-threads-N` target: both pools of N threads, every thread
/// started at once (`--prestart`: a fixed pool creates a thread per task until it has N and
/// never retires one, so a server past its first N requests has them all; the comparison measures
/// that steady state, not thread creation during the first trials). A team sizing by Little's law
/// sizes the pools for the same concurrency; the simplest honest choice is the same N for the
/// request threads and the threads that make the parallel calls.
pub fn pool_args(n: u32) -> Vec<String> {
    vec![
        "--threads".into(),
        n.to_string(),
        "--call-threads".into(),
        n.to_string(),
        "--prestart".into(),
    ]
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
    #[ignore = "tier 2 (./scripts/test): needs a JDK"]
    fn builds_once_and_again_when_a_source_changes() {
        let root = std::env::temp_dir().join(format!("fanout-java-build-{}", std::process::id()));
        let src = root.join("src");
        std::fs::create_dir_all(&src).unwrap_or_default();
        let main = src.join("Main.java");
        let write = |body: &str| {
            std::fs::write(&main, format!("public class Main {{ {body} }}")).unwrap_or_default()
        };
        write("");
        let classes = ensure_built(&src, &root.join("out"))
            .unwrap_or_else(|e| panic!("a JDK (javac) is needed: {e}"));
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
    fn java_versions_are_parsed() {
        let v = |t: &str| parse_version(t);
        assert_eq!(
            v("openjdk version \"25.0.3\" 2026-04-21 LTS\nOpenJDK Runtime"),
            Some((25, "25.0.3".into()))
        );
        assert_eq!(
            v("openjdk version \"17.0.15\" 2025-04-15"),
            Some((17, "17.0.15".into()))
        );
        assert_eq!(
            v("java version \"1.8.0_402\""),
            Some((8, "1.8.0_402".into()))
        );
        assert_eq!(v("openjdk version \"21-ea\""), Some((21, "21-ea".into())));
        assert_eq!(
            v("Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version \"21.0.2\" 2024-01-16"),
            Some((21, "21.0.2".into()))
        );
        assert_eq!(v("command not found"), None);
    }

    /// A fake JDK at `dir` whose `java -version` prints `version`.
    fn fake_jdk(dir: &Path, version: &str) {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap_or_default();
        let java = bin.join("java");
        std::fs::write(
            &java,
            format!("#!/bin/sh\necho 'openjdk version \"{version}\" 2026-01-01' >&2\n"),
        )
        .unwrap_or_default();
        std::fs::set_permissions(&java, std::fs::Permissions::from_mode(0o755)).unwrap_or_default();
    }

    #[test]
    fn the_jdk_search_prefers_java21_home_then_java_home_then_the_newest_installed() {
        let root = std::env::temp_dir().join(format!("fanout-jdk-search-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let jvm = root.join("jvm");
        fake_jdk(&jvm.join("java-17"), "17.0.15");
        fake_jdk(&jvm.join("jdk-21"), "21.0.2");
        fake_jdk(&jvm.join("temurin-25"), "25.0.3");
        fake_jdk(&root.join("home17"), "17.0.1");
        fake_jdk(&root.join("home22"), "22.0.1");
        std::fs::create_dir_all(jvm.join("not-a-jdk")).unwrap_or_default();
        let search = |j21: Option<&str>, home: Option<&str>, dir: &Path| JdkSearch {
            java21_home: j21.map(|h| root.join(h)),
            java_home: home.map(|h| root.join(h)),
            jvm_dir: dir.to_path_buf(),
        };
        let found = |s: JdkSearch| find_jdk(&s, 21).map(|j| (j.major, j.version));
        // The newest installed one.
        assert_eq!(
            found(search(None, Some("home17"), &jvm)),
            Ok((25, "25.0.3".into()))
        );
        // $JAVA_HOME when it is recent enough.
        assert_eq!(
            found(search(None, Some("home22"), &jvm)),
            Ok((22, "22.0.1".into()))
        );
        // $JAVA21_HOME first.
        assert_eq!(
            found(search(Some("jvm/jdk-21"), Some("home22"), &jvm)),
            Ok((21, "21.0.2".into()))
        );
        // A $JAVA21_HOME that is too old is passed over, and said so when nothing fits.
        let none = root.join("empty");
        std::fs::create_dir_all(&none).unwrap_or_default();
        let e = find_jdk(&search(Some("home17"), None, &none), 21).unwrap_err();
        assert!(
            e.contains("17.0.1") && e.contains("$JAVA_HOME unset") && e.contains("JAVA21_HOME"),
            "{e}"
        );
        // Only JDK 17 installed: not found, never a panic.
        let only17 = root.join("only17");
        fake_jdk(&only17.join("java-17"), "17.0.15");
        let e = find_jdk(&search(None, None, &only17), 21).unwrap_err();
        assert!(e.contains("17.0.15"), "{e}");
        assert!(find_jdk(&search(None, None, &root.join("nope")), 21).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn pool_targets_are_parsed() {
        assert_eq!(pool_size("java-threads-8"), Some(8));
        assert_eq!(pool_size("java-threads-4096"), Some(4096));
        for bad in [
            "java-threads",
            "java-threads-",
            "java-threads-0",
            "java-threads-+8",
            "java-threads-8x",
            "java-threads-99999",
            "java-blocking-8",
        ] {
            assert_eq!(pool_size(bad), None, "{bad}");
        }
        assert_eq!(
            pool_args(64),
            ["--threads", "64", "--call-threads", "64", "--prestart"]
        );
    }

    #[test]
    fn sources_are_found() {
        let files = sources(&source_dir()).unwrap_or_default();
        assert!(files.iter().any(|f| f.ends_with("Main.java")), "{files:?}");
    }
}
