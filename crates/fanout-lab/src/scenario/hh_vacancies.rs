//! `hh-vacancies`: HeadHunter's flow (examples/hh-vacancies), compared across targets. No
//! acceptance lines: the comparison is the result.

use crate::model::{Mode, Scenario};
use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

pub(super) const HH_STUBS: &str = include_str!("../../../../examples/hh-vacancies/stubs.yaml");
pub(super) const HH_GATEWAY: &str = include_str!("../../../../examples/hh-vacancies/fanout.yaml");

/// Appended to the example's config for the `fanout-nometrics` target.
const NO_METRICS: &str = "\nadmin:\n  metrics: false\n";

/// `GET /vacancies?text=rust` (also the `overload` scenario's request).
pub(super) fn hh_requests() -> Vec<RequestTemplate> {
    vec![RequestTemplate {
        method: Method::GET,
        path: "/vacancies?text=rust".into(),
        headers: vec![],
        body: Bytes::new(),
    }]
}

/// hh-vacancies' requests as `hh-vacancies` sends them: each with the lab's token
/// ([`crate::token`]) when it could be made, so that the `fanout-auth` target verifies it (and
/// every other target gets the same bytes and ignores the header).
fn hh_requests_with_token() -> Vec<RequestTemplate> {
    let mut reqs = hh_requests();
    if let Some(t) = crate::token::lab_token() {
        for r in &mut reqs {
            r.headers
                .push(("authorization".into(), format!("Bearer {}", t.token)));
        }
    }
    reqs
}

/// The `fanout-auth` variant: the example with every route behind a JWT provider whose key
/// (ES256, made for this run) is given inline, the lab's clients all sending one token — the
/// case of clients that reuse their tokens. `None` when the key could not be made.
fn with_auth() -> Option<(&'static str, String)> {
    let t = crate::token::lab_token()?;
    Some((
        "fanout-auth",
        format!(
            "{HH_GATEWAY}\nauth:\n  providers:\n    lab:\n      issuer: {iss}\n      audiences: [{aud}]\n      keys: '{jwks}'\n      algorithms: [ES256]\ndefaults:\n  auth: {{provider: lab}}\n",
            iss = crate::token::ISSUER,
            aud = crate::token::AUDIENCE,
            jwks = t.jwks,
        ),
    ))
}

/// The `fanout-tls` variant: the example on a TLS listener, the run's self-signed certificate
/// ([`crate::certs`]); its clients speak HTTP/1.1 over TLS on kept connections, so the handshake
/// is paid once per connection and the comparison with `fanout` is what TLS costs per request.
fn with_tls() -> (&'static str, String) {
    let dir = crate::certs::TLS_DIR;
    (
        "fanout-tls",
        format!(
            "{HH_GATEWAY}\ntls:\n  certificates:\n    - {{ cert_file: \"{dir}/cert.pem\", key_file: \"{dir}/key.pem\" }}\n"
        ),
    )
}

/// The `fanout-schema` variant: the example with its route's query parameters declared
/// (docs/openapi.md): `text` required, 1–200 characters; `page` and `per_page` optional
/// integers in range. Each request's parameters are then validated at the edge (the route has
/// no body, so there is no body schema to check); `--targets fanout,fanout-schema` measures
/// what that costs per request (issue 73).
fn with_schema() -> (&'static str, String) {
    (
        "fanout-schema",
        HH_GATEWAY.replacen(
            "    deadline: 500ms\n",
            "    deadline: 500ms\n    parameters:\n      text: { schema: { type: string, minLength: 1, maxLength: 200 }, required: true }\n      page: { schema: { type: integer, minimum: 0, maximum: 1000 } }\n      per_page: { schema: { type: integer, minimum: 1, maximum: 100 } }\n",
            1,
        ),
    )
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "hh-vacancies",
        about: "HeadHunter's logic: search → 3 vacancy calls in parallel (examples/hh-vacancies)",
        stubs: HH_STUBS,
        gateway: HH_GATEWAY,
        requests: hh_requests_with_token(),
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        critical_path: vec![
            ("search", "/search?text=rust"),
            ("vacancies", "/vacancies/101"),
        ],
        // The same config with metrics off: `--targets fanout,fanout-nometrics` measures what
        // recording metrics costs per request (docs/benchmarks.md).
        // `--targets fanout,fanout-auth` what authenticating every request costs (its token
        // verified once, then found in the verified-token cache).
        // `--targets fanout,fanout-tls` what TLS costs per request on kept connections.
        // `--targets fanout,fanout-schema` what validating the declared parameters costs.
        variants: std::iter::once(("fanout-nometrics", format!("{HH_GATEWAY}{NO_METRICS}")))
            .chain(with_auth())
            .chain(std::iter::once(with_tls()))
            .chain(std::iter::once(with_schema()))
            .collect(),
        baselines: &["hyper-baseline", "java-threads"],
        grpc: None,
        database: None,
        default_targets: &["fanout"],
    }
}
