//! GraphQL routes' edge (docs/graphql.md): automatic persisted queries (Apollo's APQ protocol,
//! POST and GET, the hash verified, the store bounded) and a safelist; field-level `require:`
//! (a forbidden field is `null` with `FORBIDDEN`, its resolver never called — the stub's
//! counters prove it); a per-client cost budget (429 `COST_BUDGET_EXCEEDED` with
//! `Retry-After` before any backend call). Counts and states are asserted, never times (the
//! budgets are per minute).

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;
use serde_json::{Value, json};
use sha2::Digest;

const STUBS: &str = r#"
services:
  api:
    listen: "${API_ADDR}"
    routes:
      - path: /posts
        body: '[range(1; 4) | {id: ., userId: ., title: "post \(.)", secret: "s\(.)"}]'
      - path: /users/{id}
        body: '{name: "user \($request.params.id)"}'
      - path: /salary
        body: '{amount: 100}'
"#;

fn sha(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn post(
    gw: &fanout::RunningGateway,
    path: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> Resp {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    send(
        &client(false),
        Method::POST,
        &format!("http://{}{path}", gw.addr),
        &h,
        body.to_string(),
    )
    .await
}

async fn get(gw: &fanout::RunningGateway, path_and_query: &str) -> Resp {
    send(
        &client(false),
        Method::GET,
        &format!("http://{}{path_and_query}", gw.addr),
        &[],
        "",
    )
    .await
}

fn calls_to(s: &fanout_stub::StubServer, route: &str) -> u64 {
    s.stats("api")
        .unwrap()
        .routes
        .get(route)
        .map_or(0, |r| r.requests)
}

fn code(r: &Resp) -> String {
    r.json()["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// `text` percent-encoded for a query parameter.
fn enc(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_persisted_queries_register_by_hash_and_run_by_post_and_get() {
    let gateway_yaml = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
routes:
  - path: /graphql
    graphql:
      schema: |
        type Query { posts: [Post!]! }
        type Post { id: Int! title: String! }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
      persisted_queries: { enabled: true, max_entries: 2 }
  - path: /plain
    graphql:
      schema: |
        type Query { posts: [Post!]! }
        type Post { id: Int! title: String! }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
"#;
    let s = stubs(STUBS).await;
    let gw = gateway(gateway_yaml, &s).await;
    let q = "{ posts { id title } }";
    let h = sha(q);
    let ext = |hash: &str| json!({"persistedQuery": {"version": 1, "sha256Hash": hash}});

    // An unknown hash: PERSISTED_QUERY_NOT_FOUND, and nothing called.
    let r = post(&gw, "/graphql", json!({"extensions": ext(&h)}), &[]).await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(code(&r), "PERSISTED_QUERY_NOT_FOUND");
    assert!(r.json().get("data").is_none());
    assert_eq!(calls_to(&s, "GET /posts"), 0);

    // The query with a wrong hash: refused, not run, not stored.
    let wrong = sha("{ posts { id } }");
    let r = post(
        &gw,
        "/graphql",
        json!({"query": q, "extensions": ext(&wrong)}),
        &[],
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(code(&r), "PERSISTED_QUERY_HASH_MISMATCH");
    assert_eq!(calls_to(&s, "GET /posts"), 0);
    let r = post(&gw, "/graphql", json!({"extensions": ext(&wrong)}), &[]).await;
    assert_eq!(code(&r), "PERSISTED_QUERY_NOT_FOUND");

    // The query with its hash: run and stored.
    let r = post(
        &gw,
        "/graphql",
        json!({"query": q, "extensions": ext(&h)}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json()["data"]["posts"][2],
        json!({"id": 3, "title": "post 3"})
    );
    assert_eq!(calls_to(&s, "GET /posts"), 1);

    // Then the hash alone runs it, by POST and by GET (the route's GET half shares the store).
    let r = post(&gw, "/graphql", json!({"extensions": ext(&h)}), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["data"]["posts"][0]["title"], "post 1");
    let url = format!("/graphql?extensions={}", enc(&ext(&h).to_string()));
    let r = get(&gw, &url).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["data"]["posts"][1]["id"], 2);
    assert_eq!(calls_to(&s, "GET /posts"), 3);

    // The store is bounded (max_entries: 2): two more queries push the least recently used out.
    for other in ["{ posts { id } }", "{ posts { title } }"] {
        let r = post(
            &gw,
            "/graphql",
            json!({"query": other, "extensions": ext(&sha(other))}),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let r = post(&gw, "/graphql", json!({"extensions": ext(&h)}), &[]).await;
    assert_eq!(code(&r), "PERSISTED_QUERY_NOT_FOUND", "{:?}", r.body);

    // A version other than 1, and a route without persisted queries: refused.
    let r = post(
        &gw,
        "/graphql",
        json!({"extensions": {"persistedQuery": {"version": 2, "sha256Hash": h}}}),
        &[],
    )
    .await;
    assert_eq!(code(&r), "PERSISTED_QUERY_VERSION_NOT_SUPPORTED");
    let r = post(&gw, "/plain", json!({"extensions": ext(&h)}), &[]).await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(code(&r), "PERSISTED_QUERY_NOT_SUPPORTED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safelist_runs_only_its_operations() {
    let dir = TempDir::new("graphql-safelist");
    let listed = "query Titles { posts { title } }";
    let manifest = dir.write(
        "pq.json",
        &json!({
            "format": "apollo-persisted-query-manifest",
            "version": 1,
            "operations": [{"id": "titles-v1", "name": "Titles", "type": "query", "body": listed}]
        })
        .to_string(),
    );
    let inline = "{ posts { id } }";
    let gateway_yaml = format!(
        r#"
defaults: {{ timeout: 30s, deadline: 30s, connect_timeout: 10s }}
backends:
  api: {{ url: "http://${{API_ADDR}}" }}
routes:
  - path: /graphql
    graphql:
      schema: |
        type Query {{ posts: [Post!]! }}
        type Post {{ id: Int! title: String! }}
      resolvers:
        Query.posts: {{ http: {{ backend: api, path: '"/posts"' }} }}
      persisted_queries:
        safelist_file: {}
        safelist: ['{inline}']
"#,
        manifest.display()
    );
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_yaml, &s).await;
    let ext = |hash: &str| json!({"persistedQuery": {"version": 1, "sha256Hash": hash}});

    // By the manifest's id, and by an inline document's SHA-256 (POST and GET).
    let r = post(
        &gw,
        "/graphql",
        json!({"extensions": ext("titles-v1")}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["data"]["posts"][0], json!({"title": "post 1"}));
    let url = format!(
        "/graphql?extensions={}",
        enc(&ext(&sha(inline)).to_string())
    );
    let r = get(&gw, &url).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["data"]["posts"][0], json!({"id": 1}));
    // A listed document sent as text runs too.
    let r = post(&gw, "/graphql", json!({"query": listed}), &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(calls_to(&s, "GET /posts"), 3);

    // Anything else is refused before any call: an unknown id, a text not on the list (with
    // or without its hash).
    let r = post(&gw, "/graphql", json!({"extensions": ext("nope")}), &[]).await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(code(&r), "PERSISTED_QUERY_NOT_IN_LIST");
    let other = "{ posts { id title } }";
    let r = post(&gw, "/graphql", json!({"query": other}), &[]).await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(code(&r), "QUERY_NOT_IN_SAFELIST");
    let r = post(
        &gw,
        "/graphql",
        json!({"query": other, "extensions": ext(&sha(other))}),
        &[],
    )
    .await;
    assert_eq!(code(&r), "QUERY_NOT_IN_SAFELIST");
    assert_eq!(
        calls_to(&s, "GET /posts"),
        3,
        "nothing called for the refused ones"
    );
}

const AUTH_GATEWAY: &str = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
auth:
  providers:
    corp: { issuer: https://idp.test, keys: 'JWKS', algorithms: [ES256] }
backends:
  api: { url: "http://${API_ADDR}" }
routes:
  - path: /graphql
    auth: { provider: corp }
    graphql:
      schema: |
        type Query { posts: [Post!]! salary: Salary  me: String }
        type Post { id: Int! title: String! secret: String }
        type Salary { amount: Int! }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
        Query.salary: { http: { backend: api, path: '"/salary"' } }
        Query.me: { value: '$request.auth.sub' }
      require:
        Query.salary: { scopes: [hr] }
        Post.secret: { require: '$auth.role == "admin"' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_whose_requirement_fails_is_null_with_forbidden_and_its_resolver_is_not_called() {
    let key = fanout_testkit::jwt::EsKey::generate("k1");
    let jwks = json!({"keys": [key.jwk()]}).to_string();
    let gateway_yaml = AUTH_GATEWAY.replace("JWKS", &jwks);
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_yaml, &s).await;
    let token = |claims: Value| {
        let mut c = json!({"iss": "https://idp.test", "exp": fanout_testkit::jwt::now() + 600});
        c.as_object_mut()
            .unwrap()
            .extend(claims.as_object().unwrap().clone());
        format!("Bearer {}", key.sign(&c))
    };
    let q = json!({"query": "{ me salary { amount } posts { id secret } }"});

    // A user without the scope or the role: the two fields null, with FORBIDDEN at their paths.
    let bearer = token(json!({"sub": "ada", "scope": "read", "role": "user"}));
    let r = post(&gw, "/graphql", q.clone(), &[("authorization", &bearer)]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(v["data"]["me"], "ada");
    assert_eq!(v["data"]["salary"], Value::Null);
    assert_eq!(v["data"]["posts"][0], json!({"id": 1, "secret": null}));
    let errors = v["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .all(|e| e["extensions"]["code"] == "FORBIDDEN"),
        "{v}"
    );
    assert!(errors.iter().any(|e| e["path"] == json!(["salary"])), "{v}");
    assert!(
        errors
            .iter()
            .any(|e| e["path"] == json!(["posts", 2, "secret"])),
        "{v}"
    );
    assert_eq!(
        calls_to(&s, "GET /salary"),
        0,
        "a forbidden field's resolver is not run"
    );
    assert_eq!(calls_to(&s, "GET /posts"), 1);

    // With the scope and the role: the values.
    let bearer = token(json!({"sub": "bob", "scope": "read hr", "role": "admin"}));
    let r = post(&gw, "/graphql", q, &[("authorization", &bearer)]).await;
    let v = r.json();
    assert!(v.get("errors").is_none(), "{v}");
    assert_eq!(v["data"]["salary"], json!({"amount": 100}));
    assert_eq!(v["data"]["posts"][2]["secret"], "s3");
    assert_eq!(calls_to(&s, "GET /salary"), 1);
}

#[test]
fn a_field_requirement_is_checked_at_load() {
    let load = |yaml: &str| match fanout::load_gateway("f.yaml", yaml, &|_: &str| None) {
        Ok(_) => panic!("the config loaded:\n{yaml}"),
        Err(e) => e.to_string(),
    };
    let base = "backends:\n  api: { url: \"http://127.0.0.1:1\" }\nroutes:\n  - path: /graphql\n    graphql:\n      schema: |\n        type Query { posts: [Post!]! }\n        type Post { id: Int! }\n      resolvers:\n        Query.posts: { http: { backend: api, path: '\"/posts\"' } }\n      require:\n";
    // A field the schema does not have (with a did-you-mean) …
    let e = load(&format!("{base}        Post.idd: {{ scopes: [a] }}\n"));
    assert!(
        e.contains("f.yaml:12:9: graphql.require `Post.idd`: type `Post` has no field `idd`"),
        "{e}"
    );
    // … and a route without `auth`.
    let e = load(&format!("{base}        Post.id: {{ scopes: [a] }}\n"));
    assert!(e.contains("the route has no `auth`"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_cost_budget_is_refused_before_any_backend_call() {
    let gateway_yaml = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
rate_limits:
  graphql-cost:
    rate: 1/min
    burst: 25
    key: '$request.headers["x-client"]'
routes:
  - path: /graphql
    graphql:
      schema: |
        type Query { posts: [Post!]! }
        type Post { id: Int! title: String! }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
      cost_limit: graphql-cost
"#;
    let s = stubs(STUBS).await;
    let gw = gateway(gateway_yaml, &s).await;
    // `{ posts { id title } }` costs 1 + 2 × 10 (list_size) = 21: one fits in 25, not two.
    let q = json!({"query": "{ posts { id title } }"});
    let r = post(&gw, "/graphql", q.clone(), &[("x-client", "a")]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = post(&gw, "/graphql", q.clone(), &[("x-client", "a")]).await;
    assert_eq!(r.status, 429, "{:?}", r.body);
    assert_eq!(code(&r), "COST_BUDGET_EXCEEDED");
    let msg = r.json()["errors"][0]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("graphql-cost") && msg.contains("21"), "{msg}");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");
    assert_eq!(
        calls_to(&s, "GET /posts"),
        1,
        "the refused one called nothing"
    );
    // A cheaper operation still fits the rest of the budget (4 units: `{ posts { id } }` is 11,
    // too much; `{ __typename }` is 1).
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ __typename }"}),
        &[("x-client", "a")],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // Another client has its own budget.
    let r = post(&gw, "/graphql", q, &[("x-client", "b")]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(calls_to(&s, "GET /posts"), 2);
    // An operation costing more than the whole budget can never run: 400, no Retry-After.
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ a: posts { id title } b: posts { id } }"}),
        &[("x-client", "c")],
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(code(&r), "COST_BUDGET_EXCEEDED");
    assert!(r.header("retry-after").is_none());
    assert_eq!(calls_to(&s, "GET /posts"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resolver_run_is_a_span_with_its_calls_under_it() {
    let otlp = OtlpReceiver::start().await;
    let gateway_yaml = r#"
telemetry: { tracing: { otlp_endpoint: "${OTLP}", sampling_ratio: 1.0, batch_delay: 10ms } }
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
routes:
  - path: /graphql
    graphql:
      schema: |
        type Query { posts: [Post!]! }
        type Post { id: Int! user: User }
        type User { name: String! }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
        Post.user: { http: { backend: api, path: '"/users/\($parent.userId)"' } }
"#
    .replace("${OTLP}", &otlp.endpoint());
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_yaml, &s).await;
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ posts { id user { name } } }"}),
        &[("x-request-id", "gql-spans-1")],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["data"]["posts"][2]["user"]["name"], "user 3");
    let find = || {
        otlp.spans()
            .into_iter()
            .find(|s| s.kind == 2 && s.attr("fanout.request_id") == Some("gql-spans-1"))
    };
    wait_until("the request span", || find().is_some()).await;
    let server = find().unwrap();
    // request + the graphql step + 2 resolver runs + 1 posts call + 3 user calls
    wait_until("the trace's 8 spans", || {
        otlp.trace(&server.trace_id).len() >= 8
    })
    .await;
    let spans = otlp.trace(&server.trace_id);
    assert_eq!(spans.len(), 8, "{spans:#?}");
    let step = spans
        .iter()
        .find(|s| s.name == "step graphql")
        .expect("the graphql step's span");
    assert_eq!(step.parent_span_id, server.span_id);
    let posts = spans
        .iter()
        .find(|s| s.name == "resolve Query.posts")
        .expect("Query.posts's span");
    let users = spans
        .iter()
        .find(|s| s.name == "resolve Post.user")
        .expect("Post.user's span");
    for (span, parents, calls) in [(posts, "1", "1"), (users, "3", "3")] {
        assert_eq!(span.parent_span_id, step.span_id, "{span:#?}");
        assert_eq!(span.attr("graphql.parents"), Some(parents), "{span:#?}");
        assert_eq!(span.attr("fanout.calls"), Some(calls), "{span:#?}");
        assert_eq!(span.attr("fanout.outcome"), Some("ok"), "{span:#?}");
        assert_eq!(span.attr("fanout.backend"), Some("api"), "{span:#?}");
    }
    assert_eq!(users.attr("graphql.field"), Some("Post.user"));
    let calls: Vec<&RecvSpan> = spans.iter().filter(|s| s.kind == 3).collect();
    assert_eq!(calls.len(), 4, "{spans:#?}");
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.parent_span_id == users.span_id)
            .count(),
        3,
        "the user calls are the resolver span's children"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.parent_span_id == posts.span_id)
            .count(),
        1
    );
}
