//! GraphQL routes (docs/graphql.md): the posts/users case end to end against real stubs —
//! one `/posts` call and one call per distinct user (or one batch call) per request, proven
//! by the stubs' counters; variables, fragments, aliases, `@skip`/`@include`, `__typename`;
//! a failing nullable field (partial data, `errors[].path`) and a failing non-null one (null
//! propagated); limits refusing before any backend call; introspection on and off; GET.

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;
use serde_json::{Value, json};

const STUBS: &str = r#"
services:
  api:
    listen: "${API_ADDR}"
    routes:
      - path: /posts
        body: '[range(1; 101) | {id: ., userId: ((. - 1) / 10 | floor + 1), title: "post \(.)"}]'
      - path: /posts/{id}
        body: '($request.params.id | tonumber) as $i | {id: $i, userId: (($i - 1) / 10 | floor + 1), title: "post \($i)"}'
      - path: /users/{id}
        body: '{id: ($request.params.id | tonumber), name: "user \($request.params.id)"}'
      - path: /users
        body: '[$request.query.ids | split(",")[] | {id: tonumber, name: "user \(.)"}]'
      - path: /fail
        status: 500
        body: '{}'
"#;

const GATEWAY: &str = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
  users:
    url: "http://${API_ADDR}"
    batch:
      path: '"/users"'
      query: { ids: '$keys | join(",")' }
      split: 'map({key: (.id | tostring), value: .}) | from_entries'
      max: 100
routes:
  - path: /graphql
    graphql:
      schema: |
        type Query {
          posts: [Post!]!
          post(id: Int!): Post
          flaky: String
          strict: Strict
        }
        type Strict { value: String! }
        type Post {
          id: Int!
          title: String!
          userId: Int!
          user: User
          author: User
        }
        type User { id: Int! name: String! }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
        Query.post: { http: { backend: api, path: '"/posts/\($args.id)"' } }
        Query.flaky: { http: { backend: api, path: '"/fail"' } }
        Query.strict: { value: '{value: null}' }
        Post.user: { http: { backend: api, path: '"/users/\($parent.userId)"' } }
        Post.author: { http: { backend: users, key: '$parent.userId | tostring' } }
  - path: /strict
    graphql:
      introspection: false
      limits: { max_aliases: 2, max_depth: 3, max_cost: 50 }
      schema: |
        type Query { posts: [Post!]! }
        type Post { id: Int! user: User }
        type User { id: Int! name: String! best: Post }
      resolvers:
        Query.posts: { http: { backend: api, path: '"/posts"' } }
        Post.user: { http: { backend: api, path: '"/users/\($parent.id)"' } }
"#;

async fn post(gw: &fanout::RunningGateway, path: &str, body: Value) -> Resp {
    send(
        &client(false),
        Method::POST,
        &format!("http://{}{path}", gw.addr),
        &[("content-type", "application/json")],
        body.to_string(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_with_their_users_take_one_posts_call_and_one_call_per_distinct_user() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ posts { id title user { id name } } }"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.header("content-type"),
        Some("application/graphql-response+json")
    );
    let v = r.json();
    assert!(v.get("errors").is_none(), "{v}");
    let posts = v["data"]["posts"].as_array().unwrap();
    assert_eq!(posts.len(), 100);
    assert_eq!(
        posts[0],
        json!({"id": 1, "title": "post 1", "user": {"id": 1, "name": "user 1"}})
    );
    assert_eq!(posts[99]["user"], json!({"id": 10, "name": "user 10"}));
    assert_eq!(calls_to(&s, "GET /posts"), 1);
    assert_eq!(
        calls_to(&s, "GET /users/{id}"),
        10,
        "one call per distinct user"
    );

    // Through the backend's batch form: one call for the ten users.
    s.reset_stats();
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ posts { id author { name } } }"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(
        v["data"]["posts"][42],
        json!({"id": 43, "author": {"name": "user 5"}})
    );
    assert_eq!(calls_to(&s, "GET /posts"), 1);
    assert_eq!(calls_to(&s, "GET /users"), 1, "one batch call");
    assert_eq!(calls_to(&s, "GET /users/{id}"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_fragments_aliases_and_directives() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let query = r#"
        query Two($id: Int!, $withUser: Boolean!) {
          first: post(id: $id) { ...P user @include(if: $withUser) { name } }
          second: post(id: 2) { __typename id author @skip(if: true) { name } }
        }
        fragment P on Post { id title }
    "#;
    let r = post(
        &gw,
        "/graphql",
        json!({"query": query, "variables": {"id": 12, "withUser": true}, "operationName": "Two"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json(),
        json!({"data": {
            "first": {"id": 12, "title": "post 12", "user": {"name": "user 2"}},
            "second": {"__typename": "Post", "id": 2}
        }})
    );
    assert_eq!(
        calls_to(&s, "GET /users"),
        0,
        "a skipped field calls nothing"
    );

    // A variable of the wrong type: a request error, nothing called.
    s.reset_stats();
    let r = post(
        &gw,
        "/graphql",
        json!({"query": query, "variables": {"id": "x", "withUser": true}}),
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let v = r.json();
    assert!(v.get("data").is_none(), "{v}");
    assert_eq!(v["errors"][0]["extensions"]["code"], "BAD_USER_INPUT");
    assert_eq!(calls_to(&s, "GET /posts/{id}"), 0);

    // GET: a query in the URL; `application/json` when the client asks for it.
    let url = format!(
        "http://{}/graphql?query=%7Bpost(id%3A3)%7Btitle%7D%7D",
        gw.addr
    );
    let r = send(
        &client(false),
        Method::GET,
        &url,
        &[("accept", "application/json")],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), json!({"data": {"post": {"title": "post 3"}}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_nullable_field_gives_partial_data_and_a_failing_non_null_one_propagates() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ flaky post(id: 1) { id } }"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(v["data"], json!({"flaky": null, "post": {"id": 1}}));
    assert_eq!(v["errors"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["errors"][0]["path"], json!(["flaky"]));
    assert_eq!(
        v["errors"][0]["locations"],
        json!([{"line": 1, "column": 3}])
    );
    assert!(v["errors"][0]["extensions"]["code"].is_string(), "{v}");

    // `Strict.value` is non-null and null: `strict` (nullable) becomes null.
    let r = post(&gw, "/graphql", json!({"query": "{ strict { value } }"})).await;
    let v = r.json();
    assert_eq!(v["data"], json!({"strict": null}), "{v}");
    assert_eq!(v["errors"][0]["path"], json!(["strict", "value"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_an_operation_before_any_backend_call() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    for (query, code) in [
        (
            "{ a: posts { id } b: posts { id } c: posts { id } }",
            "MAX_ALIASES_EXCEEDED",
        ),
        ("{ posts { user { best { id } } } }", "MAX_DEPTH_EXCEEDED"),
        (
            "{ posts { id user { id name } } b: posts { id user { name } } }",
            "MAX_COST_EXCEEDED",
        ),
        ("{ __schema { types { name } } }", "INTROSPECTION_DISABLED"),
        ("{ posts { nope } }", "GRAPHQL_VALIDATION_FAILED"),
        ("{ posts { id }", "GRAPHQL_PARSE_FAILED"),
    ] {
        let r = post(&gw, "/strict", json!({"query": query})).await;
        assert_eq!(r.status, 400, "{query}: {:?}", r.body);
        let v = r.json();
        assert!(v.get("data").is_none(), "{v}");
        assert_eq!(v["errors"][0]["extensions"]["code"], code, "{v}");
    }
    let big = format!("{{ posts {{ id }} }} # {}", "x".repeat(40_000));
    let r = post(&gw, "/strict", json!({"query": big})).await;
    assert_eq!(
        r.json()["errors"][0]["extensions"]["code"],
        "MAX_DOCUMENT_BYTES_EXCEEDED"
    );
    assert_eq!(calls(&s, "api"), 0, "nothing was called");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_answers_the_schema() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = post(
        &gw,
        "/graphql",
        json!({"query": "{ __schema { queryType { name } types { name kind } } __type(name: \"Post\") { fields { name type { kind ofType { name } } } } }"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(v["data"]["__schema"]["queryType"]["name"], "Query", "{v}");
    let types: Vec<&str> = v["data"]["__schema"]["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for t in ["Query", "Post", "User", "String", "__Schema"] {
        assert!(types.contains(&t), "{t} in {types:?}");
    }
    assert_eq!(
        v["data"]["__type"]["fields"][0],
        json!({"name": "id", "type": {"kind": "NON_NULL", "ofType": {"name": "Int"}}})
    );
    assert_eq!(calls(&s, "api"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutations_run_their_root_fields_in_order_and_resolvers_read_the_request() {
    let stubs_yaml = r#"
services:
  api:
    listen: "${API_ADDR}"
    routes:
      - path: /posts
        method: POST
        latency: 30ms
        body: '{id: 7, title: $request.body.title, by: $request.body.by}'
"#;
    let gateway_yaml = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
routes:
  - path: /graphql
    graphql:
      schema: |
        type Query { me: String }
        type Mutation { addPost(title: String!): Post }
        type Post { id: Int! title: String! by: String }
      resolvers:
        Query.me: { value: '$request.headers["x-user"]' }
        Mutation.addPost:
          http:
            backend: api
            method: POST
            path: '"/posts"'
            body: '{title: $args.title, by: $request.headers["x-user"]}'
"#;
    let s = stubs(stubs_yaml).await;
    let gw = gateway(gateway_yaml, &s).await;
    let r = send(
        &client(false),
        Method::POST,
        &format!("http://{}/graphql", gw.addr),
        &[("content-type", "application/json"), ("x-user", "ada")],
        json!({"query": "mutation { a: addPost(title: \"one\") { id title by } b: addPost(title: \"two\") { title } }"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json(),
        json!({"data": {"a": {"id": 7, "title": "one", "by": "ada"}, "b": {"title": "two"}}})
    );
    let st = s.stats("api").unwrap();
    assert_eq!(st.routes["POST /posts"].requests, 2);
    assert_eq!(
        st.routes["POST /posts"].max_in_flight, 1,
        "one after the other"
    );

    // A mutation by GET is refused (405), and nothing is called.
    let url = format!(
        "http://{}/graphql?query=mutation%7BaddPost(title%3A%22x%22)%7Bid%7D%7D",
        gw.addr
    );
    let r = send(&client(false), Method::GET, &url, &[], "").await;
    assert_eq!(r.status, 405, "{:?}", r.body);
    assert_eq!(s.stats("api").unwrap().routes["POST /posts"].requests, 2);

    let r = send(
        &client(false),
        Method::POST,
        &format!("http://{}/graphql", gw.addr),
        &[("content-type", "application/json"), ("x-user", "bob")],
        json!({"query": "{ me }"}).to_string(),
    )
    .await;
    assert_eq!(r.json(), json!({"data": {"me": "bob"}}));
}

/// The config errors of `yaml` (loading must fail), as text.
fn load_errors(yaml: &str) -> String {
    match fanout::load_gateway("f.yaml", yaml, &|_: &str| None) {
        Ok(_) => panic!("the config loaded:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_graphql_route_is_checked_against_its_schema_at_load() {
    let with = |resolvers: &str, schema: &str| {
        format!(
            "backends:\n  api: {{ url: \"http://127.0.0.1:1\" }}\nroutes:\n  - path: /graphql\n    graphql:\n      schema: |\n{schema}      resolvers:\n{resolvers}"
        )
    };
    let schema = "        type Query { posts: [Post!]! }\n        type Post { id: Int! user: User }\n        type User { id: Int! }\n";
    let ok = "        Query.posts: { http: { backend: api, path: '\"/posts\"' } }\n";
    // An unknown field, with a did-you-mean, at the resolver's line and column.
    let e = load_errors(&with(
        &format!("{ok}        Post.usr: {{ value: '1' }}\n"),
        schema,
    ));
    assert!(
        e.contains("f.yaml:12:9: resolver `Post.usr`: type `Post` has no field `usr`"),
        "{e}"
    );
    assert!(e.contains("user"), "{e}");
    // An unknown type.
    let e = load_errors(&with(
        &format!("{ok}        Pots.user: {{ value: '1' }}\n"),
        schema,
    ));
    assert!(
        e.contains("f.yaml:12:9: resolver `Pots.user`: the schema has no type `Pots`"),
        "{e}"
    );
    // A root field without a resolver.
    let e = load_errors(&with("        Post.user: { value: '1' }\n", schema));
    assert!(e.contains("field `Query.posts` has no resolver"), "{e}");
    // An expression error inside a resolver, at its position; `$item` is not a resolver's name.
    let e = load_errors(&with(
        &format!("{ok}        Post.user: {{ http: {{ backend: api, path: '$item.id' }} }}\n"),
        schema,
    ));
    assert!(e.contains("f.yaml:12:"), "{e}");
    assert!(e.contains("$item"), "{e}");
    // An unknown backend.
    let e = load_errors(&with(
        "        Query.posts: { http: { backend: nope, path: '\"/\"' } }\n",
        schema,
    ));
    assert!(e.contains("nope"), "{e}");
    // An SDL error, at its line and column in the config.
    let e = load_errors(&with(
        ok,
        "        type Query { posts: [Post!]! }\n        type Post { id: Intt }\n",
    ));
    assert!(e.contains("f.yaml:8:25:"), "{e}");
    assert!(e.contains("Intt"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graphql_route_goes_through_authentication_and_resolvers_read_the_claims() {
    let key = fanout_testkit::jwt::EsKey::generate("k1");
    let jwks = json!({"keys": [key.jwk()]}).to_string();
    let gateway_yaml = format!(
        r#"
auth:
  providers:
    corp: {{ issuer: https://idp.test, keys: '{jwks}', algorithms: [ES256] }}
routes:
  - path: /graphql
    auth: {{ provider: corp }}
    graphql:
      schema: |
        type Query {{ me: String }}
      resolvers:
        Query.me: {{ value: '$request.auth.sub' }}
"#
    );
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_yaml, &s).await;
    let url = format!("http://{}/graphql", gw.addr);
    let body = json!({"query": "{ me }"}).to_string();
    let r = send(
        &client(false),
        Method::POST,
        &url,
        &[("content-type", "application/json")],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, 401, "{:?}", r.body);
    let token = key.sign(
        &json!({"iss": "https://idp.test", "sub": "ada", "exp": fanout_testkit::jwt::now() + 600}),
    );
    let bearer = format!("Bearer {token}");
    let r = send(
        &client(false),
        Method::POST,
        &url,
        &[
            ("content-type", "application/json"),
            ("authorization", &bearer),
        ],
        body,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json(), json!({"data": {"me": "ada"}}));
}
