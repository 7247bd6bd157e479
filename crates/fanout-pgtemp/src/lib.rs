//! A throw-away PostgreSQL cluster for `fanout test`, the lab and the tests: `initdb` in a temporary directory,
//! a server on a free 127.0.0.1 port with durability off (it holds nothing worth keeping), and
//! `pg_ctl stop` plus removal of the directory when dropped. Run as root, every server command
//! runs as the `postgres` user (`initdb` refuses root), through `runuser`.
//!
//! The binaries are found in `$FANOUT_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`, else
//! on `PATH` (Debian's `postgresql` package; `./scripts/test` installs it where missing).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Why a cluster could not be started or controlled.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// No `initdb`/`pg_ctl` found.
    #[error(
        "PostgreSQL's server binaries (initdb, pg_ctl) were not found in $FANOUT_PG_BIN, /usr/lib/postgresql/*/bin or PATH; install them (Debian: apt-get install postgresql)"
    )]
    NoBinaries,
    /// A command could not be run.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A command failed.
    #[error("{0} failed: {1}")]
    Failed(String, String),
}

/// A running (or stopped) cluster; stopped and deleted on drop.
pub struct PgCluster {
    bin: PathBuf,
    dir: PathBuf,
    addr: SocketAddr,
    as_postgres: bool,
    tls: bool,
}

fn bin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FANOUT_PG_BIN") {
        return Some(PathBuf::from(d));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, b)) = versions.pop() {
        return Some(b);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl PgCluster {
    /// Whether the server binaries are installed.
    pub fn available() -> bool {
        bin_dir().is_some()
    }

    /// `initdb` a new cluster in a fresh temporary directory and start it on a free port. The
    /// superuser is `postgres`, authentication `trust` (loopback only).
    pub fn start() -> Result<PgCluster, PgError> {
        PgCluster::start_inner(None)
    }

    /// [`PgCluster::start`] with TLS on (`ssl = on`; plain connections are still accepted):
    /// `cert_pem` and `key_pem` are the server's certificate chain and key.
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> Result<PgCluster, PgError> {
        PgCluster::start_inner(Some((cert_pem, key_pem)))
    }

    fn start_inner(tls: Option<(&str, &str)>) -> Result<PgCluster, PgError> {
        let bin = bin_dir().ok_or(PgError::NoBinaries)?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fanout-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| PgError::Io(dir.display().to_string(), e))?;
        let as_postgres = is_root();
        let mut c = PgCluster {
            bin,
            dir,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            as_postgres,
            tls: tls.is_some(),
        };
        if as_postgres {
            c.run(
                "chown",
                Command::new("chown").arg("postgres:postgres").arg(&c.dir),
            )?;
        }
        let data = c.data_dir();
        let mut initdb = c.server_cmd("initdb");
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        c.run("initdb", &mut initdb)?;
        if let Some((cert, key)) = tls {
            for (name, text) in [("server.crt", cert), ("server.key", key)] {
                let path = data.join(name);
                std::fs::write(&path, text).map_err(|e| PgError::Io(name.into(), e))?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| PgError::Io(name.into(), e))?;
                if as_postgres {
                    c.run(
                        "chown",
                        Command::new("chown").arg("postgres:postgres").arg(&path),
                    )?;
                }
            }
        }
        // A port free a moment ago may be taken by the time the server binds it: try a few.
        let mut last = None;
        for _ in 0..5 {
            c.addr = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| PgError::Io("a free port".into(), e))?;
            match c.start_server() {
                Ok(()) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(PgError::NoBinaries))
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `postgres://` URL for database `db` as the superuser.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}/{db}", self.addr)
    }

    /// The cluster's directory (data in `data/`, the server log in `server.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn server_cmd(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    fn run(&self, what: &str, cmd: &mut Command) -> Result<Output, PgError> {
        let out = cmd.output().map_err(|e| PgError::Io(what.into(), e))?;
        if !out.status.success() {
            let mut msg = String::from_utf8_lossy(&out.stderr).into_owned();
            if msg.trim().is_empty() {
                msg = String::from_utf8_lossy(&out.stdout).into_owned();
            }
            if let Ok(log) = std::fs::read_to_string(self.dir.join("server.log")) {
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                msg.push_str("\nserver.log (last lines):\n");
                for l in tail.into_iter().rev() {
                    msg.push_str(l);
                    msg.push('\n');
                }
            }
            return Err(PgError::Failed(what.into(), msg));
        }
        Ok(out)
    }

    fn start_server(&self) -> Result<(), PgError> {
        let mut opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            self.addr.port(),
            self.dir.display()
        );
        if self.tls {
            opts.push_str(" -c ssl=on");
        }
        let mut cmd = self.server_cmd("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"]);
        self.run("pg_ctl start", &mut cmd).map(|_| ())
    }

    /// Stop the server at once (`pg_ctl stop -m immediate`: connections are cut, as when a
    /// database host dies). The data stays; [`PgCluster::restart`] starts it again.
    pub fn kill(&self) -> Result<(), PgError> {
        let mut cmd = self.server_cmd("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "60", "stop"]);
        self.run("pg_ctl stop", &mut cmd).map(|_| ())
    }

    /// Start the server again on the same port, after [`PgCluster::kill`].
    pub fn restart(&self) -> Result<(), PgError> {
        let mut last = None;
        for _ in 0..20 {
            match self.start_server() {
                Ok(()) => return Ok(()),
                // The port may linger for a moment after the old server's exit.
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
        Err(last.unwrap_or(PgError::NoBinaries))
    }

    /// Run `sql` through `psql` as the superuser (setup: create tables, load data). Returns what
    /// psql printed (unaligned, tuples only).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, PgError> {
        let psql = ["psql"]
            .iter()
            .map(|t| self.bin.join(t))
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("psql"));
        let out = self.run(
            "psql",
            Command::new(psql)
                .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
                .args(["-h", "127.0.0.1", "-U", "postgres"])
                .arg("-p")
                .arg(self.addr.port().to_string())
                .arg("-d")
                .arg(db)
                .arg("-c")
                .arg(sql),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The process's shared cluster, started by the first [`PgCluster::database`].
static SHARED: std::sync::OnceLock<Result<SharedCluster, String>> = std::sync::OnceLock::new();

/// The shared cluster and the pipe that keeps its keeper waiting: statics are never dropped, so
/// a small `sh` child stops the server and removes its directory when this process ends (its
/// stdin reaches end of file however the process ends, a panic or a kill included).
struct SharedCluster {
    cluster: PgCluster,
    _keeper: std::process::ChildStdin,
}

impl PgCluster {
    /// A fresh, empty database of its own in the one cluster this process shares (started on
    /// first use, stopped and removed when the process ends): one `initdb` per test binary
    /// instead of one per test. Tests that stop the server, change roles or need TLS start a
    /// cluster of their own ([`PgCluster::start`]) and take [`PgCluster::into_database`].
    pub fn database() -> Result<PgDatabase, PgError> {
        let shared = SHARED
            .get_or_init(|| start_shared().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| PgError::Failed("the shared cluster".into(), e.clone()))?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("t{n}");
        shared
            .cluster
            .psql("postgres", &format!("CREATE DATABASE {name}"))?;
        Ok(PgDatabase {
            cluster: Host::Shared(&shared.cluster),
            name,
        })
    }

    /// This cluster's `postgres` database, the cluster owned by the handle (stopped and removed
    /// when it is dropped).
    pub fn into_database(self) -> PgDatabase {
        PgDatabase {
            cluster: Host::Own(Box::new(self)),
            name: "postgres".into(),
        }
    }
}

fn start_shared() -> Result<SharedCluster, PgError> {
    let cluster = PgCluster::start()?;
    // `$1` runs pg_ctl (as the postgres user when root), `$2` is the directory to remove.
    let mut stop = cluster.server_cmd("pg_ctl");
    stop.arg("-D")
        .arg(cluster.data_dir())
        .args(["-m", "immediate", "-w", "-t", "60", "stop"]);
    let mut argv = vec![stop.get_program().to_os_string()];
    argv.extend(stop.get_args().map(|a| a.to_os_string()));
    let mut keeper = Command::new("sh")
        .arg("-c")
        // Ctrl-C reaches the whole process group: the keeper ignores it and cleans up once the
        // test process is gone.
        .arg("trap '' INT TERM; cat >/dev/null; dir=$1; shift; \"$@\" >/dev/null 2>&1; rm -rf \"$dir\"")
        .arg("fanout-pg-keeper")
        .arg(cluster.dir())
        .args(argv)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| PgError::Io("sh (the shared cluster's keeper)".into(), e))?;
    let stdin = keeper
        .stdin
        .take()
        .ok_or_else(|| PgError::Failed("the shared cluster's keeper".into(), "no stdin".into()))?;
    Ok(SharedCluster {
        cluster,
        _keeper: stdin,
    })
}

enum Host {
    Shared(&'static PgCluster),
    Own(Box<PgCluster>),
}

/// One database for one test: in the process's shared cluster (dropped with the handle) or the
/// `postgres` database of a cluster the handle owns.
pub struct PgDatabase {
    cluster: Host,
    name: String,
}

impl PgDatabase {
    /// The cluster the database is in (its address, directory; stop and restart it only when
    /// the handle owns it: [`PgCluster::into_database`]).
    pub fn cluster(&self) -> &PgCluster {
        match &self.cluster {
            Host::Shared(c) => c,
            Host::Own(c) => c,
        }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A `postgres://` URL of this database as the superuser.
    pub fn url(&self) -> String {
        self.cluster().url(&self.name)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.cluster().addr()
    }

    /// Run `sql` in this database through `psql` ([`PgCluster::psql`]).
    pub fn psql(&self, sql: &str) -> Result<String, PgError> {
        self.cluster().psql(&self.name, sql)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if let Host::Shared(c) = &self.cluster {
            let _ = c.psql(
                "postgres",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
    fn a_cluster_starts_answers_survives_a_kill_and_is_removed() {
        if !PgCluster::available() {
            panic!("{}", PgError::NoBinaries);
        }
        let pg = PgCluster::start().unwrap();
        assert_eq!(pg.psql("postgres", "SELECT 1 + 1").unwrap(), "2");
        pg.kill().unwrap();
        assert!(pg.psql("postgres", "SELECT 1").is_err());
        pg.restart().unwrap();
        assert_eq!(pg.psql("postgres", "SELECT 40 + 2").unwrap(), "42");
        let dir = pg.dir().to_path_buf();
        drop(pg);
        assert!(!dir.exists());
    }

    #[test]
    #[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
    fn databases_of_the_shared_cluster_are_separate_and_dropped_with_their_handle() {
        let a = PgCluster::database().unwrap();
        let b = PgCluster::database().unwrap();
        assert_eq!(a.addr(), b.addr(), "one cluster");
        assert_ne!(a.name(), b.name());
        a.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
            .unwrap();
        assert!(
            b.psql("SELECT x FROM t").is_err(),
            "b does not see a's table"
        );
        let name = a.name().to_string();
        let cluster = b.cluster();
        let exists = |n: &str| {
            cluster
                .psql(
                    "postgres",
                    &format!("SELECT count(*) FROM pg_database WHERE datname = '{n}'"),
                )
                .unwrap()
        };
        assert_eq!(exists(&name), "1");
        drop(a);
        assert_eq!(exists(&name), "0");
    }
}
