//! The admin listener: `/metrics` after real traffic through stubs (requests, backend calls by
//! outcome, caches, batches, errors), bounded labels, metrics off, the text format, the metric
//! reference (docs/operations.md#metrics) against the real output, series that follow config
//! reloads (the new ones at zero, the removed ones gone), `/healthz` and `/readyz`.

use crate::support::{config, gateway, stub_vars};
use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

/// One sample of the text format.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed `/metrics` answer: each family's type, and every sample.
#[derive(Debug)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
    text: String,
}

/// `name{a="x",b="y"} value` (label values with `\\`, `\"`, `\n` escapes); `None` if the line
/// is not a valid sample.
fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let end = loop {
            let (start, c) = *chars.peek()?;
            if c == '}' {
                break start + 1;
            }
            let eq = r[start..].find('=')? + start;
            let key = &r[start..eq];
            if !valid_label_name(key) {
                return None;
            }
            while chars.peek()?.0 <= eq {
                chars.next();
            }
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        _ => return None,
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key.to_string(), value);
            match chars.peek()?.1 {
                ',' => {
                    chars.next();
                }
                '}' => {}
                _ => return None,
            }
        };
        rest = &r[end..];
    }
    let value: f64 = match rest.strip_prefix(' ')?.trim() {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn valid_metric_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Scrape {
    /// Parse, panicking on any line that is not valid.
    fn parse(text: &str) -> Scrape {
        let mut types = BTreeMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let (name, ty) = t.split_once(' ').expect("# TYPE name type");
                assert!(valid_metric_name(name), "bad family name: {line}");
                assert!(
                    types.insert(name.to_string(), ty.to_string()).is_none(),
                    "family declared twice: {name}"
                );
            } else if line.starts_with("# HELP ") || line == "# EOF" {
            } else {
                let s = parse_sample(line).unwrap_or_else(|| panic!("invalid sample line: {line}"));
                assert!(valid_metric_name(&s.name), "bad metric name: {line}");
                samples.push(s);
            }
        }
        Scrape {
            types,
            samples,
            text: text.to_string(),
        }
    }

    /// The value of the one sample `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        match found.as_slice() {
            [one] => one.value,
            [] => panic!("no sample {name}{labels:?} in:\n{}", self.text),
            many => panic!("{} samples {name}{labels:?}: {many:?}", many.len()),
        }
    }

    fn samples_of(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// The names a reader uses: a counter family `x` is `x_total`, others their family name.
    fn metric_names(&self) -> BTreeSet<String> {
        self.types
            .iter()
            .map(|(name, ty)| match ty.as_str() {
                "counter" => format!("{name}_total"),
                _ => name.clone(),
            })
            .collect()
    }
}

async fn scrape(admin: Option<SocketAddr>) -> Scrape {
    let admin = admin.expect("the admin listener runs");
    let r = get(&format!("http://{admin}/metrics")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = r.text();
    assert!(text.ends_with("# EOF\n"), "no # EOF at the end");
    Scrape::parse(&text)
}

const STUBS: &str = r#"
services:
  api:
    listen: "${API_ADDR}"
    routes:
      - { path: "/ok/{id}", body: '{id: $request.params.id}' }
      - { path: /fail, status: 500, body: '{error: "internal"}' }
      - { path: /slow, latency: 10s, body: '{late: true}' }
      - { path: /conf, body: '{conf: true}' }
      - path: /attrs
        body: '$request.query.ids | split(",") | map({key: ., value: "v-\(.)"}) | from_entries'
"#;

const GATEWAY: &str = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
  bad: { url: "http://${API_ADDR}" }
  slow: { url: "http://${API_ADDR}", timeout: 200ms }
  cached: { url: "http://${API_ADDR}", cache: { ttl: 1h } }
  attrs:
    url: "http://${API_ADDR}"
    batch:
      path: '"/attrs"'
      query: { ids: '$keys | join(",")' }
      split: '.'
routes:
  - path: /ok/{id}
    flow:
      a: { http: { backend: api, path: '"/ok/\($request.params.id)"' } }
    respond: { body: '$a' }
  - path: /fail
    flow:
      f: { http: { backend: bad, path: '"/fail"' } }
    respond: { body: '$f' }
  - path: /slow
    flow:
      s: { http: { backend: slow, path: '"/slow"' } }
    respond: { body: '$s' }
  - path: /partial
    flow:
      ok: { http: { backend: api, path: '"/ok/1"' } }
      maybe: { optional: true, default: null, http: { backend: bad, path: '"/fail"' } }
    respond: { body: '{ok: $ok, maybe: $maybe}' }
  - path: /conf
    flow:
      c: { http: { backend: cached, path: '"/conf"' } }
    respond: { body: '$c' }
  - path: /items
    method: POST
    flow:
      v: { for_each: '$request.body', http: { backend: attrs, key: '$item' } }
    respond: { body: '$v' }
  - path: /x/{id}
    respond: { body: '$request.params.id' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_is_counted_by_route_step_and_outcome() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let base = format!("http://{}", gw.addr);
    for i in 0..3 {
        assert_eq!(get(&format!("{base}/ok/{i}")).await.status, 200);
    }
    assert_eq!(get(&format!("{base}/fail")).await.status, 502);
    assert_eq!(get(&format!("{base}/slow")).await.status, 504);
    assert_eq!(get(&format!("{base}/partial")).await.status, 200);
    for _ in 0..2 {
        assert_eq!(get(&format!("{base}/conf")).await.status, 200);
    }
    let items = post(&format!("{base}/items"), r#"["a","b","c"]"#).await;
    assert_eq!(items.json(), serde_json::json!(["v-a", "v-b", "v-c"]));
    assert_eq!(get(&format!("{base}/nothing/here")).await.status, 404);

    let m = scrape(gw.admin_addr).await;
    let req = |route, method, class| {
        m.value(
            "fanout_requests_total",
            &[
                ("route", route),
                ("method", method),
                ("status_class", class),
            ],
        )
    };
    assert_eq!(req("/ok/{id}", "GET", "2xx"), 3.0);
    assert_eq!(req("/ok/{id}", "GET", "5xx"), 0.0);
    assert_eq!(req("/fail", "GET", "5xx"), 1.0);
    assert_eq!(req("/slow", "GET", "5xx"), 1.0);
    assert_eq!(req("/items", "POST", "2xx"), 1.0);
    assert_eq!(req("unmatched", "GET", "4xx"), 1.0);
    let dur = |suffix: &str, extra: &[(&str, &str)]| {
        let mut l = vec![("route", "/ok/{id}"), ("method", "GET")];
        l.extend_from_slice(extra);
        m.value(&format!("fanout_request_duration_seconds{suffix}"), &l)
    };
    assert_eq!(dur("_count", &[]), 3.0);
    assert_eq!(dur("_bucket", &[("le", "+Inf")]), 3.0);
    assert!(dur("_sum", &[]) > 0.0);
    assert_eq!(
        m.value("fanout_requests_in_flight", &[("route", "/ok/{id}")]),
        0.0
    );
    assert_eq!(
        m.value("fanout_partial_responses_total", &[("route", "/partial")]),
        1.0
    );

    let calls = |backend, step, outcome| {
        m.value(
            "fanout_backend_calls_total",
            &[("backend", backend), ("step", step), ("outcome", outcome)],
        )
    };
    assert_eq!(calls("api", "a", "ok"), 3.0);
    assert_eq!(calls("bad", "f", "status_5xx"), 1.0);
    assert_eq!(calls("bad", "maybe", "status_5xx"), 1.0);
    assert_eq!(calls("slow", "s", "timeout"), 1.0);
    assert_eq!(calls("cached", "c", "ok"), 2.0);
    assert_eq!(
        calls("attrs", "v", "ok"),
        1.0,
        "one batch fetch for the step"
    );
    assert_eq!(
        m.value(
            "fanout_backend_call_duration_seconds_count",
            &[("backend", "api"), ("step", "a")]
        ),
        3.0
    );

    let cache = |result| {
        m.value(
            "fanout_cache_requests_total",
            &[("cache", "cached"), ("result", result)],
        )
    };
    assert_eq!(
        (cache("hit"), cache("miss"), cache("stale")),
        (1.0, 1.0, 0.0)
    );
    assert_eq!(m.value("fanout_cache_entries", &[("cache", "cached")]), 1.0);
    let batch = |name: &str| m.value(name, &[("backend", "attrs")]);
    assert_eq!(batch("fanout_batch_size_count"), 1.0);
    assert_eq!(batch("fanout_batch_size_sum"), 3.0);
    assert_eq!(
        batch("fanout_batch_saved_calls_total"),
        2.0,
        "3 keys, 1 call"
    );

    let errors = |code| m.value("fanout_errors_total", &[("code", code)]);
    assert_eq!(errors("backend_status"), 1.0);
    assert_eq!(errors("backend_timeout"), 1.0);
    assert_eq!(errors("not_found"), 1.0);
    assert!(m.value("process_resident_memory_bytes", &[]) > 0.0);
    assert!(m.value("process_open_fds", &[]) > 0.0);
    assert_eq!(
        m.value("fanout_backend_address_up", &[("backend", "api")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_paths_never_become_labels() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let base = format!("http://{}", gw.addr);
    for chunk in (0..1000).collect::<Vec<u32>>().chunks(50) {
        let urls: Vec<String> = chunk.iter().map(|i| format!("{base}/x/{i}")).collect();
        let sent = urls.iter().map(|u| send(&c, Method::GET, u, &[], ""));
        assert!(join_all(sent).await.iter().all(|r| r.status == 200));
    }
    for i in 0..20 {
        assert_eq!(get(&format!("{base}/no/such/{i}")).await.status, 404);
    }
    // An unknown method on a known path is no route either (a route is a method and a path).
    let odd = send(
        &c,
        Method::from_bytes(b"BREW").unwrap(),
        &format!("{base}/x/1"),
        &[],
        "",
    )
    .await;
    assert_eq!(odd.status, 405);

    let m = scrape(gw.admin_addr).await;
    let routes: BTreeSet<&str> = m
        .samples_of("fanout_requests_total")
        .iter()
        .map(|s| s.labels["route"].as_str())
        .collect();
    assert!(
        routes.contains("/x/{id}") && routes.contains("unmatched"),
        "{routes:?}"
    );
    assert!(
        routes
            .iter()
            .all(|r| *r == "unmatched" || !r.contains(char::is_numeric)),
        "raw paths leaked into labels: {routes:?}"
    );
    let x = |class| {
        m.value(
            "fanout_requests_total",
            &[
                ("route", "/x/{id}"),
                ("method", "GET"),
                ("status_class", class),
            ],
        )
    };
    assert_eq!(x("2xx"), 1000.0);
    let unmatched = |method| {
        m.value(
            "fanout_requests_total",
            &[
                ("route", "unmatched"),
                ("method", method),
                ("status_class", "4xx"),
            ],
        )
    };
    assert_eq!(unmatched("GET"), 20.0);
    assert_eq!(unmatched("other"), 1.0, "methods are bounded too");
    let methods: BTreeSet<&str> = m
        .samples_of("fanout_requests_total")
        .iter()
        .map(|s| s.labels["method"].as_str())
        .collect();
    assert!(!methods.contains("BREW"), "{methods:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_metrics_off_the_request_families_are_absent() {
    let s = stubs(STUBS).await;
    let off = format!("admin: {{ metrics: false }}\n{GATEWAY}");
    let gw = gateway(&off, &s).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(get(&format!("{base}/ok/1")).await.status, 200);
    assert_eq!(get(&format!("{base}/fail")).await.status, 502);
    assert_eq!(get(&format!("{base}/nope")).await.status, 404);

    let m = scrape(gw.admin_addr).await;
    for family in [
        "fanout_requests",
        "fanout_request_duration_seconds",
        "fanout_requests_in_flight",
        "fanout_partial_responses",
        "fanout_requests_coalesced",
        "fanout_backend_calls",
        "fanout_backend_call_duration_seconds",
    ] {
        // A family without samples is left out of the text altogether.
        assert!(
            !m.types.contains_key(family),
            "{family} is declared with metrics off"
        );
        let samples: Vec<_> = m
            .samples
            .iter()
            .filter(|s| s.name.starts_with(family))
            .filter(|s| {
                // `fanout_requests` is a prefix of the other request families.
                let rest = &s.name[family.len()..];
                ["", "_total", "_bucket", "_sum", "_count"].contains(&rest)
            })
            .collect();
        assert!(
            samples.is_empty(),
            "{family} recorded with metrics off: {samples:?}"
        );
    }
    // What is read at scrape time is still there.
    assert_eq!(
        m.value("fanout_errors_total", &[("code", "backend_status")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_is_valid_and_every_family_is_typed() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    assert_eq!(get(&format!("http://{}/ok/1", gw.addr)).await.status, 200);
    let m = scrape(gw.admin_addr).await;
    assert!(m.types.len() > 40, "{:?}", m.types.keys());
    for s in &m.samples {
        let family = m.types.keys().find(|f| {
            s.name == **f
                || ["_total", "_bucket", "_sum", "_count", "_created"]
                    .iter()
                    .any(|suffix| s.name == format!("{f}{suffix}"))
        });
        let family = family.unwrap_or_else(|| panic!("sample {} of no declared family", s.name));
        let ty = &m.types[family];
        match ty.as_str() {
            "counter" => assert!(s.name.ends_with("_total"), "{}", s.name),
            "histogram" => assert!(
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|x| s.name.ends_with(x)),
                "{}",
                s.name
            ),
            "gauge" => assert_eq!(s.name, *family),
            other => panic!("unexpected type {other} of {family}"),
        }
    }
    // Histogram buckets are cumulative and end with +Inf = _count.
    let buckets: Vec<f64> = m
        .samples_of("fanout_request_duration_seconds_bucket")
        .iter()
        .filter(|s| s.labels["route"] == "/ok/{id}")
        .map(|s| s.value)
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert_eq!(buckets.last(), Some(&1.0));
}

/// The metric catalog the Grafana dashboard is written against: every name with exactly these
/// label names.
const CATALOG: &[(&str, &[&str])] = &[
    (
        "fanout_requests_total",
        &["route", "method", "status_class"],
    ),
    ("fanout_request_duration_seconds", &["route", "method"]),
    ("fanout_requests_in_flight", &["route"]),
    ("fanout_partial_responses_total", &["route"]),
    ("fanout_requests_coalesced_total", &["route"]),
    ("fanout_errors_total", &["code"]),
    (
        "fanout_backend_calls_total",
        &["backend", "step", "outcome"],
    ),
    ("fanout_backend_call_duration_seconds", &["backend", "step"]),
    ("fanout_backend_in_flight", &["backend"]),
    ("fanout_db_up", &["backend"]),
    ("fanout_db_pool_max_connections", &["backend"]),
    ("fanout_db_pool_connections", &["backend", "state"]),
    ("fanout_db_pool_waiting", &["backend"]),
    ("fanout_db_pool_wait_seconds", &["backend"]),
    ("fanout_db_pool_rejections_total", &["backend", "reason"]),
    ("fanout_db_cancellations_total", &["backend"]),
    ("fanout_db_rows_total", &["backend"]),
    ("fanout_db_errors_total", &["backend", "class"]),
    ("fanout_db_step_rows_total", &["backend", "step"]),
    ("fanout_db_step_errors_total", &["backend", "step", "class"]),
    ("fanout_backend_address_up", &["backend", "address"]),
    ("fanout_outlier_ejections_total", &["backend", "address"]),
    ("fanout_breaker_state", &["backend"]),
    ("fanout_retries_total", &["backend"]),
    ("fanout_retry_budget_refusals_total", &["backend"]),
    ("fanout_hedges_total", &["backend"]),
    ("fanout_hedges_won_total", &["backend"]),
    ("fanout_admission_limit", &["class"]),
    ("fanout_admission_in_flight", &["class"]),
    ("fanout_admission_queue_length", &["class"]),
    ("fanout_admission_rejections_total", &["class", "reason"]),
    ("fanout_connections_open", &[]),
    ("fanout_connections_refused_total", &[]),
    ("fanout_cache_requests_total", &["cache", "result"]),
    ("fanout_cache_entries", &["cache"]),
    ("fanout_cache_l2_requests_total", &["cache", "result"]),
    ("fanout_dedup_saved_calls_total", &["backend"]),
    ("fanout_batch_size", &["backend"]),
    ("fanout_batch_saved_calls_total", &["backend"]),
    ("fanout_reference_age_seconds", &["dataset"]),
    ("fanout_reference_loads_total", &["dataset", "result"]),
    ("fanout_auth_keys", &["provider"]),
    ("fanout_auth_keys_age_seconds", &["provider"]),
    ("fanout_auth_jwks_fetches_total", &["provider", "result"]),
    ("fanout_auth_unknown_kid_fetches_total", &["provider"]),
    ("fanout_auth_requests_total", &["provider", "outcome"]),
    ("fanout_auth_invalid_tokens_total", &["provider", "reason"]),
    ("fanout_model_rows_total", &["model"]),
    ("fanout_model_batches_total", &["model"]),
    ("fanout_model_batch_rows", &["model"]),
    ("fanout_model_queue_seconds", &["model"]),
    ("fanout_model_compute_seconds", &["model"]),
    ("fanout_model_pending_rows", &["model"]),
    ("fanout_model_dropped_rows_total", &["model", "reason"]),
    ("fanout_model_loads_total", &["model", "result"]),
    ("fanout_model_version_age_seconds", &["model"]),
    ("fanout_compute_queue_length", &[]),
    ("fanout_compute_run_seconds", &[]),
    ("fanout_runtime_stalls_total", &[]),
    ("fanout_config_reloads_total", &["result"]),
    ("fanout_config_last_reload_success_timestamp_seconds", &[]),
    ("process_cpu_seconds_total", &[]),
    ("process_resident_memory_bytes", &[]),
    ("process_threads", &[]),
    ("process_open_fds", &[]),
    ("process_start_time_seconds", &[]),
];

const EVERYTHING_STUBS: &str = r#"
services:
  api:
    listen: "${API_ADDR}"
    routes:
      - { path: /ok, body: '{ok: true}' }
      - { path: /ref, body: '{a: 1}' }
      - path: /attrs
        body: '$request.query.ids | split(",") | map({key: ., value: .}) | from_entries'
"#;

/// A config with one of everything that has metrics: breaker, retries, hedging, dedup, caches,
/// a batch form, reference data.
const EVERYTHING: &str = r#"
backends:
  api:
    url: "http://${API_ADDR}"
    breaker: {}
    retry: {}
    hedge: { delay: 1s }
    cache: { ttl: 1h }
    batch:
      path: '"/attrs"'
      query: { ids: '$keys | join(",")' }
      split: '.'
  # A database nobody listens for: its pool's series exist from the start all the same.
  db:
    protocol: postgres
    url: "postgres://postgres@127.0.0.1:1/postgres"
    postgres: { reconnect_min: 1s, reconnect_max: 1s }
reference:
  small: { http: { backend: api, path: '"/ref"' } }
auth:
  providers:
    corp: { issuer: https://idp.test, hmac_secret: 0123456789abcdef0123456789abcdef }
routes:
  - path: /ok
    flow:
      a: { http: { backend: api, path: '"/ok"' } }
      k: { http: { backend: api, key: '"x"' } }
    respond: { body: '{a: $a, k: $k, r: $ref.small}' }
  - path: /db
    flow:
      row: { sql: { backend: db, mode: one, query: "SELECT 1 AS n" } }
    respond: { body: '$row' }
  - path: /model
    flow:
      m: { model: { name: spam_lr, input: '[range(20)]' } }
    respond: { body: '$m' }
# Relative to the test's working directory (the crate's): the antispam example's models.
models: { dir: ../../examples/antispam/models }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_catalog_metric_is_exposed_with_its_labels() {
    let s = stubs(EVERYTHING_STUBS).await;
    let gw = gateway(EVERYTHING, &s).await;
    assert_eq!(get(&format!("http://{}/ok", gw.addr)).await.status, 200);
    assert_eq!(get(&format!("http://{}/none", gw.addr)).await.status, 404);
    let m = scrape(gw.admin_addr).await;
    let names = m.metric_names();
    for (name, labels) in CATALOG {
        assert!(names.contains(*name), "{name} is not exposed");
        let want: BTreeSet<&str> = labels.iter().copied().collect();
        let series: Vec<&Sample> = m
            .samples
            .iter()
            .filter(|s| s.name == *name || s.name == format!("{name}_count"))
            .collect();
        assert!(!series.is_empty(), "{name} has no sample");
        for s in series {
            let got: BTreeSet<&str> = s.labels.keys().map(String::as_str).collect();
            assert_eq!(got, want, "labels of {name}");
        }
    }
    // Features being built elsewhere have their families and zero samples already.
    for result in ["ok", "error"] {
        assert_eq!(
            m.value("fanout_config_reloads_total", &[("result", result)]),
            0.0
        );
    }
    for result in ["hit", "miss", "error", "skipped"] {
        assert_eq!(
            m.value(
                "fanout_cache_l2_requests_total",
                &[("cache", "api"), ("result", result)]
            ),
            0.0
        );
    }
    assert_eq!(m.value("fanout_breaker_state", &[("backend", "api")]), 0.0);
    assert_eq!(
        m.value(
            "fanout_reference_loads_total",
            &[("dataset", "small"), ("result", "ok")]
        ),
        1.0
    );
    // Counting a reload shows at once.
    gw.gateway().metrics().config_reloaded(true);
    let m = scrape(gw.admin_addr).await;
    assert_eq!(
        m.value("fanout_config_reloads_total", &[("result", "ok")]),
        1.0
    );
}

/// Before the reload: backend `old` with a breaker and retries, used by route `/old`.
const BEFORE_RELOAD: &str = r#"
backends:
  api: { url: "http://${API_ADDR}" }
  old: { url: "http://${API_ADDR}", breaker: {}, retry: {} }
routes:
  - path: /ok/{id}
    flow:
      a: { http: { backend: api, path: '"/ok/\($request.params.id)"' } }
    respond: { body: '$a' }
  - path: /old
    flow:
      o: { http: { backend: old, path: '"/ok/1"' } }
    respond: { body: '$o' }
"#;

/// After the reload: `old` and `/old` are gone; backend `fresh` (with a cache and a `fail`
/// guard's code) and route `/new` are new.
const AFTER_RELOAD: &str = r#"
backends:
  api: { url: "http://${API_ADDR}" }
  fresh: { url: "http://${API_ADDR}", cache: { ttl: 1h } }
routes:
  - path: /ok/{id}
    flow:
      a: { http: { backend: api, path: '"/ok/\($request.params.id)"' } }
    respond: { body: '$a' }
  - path: /new
    flow:
      guard: { when: '$request.query.no != null', fail: { status: 400, code: no_thanks } }
      n: { http: { backend: fresh, path: '"/conf"' } }
    respond: { body: '$n' }
"#;

/// The samples of `m` that carry `label` = `value`.
fn with_label<'a>(m: &'a Scrape, label: &str, value: &str) -> Vec<&'a Sample> {
    m.samples
        .iter()
        .filter(|s| s.labels.get(label).map(String::as_str) == Some(value))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_drops_removed_series_and_adds_the_new_ones_at_zero() {
    let s = stubs(STUBS).await;
    let gw = gateway(BEFORE_RELOAD, &s).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(get(&format!("{base}/ok/1")).await.status, 200);
    assert_eq!(get(&format!("{base}/old")).await.status, 200);
    let m = scrape(gw.admin_addr).await;
    assert!(!with_label(&m, "route", "/old").is_empty());
    assert!(!with_label(&m, "backend", "old").is_empty());
    assert!(with_label(&m, "route", "/new").is_empty());

    gw.gateway().reload(config(AFTER_RELOAD, &s)).await.unwrap();
    let m = scrape(gw.admin_addr).await;
    // Gone: every series of the removed route, its step and its backend.
    for (label, value) in [("route", "/old"), ("step", "o"), ("backend", "old")] {
        let left = with_label(&m, label, value);
        assert!(
            left.is_empty(),
            "{label}={value} after the reload: {left:?}"
        );
    }
    // New, at zero before any request.
    for class in ["1xx", "2xx", "3xx", "4xx", "5xx"] {
        let labels = [
            ("route", "/new"),
            ("method", "GET"),
            ("status_class", class),
        ];
        assert_eq!(m.value("fanout_requests_total", &labels), 0.0);
    }
    let new_route = [("route", "/new"), ("method", "GET")];
    for suffix in ["_count", "_sum"] {
        let name = format!("fanout_request_duration_seconds{suffix}");
        assert_eq!(m.value(&name, &new_route), 0.0);
    }
    let inf = [("route", "/new"), ("method", "GET"), ("le", "+Inf")];
    assert_eq!(m.value("fanout_request_duration_seconds_bucket", &inf), 0.0);
    assert_eq!(
        m.value("fanout_requests_in_flight", &[("route", "/new")]),
        0.0
    );
    assert_eq!(
        m.value("fanout_partial_responses_total", &[("route", "/new")]),
        0.0
    );
    let calls = m.samples_of("fanout_backend_calls_total");
    let fresh_calls: Vec<_> = calls
        .iter()
        .filter(|s| s.labels["backend"] == "fresh" && s.labels["step"] == "n")
        .collect();
    assert_eq!(
        fresh_calls.len(),
        fanout_flow::CallClass::ALL.len(),
        "one series per outcome class"
    );
    assert!(
        fresh_calls.iter().all(|s| s.value == 0.0),
        "{fresh_calls:?}"
    );
    let fresh_step = [("backend", "fresh"), ("step", "n")];
    let name = "fanout_backend_call_duration_seconds_count";
    assert_eq!(m.value(name, &fresh_step), 0.0);
    let fresh = [("backend", "fresh")];
    for name in [
        "fanout_backend_in_flight",
        "fanout_breaker_state",
        "fanout_retries_total",
        "fanout_hedges_total",
        "fanout_dedup_saved_calls_total",
    ] {
        assert_eq!(m.value(name, &fresh), 0.0, "{name}");
    }
    assert_eq!(m.value("fanout_backend_address_up", &fresh), 1.0);
    for result in ["hit", "miss", "stale"] {
        let labels = [("cache", "fresh"), ("result", result)];
        assert_eq!(m.value("fanout_cache_requests_total", &labels), 0.0);
    }
    assert_eq!(m.value("fanout_cache_entries", &[("cache", "fresh")]), 0.0);
    assert_eq!(
        m.value("fanout_errors_total", &[("code", "no_thanks")]),
        0.0
    );
    // Kept: the series of the route both configs have continue.
    let kept = [
        ("route", "/ok/{id}"),
        ("method", "GET"),
        ("status_class", "2xx"),
    ];
    assert_eq!(m.value("fanout_requests_total", &kept), 1.0);
    assert_eq!(
        m.value("fanout_config_reloads_total", &[("result", "ok")]),
        1.0
    );
    // The new route records into its series.
    assert_eq!(get(&format!("{base}/new")).await.status, 200);
    let m = scrape(gw.admin_addr).await;
    let ok = [
        ("route", "/new"),
        ("method", "GET"),
        ("status_class", "2xx"),
    ];
    assert_eq!(m.value("fanout_requests_total", &ok), 1.0);

    // A refused reload (its required reference data does not load) leaves no series of the
    // config it built.
    let refused = format!(
        "{AFTER_RELOAD}  - path: /never\n    respond: {{ body: '1' }}\n\
         reference:\n  d: {{ http: {{ backend: api, path: '\"/missing\"' }} }}\n"
    );
    let err = gw.gateway().reload(config(&refused, &s)).await.unwrap_err();
    assert!(
        matches!(err, fanout_proxy::reload::ReloadError::Reference(_)),
        "{err}"
    );
    let m = scrape(gw.admin_addr).await;
    assert!(with_label(&m, "route", "/never").is_empty());
    assert_eq!(m.value("fanout_requests_total", &ok), 1.0);
}

/// The metric names of the reference: the first backticked word of each table row.
fn documented_metrics() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .filter(|n| n.starts_with("fanout_") || n.starts_with("process_"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_lists_exactly_the_exposed_metrics() {
    let s = stubs(EVERYTHING_STUBS).await;
    let gw = gateway(EVERYTHING, &s).await;
    let exposed = scrape(gw.admin_addr).await.metric_names();
    let documented = documented_metrics();
    let undocumented: Vec<_> = exposed.difference(&documented).collect();
    let gone: Vec<_> = documented.difference(&exposed).collect();
    assert!(
        undocumented.is_empty() && gone.is_empty(),
        "docs/operations.md (Metrics) is out of date: not documented {undocumented:?}; \
         documented but not exposed {gone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_follow_the_gateway() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let admin = gw.admin_addr.expect("admin listener");
    let health = get(&format!("http://{admin}/healthz")).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json(), serde_json::json!({"status": "ok"}));
    let ready = get(&format!("http://{admin}/readyz")).await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    gw.gateway().health().set_draining();
    let ready = get(&format!("http://{admin}/readyz")).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["status"], "not_ready");
    assert!(
        ready.json()["reason"]
            .as_str()
            .unwrap()
            .contains("draining")
    );
    assert_eq!(get(&format!("http://{admin}/healthz")).await.status, 200);
    // The status endpoint is on the admin listener, and (deprecated) still on the client port.
    let status = get(&format!("http://{admin}/__fanout/status")).await;
    assert!(status.json()["admission"].is_object());
    let old = get(&format!("http://{}/__fanout/status", gw.addr)).await;
    assert!(old.json()["admission"].is_object());
    assert_eq!(get(&format!("http://{admin}/other")).await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_required_reference_data_has_loaded() {
    let s = stubs(EVERYTHING_STUBS).await;
    let vars = stub_vars(&s);
    let lookup = |n: &str| vars.get(n).cloned();
    // Without the unreachable database, which would keep it not ready for its own reason.
    let (head, rest) = EVERYTHING.split_once("  # A database nobody").unwrap();
    let (_, tail) = rest.split_once("reference:").unwrap();
    let (tail, _) = tail.split_once("  - path: /db").unwrap();
    let config = format!("{head}reference:{tail}");
    let gw = std::sync::Arc::new(fanout::load_gateway("fanout.yaml", &config, &lookup).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(fanout_proxy::admin::serve_admin(
        gw.clone(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let readyz = || async { get(&format!("http://{admin}/readyz")).await };

    let r = readyz().await;
    assert_eq!(r.status, 503);
    assert!(
        r.json()["reason"].as_str().unwrap().contains("listener"),
        "{}",
        r.text()
    );
    gw.health().set_listening(true);
    let r = readyz().await;
    assert_eq!(r.status, 503);
    assert!(
        r.json()["reason"]
            .as_str()
            .unwrap()
            .contains("reference data not loaded yet: small"),
        "{}",
        r.text()
    );
    assert_eq!(get(&format!("http://{admin}/healthz")).await.status, 200);
    gw.start_reference().await.unwrap();
    assert_eq!(readyz().await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_is_separate_and_capped() {
    let s = stubs(STUBS).await;
    let cfg = format!("admin: {{ max_connections: 2 }}\n{GATEWAY}");
    let gw = gateway(&cfg, &s).await;
    let admin = gw.admin_addr.unwrap();
    assert_ne!(admin, gw.addr);
    // Two connections held open take both slots; a third is closed without an answer.
    let held = [h1::conn(admin).await, h1::conn(admin).await];
    let third = tokio::net::TcpStream::connect(admin).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut t = third;
        let _ = t
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await;
        t.read(&mut buf).await
    })
    .await
    .expect("closed, not left hanging");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the third connection got an answer"
    );
    drop(held);
    wait_until_async_ok(admin).await;
}

/// Once held connections are gone, the admin listener answers again (polled: the server frees
/// a slot when it sees the connection close).
async fn wait_until_async_ok(admin: SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if let Ok(mut t) = tokio::net::TcpStream::connect(admin).await {
            let _ = t
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
            let mut out = Vec::new();
            let _ = t.read_to_end(&mut out).await;
            if out.starts_with(b"HTTP/1.1 200") {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the admin listener did not answer again");
}
