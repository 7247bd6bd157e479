//! Tailcall for `fanout lab graphql-posts`: its config (the benchmark's, written the way
//! Tailcall 1.0.0 spells it) and its executable — given, or installed with npm into a cache
//! directory the first time.

use super::{DISTINCT, TAILCALL_BIN_ENV, TAILCALL_PACKAGE, TAILCALL_VERSION};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Tailcall's config: the benchmark's (`@server`, `@upstream` with its pool settings, `@http`
/// on `Query.posts` and `Post.user`), listening on `listen`, the upstreams at the stubs'
/// addresses. Tailcall 1.0.0 takes the upstream as `@http(url: …)` (its `@upstream` has no
/// `baseURL` and `@http` no `path` any more). `dedupe` on both fields when asked; the HTTP cache
/// stays off (`httpCache` unset: 0).
pub fn tailcall_sdl(
    listen: SocketAddr,
    posts: SocketAddr,
    users: SocketAddr,
    dedupe: bool,
) -> String {
    let d = if dedupe { ", dedupe: true" } else { "" };
    format!(
        r#"# `fanout lab {DISTINCT}`: tailcallhq/graphql-benchmarks' config for Tailcall {TAILCALL_VERSION}.
schema
  @server(hostname: "{host}", port: {port})
  @upstream(poolMaxIdlePerHost: 200, tcpKeepAlive: 60) {{
  query: Query
}}

type Query {{
  posts(page: Int): [Post]
    @http(url: "http://{posts}/posts", query: [{{key: "page", value: "{{{{.args.page}}}}", skipEmpty: true}}]{d})
}}

type User {{
  id: Int!
  name: String!
  username: String!
  email: String!
  phone: String
  website: String
}}

type Post {{
  id: Int!
  userId: Int!
  title: String!
  body: String!
  user: User @http(url: "http://{users}/users/{{{{.value.userId}}}}"{d})
}}
"#,
        host = listen.ip(),
        port = listen.port(),
    )
}

/// Where the lab installs Tailcall: `$FANOUT_LAB_TAILCALL_DIR`, else
/// `<cargo target dir>/lab-cache/tailcall-1.0.0` when the `fanout` binary lives in a cargo
/// profile directory (`target/release/fanout`), else `~/.cache/fanout-lab/tailcall-1.0.0`.
pub fn tailcall_dir(fanout_bin: &Path) -> PathBuf {
    if let Some(d) = std::env::var_os("FANOUT_LAB_TAILCALL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let leaf = format!("tailcall-{TAILCALL_VERSION}");
    let profile = fanout_bin.parent();
    let is_profile = profile
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "release" || n == "debug");
    match profile.and_then(Path::parent) {
        Some(target) if is_profile => target.join("lab-cache").join(leaf),
        _ => {
            let home =
                std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
            home.join(".cache/fanout-lab").join(leaf)
        }
    }
}

/// The executable the npm package puts under `dir`.
pub fn tailcall_bin_in(dir: &Path) -> PathBuf {
    dir.join("node_modules")
        .join(TAILCALL_PACKAGE)
        .join("bin/tailcall")
}

/// The npm command that installs Tailcall into `dir`.
pub fn npm_args(dir: &Path) -> Vec<String> {
    vec![
        "install".into(),
        "--prefix".into(),
        dir.display().to_string(),
        "--no-save".into(),
        "--no-audit".into(),
        "--no-fund".into(),
        format!("{TAILCALL_PACKAGE}@{TAILCALL_VERSION}"),
    ]
}

/// `tailcall --version`'s line, when the executable runs.
fn tailcall_version(bin: &Path) -> Option<String> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .env("TC_TRACKER", "false")
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !v.is_empty()).then_some(v)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// The Tailcall executable and its version: `explicit` (`--baseline-bin`) or
/// `$FANOUT_LAB_TAILCALL` as given; else the one installed in `dir`, installing it with npm
/// first when missing (announced on stderr with the command). The reason when it cannot.
pub async fn ensure_tailcall(
    explicit: Option<PathBuf>,
    dir: &Path,
) -> Result<(PathBuf, String), String> {
    let given = explicit.or_else(|| {
        std::env::var_os(TAILCALL_BIN_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    if let Some(bin) = given {
        return tailcall_version(&bin)
            .map(|v| (bin.clone(), v))
            .ok_or_else(|| format!("{} does not run (`--version` failed)", bin.display()));
    }
    let bin = tailcall_bin_in(dir);
    let wanted = format!("v{TAILCALL_VERSION}");
    if let Some(v) = tailcall_version(&bin).filter(|v| v.contains(&wanted)) {
        return Ok((bin, v));
    }
    let Some(npm) = on_path("npm") else {
        return Err(format!(
            "Tailcall {TAILCALL_VERSION} is not installed in {} and there is no npm to install it (Debian: apt-get install npm; or pass --baseline-bin PATH/TO/tailcall)",
            dir.display()
        ));
    };
    let args = npm_args(dir);
    {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr().lock(),
            "installing Tailcall {TAILCALL_VERSION} (not in {}): npm {}",
            dir.display(),
            args.join(" ")
        );
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let run = tokio::process::Command::new(&npm)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(300), run).await {
        Err(_) => return Err("npm install did not finish within 300 s".into()),
        Ok(Err(e)) => return Err(format!("npm did not start: {e}")),
        Ok(Ok(o)) => o,
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        return Err(format!(
            "npm {} failed ({}): {}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    tailcall_version(&bin)
        .filter(|v| v.contains(&wanted))
        .map(|v| (bin.clone(), v))
        .ok_or_else(|| format!("npm installed {TAILCALL_PACKAGE}@{TAILCALL_VERSION} but {} does not report {wanted}", bin.display()))
}
