//! fanout-auth through its public interface: tokens minted by `jsonwebtoken`'s `encode` with
//! keys made in the test (fanout_testkit::jwt), every classic attack refused with its reason,
//! the route conditions, the verified-token cache, and the JWK set fetches (single-flight on an
//! unknown `kid`, at most one per cooldown, on tokio's paused clock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fanout_auth::{Auth, Denied, Fetch, FetchError, FetchFuture, Fetched, TokenError};
use fanout_config::Config;
use fanout_expr::json::to_string;
use fanout_testkit::jwt::{self, EsKey};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ISS: &str = "https://idp.test";

fn config(yaml: &str) -> Config {
    Config::from_yaml("auth.yaml", yaml, &|_: &str| None).unwrap_or_else(|e| panic!("{e}"))
}

fn no_fetch() -> Result<Arc<dyn Fetch>, FetchError> {
    Err(FetchError::Transport("no fetch in this test".into()))
}

/// A config with one provider of inline keys, and routes `/r` (required), `/o` (optional),
/// `/admin` (scope admin), `/acme` (require tenant acme).
fn inline(key: &EsKey, extra: &str) -> Config {
    let jwks = jwt::jwks(&[key]);
    config(&format!(
        r#"
auth:
  providers:
    corp:
      issuer: {ISS}
      audiences: [orders]
      keys: '{jwks}'
      algorithms: [ES256]
      leeway: 5s
{extra}
routes:
  - path: /r
    auth: {{provider: corp}}
    respond: {{body: '$request.auth.sub'}}
  - path: /o
    auth: {{provider: corp, mode: optional}}
    respond: {{body: '$request.auth'}}
  - path: /admin
    auth: {{provider: corp, scopes: [admin]}}
    respond: {{body: '1'}}
  - path: /acme
    auth: {{provider: corp, require: '$auth.tenant == "acme"'}}
    respond: {{body: '1'}}
  - path: /open
    respond: {{body: '1'}}
"#
    ))
}

fn bearer(token: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    h
}

async fn check(auth: &Auth, route: usize, token: &str) -> Result<fanout_expr::Val, Denied> {
    auth.authenticate(auth.policy(route).unwrap(), &bearer(token), None)
        .await
}

fn invalid(r: Result<fanout_expr::Val, Denied>) -> TokenError {
    match r {
        Err(Denied::Invalid(e)) => e,
        other => panic!("expected an invalid token, got {other:?}"),
    }
}

#[tokio::test]
async fn a_token_minted_by_jsonwebtoken_is_accepted_and_its_claims_are_the_value() {
    let key = EsKey::generate("k1");
    let auth = Auth::build(&inline(&key, ""), None, no_fetch).unwrap();
    let token = key.sign(&jwt::claims(ISS, "orders", "ann"));
    let claims = check(&auth, 0, &token).await.unwrap();
    assert!(
        to_string(&claims).contains(r#""sub":"ann""#),
        "{}",
        to_string(&claims)
    );
    assert!(
        auth.policy(4).is_none(),
        "a route without auth has no policy"
    );
}

#[tokio::test]
async fn every_classic_attack_is_refused_with_its_reason() {
    let key = EsKey::generate("k1");
    let other = EsKey::generate("k1");
    let auth = Auth::build(&inline(&key, "      max_token_bytes: 2048"), None, no_fetch).unwrap();
    let good = jwt::claims(ISS, "orders", "ann");
    let with = |k: &str, v: serde_json::Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let now = jwt::now();
    // alg: none.
    assert_eq!(
        invalid(check(&auth, 0, &jwt::unsigned(&good)).await),
        TokenError::AlgNone
    );
    // An HMAC token whose secret is the provider's public key.
    let confused = jwt::hmac_signed(&key.public, "k1", &good);
    assert!(matches!(
        invalid(check(&auth, 0, &confused).await),
        TokenError::Algorithm(_)
    ));
    let confused_jwk = jwt::hmac_signed(key.jwk().to_string().as_bytes(), "k1", &good);
    assert!(matches!(
        invalid(check(&auth, 0, &confused_jwk).await),
        TokenError::Algorithm(_)
    ));
    // A kid the keys lack (fixed keys: no fetch).
    assert!(matches!(
        invalid(check(&auth, 0, &key.sign_as("nope", &good)).await),
        TokenError::UnknownKid(_)
    ));
    // Signed by another key under the same kid.
    assert_eq!(
        invalid(check(&auth, 0, &other.sign(&good)).await),
        TokenError::Signature
    );
    // Expired beyond the leeway (5s); within it, accepted.
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&with("exp", (now - 60).into()))).await),
        TokenError::Expired
    );
    check(&auth, 0, &key.sign(&with("exp", (now - 2).into())))
        .await
        .unwrap();
    // Not valid yet beyond the leeway.
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&with("nbf", (now + 60).into()))).await),
        TokenError::NotYetValid
    );
    // Wrong issuer, no issuer, wrong audience, no audience.
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&with("iss", "https://evil".into()))).await),
        TokenError::Issuer
    );
    let mut no_iss = good.clone();
    no_iss.as_object_mut().unwrap().remove("iss");
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&no_iss)).await),
        TokenError::MissingClaim("iss".into())
    );
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&with("aud", "billing".into()))).await),
        TokenError::Audience
    );
    let mut no_aud = good.clone();
    no_aud.as_object_mut().unwrap().remove("aud");
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&no_aud)).await),
        TokenError::MissingClaim("aud".into())
    );
    // Over the size limit: refused unread.
    let big = key.sign(&with("pad", "x".repeat(3000).into()));
    assert!(matches!(
        invalid(check(&auth, 0, &big).await),
        TokenError::TooLarge { max: 2048, .. }
    ));
    // Not a JWT at all.
    assert!(matches!(
        invalid(check(&auth, 0, "abc.def").await),
        TokenError::Malformed(_)
    ));
    // The reasons never hold the token.
    let reason = invalid(check(&auth, 0, &key.sign_as("nope", &good)).await).to_string();
    assert!(!reason.contains(&key.sign_as("nope", &good)));
}

#[tokio::test]
async fn modes_and_conditions_decide_after_verification() {
    let key = EsKey::generate("k1");
    let auth = Auth::build(&inline(&key, ""), None, no_fetch).unwrap();
    let none = http::HeaderMap::new();
    // Required: no token is `Missing`; optional: anonymous is null, a bad token still refused.
    assert_eq!(
        auth.authenticate(auth.policy(0).unwrap(), &none, None)
            .await,
        Err(Denied::Missing)
    );
    let anon = auth
        .authenticate(auth.policy(1).unwrap(), &none, None)
        .await
        .unwrap();
    assert_eq!(to_string(&anon), "null");
    assert!(matches!(
        check(&auth, 1, &jwt::unsigned(&jwt::claims(ISS, "orders", "x"))).await,
        Err(Denied::Invalid(TokenError::AlgNone))
    ));
    // Scopes.
    let mut c = jwt::claims(ISS, "orders", "ann");
    c["scope"] = "read write".into();
    match check(&auth, 2, &key.sign(&c)).await {
        Err(Denied::Forbidden { scopes, .. }) => assert_eq!(scopes, ["admin"]),
        other => panic!("{other:?}"),
    }
    c["scope"] = "read admin".into();
    check(&auth, 2, &key.sign(&c)).await.unwrap();
    // A jq condition over the claims.
    c["tenant"] = "globex".into();
    assert!(matches!(
        check(&auth, 3, &key.sign(&c)).await,
        Err(Denied::Forbidden { .. })
    ));
    c["tenant"] = "acme".into();
    check(&auth, 3, &key.sign(&c)).await.unwrap();
}

#[tokio::test]
async fn a_token_sent_again_is_taken_from_the_verified_cache() {
    let key = EsKey::generate("k1");
    let auth = Auth::build(&inline(&key, ""), None, no_fetch).unwrap();
    let token = key.sign(&jwt::claims(ISS, "orders", "ann"));
    for _ in 0..5 {
        check(&auth, 0, &token).await.unwrap();
    }
    let st = auth.status_json();
    assert_eq!(st["providers"]["corp"]["accepted"], 5, "{st}");
    assert_eq!(st["providers"]["corp"]["accepted_from_cache"], 4, "{st}");
    assert_eq!(st["verified_cache"]["entries"], 1, "{st}");
    // Bounded: a cache of 2 holds 2 of 5 tokens.
    let small = Auth::build(
        &config(&format!(
            "auth:\n  verified_cache_entries: 2\n{}",
            &inline_yaml_rest(&key)
        )),
        None,
        no_fetch,
    )
    .unwrap();
    for sub in ["a", "b", "c", "d", "e"] {
        check(&small, 0, &key.sign(&jwt::claims(ISS, "orders", sub)))
            .await
            .unwrap();
    }
    assert_eq!(small.status_json()["verified_cache"]["entries"], 2);
}

/// The providers and a route, to follow an `auth:` line that sets other fields.
fn inline_yaml_rest(key: &EsKey) -> String {
    format!(
        r#"  providers:
    corp:
      issuer: {ISS}
      audiences: [orders]
      keys: '{}'
      algorithms: [ES256]
routes:
  - path: /r
    auth: {{provider: corp}}
    respond: {{body: '1'}}
"#,
        jwt::jwks(&[key])
    )
}

#[test]
fn bad_provider_configs_are_refused_at_their_line() {
    let key = EsKey::generate("k1");
    let jwks = jwt::jwks(&[&key]);
    let refused = |yaml: &str| -> String {
        match Auth::build(&config(yaml), None, no_fetch) {
            Ok(_) => panic!("accepted:\n{yaml}"),
            Err(e) => e
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    };
    let route = "routes:\n  - path: /r\n    auth: {provider: corp}\n    respond: {body: '1'}\n";
    // HMAC with public keys.
    let e = refused(&format!(
        "auth:\n  providers:\n    corp:\n      issuer: x\n      keys: '{jwks}'\n      algorithms: [ES256, HS256]\n{route}"
    ));
    assert!(e.contains("HS256"), "{e}");
    let e = refused(&format!(
        "auth:\n  providers:\n    corp:\n      issuer: x\n      keys: '{jwks}'\n      hmac_secret: 0123456789abcdef0123456789abcdef\n{route}"
    ));
    assert!(e.contains("more than one key source"), "{e}");
    // The query only when allowed.
    let e = refused(&format!(
        "auth:\n  providers:\n    corp:\n      issuer: x\n      keys: '{jwks}'\n      token: {{query: t}}\n{route}"
    ));
    assert!(e.contains("allow_query"), "{e}");
    // An unknown provider, with a suggestion.
    let e = refused(&format!(
        "auth:\n  providers:\n    corp:\n      issuer: x\n      keys: '{jwks}'\nroutes:\n  - path: /r\n    auth: {{provider: crop}}\n    respond: {{body: '1'}}\n"
    ));
    assert!(e.contains("auth.yaml:8:") && e.contains("corp"), "{e}");
}

/// A JWKS "server": counts fetches, answers the document it holds (or fails) after 10 ms.
struct Counting {
    hits: AtomicUsize,
    doc: Mutex<Option<String>>,
}

impl Fetch for Counting {
    fn fetch(&self, _url: &str, _timeout: Duration, _max: usize) -> FetchFuture {
        self.hits.fetch_add(1, Ordering::SeqCst);
        let doc = self.doc.lock().unwrap().clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            match doc {
                Some(d) => Ok(Fetched {
                    body: d.into(),
                    max_age: None,
                }),
                None => Err(FetchError::Transport("connection refused".into())),
            }
        })
    }
}

fn jwks_config() -> Config {
    config(&format!(
        r#"
auth:
  providers:
    corp:
      issuer: {ISS}
      jwks_url: http://127.0.0.1:9/jwks.json
      algorithms: [ES256]
      refresh: {{min: 1m, max: 1h, unknown_kid_cooldown: 10s}}
routes:
  - path: /r
    auth: {{provider: corp}}
    respond: {{body: '1'}}
"#
    ))
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_unknown_kids_makes_one_fetch_per_cooldown() {
    let key = EsKey::generate("k1");
    let server = Arc::new(Counting {
        hits: AtomicUsize::new(0),
        doc: Mutex::new(Some(jwt::jwks(&[&key]))),
    });
    let f = server.clone();
    let auth = Auth::build(&jwks_config(), None, move || Ok(f as Arc<dyn Fetch>)).unwrap();
    assert!(auth.start().await.is_empty());
    assert_eq!(server.hits.load(Ordering::SeqCst), 1, "fetched at start");
    auth.readiness().unwrap();
    let good = jwt::claims(ISS, "x", "ann");
    check(&auth, 0, &key.sign(&good)).await.unwrap();
    // Within the cooldown of the start's fetch, an unknown kid makes no fetch.
    assert!(check(&auth, 0, &key.sign_as("early", &good)).await.is_err());
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        1,
        "none within the cooldown of the first"
    );
    tokio::time::advance(Duration::from_secs(11)).await;

    // 50 tokens at once, each naming a kid the set lacks: one fetch between them.
    let flood: Vec<_> = (0..50)
        .map(|i| key.sign_as(&format!("forged-{i}"), &good))
        .collect();
    let results = futures_util::future::join_all(flood.iter().map(|t| check(&auth, 0, t))).await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(Denied::Invalid(TokenError::UnknownKid(_)))))
    );
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        2,
        "one fetch for the flood"
    );
    // More within the cooldown: none.
    tokio::time::advance(Duration::from_secs(5)).await;
    for t in &flood[..10] {
        assert!(check(&auth, 0, t).await.is_err());
    }
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        2,
        "none within the cooldown"
    );
    // After the cooldown: one more, which finds a rotated key.
    let rotated = EsKey::generate("k2");
    *server.doc.lock().unwrap() = Some(jwt::jwks(&[&key, &rotated]));
    tokio::time::advance(Duration::from_secs(6)).await;
    check(&auth, 0, &rotated.sign(&good)).await.unwrap();
    assert_eq!(server.hits.load(Ordering::SeqCst), 3);
    let st = auth.status_json();
    assert_eq!(st["providers"]["corp"]["unknown_kid_fetches"], 2, "{st}");
    assert_eq!(st["providers"]["corp"]["keys"], 2, "{st}");
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_never_had_keys_is_unavailable_and_the_last_good_keys_stay() {
    let key = EsKey::generate("k1");
    let server = Arc::new(Counting {
        hits: AtomicUsize::new(0),
        doc: Mutex::new(None),
    });
    let f = server.clone();
    let auth = Auth::build(&jwks_config(), None, move || Ok(f as Arc<dyn Fetch>)).unwrap();
    assert_eq!(auth.start().await, ["http://127.0.0.1:9/jwks.json"]);
    assert!(auth.start().await.is_empty(), "started once");
    let good = key.sign(&jwt::claims(ISS, "x", "ann"));
    assert!(auth.readiness().is_err());
    assert!(matches!(
        check(&auth, 0, &good).await,
        Err(Denied::Unavailable { .. })
    ));
    assert!(matches!(
        auth.authenticate(auth.policy(0).unwrap(), &http::HeaderMap::new(), None)
            .await,
        Err(Denied::Unavailable { .. })
    ));
    // The issuer comes back: the background retry (after the cooldown) loads the keys.
    *server.doc.lock().unwrap() = Some(jwt::jwks(&[&key]));
    tokio::time::sleep(Duration::from_secs(11)).await;
    auth.readiness().unwrap();
    check(&auth, 0, &good).await.unwrap();
    // It goes away again: the scheduled refresh fails, the keys in use stay.
    *server.doc.lock().unwrap() = None;
    tokio::time::sleep(Duration::from_secs(3700)).await;
    let st = auth.status_json();
    assert!(
        st["providers"]["corp"]["fetch_failures"].as_u64().unwrap() >= 2,
        "{st}"
    );
    assert!(
        st["providers"]["corp"]["last_error"].as_str().is_some(),
        "{st}"
    );
    let fresh = key.sign(&jwt::claims(ISS, "x", "bob"));
    check(&auth, 0, &fresh).await.unwrap();
}

/// A 2048-bit RSA key made for these tests only (`openssl genrsa 2048`), and its public half.
const RSA_PRIVATE: &str = include_str!("data/test-rsa-private.pem");
const RSA_PUBLIC: &str = include_str!("data/test-rsa-public.pem");

fn pem_config(algorithms: &str) -> Config {
    let pem: String = RSA_PUBLIC
        .lines()
        .map(|l| format!("        {l}\n"))
        .collect();
    config(&format!(
        "auth:\n  providers:\n    corp:\n      issuer: {ISS}\n      algorithms: {algorithms}\n      keys: |\n{pem}\
         routes:\n  - path: /r\n    auth: {{provider: corp}}\n    respond: {{body: '1'}}\n"
    ))
}

#[tokio::test]
async fn rsa_tokens_verify_against_inline_pem_keys_and_hmac_never_does() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let auth = Auth::build(&pem_config("[RS256, PS256]"), None, no_fetch).unwrap();
    let key = EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap();
    let claims = jwt::claims(ISS, "x", "ann");
    for alg in [Algorithm::RS256, Algorithm::PS256] {
        let token = jsonwebtoken::encode(&Header::new(alg), &claims, &key).unwrap();
        let got = check(&auth, 0, &token).await.unwrap();
        assert!(to_string(&got).contains(r#""sub":"ann""#), "{alg:?}");
    }
    // RS512 is not among the provider's algorithms.
    let rs512 = jsonwebtoken::encode(&Header::new(Algorithm::RS512), &claims, &key).unwrap();
    assert!(matches!(
        invalid(check(&auth, 0, &rs512).await),
        TokenError::Algorithm(_)
    ));
    // The public PEM as an HMAC secret.
    let confused = jwt::hmac_signed(RSA_PUBLIC.as_bytes(), "any", &claims);
    assert!(matches!(
        invalid(check(&auth, 0, &confused).await),
        TokenError::Algorithm(_)
    ));
}

#[tokio::test]
async fn an_hmac_provider_takes_only_hmac_tokens_with_its_secret() {
    let secret = "0123456789abcdef0123456789abcdef";
    let auth = Auth::build(
        &config(&format!(
            "auth:\n  providers:\n    corp: {{issuer: {ISS}, hmac_secret: {secret}}}\n\
             routes:\n  - path: /r\n    auth: {{provider: corp}}\n    respond: {{body: '1'}}\n"
        )),
        None,
        no_fetch,
    )
    .unwrap();
    let claims = jwt::claims(ISS, "x", "ann");
    check(&auth, 0, &jwt::hmac_signed(secret.as_bytes(), "k", &claims))
        .await
        .unwrap();
    assert_eq!(
        invalid(
            check(
                &auth,
                0,
                &jwt::hmac_signed(b"another secret of 32 bytes......", "k", &claims)
            )
            .await
        ),
        TokenError::Signature
    );
    let es = EsKey::generate("k1").sign(&claims);
    assert!(matches!(
        invalid(check(&auth, 0, &es).await),
        TokenError::Algorithm(_)
    ));
}

#[tokio::test]
async fn eddsa_and_es256_keys_of_one_set_each_verify_their_own_tokens() {
    let es = EsKey::generate("es");
    let ed = jwt::EdKey::generate("ed");
    let set = serde_json::json!({ "keys": [es.jwk(), ed.jwk(), {"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}] });
    let auth = Auth::build(
        &config(&format!(
            "auth:\n  providers:\n    corp:\n      issuer: {ISS}\n      keys: '{set}'\n      algorithms: [ES256, EdDSA]\n\
             routes:\n  - path: /r\n    auth: {{provider: corp}}\n    respond: {{body: '1'}}\n"
        )),
        None,
        no_fetch,
    )
    .unwrap();
    let claims = jwt::claims(ISS, "x", "ann");
    check(&auth, 0, &ed.sign(&claims)).await.unwrap();
    check(&auth, 0, &es.sign(&claims)).await.unwrap();
    // The `oct` key of the set is never used: an HS256 token naming it is refused.
    let hs = jwt::hmac_signed(b"secret", "hs", &claims);
    assert!(matches!(
        invalid(check(&auth, 0, &hs).await),
        TokenError::Algorithm(_)
    ));
    assert_eq!(auth.status_json()["providers"]["corp"]["skipped_keys"], 1);
}

#[tokio::test]
async fn required_claims_and_the_leeway_are_the_providers() {
    let key = EsKey::generate("k1");
    let auth = Auth::build(
        &inline(&key, "      required_claims: [sub, tenant]"),
        None,
        no_fetch,
    )
    .unwrap();
    let mut c = jwt::claims(ISS, "orders", "ann");
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&c)).await),
        TokenError::MissingClaim("tenant".into())
    );
    c["tenant"] = "acme".into();
    check(&auth, 0, &key.sign(&c)).await.unwrap();
    c.as_object_mut().unwrap().remove("sub");
    assert_eq!(
        invalid(check(&auth, 0, &key.sign(&c)).await),
        TokenError::MissingClaim("sub".into())
    );
    // `nbf` just ahead, within the 5s leeway: accepted.
    let mut soon = jwt::claims(ISS, "orders", "ann");
    soon["tenant"] = "acme".into();
    soon["nbf"] = (jwt::now() + 2).into();
    check(&auth, 0, &key.sign(&soon)).await.unwrap();
}

/// Issue 69 §4: a correctly signed token whose header marks an extension as critical (`crit`)
/// is refused — fanout understands none (RFC 7515 §4.1.11, RFC 8725) — and so is a malformed
/// `crit`; the same header without it verifies.
#[tokio::test]
async fn a_token_with_a_critical_extension_is_refused() {
    let key = EsKey::generate("k1");
    let auth = Auth::build(&inline(&key, ""), None, no_fetch).unwrap();
    let claims = jwt::claims(ISS, "orders", "ann");
    let plain = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": "k1"});
    check(&auth, 0, &key.sign_header(&plain, &claims))
        .await
        .unwrap();
    for crit in [
        serde_json::json!(["x-unknown"]),
        serde_json::json!(["b64"]),
        serde_json::json!([]),
        serde_json::json!("x-unknown"),
        serde_json::json!(["exp"]),
    ] {
        let mut h = plain.clone();
        h["crit"] = crit.clone();
        h["x-unknown"] = serde_json::json!(true);
        let e = invalid(check(&auth, 0, &key.sign_header(&h, &claims)).await);
        assert!(matches!(e, TokenError::Critical(_)), "{crit}: {e:?}");
        assert_eq!(e.reason(), "critical");
    }
    let e = invalid(
        check(
            &auth,
            0,
            &key.sign_header(
                &serde_json::json!({"alg": "ES256", "kid": "k1", "crit": ["x-a\nforged"]}),
                &claims,
            ),
        )
        .await,
    );
    assert!(!e.to_string().contains('\n'), "escaped: {e}");
}

/// Issue 69 §3: the parser's message about a header it cannot read quotes the header's `alg`;
/// what reaches the log never holds a line break or another control character.
#[tokio::test]
async fn a_forged_alg_cannot_break_the_log_line() {
    let key = EsKey::generate("k1");
    let auth = Auth::build(&inline(&key, ""), None, no_fetch).unwrap();
    let claims = jwt::claims(ISS, "orders", "ann");
    let forged = "RS256\n2026-01-01T00:00:00.000000Z  INFO fanout: FORGED admin logged in\r\x1b[2J";
    let token = key.sign_header(&serde_json::json!({"alg": forged, "kid": "k1"}), &claims);
    let e = invalid(check(&auth, 0, &token).await);
    assert_eq!(e.reason(), "malformed", "{e:?}");
    let text = e.to_string();
    assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
    assert!(
        text.contains("\\n2026-01-01"),
        "the value is shown escaped: {text}"
    );
}

/// Issue 69 §5: an issuer revokes a leaked key by removing it from the JWK set. Once the set no
/// longer has it, a token verified with it before is refused too (it is not taken from the
/// verified-token cache until its `exp`); a token of the key that stays keeps verifying, and a
/// refresh that brings the same keys back does not empty the cache.
#[tokio::test(start_paused = true)]
async fn a_key_removed_from_the_set_revokes_the_tokens_it_verified() {
    let k1 = EsKey::generate("k1");
    let k2 = EsKey::generate("k2");
    let server = Arc::new(Counting {
        hits: AtomicUsize::new(0),
        doc: Mutex::new(Some(jwt::jwks(&[&k1, &k2]))),
    });
    let f = server.clone();
    let auth = Auth::build(&jwks_config(), None, move || Ok(f as Arc<dyn Fetch>)).unwrap();
    assert!(auth.start().await.is_empty());
    let claims = jwt::claims(ISS, "x", "ann");
    let (old, kept) = (k1.sign(&claims), k2.sign(&claims));
    check(&auth, 0, &old).await.unwrap();
    check(&auth, 0, &kept).await.unwrap();
    check(&auth, 0, &old).await.unwrap();
    let st = auth.status_json();
    assert_eq!(st["providers"]["corp"]["accepted_from_cache"], 1, "{st}");

    // The same keys again: cached tokens stay cached.
    tokio::time::sleep(Duration::from_secs(3700)).await;
    assert!(server.hits.load(Ordering::SeqCst) >= 2, "refreshed");
    check(&auth, 0, &old).await.unwrap();
    let st = auth.status_json();
    assert_eq!(st["providers"]["corp"]["accepted_from_cache"], 2, "{st}");

    // k1 leaves the set.
    *server.doc.lock().unwrap() = Some(jwt::jwks(&[&k2]));
    let before = server.hits.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3700)).await;
    assert!(server.hits.load(Ordering::SeqCst) > before, "refreshed");
    assert_eq!(auth.status_json()["providers"]["corp"]["keys"], 1);
    let e = invalid(check(&auth, 0, &old).await);
    assert!(matches!(e, TokenError::UnknownKid(_)), "{e:?}");
    check(&auth, 0, &kept).await.unwrap();
}
