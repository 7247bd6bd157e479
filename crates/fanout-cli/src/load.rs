//! `fanout load`: the open-model generator from the command line (progress, summary, JSON, thresholds).
//! HTTP/1.1, h2c, or unary gRPC (`--grpc pkg.Svc/Method --proto FILE --data JSON`).

use anyhow::{Context, bail};
use fanout_load::{
    GrpcTemplateError, LoadSpec, Protocol, RequestTemplate, Schedule, SecondStats, Threshold,
};
use std::io::Write;
use std::path::PathBuf;

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
    /// Request body (with `grpc`: the message as JSON; default `{}`).
    pub body: Option<String>,
    /// HTTP/2.
    pub http2: bool,
    /// A unary gRPC method (`package.Service/Method`) to call instead of an HTTP request.
    pub grpc: Option<String>,
    /// `.proto` files defining the `grpc` method.
    pub protos: Vec<String>,
    /// Import paths for the `.proto` files (default: each file's directory, then `.`).
    pub import_paths: Vec<String>,
    /// Connection cap.
    pub connections: usize,
    /// HTTP/2 and gRPC: connections opened before the run and used in turn (0: on demand).
    pub open_connections: usize,
    /// Per-request timeout (a bare number is milliseconds).
    pub timeout: String,
    /// `https://` URLs: the certificates trusted (`--cacert`, `--insecure`).
    pub tls: fanout_load::TlsOptions,
    /// Every request with its own `x-request-id` ([`DISTINCT_REQUEST_IDS`] values in turn).
    pub distinct_request_ids: bool,
    /// Thresholds.
    pub thresholds: Vec<String>,
    /// JSON output file.
    pub json: Option<String>,
}

/// Exit code when a threshold is crossed.
pub const EXIT_THRESHOLD: i32 = 2;
/// Exit code when the generator could not keep its schedule.
pub const EXIT_INVALID: i32 = 3;
/// Exit code when not one request succeeded (nothing listening, every answer an error): a run
/// that measured nothing never passes, thresholds or not.
pub const EXIT_NOTHING_OK: i32 = 4;

/// Run the generator; returns the process exit code.
pub async fn run_cli(a: LoadArgs) -> anyhow::Result<i32> {
    if a.grpc.is_some() {
        return run_grpc(a).await;
    }
    let (scheme_host, path) = split_url(&a.url)?;
    let schedule = Schedule::parse(&a.schedule).map_err(|e| anyhow::anyhow!("--schedule: {e}"))?;
    let thresholds = parse_thresholds(&a.thresholds)?;
    let headers = parse_headers(&a.headers)?;
    let method = http::Method::from_bytes(a.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| anyhow::anyhow!("--method `{}` is not an HTTP method", a.method))?;
    let timeout = parse_timeout(&a.timeout)?;
    let mut spec = LoadSpec::new(scheme_host, schedule);
    let template = RequestTemplate {
        method,
        path,
        headers,
        body: bytes::Bytes::from(a.body.unwrap_or_default()),
    };
    spec.requests = if a.distinct_request_ids {
        with_request_ids(&template)?
    } else {
        vec![template]
    };
    spec.protocol = if a.http2 {
        Protocol::Http2
    } else {
        Protocol::Http1
    };
    if a.open_connections > 0 && !a.http2 {
        bail!("--open-connections needs --http2 or --grpc (HTTP/1.1 connections open on demand)");
    }
    spec.max_connections = a.connections.max(1);
    spec.open_connections = a.open_connections;
    spec.timeout = timeout;
    spec.drain = timeout;
    spec.tls = a.tls.clone();
    execute(&spec, &a.url, &thresholds, a.json.as_deref()).await
}

/// How many `x-request-id` values `--distinct-request-ids` sends in turn: far more than the
/// requests one run keeps in flight, so concurrent requests never share one.
pub const DISTINCT_REQUEST_IDS: usize = 1024;

/// `--distinct-request-ids`: the template [`DISTINCT_REQUEST_IDS`] times, each with its own
/// `x-request-id` (`load-0001` …); an `x-request-id` given with -H is an error (which one wins?).
fn with_request_ids(t: &RequestTemplate) -> anyhow::Result<Vec<RequestTemplate>> {
    if t.headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("x-request-id"))
    {
        bail!("--distinct-request-ids sets x-request-id itself: leave -H 'x-request-id: …' out");
    }
    Ok((1..=DISTINCT_REQUEST_IDS)
        .map(|n| {
            let mut r = t.clone();
            r.headers
                .push(("x-request-id".into(), format!("load-{n:04}")));
            r
        })
        .collect())
}

/// `--grpc`: the same run with one unary gRPC call built from the `.proto` files.
async fn run_grpc(a: LoadArgs) -> anyhow::Result<i32> {
    let Some(method) = a.grpc.as_deref() else {
        bail!("--grpc: no method given");
    };
    let url = if a.url.contains("://") {
        a.url.clone()
    } else {
        format!("http://{}", a.url)
    };
    let (scheme_host, path) = split_url(&url)?;
    if path != "/" {
        bail!(
            "`{}`: with --grpc the URL is the server's address ({scheme_host}); the method gives the path",
            a.url
        );
    }
    if !a.method.eq_ignore_ascii_case("GET") && !a.method.eq_ignore_ascii_case("POST") {
        bail!(
            "--method {}: a gRPC call is a POST (leave -X out with --grpc)",
            a.method
        );
    }
    if a.protos.is_empty() {
        bail!("--grpc needs the .proto file defining {method}: add --proto FILE");
    }
    let schedule = Schedule::parse(&a.schedule).map_err(|e| anyhow::anyhow!("--schedule: {e}"))?;
    let thresholds = parse_thresholds(&a.thresholds)?;
    let metadata = parse_headers(&a.headers)?;
    let timeout = parse_timeout(&a.timeout)?;
    let files: Vec<PathBuf> = a.protos.iter().map(PathBuf::from).collect();
    let imports: Vec<PathBuf> = a.import_paths.iter().map(PathBuf::from).collect();
    let protos =
        fanout_load::load_protos(&files, &imports).map_err(|e| anyhow::anyhow!("--proto: {e}"))?;
    let json = a.body.as_deref().unwrap_or("{}");
    let template = fanout_load::grpc_request(&protos, method, json, &metadata).map_err(|e| {
        let flag = match &e {
            GrpcTemplateError::Json { .. } => "--data",
            GrpcTemplateError::Metadata { .. } => "--header",
            _ => "--grpc",
        };
        anyhow::anyhow!("{flag}: {e}")
    })?;
    let mut spec = LoadSpec::new(scheme_host, schedule);
    spec.requests = vec![template];
    spec.protocol = Protocol::Grpc;
    spec.max_connections = a.connections.max(1);
    spec.open_connections = a.open_connections;
    spec.timeout = timeout;
    spec.drain = timeout;
    spec.tls = a.tls.clone();
    let shown = format!("{}/{}", url.trim_end_matches('/'), method);
    execute(&spec, &shown, &thresholds, a.json.as_deref()).await
}

fn parse_thresholds(thresholds: &[String]) -> anyhow::Result<Vec<Threshold>> {
    thresholds
        .iter()
        .map(|t| Threshold::parse(t).map_err(|e| anyhow::anyhow!("--threshold {t}: {e}")))
        .collect()
}

fn parse_headers(headers: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for h in headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("--header `{h}`: expected `name: value`");
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// The config grammar: a bare number is milliseconds, at most `Dur::MAX`.
fn parse_timeout(text: &str) -> anyhow::Result<std::time::Duration> {
    Ok(fanout_config::Dur::parse(text)
        .map_err(|e| anyhow::anyhow!("--timeout: {e}"))?
        .0)
}

/// Run `spec` with per-second progress on stderr, print the summary, write the JSON, check the
/// thresholds; returns the exit code.
async fn execute(
    spec: &LoadSpec,
    url: &str,
    thresholds: &[Threshold],
    json: Option<&str>,
) -> anyhow::Result<i32> {
    let progress = |s: &SecondStats| {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "t={:>4}s offered {:>6}/s sent {:>6} ok {:>6} errors {:>5} p50 {:>7.2} ms p99 {:>7.2} ms lag p99 {:>6.2} ms",
            s.t, s.offered, s.sent, s.ok, s.errors, s.p50_ms, s.p99_ms, s.lag_p99_ms
        );
    };
    let mut report = fanout_load::run(spec, Some(&progress))
        .await
        .context("load run failed")?;
    // the summary and the JSON name the whole URL given, path included
    report.target = url.to_string();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", fanout_load::summary_text(&report));
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {path}"))?;
    }
    let failed = fanout_load::check_thresholds(&report, thresholds);
    for f in &failed {
        let _ = writeln!(out, "THRESHOLD FAILED: {f}");
    }
    let nothing_ok = report.ok == 0 && report.offered > 0;
    if nothing_ok {
        let _ = writeln!(
            out,
            "NO REQUEST SUCCEEDED: {} offered, {} completed, 0 ok (see the errors above)",
            report.offered, report.completed
        );
    }
    // The user's own pass/fail criteria come first; a run that measured nothing or could not
    // keep its schedule fails without them too.
    Ok(if !failed.is_empty() {
        EXIT_THRESHOLD
    } else if nothing_ok {
        EXIT_NOTHING_OK
    } else if !report.valid {
        EXIT_INVALID
    } else {
        0
    })
}

/// `http://host:port/path?q` → (`http://host:port`, `/path?q`); `https://` alike.
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("`{url}` is not a URL: expected http://host:port/path");
    };
    if scheme != "http" && scheme != "https" {
        bail!(
            "`{url}`: only http:// (h2c with --http2) and https:// (h2 with --http2, by ALPN) targets are supported"
        );
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
