//! Record cost of metrics: the operations fanout performs per request, with `prometheus-client`
//! (what fanout uses, plus its own lock-free histogram) and with the `metrics` facade +
//! `metrics-exporter-prometheus` (the alternative the issue names), and the cost of one scrape.
//! Run: `cargo bench -p fanout-ops --bench metrics -- --warm-up-time 1 --measurement-time 3`
//! (figures in docs/benchmarks.md).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // bench code
use criterion::{Criterion, criterion_group, criterion_main};
use fanout_flow::{Backend, CallError, CallRequest, CallResponse};
use fanout_ops::metrics::{Metrics, RouteTable};
use fanout_runtime::hist::{AtomicHistogram, LATENCY_NS, NS_PER_S};
use futures_util::future::BoxFuture;
use http::{Method, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

const ELAPSED: Duration = Duration::from_micros(1234);

fn bounds_s() -> Vec<f64> {
    LATENCY_NS.iter().map(|&b| b as f64 / NS_PER_S).collect()
}

/// Never called: the plan needs backends to compile against.
struct Nothing;

impl Backend for Nothing {
    fn call(&self, _: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        Box::pin(async { Err(CallError::new(fanout_flow::CallErrorKind::Connect, "x")) })
    }
}

/// The route of the hh-vacancies flow shape: one route, two steps calling backends.
fn plan() -> fanout_flow::Plan {
    let yaml = r#"
backends:
  search: { url: "http://127.0.0.1:1" }
  vacancies: { url: "http://127.0.0.1:1" }
routes:
  - path: /vacancies
    flow:
      found: { http: { backend: search, path: '"/search"' } }
      details: { for_each: '$found.items', http: { backend: vacancies, path: '"/v/\($item)"' } }
    respond: { body: '$details' }
"#;
    let cfg = fanout_config::Config::from_yaml("bench.yaml", yaml, &|_| None).unwrap();
    let mut backends: HashMap<String, Arc<dyn Backend>> = HashMap::new();
    for name in ["search", "vacancies"] {
        backends.insert(name.into(), Arc::new(Nothing));
    }
    fanout_flow::compile(&cfg, &backends).unwrap()
}

/// fanout's own request path: record a request with 4 backend calls (1 search + 3 details),
/// exactly as the server does (`RequestRecord`, `RouteMetrics::call_finished`).
fn fanout_request(c: &mut Criterion) {
    let plan = plan();
    let metrics = Metrics::new();
    let table = metrics.route_table(&plan.routes);
    let route = &plan.routes[0];
    let (search, details) = (&route.steps[0], &route.steps[1]);
    c.bench_function("fanout: one request with 4 calls (RequestRecord)", |b| {
        b.iter(|| {
            let mut rec =
                RouteTable::request(Some(&table), tokio::time::Instant::now(), &Method::GET);
            rec.routed(route);
            let m = rec.route_metrics().unwrap();
            m.call_finished(search, ELAPSED, Ok(()));
            for _ in 0..3 {
                m.call_finished(details, ELAPSED, Ok(()));
            }
            rec.finish(StatusCode::OK);
        })
    });
    c.bench_function("fanout: metrics off (no table)", |b| {
        b.iter(|| {
            let mut rec = RouteTable::request(None, tokio::time::Instant::now(), &Method::GET);
            rec.routed(route);
            black_box(rec.route_metrics());
            rec.finish(StatusCode::OK);
        })
    });
}

/// The single operations with prometheus-client.
fn prometheus_client_ops(c: &mut Criterion) {
    let family = Family::<[(&'static str, String); 3], Counter>::default();
    let counter = family.get_or_create_owned(&[
        ("route", "/vacancies".into()),
        ("method", "GET".into()),
        ("status_class", "2xx".into()),
    ]);
    let gauge: Gauge = Gauge::default();
    let hist = Histogram::new(bounds_s());
    let ours = AtomicHistogram::latency();
    c.bench_function("prometheus-client: cached counter inc", |b| {
        b.iter(|| black_box(&counter).inc())
    });
    c.bench_function("prometheus-client: family get_or_create + inc", |b| {
        b.iter(|| {
            family
                .get_or_create(&[
                    ("route", "/vacancies".into()),
                    ("method", "GET".into()),
                    ("status_class", "2xx".into()),
                ])
                .inc()
        })
    });
    c.bench_function("prometheus-client: gauge inc + dec", |b| {
        b.iter(|| {
            black_box(&gauge).inc();
            black_box(&gauge).dec();
        })
    });
    c.bench_function("prometheus-client: cached histogram observe (mutex)", |b| {
        b.iter(|| black_box(&hist).observe(ELAPSED.as_secs_f64()))
    });
    c.bench_function("fanout AtomicHistogram: record_duration", |b| {
        b.iter(|| black_box(&ours).record_duration(black_box(ELAPSED)))
    });
}

/// The same operations with the `metrics` facade and its Prometheus exporter (histograms with
/// the same buckets; handles cached, as fanout would cache them).
fn metrics_crate_ops(c: &mut Criterion) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&bounds_s())
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    let counter = metrics::counter!("fanout_requests_total", "route" => "/vacancies", "method" => "GET", "status_class" => "2xx");
    let gauge = metrics::gauge!("fanout_requests_in_flight", "route" => "/vacancies");
    let hist = metrics::histogram!("fanout_request_duration_seconds", "route" => "/vacancies", "method" => "GET");
    c.bench_function("metrics: cached counter increment", |b| {
        b.iter(|| black_box(&counter).increment(1))
    });
    c.bench_function("metrics: counter! macro with labels + increment", |b| {
        b.iter(|| {
            metrics::counter!("fanout_requests_total", "route" => "/vacancies", "method" => "GET", "status_class" => "2xx").increment(1)
        })
    });
    c.bench_function("metrics: gauge increment + decrement", |b| {
        b.iter(|| {
            black_box(&gauge).increment(1.0);
            black_box(&gauge).decrement(1.0);
        })
    });
    c.bench_function("metrics: cached histogram record", |b| {
        b.iter(|| black_box(&hist).record(ELAPSED.as_secs_f64()))
    });
    let calls: Vec<metrics::Counter> = (0..2)
        .map(|i| metrics::counter!("fanout_backend_calls_total", "step" => format!("s{i}")))
        .collect();
    let call_hist: Vec<metrics::Histogram> = (0..2)
        .map(|i| metrics::histogram!("fanout_backend_call_duration_seconds", "step" => format!("s{i}")))
        .collect();
    c.bench_function("metrics: one request with 4 calls (cached handles)", |b| {
        b.iter(|| {
            gauge.increment(1.0);
            for i in [0, 1, 1, 1] {
                calls[i].increment(1);
                call_hist[i].record(ELAPSED.as_secs_f64());
            }
            counter.increment(1);
            hist.record(ELAPSED.as_secs_f64());
            gauge.decrement(1.0);
        })
    });
    c.bench_function("metrics: render with no new samples", |b| {
        b.iter(|| black_box(handle.render().len()))
    });
    // Render cost grows with the samples recorded since the last render: record 10 000
    // request-shaped events between renders, as ~10 s of traffic at 1 000 req/s would.
    c.bench_function("metrics: render after 10k recorded requests", |b| {
        b.iter(|| {
            for _ in 0..10_000 {
                hist.record(ELAPSED.as_secs_f64());
                call_hist[1].record(ELAPSED.as_secs_f64());
            }
            black_box(handle.render().len())
        })
    });
}

/// One scrape's encoding of fanout's per-event families (one route, its steps), after 10 000
/// recorded requests, like the render above.
fn prometheus_client_encode(c: &mut Criterion) {
    let plan = plan();
    let metrics = Metrics::new();
    let table = metrics.route_table(&plan.routes);
    let route = &plan.routes[0];
    c.bench_function(
        "prometheus-client: encode after 10k recorded requests",
        |b| {
            b.iter(|| {
                for _ in 0..10_000 {
                    let mut rec = RouteTable::request(
                        Some(&table),
                        tokio::time::Instant::now(),
                        &Method::GET,
                    );
                    rec.routed(route);
                    let m = rec.route_metrics().unwrap();
                    m.call_finished(&route.steps[1], ELAPSED, Ok(()));
                    rec.finish(StatusCode::OK);
                }
                let mut out = String::new();
                encode(&mut out, metrics.registry()).unwrap();
                black_box(out.len())
            })
        },
    );
    c.bench_function(
        "prometheus-client: encode fanout's per-event families only",
        |b| {
            b.iter(|| {
                let mut out = String::new();
                encode(&mut out, metrics.registry()).unwrap();
                black_box(out.len())
            })
        },
    );
    let mut registry = Registry::default();
    let family = Family::<[(&'static str, String); 1], Counter>::default();
    registry.register("bench", "bench", family.clone());
    for i in 0..100 {
        family.get_or_create(&[("k", i.to_string())]).inc();
    }
    c.bench_function("prometheus-client: encode 100 counter series", |b| {
        b.iter(|| {
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            black_box(out.len())
        })
    });
}

criterion_group!(
    benches,
    fanout_request,
    prometheus_client_ops,
    metrics_crate_ops,
    prometheus_client_encode
);
criterion_main!(benches);
