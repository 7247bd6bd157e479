//! Per-request engine overhead of one flow, in process, with zero-latency fake backends, against
//! a hand-written baseline doing the same calls, parses and response building with serde_json.
//! Run: `cargo bench -p fanout-flow --bench engine`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use fanout_config::Config;
use fanout_expr::request::{RequestParts, request_val};
use fanout_flow::{Backend, CallError, CallRequest, CallResponse, compile};
use futures_util::future::BoxFuture;
use http::StatusCode;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

// The production allocator (see crates/fanout-cli/src/main.rs); both sides of the comparison use it.
#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

/// Answers instantly with a canned body chosen by path prefix.
struct Canned {
    search: Bytes,
}

fn vacancy(id: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"id":{id},"title":"Vacancy {id}","salary":{id}000,"company":{{"name":"ACME","city":"Moscow"}},"tags":["rust","remote"]}}"#
    ))
}

impl Backend for Canned {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let path = req.as_http().expect("an HTTP call").path_and_query.as_str();
        let body = if path.starts_with("/search") {
            self.search.clone()
        } else {
            let id = path.rsplit('/').next().unwrap_or("0").to_string();
            vacancy(&id)
        };
        Box::pin(async move {
            Ok(CallResponse {
                status: StatusCode::OK,
                body,
                value: None,
                parsed: None,
            })
        })
    }
}

const FLOW: &str = r#"
backends:
  search: { url: "http://127.0.0.1:1" }
  vacancies: { url: "http://127.0.0.1:1" }
routes:
  - path: /vacancies
    flow:
      found:
        http: { backend: search, path: '"/search"', query: { text: '$request.query.text' } }
      details:
        when: '$found.ids | length > 0'
        for_each: '$found.ids'
        http: { backend: vacancies, path: '"/vacancies/\($item)"' }
    respond:
      body: '{total: $found.total, items: $details}'
"#;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let search = Bytes::from_static(br#"{"total":5,"ids":[101,102,103,104,105]}"#);
    let backend = Arc::new(Canned {
        search: search.clone(),
    });
    let mut backends: HashMap<String, Arc<dyn Backend>> = HashMap::new();
    backends.insert("search".into(), backend.clone());
    backends.insert("vacancies".into(), backend.clone());
    let cfg = Config::from_yaml("bench.yaml", FLOW, &|_: &str| None).unwrap();
    let plan = compile(&cfg, &backends).unwrap();
    let route = plan.routes[0].clone();
    let headers: Vec<(&str, &[u8])> = vec![
        ("host", b"localhost"),
        ("accept", b"*/*"),
        ("user-agent", b"bench"),
    ];

    let mut g = c.benchmark_group("engine");
    g.bench_function("hh_vacancies_flow/fanout", |b| {
        b.iter(|| {
            let req = request_val(RequestParts::new(
                "GET",
                "/vacancies",
                Some("text=rust"),
                headers.iter().copied(),
            ));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            let out = rt.block_on(route.run(req, deadline)).unwrap();
            black_box(out.body)
        })
    });
    // Baseline: the same calls and JSON work written by hand (what a hand-written aggregator does).
    g.bench_function("hh_vacancies_flow/hand_written", |b| {
        b.iter(|| {
            let out = rt.block_on(async {
                let mk = |p: String| CallRequest {
                    call: fanout_layers::backend::Call::Http(fanout_layers::backend::HttpCall {
                        method: http::Method::GET,
                        path_and_query: p.parse().expect("a valid path"),
                        headers: http::HeaderMap::new(),
                        body: Bytes::new(),
                    }),
                    timeout: Duration::from_secs(1),
                    deadline: tokio::time::Instant::now() + Duration::from_secs(1),
                    idempotent: true,
                    trace: None,
                };
                let r = backend.call(mk("/search?text=rust".into())).await.unwrap();
                let found: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                let ids = found["ids"].as_array().cloned().unwrap_or_default();
                let calls = ids
                    .iter()
                    .map(|id| backend.call(mk(format!("/vacancies/{id}"))));
                let answers = futures_util::future::join_all(calls).await;
                let items: Vec<serde_json::Value> = answers
                    .into_iter()
                    .map(|a| serde_json::from_slice(&a.unwrap().body).unwrap())
                    .collect();
                serde_json::to_vec(&serde_json::json!({"total": found["total"], "items": items}))
                    .unwrap()
            });
            black_box(out)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
