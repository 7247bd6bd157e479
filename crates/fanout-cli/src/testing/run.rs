//! Running a cases file: the stubs in process on free ports, the gateway on a free port with
//! the config's `${…_ADDR}` pointing at them, then each case in order.

use super::cases::{BackendCalls, BackendOverride, Case, Cases, ExpectedCall, FaultName};
use super::diff;
use crate::{addr_var, start_gateway};
use bytes::Bytes;
use fanout_config::{ConfigErrors, Dur};
use fanout_stub::{FaultAction, FaultConfig, LatencyConfig, RouteUpdate, StubServer};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What `fanout test` runs: a gateway config, the stubs its backends are, and the cases.
#[derive(Debug, Clone)]
pub struct Suite {
    /// The gateway config.
    pub config: PathBuf,
    /// The stubs file (`fanout stub` format); `None`: no simulated backends.
    pub stubs: Option<PathBuf>,
    /// The cases file.
    pub cases: PathBuf,
    /// SQL run in a throw-away PostgreSQL database before the cases, for a config that reads
    /// `${DATABASE_URL}` (when no `database_url` is given).
    pub schema_sql: Option<PathBuf>,
    /// The database the config's `${DATABASE_URL}` points at (used as it is).
    pub database_url: Option<String>,
    /// Other `${VARS}` of the config (before the environment).
    pub vars: Vec<(String, String)>,
    /// How long one request may take before its case fails.
    pub request_timeout: Duration,
    /// Calls kept per service and case for `backend_calls.*.calls` checks.
    pub max_recorded_calls: usize,
}

impl Suite {
    /// The suite of a directory (its `fanout.yaml`) or of a config file: `stubs.yaml`,
    /// `cases.yaml` and `schema.sql` are taken from beside the config when they exist.
    pub fn beside(path: &Path) -> Suite {
        let config = if path.is_dir() {
            path.join("fanout.yaml")
        } else {
            path.to_path_buf()
        };
        let dir = config
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let exists = |f: &str| Some(dir.join(f)).filter(|p| p.exists());
        Suite {
            stubs: exists("stubs.yaml"),
            cases: dir.join("cases.yaml"),
            schema_sql: exists("schema.sql"),
            config,
            database_url: None,
            vars: Vec::new(),
            request_timeout: Duration::from_secs(10),
            max_recorded_calls: 1000,
        }
    }
}

/// Why a suite could not run (a failing case is not an error: see [`CaseResult`]).
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    /// A file does not load: FILE:LINE:COL errors.
    #[error("{0}")]
    Load(ConfigErrors),
    /// The stubs, the database or the gateway did not start.
    #[error("{0}")]
    Start(String),
    /// A case names a case filter that matches nothing.
    #[error("no case matches {0:?}")]
    NoMatch(Vec<String>),
}

/// What one case gave.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// The cases file.
    pub file: String,
    /// The line the case starts on.
    pub line: u32,
    /// Each assertion that failed, as a readable text (empty: the case passed).
    pub failures: Vec<String>,
    /// Time from sending the request to the answer's last byte.
    pub elapsed: Duration,
    /// The actual answer, when it was JSON.
    pub actual: Option<serde_json::Value>,
    /// The case's place in the file's `cases:` list, from 0 (for `--update`).
    pub index: usize,
    /// The line of the case's `response:` value, when it has one.
    pub response_line: Option<u32>,
    /// Whether the `response:` (exact answer) check failed.
    pub response_differs: bool,
    /// The answer's status, once one came.
    pub status: Option<u16>,
    /// The answer's headers, once one came (what `tests/gateway/openapi.rs` checks against
    /// the exported document).
    pub headers: http::HeaderMap,
    /// The answer's body as it came (empty before one came).
    pub body: Bytes,
}

impl CaseResult {
    /// Whether every assertion held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The results of a suite.
#[derive(Debug, Clone)]
pub struct Report {
    /// The cases file.
    pub file: String,
    /// One result per case run, in file order.
    pub results: Vec<CaseResult>,
    /// The whole run (start-up included).
    pub elapsed: Duration,
    /// The routes and branches no case went through (with [`RunOptions::coverage`]).
    pub coverage: Option<super::coverage::Summary>,
    /// Each route's draft answer schema (with [`RunOptions::propose_schemas`]).
    pub proposals: Vec<super::schemas::RouteProposal>,
    /// The gateway config file.
    pub config: String,
}

impl Report {
    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.results.iter().all(CaseResult::passed)
    }
}

/// Where `log:` assertions find the gateway's log lines: lines containing a text.
pub type LogLines<'a> = &'a (dyn Fn(&str) -> Vec<String> + Sync);

/// Options of one run.
#[derive(Clone, Copy)]
pub struct RunOptions<'a> {
    /// Run only the cases whose name contains one of these (all when empty).
    pub filter: &'a [String],
    /// The gateway's log, for `log:` assertions (`None`: such a case fails, saying so).
    pub logs: Option<LogLines<'a>>,
    /// Record which routes and branches of the flows the cases go through
    /// ([`Report::coverage`]).
    pub coverage: bool,
    /// Check each case's request and answer against its route's declared schemas
    /// (`--schemas`, `schemas.rs`).
    pub schemas: bool,
    /// Draft an answer schema for each route from its cases' success answers
    /// (`--propose-schemas`, [`Report::proposals`]).
    pub propose_schemas: bool,
}

/// Run a suite: load everything (errors with FILE:LINE:COL), start the stubs, the database and
/// the gateway, run the selected cases in order, stop everything.
pub async fn run(suite: &Suite, opts: RunOptions<'_>) -> Result<Report, TestError> {
    let started = Instant::now();
    let cases_file = suite.cases.display().to_string();
    let cases = {
        let file = cases_file.clone();
        blocking(move || Cases::load_file(&file))
            .await?
            .map_err(TestError::Load)?
    };
    let selected: Vec<(usize, &fanout_config::Located<Case>)> = cases
        .cases
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            opts.filter.is_empty()
                || opts
                    .filter
                    .iter()
                    .any(|f| c.value.name.contains(f.as_str()))
        })
        .collect();
    if selected.is_empty() && !opts.filter.is_empty() {
        return Err(TestError::NoMatch(opts.filter.to_vec()));
    }
    let stubs = match &suite.stubs {
        Some(path) => {
            let path = path.display().to_string();
            let compiled = blocking(move || {
                // every service on a free port; other variables from the environment
                let any_port = |n: &str| {
                    if n.ends_with("_ADDR") {
                        Some("127.0.0.1:0".to_string())
                    } else {
                        fanout_config::env_lookup(n)
                    }
                };
                fanout_stub::load_file(&path, &any_port)
            })
            .await?
            .map_err(TestError::Load)?;
            Some(
                compiled
                    .start()
                    .await
                    .map_err(|e| TestError::Start(format!("starting the stubs: {e}")))?,
            )
        }
        None => None,
    };
    let wants_calls = selected.iter().any(|(_, c)| {
        c.value
            .backend_calls
            .values()
            .any(|b| matches!(b, BackendCalls::Detailed(d) if !d.calls.is_empty()))
    });
    if let (true, Some(s)) = (wants_calls, &stubs) {
        s.record_calls(suite.max_recorded_calls);
    }
    let mut vars: HashMap<String, String> = suite.vars.iter().cloned().collect();
    if let Some(s) = &stubs {
        for (name, addr) in s.services() {
            vars.insert(addr_var(&name), addr.to_string());
        }
    }
    let config_file = suite.config.display().to_string();
    let config_text = {
        let file = config_file.clone();
        blocking(move || {
            fanout_config::read_limited(&file, fanout_config::MAX_CONFIG_BYTES)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
        })
        .await?
    };
    let _database = if config_text.contains("${DATABASE_URL") && !vars.contains_key("DATABASE_URL")
    {
        let db = super::database::provide(&suite.config, suite.schema_sql.as_deref())
            .await
            .map_err(TestError::Start)?;
        vars.insert("DATABASE_URL".into(), db.url());
        Some(db)
    } else {
        None
    };
    let want_coverage = opts.coverage;
    let want_schemas = opts.schemas;
    let load_schemas = opts.schemas || opts.propose_schemas;
    let (mut gateway, inventory, schemas) = blocking(move || {
        let lookup = |n: &str| {
            vars.get(n)
                .cloned()
                .or_else(|| fanout_config::env_lookup(n))
        };
        let cfg = fanout_config::Config::from_file(&config_file, &lookup)?;
        let inventory = want_coverage.then(|| super::coverage::inventory(&cfg));
        let gateway = fanout_proxy::Gateway::build(&cfg)?;
        let schemas = match load_schemas {
            true => Some(super::schemas::Schemas::load(cfg)?),
            false => None,
        };
        Ok((gateway, inventory, schemas))
    })
    .await?
    .map_err(TestError::Load)?;
    let coverage = inventory.map(|items| {
        let recorder = Arc::new(fanout_flow::coverage::Coverage::new());
        gateway.record_coverage(recorder.clone());
        (items, recorder)
    });
    let gw = start_gateway(gateway, "127.0.0.1:0", None)
        .await
        .map_err(|e| TestError::Start(format!("starting the gateway: {e}")))?;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut results = Vec::new();
    // each route's success answers (JSON), for --propose-schemas
    let mut answers: Vec<Vec<serde_json::Value>> = Vec::new();
    for (index, case) in selected {
        let mut r = run_case(
            &client,
            gw.addr,
            stubs.as_ref(),
            &cases_file,
            case,
            suite.request_timeout,
            opts.logs,
        )
        .await;
        r.index = index;
        if let (true, Some(s), Some(200..=299), Some(a)) =
            (opts.propose_schemas, &schemas, r.status, &r.actual)
        {
            let q = &case.value.request;
            if let Some(i) = s.index(&q.method, &q.path) {
                if answers.len() <= i {
                    answers.resize_with(i + 1, Vec::new);
                }
                answers[i].push(a.clone());
            }
        }
        if let (true, Some(s), Some(status)) = (want_schemas, &schemas, r.status) {
            let q = &case.value.request;
            let found = s.check(
                &q.method,
                &q.path,
                q.body.as_ref(),
                status,
                r.actual.as_ref(),
            );
            r.failures.extend(found);
        }
        results.push(r);
    }
    // Stopping is best effort: the answers are in.
    let _ = gw.shutdown().await;
    if let Some(s) = stubs {
        s.shutdown().await;
    }
    let config_name = suite.config.display().to_string();
    let proposals = match (&schemas, opts.propose_schemas) {
        (Some(s), true) => s.proposals(&answers),
        _ => Vec::new(),
    };
    Ok(Report {
        proposals,
        config: config_name.clone(),
        file: cases_file,
        results,
        elapsed: started.elapsed(),
        coverage: coverage
            .map(|(items, rec)| super::coverage::summarize(&config_name, &items, &rec)),
    })
}

/// `f` on tokio's blocking pool (file reads, config compilation): never on a worker.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TestError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TestError::Start(format!("loading: {e}")))
}

/// The routes of a service as they were before a case changed them.
type Saved = Vec<(String, String, Arc<fanout_stub::Behaviour>)>;

fn apply_overrides(
    stubs: Option<&StubServer>,
    overrides: &std::collections::BTreeMap<String, BackendOverride>,
) -> Result<Saved, String> {
    let mut saved = Vec::new();
    if overrides.is_empty() {
        return Ok(saved);
    }
    let Some(stubs) = stubs else {
        return Err("`backends:` needs a stubs file".into());
    };
    for (service, o) in overrides {
        let routes = stubs.routes(service).ok_or_else(|| {
            format!("`backends:` names `{service}`, which the stubs file has not")
        })?;
        for view in routes {
            if let Some(b) = stubs.behaviour(service, &view.route) {
                saved.push((service.clone(), view.route.clone(), b));
            }
            let fault = o.fault.map(|f| FaultConfig {
                p: 1.0,
                action: match f {
                    FaultName::Down | FaultName::Reset => FaultAction::Reset,
                    FaultName::Slow => FaultAction::Hang,
                    FaultName::ServerError => FaultAction::Status {
                        status: 503,
                        body: None,
                    },
                },
            });
            let update = RouteUpdate {
                latency: o
                    .latency_ms
                    .map(|ms| LatencyConfig::Fixed(Dur(Duration::from_millis(ms)))),
                faults: fault.map(|f| vec![f]),
                status: o.status.as_ref().map(|s| s.value),
                ..Default::default()
            };
            stubs
                .update_route(service, &view.route, update)
                .map_err(|e| format!("`backends.{service}`: {e}"))?;
            if let Some(body) = &o.body
                && let Some(b) = stubs.behaviour(service, &view.route)
            {
                let mut b = (*b).clone();
                b.raw_body = Some(Bytes::from(body.to_string()));
                b.body = None;
                stubs.set_behaviour(service, &view.route, b);
            }
        }
    }
    Ok(saved)
}

fn restore(stubs: Option<&StubServer>, saved: Saved) {
    if let Some(stubs) = stubs {
        for (service, route, b) in saved {
            stubs.set_behaviour(&service, &route, (*b).clone());
        }
    }
}

async fn run_case(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: std::net::SocketAddr,
    stubs: Option<&StubServer>,
    file: &str,
    case: &fanout_config::Located<Case>,
    timeout: Duration,
    logs: Option<LogLines<'_>>,
) -> CaseResult {
    let c = &case.value;
    let mut result = CaseResult {
        name: c.name.clone(),
        file: file.to_string(),
        line: case.pos.line,
        failures: Vec::new(),
        elapsed: Duration::ZERO,
        actual: None,
        index: 0,
        response_line: c.response.as_ref().map(|r| r.pos.line),
        response_differs: false,
        status: None,
        headers: http::HeaderMap::new(),
        body: Bytes::new(),
    };
    if let Some(s) = stubs {
        s.reset_stats();
    }
    let saved = match apply_overrides(stubs, &c.backends) {
        Ok(s) => s,
        Err(e) => {
            result.failures.push(e);
            return result;
        }
    };
    let sent = Instant::now();
    let answer = send(client, addr, c, timeout).await;
    result.elapsed = sent.elapsed();
    restore(stubs, saved);
    let (status, headers, body) = match answer {
        Ok(a) => a,
        Err(e) => {
            result.failures.push(e);
            return result;
        }
    };
    result.status = Some(status);
    check(c, &mut result, status, &headers, &body, stubs, logs);
    result.headers = headers;
    result.body = body;
    result
}

type Answer = (u16, http::HeaderMap, Bytes);

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: std::net::SocketAddr,
    c: &Case,
    timeout: Duration,
) -> Result<Answer, String> {
    let r = &c.request;
    let method = r
        .method()
        .ok_or_else(|| format!("request.method {:?} is not an HTTP method", r.method))?;
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{}", r.path));
    let mut has_type = false;
    for (k, v) in &r.headers {
        has_type |= k.eq_ignore_ascii_case("content-type");
        req = req.header(k.as_str(), v.as_str());
    }
    if r.body.is_some() && !has_type {
        req = req.header("content-type", "application/json");
    }
    let body = r.body_text();
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let (parts, body) = resp.into_parts();
        // A streamed answer is read as it arrives, up to what the case reads of it.
        let body = match &c.stream {
            Some(want) => super::stream::read(&want.value, body).await?,
            None => body
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes(),
        };
        Ok((parts.status.as_u16(), parts.headers, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
}

fn check(
    c: &Case,
    result: &mut CaseResult,
    status: u16,
    headers: &http::HeaderMap,
    body: &Bytes,
    stubs: Option<&StubServer>,
    logs: Option<LogLines<'_>>,
) {
    let fails = &mut result.failures;
    let actual: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let shown = || match &actual {
        Some(v) => v.to_string(),
        None => String::from_utf8_lossy(body).into_owned(),
    };
    if status != c.status {
        fails.push(format!(
            "status: expected {}, got {status}; answer: {}",
            c.status,
            diff::clip(&shown(), 400)
        ));
    }
    for (k, v) in &c.headers {
        let got = headers
            .get(k.as_str())
            .map(|h| String::from_utf8_lossy(h.as_bytes()));
        if got.as_deref() != Some(v.as_str()) {
            fails.push(format!(
                "header {k}: expected {v:?}, got {}",
                got.map_or("none".to_string(), |g| format!("{g:?}"))
            ));
        }
    }
    if let Some(expected) = &c.response {
        match &actual {
            Some(a) if diff::json_eq(&expected.value, a) => {}
            Some(a) => {
                result.response_differs = true;
                fails.push(format!(
                    "response differs:\n{}",
                    diff::show(&expected.value, a)
                ));
            }
            None => {
                result.response_differs = true;
                fails.push(format!(
                    "response: expected JSON, got {}",
                    diff::clip(&shown(), 400)
                ));
            }
        }
    }
    if let Some(want) = &c.stream {
        super::stream::check(&want.value, body, fails);
    }
    if let Some(part) = &c.response_includes {
        match &actual {
            Some(a) => {
                let mut misses = Vec::new();
                diff::includes(part, a, &mut String::new(), &mut misses);
                if !misses.is_empty() {
                    fails.push(format!(
                        "response_includes: the answer does not include\n{}",
                        misses
                            .iter()
                            .map(|m| format!("  {m}"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    ));
                }
            }
            None => fails.push(format!(
                "response_includes: expected JSON, got {}",
                diff::clip(&shown(), 400)
            )),
        }
    }
    for pred in &c.expect {
        let pred = &pred.value;
        if let Err(e) = predicate(pred, actual.as_ref(), status, headers) {
            fails.push(format!("expect `{pred}`: {e}"));
        }
    }
    if let Some(max) = c.max_latency_ms
        && result.elapsed > Duration::from_millis(max)
    {
        fails.push(format!(
            "max_latency_ms: answered in {} ms, above {max} ms",
            result.elapsed.as_millis()
        ));
    }
    for (service, want) in &c.backend_calls {
        let stats = stubs.and_then(|s| s.stats(service));
        let Some(stats) = stats else {
            fails.push(format!(
                "backend_calls: the stubs file has no service `{service}`"
            ));
            continue;
        };
        let total: u64 = stats.routes.values().map(|r| r.requests).sum();
        let (count, routes) = match want {
            BackendCalls::Count(n) => (Some(*n), None),
            BackendCalls::Detailed(d) => (d.count, Some(&d.routes)),
        };
        if let BackendCalls::Detailed(d) = want
            && !d.calls.is_empty()
        {
            let got = stubs
                .and_then(|s| s.recorded_calls(service))
                .unwrap_or_default();
            check_calls(service, &d.calls, &got, fails);
        }
        if let Some(n) = count
            && n != total
        {
            fails.push(format!("calls to {service}: expected {n}, got {total}"));
        }
        for (route, n) in routes.into_iter().flatten() {
            match stats.routes.get(route) {
                Some(r) if r.requests == *n => {}
                Some(r) => fails.push(format!(
                    "calls to {service} {route}: expected {n}, got {}",
                    r.requests
                )),
                None => fails.push(format!(
                    "backend_calls: `{service}` has no route `{route}`; its routes: {}",
                    stats.routes.keys().cloned().collect::<Vec<_>>().join(", ")
                )),
            }
        }
    }
    if !c.log.is_empty() {
        let rid = c
            .request
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("x-request-id"))
            .map(|(_, v)| v.clone());
        match (rid, logs) {
            (None, _) => fails.push("`log` needs the request's x-request-id header".into()),
            (Some(_), None) => fails.push("`log`: this runner does not capture the log".into()),
            (Some(rid), Some(logs)) => {
                let lines = logs(&format!("request_id={rid}"));
                for text in &c.log {
                    if !lines.iter().any(|l| l.contains(text.as_str())) {
                        fails.push(format!(
                            "log: no log line of request {rid} contains {text:?}; its lines:\n{}",
                            lines.join("\n")
                        ));
                    }
                }
            }
        }
    }
    result.actual = actual;
}

fn predicate(
    src: &str,
    body: Option<&serde_json::Value>,
    status: u16,
    headers: &http::HeaderMap,
) -> Result<(), String> {
    let expr =
        fanout_expr::Expr::compile(src, super::cases::PREDICATE_VARS).map_err(|e| e.to_string())?;
    let input = body.map_or(fanout_expr::Val::Null, fanout_expr::json::from_serde);
    let hs: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let hs = fanout_expr::json::from_serde(&serde_json::Value::Object(hs));
    let st = fanout_expr::json::from_serde(&serde_json::Value::from(status));
    let v = expr
        .eval(&input, |i| if i == 0 { st.clone() } else { hs.clone() })
        .map_err(|e| e.to_string())?;
    if fanout_expr::truthy(&v) {
        Ok(())
    } else {
        Err(format!("gave {}", fanout_expr::json::to_string(&v)))
    }
}

/// Match each expected call to a different received one (the first that matches, in the order
/// written); a failure for each that none matches.
fn check_calls(
    service: &str,
    want: &[ExpectedCall],
    got: &[fanout_stub::RecordedCall],
    fails: &mut Vec<String>,
) {
    let mut used = vec![false; got.len()];
    for (i, w) in want.iter().enumerate() {
        let mut nearest: Option<Vec<String>> = None;
        let mut found = false;
        for (j, g) in got.iter().enumerate() {
            if used[j] {
                continue;
            }
            let misses = call_misses(w, g);
            if misses.is_empty() {
                used[j] = true;
                found = true;
                break;
            }
            if nearest.as_ref().is_none_or(|n| misses.len() < n.len()) {
                nearest = Some(misses);
            }
        }
        if !found {
            let why = match nearest {
                Some(m) => format!("; the nearest: {}", m.join(", ")),
                None => String::new(),
            };
            let seen: Vec<String> = got
                .iter()
                .map(|g| match &g.query {
                    Some(q) => format!("{} {}?{q}", g.method, g.path),
                    None => format!("{} {}", g.method, g.path),
                })
                .collect();
            fails.push(format!(
                "calls to {service}: no call matches calls[{i}]{why}; received: [{}]",
                seen.join(", ")
            ));
        }
    }
}

/// How a received call differs from an expected one (empty: it matches).
fn call_misses(w: &ExpectedCall, g: &fanout_stub::RecordedCall) -> Vec<String> {
    let mut m = Vec::new();
    if let Some(method) = &w.method
        && !method.eq_ignore_ascii_case(&g.method)
    {
        m.push(format!("method {} (expected {method})", g.method));
    }
    if let Some(path) = &w.path
        && path != &g.path
    {
        m.push(format!("path {} (expected {path})", g.path));
    }
    if !w.query.is_empty() {
        let q = fanout_expr::request::parse_query(g.query.as_deref().unwrap_or(""));
        let text = fanout_expr::json::to_string(&fanout_expr::Val::obj(q));
        let actual: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let part = serde_json::Value::Object(w.query.clone().into_iter().collect());
        let mut misses = Vec::new();
        diff::includes(&part, &actual, &mut String::new(), &mut misses);
        m.extend(misses.into_iter().map(|x| format!("query {x}")));
    }
    for (k, v) in &w.headers {
        let found = g
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v);
        if found != Some(v) {
            m.push(format!(
                "header {k}: {} (expected {v:?})",
                found.map_or("none".to_string(), |f| format!("{f:?}"))
            ));
        }
    }
    if let Some(body) = &w.body {
        match serde_json::from_slice::<serde_json::Value>(&g.body) {
            Ok(b) if diff::json_eq(body, &b) => {}
            Ok(b) => m.push(format!(
                "body {} (expected {body})",
                diff::clip(&b.to_string(), 200)
            )),
            Err(_) => m.push(format!(
                "body {:?} (expected JSON {body})",
                diff::clip(&String::from_utf8_lossy(&g.body), 200)
            )),
        }
    }
    m
}
