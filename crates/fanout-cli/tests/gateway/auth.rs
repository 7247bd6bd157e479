//! JWT authentication at the edge (issue 48 §1): tokens minted by an independent library
//! (`jsonwebtoken`'s `encode`, keys made in the test: `fanout_testkit::jwt`), their keys served
//! as a JWK set by a real stub on 127.0.0.1; the classic attacks refused with 401, the reason
//! logged (never the token); a JWKS host down at start is 503 and not ready; a flood of unknown
//! `kid`s makes at most one fetch per cooldown; two users never share a coalesced run or a
//! deduplicated call when the flow reads `$request.auth`.

use crate::support::{config, gateway};
use fanout_expr::Expr;
use fanout_stub::StubServer;
use fanout_testkit::jwt::{self, EsKey};
use fanout_testkit::*;
use http::Method;

const ISS: &str = "https://idp.test";

/// The JWK set stub (`GET /jwks.json`) and a backend that says who asked (`GET /who`, slow
/// enough that concurrent calls overlap).
fn stubs_yaml(keys: &[&EsKey]) -> String {
    format!(
        r#"
services:
  idp:
    listen: "${{IDP_ADDR}}"
    routes:
      - path: /jwks.json
        body: '{}'
  api:
    listen: "${{API_ADDR}}"
    routes:
      - path: /who
        latency: 150ms
        body: '{{user: $request.headers["x-user"]}}'
"#,
        jwt::jwks(keys)
    )
}

/// Serve `keys` as the JWK set from now on.
fn serve_keys(s: &StubServer, keys: &[&EsKey]) {
    let mut b = (*s.behaviour("idp", "GET /jwks.json").expect("route")).clone();
    b.body = Some(Expr::compile(&jwt::jwks(keys), &["request"]).unwrap());
    assert!(s.set_behaviour("idp", "GET /jwks.json", b));
}

fn gateway_yaml(jwks_url: &str, cooldown: &str) -> String {
    format!(
        r#"
server: {{ error_log_per_second: 100000 }}
backends:
  api: {{ url: "http://${{API_ADDR}}", timeout: 2s }}
auth:
  providers:
    corp:
      issuer: {ISS}
      audiences: [orders]
      jwks_url: {jwks_url}
      algorithms: [ES256]
      leeway: 5s
      max_token_bytes: 2048
      refresh: {{ unknown_kid_cooldown: {cooldown}, fetch_timeout: 1s }}
defaults:
  deadline: 5s
  auth: {{ provider: corp }}
routes:
  - path: /who
    flow:
      who:
        http: {{ backend: api, path: '"/who"', headers: {{ x-user: '$request.auth.sub' }} }}
    respond: {{ body: '$who' }}
  - path: /plain
    flow:
      who:
        http: {{ backend: api, path: '"/who"' }}
    respond: {{ body: '$who' }}
  - path: /maybe
    auth: {{ provider: corp, mode: optional }}
    respond: {{ body: '{{auth: $request.auth}}' }}
  - path: /admin
    auth: {{ provider: corp, scopes: [admin] }}
    respond: {{ body: '1' }}
  - path: /open
    auth: {{ mode: none }}
    respond: {{ body: '1' }}
"#
    )
}

fn addr_of(s: &StubServer, name: &str) -> std::net::SocketAddr {
    s.services()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| a)
        .expect("stub service")
}

async fn ask(url: &str, token: Option<&str>, rid: &str) -> Resp {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut h = vec![("x-request-id", rid)];
    if let Some(b) = &bearer {
        h.push(("authorization", b.as_str()));
    }
    send(&client(false), Method::GET, url, &h, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_token_reaches_the_flow_and_every_attack_is_refused_and_logged() {
    let logs = capture_logs();
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let idp = addr_of(&s, "idp");
    let gw = gateway(&gateway_yaml(&format!("http://{idp}/jwks.json"), "1h"), &s).await;
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    let good = jwt::claims(ISS, "orders", "ann");

    // Accepted: the verified subject reaches the backend.
    let r = ask(&url("/who"), Some(&key.sign(&good)), "auth-ok-1").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "ann");

    // No token: 401 unauthenticated with a bare challenge.
    let r = ask(&url("/who"), None, "auth-missing-1").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.code(), "unauthenticated");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));

    let now = jwt::now();
    let with = |k: &str, v: serde_json::Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let attacks = [
        ("alg-none", jwt::unsigned(&good), "unsigned"),
        (
            "hmac-with-public-key",
            jwt::hmac_signed(key.jwk().to_string().as_bytes(), "k1", &good),
            "alg HS256",
        ),
        (
            "unknown-kid",
            key.sign_as("not-in-the-set", &good),
            "key id \"not-in-the-set\"",
        ),
        (
            "expired",
            key.sign(&with("exp", (now - 60).into())),
            "expired",
        ),
        (
            "not-yet-valid",
            key.sign(&with("nbf", (now + 120).into())),
            "not valid yet",
        ),
        (
            "wrong-issuer",
            key.sign(&with("iss", "https://evil.test".into())),
            "issuer",
        ),
        (
            "wrong-audience",
            key.sign(&with("aud", "billing".into())),
            "audience",
        ),
        (
            "too-large",
            key.sign(&with("pad", "x".repeat(3000).into())),
            "over max_token_bytes",
        ),
        (
            "other-signer",
            EsKey::generate("k1").sign(&good),
            "signature",
        ),
    ];
    for (name, token, reason) in &attacks {
        let rid = format!("auth-attack-{name}");
        let r = ask(&url("/who"), Some(token), &rid).await;
        assert_eq!(r.status, 401, "{name}: {}", r.text());
        assert_eq!(r.code(), "invalid_token", "{name}");
        assert_eq!(
            r.header("www-authenticate"),
            Some(r#"Bearer error="invalid_token""#),
            "{name}"
        );
        assert_eq!(
            r.json()["error"]["message"],
            "the token is not valid",
            "{name}: the reason is not the client's"
        );
        let lines = logs.lines_with(&format!("request_id={rid} "));
        assert_eq!(lines.len(), 1, "{name}: one log line: {lines:?}");
        assert!(lines[0].contains(reason), "{name}: {}", lines[0]);
        assert!(
            !lines[0].contains(token.as_str()),
            "{name}: the token is never logged"
        );
    }
    assert_eq!(
        calls(&s, "api"),
        1,
        "no refused request reached the backend"
    );

    // Optional: anonymous is null; a sent token must still be valid.
    let r = ask(&url("/maybe"), None, "auth-anon").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"auth": null}));
    let r = ask(&url("/maybe"), Some(&jwt::unsigned(&good)), "auth-anon-bad").await;
    assert_eq!(r.status, 401);
    let r = ask(&url("/maybe"), Some(&key.sign(&good)), "auth-anon-ok").await;
    assert_eq!(r.json()["auth"]["sub"], "ann");

    // A condition that fails: 403 insufficient_scope.
    let r = ask(&url("/admin"), Some(&key.sign(&good)), "auth-scope").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.code(), "forbidden");
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer error="insufficient_scope", scope="admin""#)
    );
    let r = ask(
        &url("/admin"),
        Some(&key.sign(&with("scope", "read admin".into()))),
        "auth-scope-ok",
    )
    .await;
    assert_eq!(r.status, 200);
    // `mode: none` turns the default off.
    assert_eq!(ask(&url("/open"), None, "auth-open").await.status, 200);

    // The status endpoint shows the keys and the refusals.
    let st = gw.gateway.status_json();
    let corp = &st["auth"]["providers"]["corp"];
    assert_eq!(corp["keys"], 1, "{st}");
    assert_eq!(corp["fetches"], 1, "{st}");
    assert_eq!(corp["refused"]["alg_none"], 2, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_kids_makes_at_most_one_fetch_per_cooldown() {
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let idp = addr_of(&s, "idp");
    let started = tokio::time::Instant::now();
    let gw = gateway(&gateway_yaml(&format!("http://{idp}/jwks.json"), "1s"), &s).await;
    let url = format!("http://{}/maybe", gw.addr);
    let url = url.as_str();
    assert_eq!(
        route_calls(&s, "idp", "GET /jwks.json"),
        1,
        "fetched at start"
    );
    let good = jwt::claims(ISS, "orders", "ann");
    let flood: Vec<String> = (0..60)
        .map(|i| key.sign_as(&format!("forged-{i}"), &good))
        .collect();
    let answers = futures_util::future::join_all(
        flood
            .iter()
            .enumerate()
            .map(|(i, t)| async move { ask(url, Some(t), &format!("auth-flood-{i}")).await }),
    )
    .await;
    assert!(answers.iter().all(|r| r.status == 401));
    let periods = started.elapsed().as_millis() as u64 / 1000;
    let fetches = route_calls(&s, "idp", "GET /jwks.json");
    assert!(
        fetches <= 2 + periods,
        "{fetches} fetches in {periods} full cooldowns (+ the start's and one)"
    );
    // A rotated key is found by the fetch an unknown kid makes once the cooldown allows.
    let rotated = EsKey::generate("k2");
    serve_keys(&s, &[&key, &rotated]);
    let token = rotated.sign(&good);
    wait_until_async("the rotated key is fetched", || async {
        ask(url, Some(&token), "auth-rotated").await.status == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_host_down_at_start_is_503_and_not_ready_until_it_answers() {
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let down = free_addr();
    let gw = gateway(
        &gateway_yaml(&format!("http://{down}/jwks.json"), "200ms"),
        &s,
    )
    .await;
    let url = format!("http://{}/who", gw.addr);
    let token = key.sign(&jwt::claims(ISS, "orders", "ann"));
    for (t, rid) in [(Some(token.as_str()), "auth-down-1"), (None, "auth-down-2")] {
        let r = ask(&url, t, rid).await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.code(), "auth_unavailable");
    }
    let ready = format!("http://{}/readyz", gw.admin_addr.unwrap());
    assert_eq!(get(&ready).await.status, 503, "not ready without keys");
    assert_eq!(calls(&s, "api"), 0);
    // The issuer comes up: the background retry loads the keys.
    let _idp = start_stubs(&format!(
        "services:\n  idp:\n    listen: \"{down}\"\n    routes:\n      - path: /jwks.json\n        body: '{}'\n",
        jwt::jwks(&[&key])
    ))
    .await;
    wait_until_async("ready once the keys load", || async {
        get(&ready).await.status == 200
    })
    .await;
    assert_eq!(ask(&url, Some(&token), "auth-down-3").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_never_share_a_coalesced_run_or_a_deduplicated_call() {
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let idp = addr_of(&s, "idp");
    let gw = gateway(&gateway_yaml(&format!("http://{idp}/jwks.json"), "10s"), &s).await;
    let url = format!("http://{}/who", gw.addr);
    let ann = key.sign(&jwt::claims(ISS, "orders", "ann"));
    let bob = key.sign(&jwt::claims(ISS, "orders", "bob"));
    let forged = jwt::unsigned(&jwt::claims(ISS, "orders", "ann"));
    // Concurrent: ann and bob, several each, and a forged token for ann while her run is live.
    let asks = (0..12).map(|i| {
        let (who, token) = match i % 3 {
            0 => ("ann", ann.as_str()),
            1 => ("bob", bob.as_str()),
            _ => ("forged", forged.as_str()),
        };
        let url = &url;
        async move { (who, ask(url, Some(token), &format!("auth-share-{i}")).await) }
    });
    for (who, r) in futures_util::future::join_all(asks).await {
        if who == "forged" {
            assert_eq!(r.status, 401, "a forged token never joins a run");
        } else {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["user"], who, "each user gets their own answer");
        }
    }
    // Each user's requests share a run (or a call): at most one backend call per user per
    // overlapping group, never one answer for both.
    let n = calls(&s, "api");
    assert!((2..=8).contains(&n), "{n} backend calls");
}

#[test]
fn explain_shows_each_routes_authentication() {
    let dir = TempDir::new("auth-explain");
    let yaml =
        gateway_yaml("http://127.0.0.1:9/jwks.json", "10s").replace("${API_ADDR}", "127.0.0.1:9");
    let cfg = dir.write("fanout.yaml", &yaml);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["explain", "-c", cfg.to_str().unwrap()])
        .env_remove("LISTEN")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let section = |route: &str| -> String {
        let start = text
            .find(&format!("GET {route}\n"))
            .unwrap_or_else(|| panic!("{route} in:\n{text}"));
        text[start..].split("\n\n").next().unwrap().to_string()
    };
    let who = section("/who");
    assert!(
        who.contains(
            "auth: a JWT from provider `corp`, required (no valid token: 401); issuer https://idp.test, keys from http://127.0.0.1:9/jwks.json"
        ),
        "{who}"
    );
    assert!(
        who.contains("$request.auth"),
        "the coalescing key names it: {who}"
    );
    assert!(section("/maybe").contains("optional"), "{text}");
    assert!(
        section("/admin").contains("scopes admin (else 403)"),
        "{text}"
    );
    assert!(section("/open").contains("auth: none"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_keys_of_an_unchanged_jwks_url_and_fetches_a_new_one_before_serving() {
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let idp = addr_of(&s, "idp");
    let yaml = gateway_yaml(&format!("http://{idp}/jwks.json"), "1h");
    let gw = gateway(&yaml, &s).await;
    let url = format!("http://{}/who", gw.addr);
    let token = key.sign(&jwt::claims(ISS, "orders", "ann"));
    assert_eq!(ask(&url, Some(&token), "auth-reload-1").await.status, 200);
    // The same JWKS URL and schedule: the keys are kept, nothing is fetched.
    let renamed = yaml.replace("path: /open", "path: /open2");
    gw.gateway.reload(config(&renamed, &s)).await.unwrap();
    assert_eq!(route_calls(&s, "idp", "GET /jwks.json"), 1);
    assert_eq!(ask(&url, Some(&token), "auth-reload-2").await.status, 200);
    // Another schedule is another cache: fetched before the new config serves.
    let changed = renamed.replace("fetch_timeout: 1s", "fetch_timeout: 2s");
    gw.gateway.reload(config(&changed, &s)).await.unwrap();
    assert_eq!(route_calls(&s, "idp", "GET /jwks.json"), 2);
    assert_eq!(ask(&url, Some(&token), "auth-reload-3").await.status, 200);
    // A reload whose new JWK set cannot be fetched is refused; the old config serves on.
    let unreachable = changed.replace(
        &format!("http://{idp}/jwks.json"),
        &format!("http://{}/jwks.json", free_addr()),
    );
    let err = gw
        .gateway
        .reload(config(&unreachable, &s))
        .await
        .unwrap_err();
    assert!(
        matches!(err, fanout_proxy::reload::ReloadError::Stage(ref why) if why.contains("JWK set")),
        "{err}"
    );
    assert_eq!(ask(&url, Some(&token), "auth-reload-5").await.status, 200);
    // A reload with a broken provider is refused at its line; the old config serves on.
    let broken = changed.replace("algorithms: [ES256]", "algorithms: [ES256, HS256]");
    let err = gw.gateway.reload(config(&broken, &s)).await.unwrap_err();
    assert!(err.to_string().contains("HS256"), "{err}");
    assert_eq!(ask(&url, Some(&token), "auth-reload-4").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_route_authenticates_like_an_http_one() {
    use crate::grpc::{Profile, ProfileRequest, example};
    let key = EsKey::generate("k1");
    let s = stubs(&example("stubs.yaml")).await;
    let yaml = format!(
        "{}\nauth:\n  providers:\n    corp: {{issuer: \"{ISS}\", keys: '{}', algorithms: [ES256]}}\n\
         defaults: {{auth: {{provider: corp}}}}\n",
        example("fanout.yaml"),
        jwt::jwks(&[&key])
    );
    let gw = gateway(&yaml, &s).await;
    let call = |token: Option<String>| {
        let addr = gw.addr;
        async move {
            let origin: http::Uri = format!("http://{addr}").parse().unwrap();
            let h2 =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .http2_only(true)
                    .build_http();
            let mut grpc = tonic::client::Grpc::with_origin(h2, origin);
            grpc.ready().await.unwrap();
            let mut req = tonic::Request::new(ProfileRequest {
                user_id: "u1".into(),
            });
            if let Some(t) = token {
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {t}").parse().unwrap());
            }
            grpc.unary(
                req,
                http::uri::PathAndQuery::from_static("/demo.v1.ProfileGateway/GetProfile"),
                tonic_prost::ProstCodec::<ProfileRequest, Profile>::default(),
            )
            .await
        }
    };
    let e = call(None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert_eq!(
        e.metadata().get("x-fanout-error-code").unwrap(),
        "unauthenticated"
    );
    let forged = jwt::unsigned(&jwt::claims(ISS, "orders", "ann"));
    let e = call(Some(forged)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert_eq!(
        e.metadata().get("x-fanout-error-code").unwrap(),
        "invalid_token"
    );
    assert_eq!(calls(&s, "users"), 0, "no refused call reached a backend");
    let ok = call(Some(key.sign(&jwt::claims(ISS, "orders", "ann"))))
        .await
        .unwrap();
    assert_eq!(ok.get_ref().user.as_ref().unwrap().id, "u1");
}

/// Issue 69 §6: a request with two `Authorization` headers is refused (400 `bad_header`) on
/// HTTP/1.1 and HTTP/2 — authentication would verify the first while the flow and the backends
/// see both joined — and so is one with two `Host` lines; neither reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_authorization_or_host_header_is_refused() {
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let idp = addr_of(&s, "idp");
    let gw = gateway(&gateway_yaml(&format!("http://{idp}/jwks.json"), "1h"), &s).await;
    let good = format!("Bearer {}", key.sign(&jwt::claims(ISS, "orders", "ann")));
    for h2 in [false, true] {
        for (path, second) in [("/who", "Bearer garbage"), ("/open", "Basic dTpw")] {
            let r = send(
                &client(h2),
                Method::GET,
                &format!("http://{}{path}", gw.addr),
                &[("authorization", good.as_str()), ("authorization", second)],
                "",
            )
            .await;
            assert_eq!(r.status, 400, "h2 {h2} {path}: {}", r.text());
            assert_eq!(r.code(), "bad_header");
            assert!(
                r.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("authorization"),
                "{}",
                r.text()
            );
        }
        // One is fine.
        let r = send(
            &client(h2),
            Method::GET,
            &format!("http://{}/who", gw.addr),
            &[("authorization", good.as_str())],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = send(
        &client(false),
        Method::GET,
        &format!("http://{}/open", gw.addr),
        &[("host", "a.example"), ("host", "b.example")],
        "",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.code(), "bad_header");
    assert_eq!(
        calls(&s, "api"),
        2,
        "only the two good requests were served"
    );
}

/// Issue 69 §3: a token whose `alg` holds a line break and a forged log line gets 401, and the
/// real binary's text log (`fanout serve --log-format text`) stays one line per event: no line
/// starts with the forged timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_alg_never_starts_a_log_line_of_its_own() {
    let key = EsKey::generate("k1");
    let yaml = format!(
        "auth:\n  providers:\n    corp: {{issuer: \"{ISS}\", keys: '{}', algorithms: [ES256]}}\n\
         server: {{error_log_per_second: 100000}}\n\
         routes:\n  - path: /r\n    auth: {{provider: corp}}\n    respond: {{body: '1'}}\n",
        jwt::jwks(&[&key])
    );
    let gw =
        crate::support::ServeProcess::start_logging("auth-forged-alg", &yaml, &[], &[], "text")
            .await;
    let forged = "RS256\n2026-01-01T00:00:00.000000Z  INFO fanout: FORGED admin logged in";
    let token = key.sign_header(
        &serde_json::json!({"alg": forged, "kid": "k1"}),
        &jwt::claims(ISS, "orders", "ann"),
    );
    let r = ask(
        &format!("http://127.0.0.1:{}/r", gw.port),
        Some(&token),
        "auth-forged-alg-1",
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text());
    wait_until("the refusal is logged", || {
        gw.log().contains("auth-forged-alg-1")
    })
    .await;
    let log = gw.log();
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01")),
        "a forged line:\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("auth-forged-alg-1"))
        .unwrap();
    assert!(
        line.contains("FORGED"),
        "the value is kept, escaped: {line}"
    );
}

/// Issue 70 §5: a provider's key URL may name a backend (`backend://NAME/path`): the JWK set is
/// fetched through that backend's client and stack (its TLS roots, client certificate, timeouts,
/// breaker), not a client of its own with fixed roots. The URL holds no address: the keys can only
/// have come through the backend. A name that is no backend is a config error at its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwk_set_is_fetched_through_a_named_backend() {
    let key = EsKey::generate("k1");
    let s = stubs(&stubs_yaml(&[&key])).await;
    let yaml = gateway_yaml("backend://idp/jwks.json", "1h").replace(
        "backends:\n",
        "backends:\n  idp: { url: \"http://${IDP_ADDR}\", timeout: 1s }\n",
    );
    let gw = gateway(&yaml, &s).await;
    let url = format!("http://{}/who", gw.addr);
    let r = ask(
        &url,
        Some(&key.sign(&jwt::claims(ISS, "orders", "ann"))),
        "auth-backend-1",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "ann");
    assert!(calls(&s, "idp") >= 1, "the set came from the idp stub");
    let status = get(&format!(
        "http://{}/__fanout/status",
        gw.admin_addr.unwrap()
    ))
    .await
    .json();
    assert_eq!(
        status["auth"]["providers"]["corp"]["jwks_url"], "backend://idp/jwks.json",
        "{status}"
    );

    let broken = gateway_yaml("backend://nope/jwks.json", "1h");
    let lookup = |n: &str| Some(if n == "API_ADDR" { "127.0.0.1:1" } else { "" }.to_string());
    let err = fanout::load_gateway("fanout.yaml", &broken, &lookup)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("names backend `nope`, which is not in `backends:`"),
        "{err}"
    );
    let line = broken
        .lines()
        .position(|l| l.contains("backend://nope"))
        .unwrap()
        + 1;
    assert!(err.contains(&format!("fanout.yaml:{line}:")), "{err}");
}
