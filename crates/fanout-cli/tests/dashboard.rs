//! The Grafana dashboard (deploy/grafana/fanout.json) queries only metrics that exist.
//!
//! - Every metric name in the dashboard's PromQL (`expr` of panels, `query` of variables) is in
//!   the metric catalog below, and every catalog metric is on the dashboard.
//! - `every_dashboard_metric_is_in_a_running_gateways_metrics` starts the `fanout` binary with an
//!   admin listener, sends a few requests, scrapes `/metrics` and requires every name the
//!   dashboard queries to be in that output (as a sample or a `# TYPE` line).
//!
//! The helm chart's copy (deploy/helm/fanout/dashboards/fanout.json) must be the same file; both
//! are written by deploy/grafana/generate.py.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The metric catalog: the names the metrics work exposes and the dashboard may query
/// (histograms by their base name; `_bucket`/`_sum`/`_count` are stripped before comparing).
const CATALOG: &[&str] = &[
    "fanout_requests_total",
    "fanout_request_duration_seconds",
    "fanout_requests_in_flight",
    "fanout_partial_responses_total",
    "fanout_errors_total",
    "fanout_backend_calls_total",
    "fanout_backend_call_duration_seconds",
    "fanout_backend_in_flight",
    "fanout_backend_address_up",
    "fanout_outlier_ejections_total",
    "fanout_breaker_state",
    "fanout_retries_total",
    "fanout_retry_budget_refusals_total",
    "fanout_hedges_total",
    "fanout_hedges_won_total",
    "fanout_admission_limit",
    "fanout_admission_in_flight",
    "fanout_admission_queue_length",
    "fanout_admission_rejections_total",
    "fanout_connections_open",
    "fanout_connections_refused_total",
    "fanout_cache_requests_total",
    "fanout_cache_entries",
    "fanout_cache_l2_requests_total",
    "fanout_dedup_saved_calls_total",
    "fanout_batch_size",
    "fanout_batch_saved_calls_total",
    "fanout_reference_age_seconds",
    "fanout_reference_loads_total",
    "fanout_compute_queue_length",
    "fanout_compute_run_seconds",
    "fanout_runtime_stalls_total",
    "fanout_config_reloads_total",
    "fanout_config_last_reload_success_timestamp_seconds",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_threads",
    "process_open_fds",
    "process_start_time_seconds",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(root().join("deploy/grafana/fanout.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The metric names one PromQL expression reads: identifiers starting with `fanout_` or
/// `process_`, histogram series suffixes stripped.
fn metric_names_in(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let at_start = i == 0 || !ident(b[i - 1]);
        let prefix = ["fanout_", "process_"]
            .iter()
            .find(|p| expr[i..].starts_with(**p));
        if let (true, Some(_)) = (at_start, prefix) {
            let end = (i..b.len())
                .find(|&j| !(b[j].is_ascii_lowercase() || b[j].is_ascii_digit() || b[j] == b'_'))
                .unwrap_or(b.len());
            out.push(strip_series_suffix(&expr[i..end]).to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// `x_bucket`, `x_sum`, `x_count` → `x` (the histogram's name).
fn strip_series_suffix(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// Every metric name the dashboard's queries read (panel targets and variable queries).
fn dashboard_metrics(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk(v, &mut |key, s| {
        if matches!(key, "expr" | "query" | "definition") {
            out.extend(metric_names_in(s));
        }
    });
    out
}

fn walk(v: &Value, f: &mut dyn FnMut(&str, &str)) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match x {
                    Value::String(s) => f(k, s),
                    other => walk(other, f),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
        _ => {}
    }
}

/// The names a Prometheus or OpenMetrics text exposition has: `# TYPE` names (a counter also
/// under its `_total` name, as OpenMetrics drops the suffix there) and sample names (histogram
/// series suffixes stripped).
fn exposed_metrics(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                out.insert(name.to_string());
                if kind == "counter" && !name.ends_with("_total") {
                    out.insert(format!("{name}_total"));
                }
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.insert(strip_series_suffix(&name).to_string());
            out.insert(name);
        }
    }
    out
}

/// Names the dashboard queries that `exposed` lacks.
fn missing_from(dashboard: &BTreeSet<String>, exposed: &BTreeSet<String>) -> Vec<String> {
    dashboard.difference(exposed).cloned().collect()
}

#[test]
fn names_are_read_from_promql() {
    let expr = r#"histogram_quantile(0.99, sum by (le, route) (rate(fanout_request_duration_seconds_bucket{job=~"$job", route=~"fanout_not_a_metric"}[5m]))) / on() group_left process_open_fds + my_fanout_thing"#;
    assert_eq!(
        metric_names_in(expr),
        [
            "fanout_request_duration_seconds",
            "fanout_not_a_metric",
            "process_open_fds"
        ]
    );
    assert_eq!(
        metric_names_in("time() - process_start_time_seconds{instance=~\"$instance\"}"),
        ["process_start_time_seconds"]
    );
    assert_eq!(
        metric_names_in("label_values(fanout_requests_total{job=~\"$job\"}, route)"),
        ["fanout_requests_total"]
    );
}

#[test]
fn exposition_names_cover_types_samples_and_openmetrics_counters() {
    let text = "\
# HELP fanout_requests Requests.
# TYPE fanout_requests counter
fanout_requests_total{route=\"/a\",method=\"GET\",status_class=\"2xx\"} 3
# TYPE fanout_request_duration_seconds histogram
fanout_request_duration_seconds_bucket{route=\"/a\",method=\"GET\",le=\"0.005\"} 1
fanout_request_duration_seconds_sum{route=\"/a\",method=\"GET\"} 0.01
# TYPE fanout_hedges_total counter
# TYPE process_threads gauge
process_threads 12
# EOF
";
    let exposed = exposed_metrics(text);
    let wanted: BTreeSet<String> = [
        "fanout_requests_total",
        "fanout_request_duration_seconds",
        "fanout_hedges_total",
        "process_threads",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert!(missing_from(&wanted, &exposed).is_empty());
    let more: BTreeSet<String> = ["fanout_breaker_state".to_string()].into();
    assert_eq!(missing_from(&more, &exposed), ["fanout_breaker_state"]);
}

#[test]
fn the_dashboard_queries_exactly_the_catalog() {
    let used = dashboard_metrics(&dashboard());
    let catalog: BTreeSet<String> = CATALOG.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<_> = used.difference(&catalog).collect();
    assert!(unknown.is_empty(), "not in the metric catalog: {unknown:?}");
    let unused: Vec<_> = catalog.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "catalog metrics without a panel: {unused:?}"
    );
}

#[test]
fn the_dashboard_uses_the_prometheus_input_and_the_charts_copy_is_identical() {
    let d = dashboard();
    assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS");
    let mut datasources = BTreeSet::new();
    walk(&d, &mut |key, s| {
        if key == "uid" && s.starts_with("${") {
            datasources.insert(s.to_string());
        }
    });
    assert_eq!(
        datasources,
        BTreeSet::from(["${DS_PROMETHEUS}".to_string()])
    );
    let a = std::fs::read(root().join("deploy/grafana/fanout.json")).unwrap();
    let b = std::fs::read(root().join("deploy/helm/fanout/dashboards/fanout.json")).unwrap();
    assert!(a == b, "run python3 deploy/grafana/generate.py");
}

/// The ports of the client and admin listeners, from the `fanout serving` JSON log line.
fn serving_ports(log: &str) -> Option<(u16, u16)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "fanout serving")
        .and_then(|v| {
            let port = |k: &str| -> Option<u16> {
                let addr: std::net::SocketAddr = v["fields"][k].as_str()?.parse().ok()?;
                Some(addr.port())
            };
            Some((port("addr")?, port("admin")?))
        })
}

/// One HTTP/1.0 GET (no chunked encoding): the status line and the body, or `None` if the
/// server is not there (yet).
fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn every_dashboard_metric_is_in_a_running_gateways_metrics() {
    // A cache, a batch form, a reference dataset and a call that fails: every family has a
    // reason to be registered, most have samples.
    let config = r#"
backends:
  down:
    url: "http://127.0.0.1:9"
    timeout: 200ms
    cache: { ttl: 1s }
    retry: {}
    hedge: { delay: 50ms }
    breaker: {}
    batch: { path: '"/items"', query: { ids: '$keys | join(",")' }, split: . }
reference:
  masks:
    http: { backend: down, path: '"/masks"' }
    optional: true
routes:
  - path: /hello
    respond: { body: '{hello: 1}' }
  - path: /down/{id}
    flow:
      one: { http: { backend: down, path: '"/x/\($request.params.id)"' } }
      many: { for_each: '[1, 2]', http: { backend: down, key: '$item' } }
    respond: { body: '[$one, $many]' }
"#;
    let dir = std::env::temp_dir().join(format!("fanout-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fanout.yaml");
    std::fs::write(&file, config).unwrap();
    let log = dir.join("stderr.log");
    let mut gw = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
            .args(["--admin-listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    // Both listeners bind port 0; their addresses are in the `fanout serving` log line.
    let mut ports = None;
    fanout_testkit::wait_until("the gateway to log its addresses", || {
        if let Ok(Some(status)) = gw.0.try_wait() {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("fanout serve exited ({status}):\n{err}");
        }
        ports = serving_ports(&std::fs::read_to_string(&log).unwrap_or_default());
        ports.is_some()
    })
    .await;
    let (port, admin) = ports.unwrap();
    fanout_testkit::wait_until("the admin listener answers /metrics", || {
        http_get(admin, "/metrics").is_some_and(|(status, _)| status.contains(" 200"))
    })
    .await;
    for path in ["/hello", "/down/1", "/nowhere"] {
        let answered = http_get(port, path);
        assert!(answered.is_some(), "{path} was not answered");
    }
    let (_, text) = http_get(admin, "/metrics").unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let exposed = exposed_metrics(&text);
    let missing = missing_from(&dashboard_metrics(&dashboard()), &exposed);
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not have: {missing:?}\n--- /metrics\n{text}"
    );
}
