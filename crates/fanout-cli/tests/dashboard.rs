//! The Grafana dashboard (deploy/grafana/fanout.json) queries only metrics that exist.
//!
//! - Every metric name in the dashboard's PromQL (`expr` of panels, `query` of variables) is in
//!   the metric catalog below, and every catalog metric is on the dashboard.
//! - `every_dashboard_metric_is_in_a_running_gateways_metrics` starts the `fanout` binary with an
//!   admin listener and scrapes `/metrics` before the gateway has served any request: every
//!   series the dashboard queries must be there already — each metric with every label set its
//!   config determines (routes, backends, steps, caches, datasets, error codes, outcome classes,
//!   admission classes and reasons …), request counters at zero, histograms with `_count`,
//!   `_sum` and their buckets — so no panel or alert shows "no data" on a fresh gateway. It then
//!   sends a few requests, scrapes again and requires every name the dashboard queries to be in
//!   that output (as a sample or a `# TYPE` line).
//!
//! The helm chart's copy (deploy/helm/fanout/dashboards/fanout.json) must be the same file; both
//! are written by deploy/grafana/generate.py.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_testkit::repo_root as root;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The metric catalog: the names the metrics work exposes and the dashboard may query
/// (histograms by their base name; `_bucket`/`_sum`/`_count` are stripped before comparing).
const CATALOG: &[&str] = &[
    "fanout_tls_certificate_expiry_timestamp_seconds",
    "fanout_tls_reloads_total",
    "fanout_tls_handshake_failures_total",
    "fanout_compressed_answers_total",
    "fanout_compressed_answer_bytes_before_total",
    "fanout_compressed_answer_bytes_after_total",
    "fanout_compression_skipped_total",
    "fanout_decoded_request_bodies_total",
    "fanout_encoded_request_bodies_refused_total",
    "fanout_requests_total",
    "fanout_request_duration_seconds",
    "fanout_requests_in_flight",
    "fanout_partial_responses_total",
    "fanout_requests_coalesced_total",
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
    "fanout_db_up",
    "fanout_db_pool_max_connections",
    "fanout_db_pool_connections",
    "fanout_db_pool_waiting",
    "fanout_db_pool_wait_seconds",
    "fanout_db_pool_rejections_total",
    "fanout_db_cancellations_total",
    "fanout_db_rows_total",
    "fanout_db_errors_total",
    "fanout_db_step_rows_total",
    "fanout_db_step_errors_total",
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
    "fanout_model_rows_total",
    "fanout_model_batches_total",
    "fanout_model_batch_rows",
    "fanout_model_queue_seconds",
    "fanout_model_compute_seconds",
    "fanout_model_pending_rows",
    "fanout_model_dropped_rows_total",
    "fanout_model_loads_total",
    "fanout_model_version_age_seconds",
    "fanout_compute_queue_length",
    "fanout_compute_run_seconds",
    "fanout_runtime_stalls_total",
    "fanout_config_reloads_total",
    "fanout_config_last_reload_success_timestamp_seconds",
    "fanout_pass_bytes_total",
    "fanout_pass_cut_total",
    "fanout_sse_streams_open",
    "fanout_sse_events_total",
    "fanout_sse_heartbeats_total",
    "fanout_sse_streams_ended_total",
    "fanout_websockets_open",
    "fanout_websocket_open",
    "fanout_websocket_messages_total",
    "fanout_websocket_bytes_total",
    "fanout_websocket_closes_total",
    "fanout_websocket_refused_total",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_threads",
    "process_open_fds",
    "process_start_time_seconds",
];

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

/// One sample line of the text exposition: (name, labels, value); `None` for other lines.
fn parse_sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices();
        let end = loop {
            let (start, c) = chars.next()?;
            match c {
                '}' => break start + 1,
                ',' => continue,
                _ => {}
            }
            let eq = start + r[start..].find("=\"")?;
            let key = r[start..eq].to_string();
            while chars.next()?.0 < eq + 1 {}
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '\\' => value.push(chars.next()?.1),
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key, value);
        };
        rest = &r[end..];
    }
    let value = match rest.trim() {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}

/// Label sets: each a list of (name, value).
type LabelSets = Vec<Vec<(&'static str, String)>>;

/// Every combination of the given values of each label, in order.
fn product(dims: &[(&'static str, &[&str])]) -> LabelSets {
    let mut out: LabelSets = vec![vec![]];
    for (label, values) in dims {
        out = out
            .into_iter()
            .flat_map(|set| {
                values.iter().map(move |v| {
                    let mut set = set.clone();
                    set.push((*label, v.to_string()));
                    set
                })
            })
            .collect();
    }
    out
}

/// The config of the running-gateway test: a cache, a batch form, a reference dataset, a
/// backend with every resilience layer and one with none, a `fail` guard and `on_status`
/// answers — every family has label values the config determines.
const CONFIG: &str = r#"
backends:
  down:
    url: "http://127.0.0.1:9"
    timeout: 200ms
    cache: { ttl: 1s }
    retry: {}
    hedge: { delay: 50ms }
    breaker: {}
    batch: { path: '"/items"', query: { ids: '$keys | join(",")' }, split: . }
  plain:
    url: "http://127.0.0.1:1"
    timeout: 200ms
  # A database nobody listens for: its pool's series exist from the start all the same.
  db:
    protocol: postgres
    url: "postgres://postgres@127.0.0.1:1/postgres"
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
  - path: /orders
    method: POST
    flow:
      check: { when: '$request.body.id == null', fail: { status: 400, code: missing_id } }
      save:
        http: { backend: plain, method: POST, path: '"/orders"', body: '$request.body' }
        on_status: { 409: 409, 410: { status: 404, code: order_archived } }
    respond: { body: '$save' }
  - path: /db
    flow:
      row: { sql: { backend: db, mode: one, query: "SELECT 1 AS n" } }
    respond: { body: '$row' }
  - path: /files/{*rest}
    pass: { backend: plain }
  - path: /chat
    websocket: { backend: plain }
  - path: /model
    flow:
      m: { model: { name: spam_lr, input: '[range(20)]' } }
    respond: { body: '$m' }
models: { dir: "${MODELS_DIR}" }
compression:
  response: { enabled: true }
  request: { decode: [gzip] }
"#;

/// The series a gateway running [`CONFIG`] has before it serves any request, by metric: every
/// label set the config determines. Every metric the dashboard queries has an entry (the test
/// checks it), so a new panel brings its expectation here.
fn config_series() -> BTreeMap<&'static str, LabelSets> {
    const CLASSES: &[&str] = &["1xx", "2xx", "3xx", "4xx", "5xx"];
    const UNMATCHED_METHODS: &[&str] = &[
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other",
    ];
    const OUTCOMES: &[&str] = &[
        "ok",
        "timeout",
        "refused",
        "reset",
        "bad_answer",
        "status_4xx",
        "status_5xx",
        "rejected_bulkhead",
        "rejected_breaker",
        "invalid_call",
        "other",
        "rejected_pool",
    ];
    const BACKENDS: &[&str] = &["down", "plain"];
    // Every model of the directory has its series, used by a step or not.
    const MODELS: &[&str] = &["spam_gbdt", "spam_lr", "topic_mlp"];
    const SQL_CLASSES: &[&str] = &[
        "data_exception",
        "integrity_constraint_violation",
        "transaction_rollback",
        "syntax_error_or_access_rule_violation",
        "insufficient_resources",
        "object_not_in_prerequisite_state",
        "operator_intervention",
        "connection_exception",
        "other",
    ];
    const ADMISSION: &[&str] = &["critical", "normal", "sheddable"];
    // A selection of the gateway's and the flow's codes, and every code of the config.
    const CODES: &[&str] = &[
        "backend_timeout",
        "backend_unavailable",
        "backend_status",
        "backend_rejected",
        "deadline_exceeded",
        "not_found",
        "method_not_allowed",
        "overloaded",
        "invalid_json",
        "body_too_large",
        "internal_error",
        "missing_id",
        "conflict",
        "order_archived",
    ];
    let routes = [
        ("/hello", "GET"),
        ("/down/{id}", "GET"),
        ("/orders", "POST"),
        ("/db", "GET"),
    ];
    let route_methods: LabelSets = routes
        .iter()
        .map(|(r, m)| vec![("route", r.to_string()), ("method", m.to_string())])
        .chain(product(&[
            ("route", &["unmatched"]),
            ("method", UNMATCHED_METHODS),
        ]))
        .collect();
    let requests: LabelSets = route_methods
        .iter()
        .flat_map(|rm| {
            CLASSES.iter().map(move |c| {
                let mut l = rm.clone();
                l.push(("status_class", c.to_string()));
                l
            })
        })
        .collect();
    let route_names: Vec<&str> = routes.iter().map(|(r, _)| *r).collect();
    let coalescing: Vec<&str> = route_names
        .iter()
        .copied()
        .filter(|r| *r != "/orders")
        .collect();
    let steps: LabelSets = [
        ("down", "one"),
        ("down", "many"),
        ("plain", "save"),
        ("db", "row"),
    ]
    .iter()
    .map(|(b, s)| vec![("backend", b.to_string()), ("step", s.to_string())])
    .collect();
    let calls: LabelSets = steps
        .iter()
        .flat_map(|bs| {
            OUTCOMES.iter().map(move |o| {
                let mut l = bs.clone();
                l.push(("outcome", o.to_string()));
                l
            })
        })
        .collect();
    let addresses = vec![
        vec![
            ("backend", "down".to_string()),
            ("address", "http://127.0.0.1:9".to_string()),
        ],
        vec![
            ("backend", "plain".to_string()),
            ("address", "http://127.0.0.1:1".to_string()),
        ],
    ];
    let none = || vec![vec![]];
    const CODINGS: &[&str] = &["zstd", "br", "gzip"];
    const DIRECTIONS: &[&str] = &["in", "out"];
    const PASS_ROUTE: [(&str, &[&str]); 2] = [("route", &["/files/{*rest}"]), ("method", &["GET"])];
    const WS_ROUTE: (&str, &[&str]) = ("route", &["/chat"]);
    BTreeMap::from([
        // The config's listeners speak plain HTTP (the test's client does): the TLS families are
        // there without series (a TLS listener's series: the `tls_listener::` tests).
        ("fanout_tls_certificate_expiry_timestamp_seconds", vec![]),
        ("fanout_tls_reloads_total", vec![]),
        ("fanout_tls_handshake_failures_total", vec![]),
        (
            "fanout_compressed_answers_total",
            product(&[("coding", CODINGS)]),
        ),
        (
            "fanout_compressed_answer_bytes_before_total",
            product(&[("coding", CODINGS)]),
        ),
        (
            "fanout_compressed_answer_bytes_after_total",
            product(&[("coding", CODINGS)]),
        ),
        ("fanout_compression_skipped_total", none()),
        (
            "fanout_decoded_request_bodies_total",
            product(&[("coding", CODINGS)]),
        ),
        ("fanout_encoded_request_bodies_refused_total", none()),
        ("fanout_requests_total", requests),
        ("fanout_request_duration_seconds", route_methods),
        (
            "fanout_requests_in_flight",
            product(&[("route", &route_names)]),
        ),
        (
            "fanout_partial_responses_total",
            product(&[("route", &route_names)]),
        ),
        // Routes that coalesce: all but `/orders`, whose `save` step POSTs.
        (
            "fanout_requests_coalesced_total",
            product(&[("route", &coalescing)]),
        ),
        ("fanout_errors_total", product(&[("code", CODES)])),
        ("fanout_backend_calls_total", calls),
        ("fanout_backend_call_duration_seconds", steps),
        (
            "fanout_backend_in_flight",
            product(&[("backend", BACKENDS)]),
        ),
        ("fanout_backend_address_up", addresses.clone()),
        ("fanout_outlier_ejections_total", addresses),
        ("fanout_breaker_state", product(&[("backend", BACKENDS)])),
        ("fanout_retries_total", product(&[("backend", BACKENDS)])),
        (
            "fanout_retry_budget_refusals_total",
            product(&[("backend", BACKENDS)]),
        ),
        ("fanout_hedges_total", product(&[("backend", BACKENDS)])),
        ("fanout_hedges_won_total", product(&[("backend", BACKENDS)])),
        (
            "fanout_dedup_saved_calls_total",
            product(&[("backend", BACKENDS)]),
        ),
        ("fanout_db_up", product(&[("backend", &["db"])])),
        (
            "fanout_db_pool_max_connections",
            product(&[("backend", &["db"])]),
        ),
        (
            "fanout_db_pool_connections",
            product(&[("backend", &["db"]), ("state", &["idle", "in_use"])]),
        ),
        ("fanout_db_pool_waiting", product(&[("backend", &["db"])])),
        (
            "fanout_db_pool_wait_seconds",
            product(&[("backend", &["db"])]),
        ),
        (
            "fanout_db_pool_rejections_total",
            product(&[("backend", &["db"]), ("reason", &["full", "wait"])]),
        ),
        (
            "fanout_db_cancellations_total",
            product(&[("backend", &["db"])]),
        ),
        ("fanout_db_rows_total", product(&[("backend", &["db"])])),
        (
            "fanout_db_step_rows_total",
            product(&[("backend", &["db"]), ("step", &["row"])]),
        ),
        (
            "fanout_db_step_errors_total",
            product(&[
                ("backend", &["db"]),
                ("step", &["row"]),
                ("class", SQL_CLASSES),
            ]),
        ),
        (
            "fanout_db_errors_total",
            product(&[("backend", &["db"]), ("class", SQL_CLASSES)]),
        ),
        ("fanout_admission_limit", product(&[("class", ADMISSION)])),
        (
            "fanout_admission_in_flight",
            product(&[("class", ADMISSION)]),
        ),
        (
            "fanout_admission_queue_length",
            product(&[("class", ADMISSION)]),
        ),
        (
            "fanout_admission_rejections_total",
            product(&[
                ("class", ADMISSION),
                (
                    "reason",
                    &[
                        "queue_full",
                        "evicted",
                        "queue_timeout",
                        "codel",
                        "expected_wait",
                    ],
                ),
            ]),
        ),
        ("fanout_connections_open", none()),
        ("fanout_connections_refused_total", none()),
        (
            "fanout_cache_requests_total",
            product(&[
                ("cache", &["down", "down:keys"]),
                ("result", &["hit", "miss", "stale"]),
            ]),
        ),
        (
            "fanout_cache_entries",
            product(&[("cache", &["down", "down:keys"])]),
        ),
        (
            "fanout_cache_l2_requests_total",
            product(&[
                ("cache", &["down"]),
                ("result", &["hit", "miss", "error", "skipped"]),
            ]),
        ),
        ("fanout_batch_size", product(&[("backend", &["down"])])),
        (
            "fanout_batch_saved_calls_total",
            product(&[("backend", &["down"])]),
        ),
        (
            "fanout_reference_age_seconds",
            product(&[("dataset", &["masks"])]),
        ),
        (
            "fanout_reference_loads_total",
            product(&[("dataset", &["masks"]), ("result", &["ok", "error"])]),
        ),
        ("fanout_model_rows_total", product(&[("model", MODELS)])),
        ("fanout_model_batches_total", product(&[("model", MODELS)])),
        ("fanout_model_batch_rows", product(&[("model", MODELS)])),
        ("fanout_model_queue_seconds", product(&[("model", MODELS)])),
        (
            "fanout_model_compute_seconds",
            product(&[("model", MODELS)]),
        ),
        ("fanout_model_pending_rows", product(&[("model", MODELS)])),
        (
            "fanout_model_dropped_rows_total",
            product(&[
                ("model", MODELS),
                ("reason", &["queue_full", "expired", "failed"]),
            ]),
        ),
        (
            "fanout_model_loads_total",
            product(&[("model", MODELS), ("result", &["ok", "error"])]),
        ),
        (
            "fanout_model_version_age_seconds",
            product(&[("model", MODELS)]),
        ),
        ("fanout_compute_queue_length", none()),
        ("fanout_compute_run_seconds", none()),
        ("fanout_runtime_stalls_total", none()),
        (
            "fanout_config_reloads_total",
            product(&[("result", &["ok", "error"])]),
        ),
        (
            "fanout_config_last_reload_success_timestamp_seconds",
            none(),
        ),
        // A pass-through route and a WebSocket route: their families have every series of
        // every route from the start.
        (
            "fanout_pass_bytes_total",
            product(&[PASS_ROUTE[0], PASS_ROUTE[1], ("direction", DIRECTIONS)]),
        ),
        (
            "fanout_pass_cut_total",
            product(&[
                PASS_ROUTE[0],
                PASS_ROUTE[1],
                (
                    "reason",
                    &[
                        "timeout",
                        "idle_timeout",
                        "body_too_large",
                        "client_broke",
                        "backend_broke",
                    ],
                ),
            ]),
        ),
        ("fanout_sse_streams_open", product(&PASS_ROUTE)),
        ("fanout_sse_events_total", product(&PASS_ROUTE)),
        ("fanout_sse_heartbeats_total", product(&PASS_ROUTE)),
        (
            "fanout_sse_streams_ended_total",
            product(&[
                PASS_ROUTE[0],
                PASS_ROUTE[1],
                (
                    "cause",
                    &[
                        "client_left",
                        "backend_ended",
                        "idle",
                        "timeout",
                        "drain",
                        "error",
                    ],
                ),
            ]),
        ),
        ("fanout_websockets_open", none()),
        ("fanout_websocket_open", product(&[WS_ROUTE])),
        (
            "fanout_websocket_messages_total",
            product(&[WS_ROUTE, ("direction", DIRECTIONS)]),
        ),
        (
            "fanout_websocket_bytes_total",
            product(&[WS_ROUTE, ("direction", DIRECTIONS)]),
        ),
        (
            "fanout_websocket_closes_total",
            product(&[
                WS_ROUTE,
                ("by", &["client", "backend", "gateway"]),
                ("code", &["1000", "1001", "1006", "1009"]),
            ]),
        ),
        (
            "fanout_websocket_refused_total",
            product(&[
                WS_ROUTE,
                (
                    "reason",
                    &["origin", "route_limit", "draining", "backend_timeout"],
                ),
            ]),
        ),
        ("process_cpu_seconds_total", none()),
        ("process_resident_memory_bytes", none()),
        ("process_threads", none()),
        ("process_open_fds", none()),
        ("process_start_time_seconds", none()),
    ])
}

/// The metrics that count served requests: zero on a gateway that has served none.
const REQUEST_COUNTS: &[&str] = &[
    "fanout_requests_total",
    "fanout_request_duration_seconds_count",
    "fanout_request_duration_seconds_sum",
    "fanout_requests_in_flight",
    "fanout_partial_responses_total",
    "fanout_requests_coalesced_total",
    "fanout_errors_total",
    "fanout_backend_calls_total",
    "fanout_backend_call_duration_seconds_count",
    "fanout_backend_call_duration_seconds_bucket",
    "fanout_request_duration_seconds_bucket",
];

/// What of [`config_series`] `text` (a scrape before any request) lacks or has wrong: one line
/// per problem. Histograms (`# TYPE … histogram`) are checked as their `_count`, `_sum` and
/// `le="+Inf"` bucket.
fn series_problems(text: &str) -> Vec<String> {
    let histograms: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .collect();
    let samples: BTreeMap<(String, BTreeMap<String, String>), f64> = text
        .lines()
        .filter_map(parse_sample)
        .map(|(n, l, v)| ((n, l), v))
        .collect();
    let mut problems = Vec::new();
    for (metric, sets) in config_series() {
        let names: Vec<(String, Option<&str>)> = if histograms.contains(metric) {
            vec![
                (format!("{metric}_count"), None),
                (format!("{metric}_sum"), None),
                (format!("{metric}_bucket"), Some("+Inf")),
            ]
        } else {
            vec![(metric.to_string(), None)]
        };
        for set in &sets {
            for (name, le) in &names {
                let mut labels: BTreeMap<String, String> = set
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect();
                if let Some(le) = le {
                    labels.insert("le".into(), le.to_string());
                }
                match samples.get(&(name.clone(), labels.clone())) {
                    None => problems.push(format!("missing {name}{labels:?}")),
                    Some(v) if REQUEST_COUNTS.contains(&name.as_str()) && *v != 0.0 => {
                        problems.push(format!("{name}{labels:?} is {v}, not 0"))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    problems
}

#[test]
fn samples_are_parsed_with_their_labels() {
    let (name, labels, value) =
        parse_sample(r#"fanout_cache_requests_total{cache="a:keys",result="hit"} 3"#).unwrap();
    assert_eq!(name, "fanout_cache_requests_total");
    assert_eq!(labels["cache"], "a:keys");
    assert_eq!(labels["result"], "hit");
    assert_eq!(value, 3.0);
    let (_, labels, value) =
        parse_sample(r#"x_bucket{le="+Inf",route="/a/{id}",q="say \"hi\""} 0"#).unwrap();
    assert_eq!(labels["route"], "/a/{id}");
    assert_eq!(labels["q"], "say \"hi\"");
    assert_eq!(value, 0.0);
    assert_eq!(parse_sample("process_threads 12.0").unwrap().2, 12.0);
    assert!(parse_sample("# TYPE x counter").is_none());
}

#[tokio::test]
async fn every_dashboard_metric_is_in_a_running_gateways_metrics() {
    // Every metric the dashboard queries has its expected series (and nothing else does).
    let expected: BTreeSet<String> = config_series().keys().map(|k| k.to_string()).collect();
    assert_eq!(
        expected,
        dashboard_metrics(&dashboard()),
        "config_series() and the dashboard's metrics differ"
    );
    let gw = support::ServeProcess::start(
        "dashboard",
        CONFIG,
        &[],
        &[("MODELS_DIR", root().join("examples/antispam/models"))],
    )
    .await;
    let (port, admin) = (gw.port, gw.admin);
    fanout_testkit::wait_until("the admin listener answers /metrics", || {
        http_get(admin, "/metrics").is_some_and(|(status, _)| status.contains(" 200"))
    })
    .await;
    // Before any request: every series the config determines is there, request counts at 0.
    let (_, fresh) = http_get(admin, "/metrics").unwrap();
    let problems = series_problems(&fresh);
    assert!(
        problems.is_empty(),
        "a gateway that has served nothing lacks series the dashboard queries:\n{}\n--- /metrics\n{fresh}",
        problems.join("\n")
    );
    for path in ["/hello", "/down/1", "/nowhere"] {
        let answered = http_get(port, path);
        assert!(answered.is_some(), "{path} was not answered");
    }
    let (_, text) = http_get(admin, "/metrics").unwrap();
    let exposed = exposed_metrics(&text);
    let missing = missing_from(&dashboard_metrics(&dashboard()), &exposed);
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not have: {missing:?}\n--- /metrics\n{text}"
    );
}
