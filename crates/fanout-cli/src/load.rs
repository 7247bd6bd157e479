//! `fanout load`: the open-model generator from the command line (progress, summary, JSON, thresholds).

use anyhow::{Context, bail};
use fanout_load::{LoadSpec, Protocol, RequestTemplate, Schedule, SecondStats, Threshold};
use std::io::Write;

/// Arguments of `fanout load`.
pub struct LoadArgs {
    /// Full target URL.
    pub url: String,
    /// Tank-syntax schedule (a bare duration is seconds).
    pub schedule: String,
    /// HTTP method.
    pub method: String,
    /// `name: value` headers.
    pub headers: Vec<String>,
    /// Request body.
    pub body: Option<String>,
    /// HTTP/2.
    pub http2: bool,
    /// Connection cap.
    pub connections: usize,
    /// Per-request timeout (a bare number is milliseconds).
    pub timeout: String,
    /// Thresholds.
    pub thresholds: Vec<String>,
    /// JSON output file.
    pub json: Option<String>,
}

/// Exit code when a threshold is crossed.
pub const EXIT_THRESHOLD: i32 = 2;
/// Exit code when the generator could not keep its schedule.
pub const EXIT_INVALID: i32 = 3;

/// Run the generator; returns the process exit code.
pub async fn run_cli(a: LoadArgs) -> anyhow::Result<i32> {
    let (scheme_host, path) = split_url(&a.url)?;
    let schedule = Schedule::parse(&a.schedule).map_err(|e| anyhow::anyhow!("--schedule: {e}"))?;
    let thresholds = a
        .thresholds
        .iter()
        .map(|t| Threshold::parse(t).map_err(|e| anyhow::anyhow!("--threshold {t}: {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut headers = Vec::new();
    for h in &a.headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("--header `{h}`: expected `name: value`");
        };
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let method = http::Method::from_bytes(a.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| anyhow::anyhow!("--method `{}` is not an HTTP method", a.method))?;
    // The config grammar: a bare number is milliseconds, at most `Dur::MAX`.
    let timeout = fanout_config::Dur::parse(&a.timeout)
        .map_err(|e| anyhow::anyhow!("--timeout: {e}"))?
        .0;
    let mut spec = LoadSpec::new(scheme_host, schedule);
    spec.requests = vec![RequestTemplate {
        method,
        path,
        headers,
        body: bytes::Bytes::from(a.body.unwrap_or_default()),
    }];
    spec.protocol = if a.http2 {
        Protocol::Http2
    } else {
        Protocol::Http1
    };
    spec.max_connections = a.connections.max(1);
    spec.timeout = timeout;
    spec.drain = timeout;

    let progress = |s: &SecondStats| {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "t={:>4}s offered {:>6}/s sent {:>6} ok {:>6} errors {:>5} p50 {:>7.2} ms p99 {:>7.2} ms lag p99 {:>6.2} ms",
            s.t, s.offered, s.sent, s.ok, s.errors, s.p50_ms, s.p99_ms, s.lag_p99_ms
        );
    };
    let report = fanout_load::run(&spec, Some(&progress))
        .await
        .context("load run failed")?;
    println!("{}", fanout_load::summary_text(&report));
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {path}"))?;
    }
    let failed = fanout_load::check_thresholds(&report, &thresholds);
    for f in &failed {
        println!("THRESHOLD FAILED: {f}");
    }
    // The user's own pass/fail criteria come first; an invalid run without them still fails.
    Ok(if !failed.is_empty() {
        EXIT_THRESHOLD
    } else if !report.valid {
        EXIT_INVALID
    } else {
        0
    })
}

/// `http://host:port/path?q` → (`http://host:port`, `/path?q`).
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("`{url}` is not a URL: expected http://host:port/path");
    };
    if scheme != "http" {
        bail!("`{url}`: only http:// targets are supported (h2c with --http2)");
    }
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if host.is_empty() {
        bail!("`{url}` has no host");
    }
    Ok((format!("{scheme}://{host}"), path.to_string()))
}
