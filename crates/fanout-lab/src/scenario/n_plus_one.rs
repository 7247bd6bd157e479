//! `n-plus-one`: Tailcall's N+1 benchmark (issue 25 §2) — `GET /posts?page=N`: the page's 100
//! posts, each joined with its user (`scenarios/n-plus-one.yaml`: one step for the posts, one
//! `for_each` step calling users per post, which fanout's in-flight dedup merges into one call per
//! distinct user). Every request asks for another page, and every page has its own 10 users, so
//! nothing one request fetches can serve another: fanout and the hand-written `hyper-baseline`
//! make the same 1 + 10 calls per request (the lab checks). Measured at a fixed 300 req/s and at
//! 50 % / 80 % of the lower capacity.
//!
//! `n-plus-one-identical`: the same route with every request identical (`?page=1`) except a
//! distinct `x-request-id` (a header the flow never reads) — what whole-request coalescing saves:
//! `fanout` (the lab turns coalescing off, as main computed every request before it) against
//! `coalesce` (the same config with coalescing on, the default). Not an equal-work comparison: a
//! line of its own. Each fanout target's `/__fanout/status` at the end of the run is written to
//! `DIR/NAME.status.json` (`coalesce`: flow runs and coalesced requests).

use crate::model::{Mode, Scenario};
use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

/// The stubs: `posts` (`GET /posts?page=N`, 100 posts) and `users` (`GET /users/{id}`).
pub const N_PLUS_ONE_STUBS: &str = include_str!("../scenarios/n-plus-one.stubs.yaml");
/// The route `GET /posts?page=N`.
pub const N_PLUS_ONE_GATEWAY: &str = include_str!("../scenarios/n-plus-one.yaml");

/// Offered rate of the fixed-rate trials (issue 25 §2: "a moderate open-model rate").
pub const FIXED_RATE: f64 = 300.0;

/// Requests cycled by the generator: this many pages, or this many request ids.
const DISTINCT: u32 = 1024;

/// `GET /posts?page=N` for N = 1 … 1024, sent in turn: concurrent requests never ask for the
/// same page (a page comes back every 1 024 requests, seconds later).
pub fn distinct_requests() -> Vec<RequestTemplate> {
    (1..=DISTINCT)
        .map(|n| RequestTemplate::get(format!("/posts?page={n}")))
        .collect()
}

/// `GET /posts?page=1`, each with its own `x-request-id` (`n1-0001` …, 1 024 in turn).
pub fn identical_requests() -> Vec<RequestTemplate> {
    (1..=DISTINCT)
        .map(|n| RequestTemplate {
            method: Method::GET,
            path: "/posts?page=1".into(),
            headers: vec![("x-request-id".into(), format!("n1-{n:04}"))],
            body: Bytes::new(),
        })
        .collect()
}

/// The same config with whole-request coalescing on, stated (the lab keeps a config that says
/// `coalesce: true` itself as it is: see `crate::equal_work`).
pub fn coalescing_config() -> String {
    format!("{N_PLUS_ONE_GATEWAY}\ndefaults:\n  coalesce: true\n")
}

/// The scenario with distinct requests.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "n-plus-one",
        about: "Tailcall's N+1: 100 posts, each joined with its user (1 + 10 calls), a different page per request",
        stubs: N_PLUS_ONE_STUBS,
        gateway: N_PLUS_ONE_GATEWAY,
        requests: distinct_requests(),
        mode: Mode::CompareAt { rate: FIXED_RATE },
        slo_p99_ms: 50.0,
        critical_path: vec![("posts", "/posts?page=1"), ("users", "/users/11")],
        variants: vec![],
        baselines: &["hyper-baseline"],
        grpc: None,
        database: None,
        default_targets: &["fanout", "hyper-baseline"],
    }
}

/// The scenario with identical requests (distinct `x-request-id`s).
pub(super) fn identical() -> Scenario {
    Scenario {
        name: "n-plus-one-identical",
        about: "the N+1 route with identical requests (each its own x-request-id): coalescing off (fanout) vs on (coalesce) — what sharing saves",
        stubs: N_PLUS_ONE_STUBS,
        gateway: N_PLUS_ONE_GATEWAY,
        requests: identical_requests(),
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        critical_path: vec![("posts", "/posts?page=1"), ("users", "/users/11")],
        variants: vec![("coalesce", coalescing_config())],
        baselines: &["hyper-baseline"],
        grpc: None,
        database: None,
        default_targets: &["fanout", "coalesce"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_differ_by_page_or_by_request_id() {
        let d = distinct_requests();
        let paths: std::collections::BTreeSet<_> = d.iter().map(|r| &r.path).collect();
        assert_eq!(paths.len(), 1024);
        let i = identical_requests();
        assert!(i.iter().all(|r| r.path == "/posts?page=1"));
        let ids: std::collections::BTreeSet<_> = i.iter().map(|r| &r.headers[0].1).collect();
        assert_eq!(ids.len(), 1024);
        // The lab turns coalescing off in `fanout`, and leaves it on in `coalesce`.
        assert!(crate::equal_work(N_PLUS_ONE_GATEWAY, true).contains("coalesce: false"));
        let on = crate::equal_work(&coalescing_config(), true);
        assert!(on.contains("coalesce: true") && !on.contains("coalesce: false"));
    }
}
