//! GraphQL routes read by independent clients (tier 2; issue 72's acceptance, docs/graphql.md
//! "Checked by"): the graphql-posts example and a schema using every part of the type system
//! an introspection answer carries, behind real stubs.
//! - Python `graphql-core` reads each route's introspection answer (`build_client_schema`) and
//!   prints the schema the config's SDL prints (`print_schema(build_schema(SDL))`): descriptions,
//!   deprecations (of fields, arguments, input fields and enum values), default values,
//!   `@specifiedBy`, custom directives (repeatable), interfaces implementing interfaces, unions,
//!   input types, the schema's description and root types.
//! - The Python `gql` client (the schema fetched by introspection, each operation validated
//!   against it before it is sent) runs queries with variables and fragments and a mutation and
//!   gets the expected data; the stubs' counters show the calls each took. A query beyond a limit
//!   is refused with a GraphQL error, and the stubs got no call.
//! - The graphql-http server audit (`scripts/graphql-audit`, the npm package pinned by its
//!   lockfile, installed with `npm ci`): every MUST passes; the SHOULDs that warn are exactly
//!   those docs/graphql.md lists with why.
//! - What the audit found, in tier 1: a POST that is not JSON is 415, a parameter of the wrong
//!   type keeps its 400 whatever the client accepts.
//!
//! The tools are installed once (`support/python.rs`).

use crate::support::{gateway, python};
use fanout_testkit::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python packages the test pins (`gql`'s `requests` transport).
const GQL: &str = "gql[requests]==4.4.0";
const GRAPHQL_CORE: &str = "graphql-core==3.3.2";

fn example(file: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/graphql-posts");
    std::fs::read_to_string(dir.join(file)).unwrap()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/py/graphql_clients.py")
}

/// A route whose schema uses every part of the type system an introspection answer carries;
/// `Root.article` calls the example's stub, the other resolvers are values.
const RICH: &str = r#"
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  api: { url: "http://${API_ADDR}" }
routes:
  - path: /rich
    graphql:
      limits: { max_cost: 60 }
      schema: |
        """
        A schema that uses every part of the type system an introspection answer carries.
        """
        schema {
          query: Root
          mutation: Changes
        }

        "How long an answer may be cached."
        directive @cacheHint(
          "Seconds."
          maxAge: Int = 60
          scope: Scope = PUBLIC
        ) repeatable on FIELD_DEFINITION | OBJECT

        directive @internal on FIELD_DEFINITION

        "Where a cached answer may be kept."
        enum Scope {
          "Any cache."
          PUBLIC
          PRIVATE @deprecated(reason: "Use `PUBLIC` with a `Vary`.")
          NONE @deprecated
        }

        "An instant, as RFC 3339 text."
        scalar DateTime @specifiedBy(url: "https://www.rfc-editor.org/rfc/rfc3339")

        scalar Cursor

        "Something with an id."
        interface Node {
          "The id, unique among all nodes."
          id: ID!
        }

        "Something with a title."
        interface Titled implements Node {
          id: ID!
          title(upper: Boolean = false): String!
        }

        """
        An article.

        Its text is elsewhere.
        """
        type Article implements Node & Titled @cacheHint(maxAge: 30) {
          id: ID!
          title(upper: Boolean = false): String!
          "When it was published."
          published: DateTime
          score: Float
          tags: [String!]
          byline: String @deprecated(reason: "Use `author`.")
          author: Person @internal
        }

        type Person implements Node {
          id: ID!
          name: String!
          legacyName: String @deprecated
        }

        "What a search finds."
        union Found = Article | Person

        "How to search."
        input Search {
          "Words to look for."
          text: String!
          first: Int = 10
          kinds: [Kind!] = [ARTICLE, PERSON]
          within: Window = {from: "2020-01-01T00:00:00Z"}
          after: Cursor
          exact: Boolean @deprecated(reason: "Always exact now.")
        }

        input Window {
          from: DateTime!
          to: DateTime
        }

        enum Kind {
          ARTICLE
          PERSON
        }

        type Root {
          "A node by its id."
          node(id: ID!): Node
          search(
            "What to look for."
            query: Search!
            limit: Int = 5 @deprecated(reason: "Use `query.first`.")
          ): [Found!]!
          article(id: ID! = "1"): Article @cacheHint(maxAge: 5) @cacheHint(maxAge: 10)
          now: DateTime
          ratio(of: Float = 0.5, big: Int = -3, word: String = "a \"quoted\"\nline"): Float
        }

        type Changes {
          "Renames an article."
          rename(id: ID!, title: String!): Article
        }
      resolvers:
        Root.node: { value: 'if $args.id == "p1" then {__typename: "Person", id: "p1", name: "Ada"} else {__typename: "Article", id: $args.id, title: "article \($args.id)", tags: []} end' }
        Root.search: { value: '[{__typename: "Article", id: "1", title: "found \($args.query.text)", tags: ["a"], score: 1.5}, {__typename: "Person", id: "p1", name: "Ada"}] | .[0:$args.query.first]' }
        Root.article: { http: { backend: api, path: '"/posts/\($args.id)"' } }
        Root.now: { value: '"2026-11-29T00:00:00Z"' }
        Root.ratio: { value: '$args.of' }
        Changes.rename: { value: '{id: $args.id, title: $args.title}' }
        Article.title: { value: 'if $args.upper then "ARTICLE \($parent.id)" else $parent.title end' }
"#;

/// The SDL of the first GraphQL route of a config.
fn sdl(yaml: &str, stubs: &fanout_stub::StubServer) -> String {
    let cfg = crate::support::config(yaml, stubs);
    let g = cfg
        .routes
        .iter()
        .find_map(|r| r.graphql.as_ref())
        .expect("a graphql route");
    g.source.as_ref().expect("its schema").text.clone()
}

/// `graphql_clients.py` with `args`: its JSON line.
async fn py_client(py: &Path, args: Vec<String>) -> Value {
    let py = py.to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        python::run_bounded(
            Command::new(&py).arg(script()).args(&args),
            &format!("graphql_clients.py {}", args.join(" ")),
            std::time::Duration::from_secs(300),
        )
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `gql` runs `query` (written to a file in `dir`) against `url`.
async fn gql(py: &Path, dir: &TempDir, url: &str, query: &str, variables: Value) -> Value {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = dir.join(format!("q{n}.graphql"));
    std::fs::write(&file, query).unwrap();
    py_client(
        py,
        vec![
            "run".into(),
            url.into(),
            file.display().to_string(),
            variables.to_string(),
        ],
    )
    .await
}

fn route_calls(s: &fanout_stub::StubServer, route: &str) -> u64 {
    fanout_testkit::route_calls(s, "api", route)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs python3 (graphql-core and gql from PyPI)"]
async fn graphql_core_prints_the_configs_schema_from_introspection_and_gql_runs_operations() {
    let py = tokio::task::spawn_blocking(|| {
        python::venv_or_panic(&[GQL, GRAPHQL_CORE], &["graphql", "gql", "requests"])
    })
    .await
    .unwrap();
    let s = stubs(&example("stubs.yaml")).await;
    let posts = gateway(&example("fanout.yaml"), &s).await;
    let rich = gateway(RICH, &s).await;
    let posts_url = format!("http://{}/graphql", posts.addr);
    let rich_url = format!("http://{}/rich", rich.addr);
    let dir = TempDir::new("graphql-interop");

    // The introspection answer, read by graphql-core, prints the schema the SDL prints.
    for (name, url, yaml) in [
        ("graphql-posts", &posts_url, example("fanout.yaml")),
        ("rich", &rich_url, RICH.to_string()),
    ] {
        let file = dir.join(format!("{name}.graphql"));
        std::fs::write(&file, sdl(&yaml, &s)).unwrap();
        let v = py_client(
            &py,
            vec!["schema".into(), url.clone(), file.display().to_string()],
        )
        .await;
        let (Some(introspected), Some(printed)) = (v["introspected"].as_str(), v["sdl"].as_str())
        else {
            panic!("{name}: {v}");
        };
        assert_eq!(introspected, printed, "{name}: introspected vs SDL");
        eprintln!(
            "{name}: the introspected schema prints as the SDL ({} lines)",
            printed.lines().count()
        );
    }
    assert_eq!(calls(&s, "api"), 0, "introspection calls nothing");

    // gql: variables, named fragments, @include, the users of the page through the batch form.
    let page = gql(
        &py,
        &dir,
        &posts_url,
        "query Page($id: Int!, $withUser: Boolean!) {
           post(id: $id) { ...PostFields user @include(if: $withUser) { ...UserFields } }
           posts { id author { ...UserFields } }
         }
         fragment PostFields on Post { id title }
         fragment UserFields on User { id name }",
        json!({"id": 12, "withUser": true}),
    )
    .await;
    assert!(page.get("errors").is_none(), "{page}");
    assert_eq!(
        page["data"]["post"],
        json!({"id": 12, "title": "post 12", "user": {"id": 2, "name": "User 2"}})
    );
    let list = page["data"]["posts"].as_array().unwrap();
    assert_eq!(list.len(), 100);
    assert_eq!(
        list[99],
        json!({"id": 100, "author": {"id": 10, "name": "User 10"}})
    );
    for (route, n) in [
        ("GET /posts/{id}", 1),
        ("GET /users/{id}", 1),
        ("GET /posts", 1),
        ("GET /users", 1),
    ] {
        assert_eq!(route_calls(&s, route), n, "{route}");
    }

    // Interfaces, unions, input objects with defaults, fragments on an interface and a union
    // member, a variable's default, ID values as strings.
    let found = gql(
        &py,
        &dir,
        &rich_url,
        "query Find($q: Search!, $upper: Boolean = false) {
           search(query: $q) { __typename ... on Titled { id title(upper: $upper) } ...Who }
           node(id: \"p1\") { id ...Who }
           other: node(id: \"7\") { __typename ... on Article { title tags } }
           ratio
           now
         }
         fragment Who on Person { name }",
        json!({"q": {"text": "x", "first": 2}, "upper": true}),
    )
    .await;
    assert_eq!(
        found,
        json!({"data": {
            "search": [
                {"__typename": "Article", "id": "1", "title": "ARTICLE 1"},
                {"__typename": "Person", "name": "Ada"}
            ],
            "node": {"id": "p1", "name": "Ada"},
            "other": {"__typename": "Article", "title": "article 7", "tags": []},
            "ratio": 0.5,
            "now": "2026-11-29T00:00:00Z"
        }})
    );
    // A backend's integer id answered as an `ID` (a string), and a mutation.
    let article = gql(
        &py,
        &dir,
        &rich_url,
        "query { article(id: 3) { id title } }",
        json!({}),
    )
    .await;
    assert_eq!(
        article,
        json!({"data": {"article": {"id": "3", "title": "post 3"}}})
    );
    let renamed = gql(
        &py,
        &dir,
        &rich_url,
        "mutation Rename($t: String!) { rename(id: \"3\", title: $t) { id title } }",
        json!({"t": "new"}),
    )
    .await;
    assert_eq!(
        renamed,
        json!({"data": {"rename": {"id": "3", "title": "new"}}})
    );

    // Beyond a limit: a GraphQL error, and the stubs got no call.
    s.reset_stats();
    let aliases: String = (1..=11)
        .map(|i| format!("p{i}: post(id: {i}) {{ id }} "))
        .collect();
    let refused = gql(
        &py,
        &dir,
        &posts_url,
        &format!("{{ {aliases} }}"),
        json!({}),
    )
    .await;
    assert_eq!(
        refused["errors"][0]["extensions"]["code"], "MAX_ALIASES_EXCEEDED",
        "{refused}"
    );
    assert_eq!(refused["data"], Value::Null, "{refused}");
    // The estimated cost (60 on this route): the article's 3, the search's 1 and 7 fields × the
    // 10 results assumed of a list.
    let refused = gql(
        &py,
        &dir,
        &rich_url,
        "{ article { id title }
           search(query: {text: \"x\"}) {
             ... on Article { id title score tags published }
             ... on Person { id name }
           } }",
        json!({}),
    )
    .await;
    assert_eq!(
        refused["errors"][0]["extensions"]["code"], "MAX_COST_EXCEEDED",
        "{refused}"
    );
    assert_eq!(calls(&s, "api"), 0, "nothing was called");
}

/// The SHOULD audits of graphql-http that the example's route fails, each listed with why in
/// docs/graphql.md ("Checked by"): both assume an answer in `application/json` when the client
/// accepts anything, which the GraphQL-over-HTTP draft replaced after its 2025-01-01 watershed.
const SHOULD_WARNINGS: [&str; 2] = ["47DE", "80D8"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs node and npm (graphql-http from npm)"]
async fn the_graphql_http_audit_passes_every_must() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/graphql-audit")
        .canonicalize()
        .unwrap();
    let installed = {
        let source = source.clone();
        tokio::task::spawn_blocking(move || python::npm_ci("graphql-audit", &source))
            .await
            .unwrap()
    };
    // The script beside the installed packages (a link to them: node resolves `graphql-http`
    // from the script's folder).
    let dir = TempDir::new("graphql-audit");
    std::fs::copy(source.join("audit.mjs"), dir.join("audit.mjs")).unwrap();
    std::os::unix::fs::symlink(installed.join("node_modules"), dir.join("node_modules")).unwrap();

    let s = stubs(&example("stubs.yaml")).await;
    let gw = gateway(&example("fanout.yaml"), &s).await;
    let url = format!("http://{}/graphql", gw.addr);
    let script = dir.join("audit.mjs");
    // Each of the audit's requests is bounded (30 s); this ends a hung run.
    let out = tokio::task::spawn_blocking(move || {
        python::output_bounded(
            Command::new("node").arg(&script).arg(&url),
            "node audit.mjs",
            std::time::Duration::from_secs(600),
        )
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e} (node: `apt-get install nodejs`)"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let audits: Vec<&Value> = lines.iter().filter(|l| l.get("id").is_some()).collect();
    assert!(audits.len() >= 60, "the whole audit ran: {}", audits.len());
    let of = |level: &str, pass: bool| -> Vec<String> {
        audits
            .iter()
            .filter(|a| a["name"].as_str().unwrap().starts_with(level))
            .filter(|a| (a["status"] == "ok") == pass)
            .map(|a| format!("{} {}", a["id"].as_str().unwrap(), a["name"]))
            .collect()
    };
    assert!(
        of("MUST", false).is_empty(),
        "MUSTs failing: {:#?}",
        of("MUST", false)
    );
    assert!(out.status.success(), "the audit failed: {text}");
    let warned: Vec<String> = of("SHOULD", false)
        .iter()
        .map(|a| a[..4].to_string())
        .collect();
    assert_eq!(
        warned,
        SHOULD_WARNINGS,
        "the SHOULDs failing: {:#?}",
        of("SHOULD", false)
    );
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/graphql.md"),
    )
    .unwrap();
    for id in SHOULD_WARNINGS {
        assert!(docs.contains(id), "docs/graphql.md lists {id} with why");
    }
    eprintln!(
        "graphql-http audit: {} audits, MUST {} ok, SHOULD {} ok ({} warn), MAY {} ok",
        audits.len(),
        of("MUST", true).len(),
        of("SHOULD", true).len(),
        warned.len(),
        of("MAY", true).len()
    );
}

/// What the audit found, checked in tier 1 too: a POST that is not JSON is 415, a parameter of
/// the wrong type is 400 whatever media type the client accepts, a GraphQL request error is 200
/// under `application/json`, and nothing is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_is_not_well_formed_keeps_its_4xx_and_calls_nothing() {
    use http::Method;
    let s = stubs(&example("stubs.yaml")).await;
    let gw = gateway(&example("fanout.yaml"), &s).await;
    let url = format!("http://{}/graphql", gw.addr);
    let body = json!({"query": "{ posts { id } }"}).to_string();
    for (content_type, accept) in [
        (None, None),
        (Some("text/plain;charset=UTF-8"), None),
        (
            Some("application/x-www-form-urlencoded"),
            Some("application/json"),
        ),
    ] {
        let mut headers = Vec::new();
        headers.extend(content_type.map(|c| ("content-type", c)));
        headers.extend(accept.map(|a| ("accept", a)));
        let r = send(&client(false), Method::POST, &url, &headers, body.clone()).await;
        assert_eq!(r.status, 415, "{content_type:?}: {:?}", r.body);
        let v = r.json();
        assert_eq!(
            v["errors"][0]["extensions"]["code"],
            "UNSUPPORTED_MEDIA_TYPE"
        );
        assert!(v.get("data").is_none(), "{v}");
    }
    let json_post = |accept: &'static str, body: Value| {
        let url = url.clone();
        async move {
            send(
                &client(false),
                Method::POST,
                &url,
                &[("content-type", "application/json"), ("accept", accept)],
                body.to_string(),
            )
            .await
        }
    };
    for accept in ["application/json", "application/graphql-response+json"] {
        for body in [
            json!({"query": "{ posts { id } }", "extensions": "x"}),
            json!({"query": 1}),
            json!({"operationName": "A"}),
        ] {
            let r = json_post(accept, body.clone()).await;
            assert_eq!(r.status, 400, "{accept} {body}: {:?}", r.body);
            assert_eq!(r.json()["errors"][0]["extensions"]["code"], "BAD_REQUEST");
        }
    }
    // A well-formed request that fails validation: 200 under `application/json`, 400 under
    // the new type.
    let bad = json!({"query": "{ posts { nope } }"});
    let r = json_post("application/json", bad.clone()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json()["errors"][0]["extensions"]["code"],
        "GRAPHQL_VALIDATION_FAILED"
    );
    let r = json_post("application/graphql-response+json", bad).await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    // GET: `extensions` must be a JSON object too.
    let r = send(
        &client(false),
        Method::GET,
        &format!("{url}?query=%7Bposts%7Bid%7D%7D&extensions=%5B1%5D"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(calls(&s, "api"), 0, "nothing was called");
}
