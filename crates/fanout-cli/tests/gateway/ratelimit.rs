//! Rate limits (`rate_limits:`, `rate_limit:`), end to end:
//! - over a policy's budget a request is answered 429 `rate_limited` with `Retry-After`,
//!   `RateLimit-Policy` and `RateLimit`; keys are counted apart; `[]` turns the defaults off;
//! - the client address comes from `X-Forwarded-For` only when the peer is a trusted proxy;
//! - a flood of distinct keys leaves the key table within `max_keys` (the rest overflow);
//! - shared through a real Redis (tier 2): two gateways hold one budget; Redis frozen, then
//!   killed, mid-run: no 5xx, each instance falls back as configured (counted).
//!
//! Counts and states are asserted, never times (the budgets are per minute where a test must
//! not see a refill).

use crate::support::{gateway, gateway_with};
use fanout_testkit::*;
use http::Method;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

async fn no_backend() -> fanout_stub::StubServer {
    stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await
}

const LOCAL: &str = r#"
rate_limits:
  per-user:
    rate: 1/min
    burst: 3
    key: '$request.headers["x-user"]'
  by-client:
    rate: 1/min
    burst: 2
defaults:
  rate_limit: [per-user]
routes:
  - path: /limited
    respond: { body: '{ok: true}' }
  - path: /open
    rate_limit: []
    respond: { body: '{ok: true}' }
  - path: /client
    rate_limit: [by-client]
    respond: { body: '{client: $request.client.address}' }
"#;

async fn hit(c: &TestClient, url: &str, headers: &[(&str, &str)]) -> Resp {
    send(c, Method::GET, url, headers, bytes::Bytes::new()).await
}

#[tokio::test]
async fn over_the_limit_is_a_429_with_retry_after_and_ratelimit_headers() {
    let s = no_backend().await;
    let gw = gateway(LOCAL, &s).await;
    let c = client(false);
    let url = format!("http://{}/limited", gw.addr);
    let ann = [("x-user", "ann")];
    for i in 0..3 {
        let r = hit(&c, &url, &ann).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    let r = hit(&c, &url, &ann).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.code(), "rate_limited");
    // 1/min with a burst of 3: the next request in 60 s, the whole burst back in 180 s
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(r.header("ratelimit-policy"), Some("\"per-user\";q=3;w=180"));
    assert_eq!(r.header("ratelimit"), Some("\"per-user\";r=0;t=60"));
    let st = gw.gateway.status_json();
    assert_eq!(st["rate_limits"]["per-user"]["allowed"], 3, "{st}");
    assert_eq!(st["rate_limits"]["per-user"]["denied"], 1, "{st}");
    assert_eq!(st["errors"]["rate_limited"], 1, "{st}");
    let admin = gw.admin_addr.unwrap();
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    for line in [
        "fanout_ratelimit_decisions_total{policy=\"per-user\",decision=\"denied\"} 1",
        "fanout_ratelimit_decisions_total{policy=\"per-user\",decision=\"allowed\"} 3",
        "fanout_ratelimit_keys{policy=\"per-user\"} 1.0",
        "fanout_ratelimit_fallback_total{policy=\"per-user\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn keys_are_counted_apart_and_an_empty_list_turns_the_defaults_off() {
    let s = no_backend().await;
    let gw = gateway(LOCAL, &s).await;
    let c = client(false);
    let url = format!("http://{}/limited", gw.addr);
    for _ in 0..3 {
        assert_eq!(hit(&c, &url, &[("x-user", "ann")]).await.status, 200);
    }
    assert_eq!(hit(&c, &url, &[("x-user", "ann")]).await.status, 429);
    // another key has its own budget
    for _ in 0..3 {
        assert_eq!(hit(&c, &url, &[("x-user", "bob")]).await.status, 200);
    }
    assert_eq!(hit(&c, &url, &[("x-user", "bob")]).await.status, 429);
    // `rate_limit: []`: no limit at all
    let open = format!("http://{}/open", gw.addr);
    for _ in 0..10 {
        assert_eq!(hit(&c, &open, &[("x-user", "ann")]).await.status, 200);
    }
}

#[tokio::test]
async fn x_forwarded_for_counts_only_from_a_trusted_proxy() {
    let s = no_backend().await;
    let c = client(false);
    // Not trusted: the socket's address (127.0.0.1) whatever the header says.
    let gw = gateway(LOCAL, &s).await;
    let url = format!("http://{}/client", gw.addr);
    let r = hit(&c, &url, &[("x-forwarded-for", "203.0.113.1")]).await;
    assert_eq!(r.json()["client"], "127.0.0.1");
    assert_eq!(
        hit(&c, &url, &[("x-forwarded-for", "203.0.113.2")])
            .await
            .status,
        200
    );
    // a third "client" is the same socket address: over its burst of 2
    let r = hit(&c, &url, &[("x-forwarded-for", "203.0.113.3")]).await;
    assert_eq!(r.status, 429, "{}", r.text());

    // Trusted: the header's address, right to left past trusted hops.
    let trusted =
        format!("server:\n  trusted_proxies: [\"127.0.0.1/32\", \"10.0.0.0/8\"]\n{LOCAL}");
    let gw = gateway(&trusted, &s).await;
    let url = format!("http://{}/client", gw.addr);
    let r = hit(
        &c,
        &url,
        &[("x-forwarded-for", "198.51.100.9, 203.0.113.1, 10.1.2.3")],
    )
    .await;
    assert_eq!(r.json()["client"], "203.0.113.1");
    for ip in ["203.0.113.2", "203.0.113.3", "203.0.113.4"] {
        let r = hit(&c, &url, &[("x-forwarded-for", ip)]).await;
        assert_eq!(r.status, 200, "{ip}: each address has its own budget");
        assert_eq!(r.json()["client"], ip);
    }
    assert_eq!(
        hit(&c, &url, &[("x-forwarded-for", "203.0.113.1")])
            .await
            .status,
        200
    );
    assert_eq!(
        hit(&c, &url, &[("x-forwarded-for", "203.0.113.1")])
            .await
            .status,
        429,
        "203.0.113.1's third request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_leaves_the_key_table_within_max_keys() {
    let s = no_backend().await;
    let yaml = r#"
rate_limits:
  per-key:
    rate: 1/min
    burst: 1000000
    key: '$request.headers["x-key"]'
    max_keys: 500
defaults:
  rate_limit: [per-key]
routes:
  - path: /k
    respond: { body: '1' }
"#;
    let gw = gateway(yaml, &s).await;
    let url = format!("http://{}/k", gw.addr);
    let sent = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (url, sent) = (url.clone(), sent.clone());
            tokio::spawn(async move {
                let c = client(false);
                for i in 0..500 {
                    let key = format!("k-{t}-{i}");
                    let r = hit(&c, &url, &[("x-key", &key)]).await;
                    assert_eq!(r.status, 200, "{}", r.text());
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let st = gw.gateway.status_json();
    let p = &st["rate_limits"]["per-key"];
    let keys = p["keys"].as_u64().unwrap();
    let overflow = p["overflow"].as_u64().unwrap();
    assert!(keys <= 500, "{p}");
    assert_eq!(
        keys + overflow,
        2000,
        "every key is in the table or overflowed: {p}"
    );
    assert!(overflow >= 1500, "{p}");
}

/// `rate_limits` counters of a gateway.
fn counters(gw: &fanout::RunningGateway, policy: &str) -> Value {
    gw.gateway.status_json()["rate_limits"][policy].clone()
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {field} in {v}"))
}

fn shared(rate: &str, burst: u64, redis: &str) -> String {
    format!(
        r#"
redis:
  url: "${{REDIS_URL}}"
  key_prefix: "t:"
rate_limits:
  fleet:
    rate: {rate}
    burst: {burst}
    key: '"all"'
    store: redis
    redis: {redis}
defaults:
  rate_limit: [fleet]
routes:
  - path: /x
    respond: {{ body: '1' }}
"#
    )
}

/// Requests to `url` from `workers` clients in a loop until `stop`; counts answers by status
/// (panics on a 5xx).
async fn hammer(
    url: String,
    workers: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (u64, u64) {
    let ok = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (url, stop, ok, limited) = (url.clone(), stop.clone(), ok.clone(), limited.clone());
            tokio::spawn(async move {
                let c = client(false);
                while !stop.load(Ordering::Relaxed) {
                    let r = hit(&c, &url, &[]).await;
                    match r.status.as_u16() {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        429 => limited.fetch_add(1, Ordering::Relaxed),
                        s => panic!("status {s}: {}", r.text()),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (ok.load(Ordering::Relaxed), limited.load(Ordering::Relaxed))
}

/// The acceptance scenario: two gateways, one policy of 100/s in one Redis, offered far more.
/// Admitted requests over the window are compared with the budget × the window (plus the
/// burst) as the clients saw it: within ±10 % (measured; docs/benchmarks.md), asserted within
/// +10 % / −25 % so that a CPU-starved client, which offers less, does not fail the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn two_gateways_sharing_a_policy_in_redis_hold_one_budget() {
    let redis = RedisServer::start().await;
    let s = no_backend().await;
    // A generous time limit: this test measures the shared budget, not the fallback.
    let yaml = shared("100/s", 10, "{timeout: 2s, fleet_share: 0.5}");
    let a = gateway_with(&yaml, &s, &[("REDIS_URL", redis.url())]).await;
    let b = gateway_with(&yaml, &s, &[("REDIS_URL", redis.url())]).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Instant::now();
    let ha = tokio::spawn(hammer(format!("http://{}/x", a.addr), 4, stop.clone()));
    let hb = tokio::spawn(hammer(format!("http://{}/x", b.addr), 4, stop.clone()));
    wait_until("5 s of load", || start.elapsed() >= Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let (ok_a, lim_a) = ha.await.unwrap();
    let (ok_b, lim_b) = hb.await.unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    let admitted = (ok_a + ok_b) as f64;
    let budget = 100.0 * elapsed + 10.0;
    let offered = admitted + (lim_a + lim_b) as f64;
    println!(
        "two gateways, one 100/s policy: admitted {admitted} of {offered} in {elapsed:.2} s \
         (budget {budget:.0}: {:+.1} %; a {ok_a}/{lim_a}, b {ok_b}/{lim_b})",
        (admitted / budget - 1.0) * 100.0
    );
    assert!(ok_a > 0 && ok_b > 0, "both instances admit");
    assert_eq!(n(&counters(&a, "fleet"), "fallback"), 0);
    assert!(
        admitted <= budget * 1.1,
        "admitted {admitted}, budget {budget}"
    );
    assert!(
        offered >= budget * 2.0,
        "the clients offered too little to judge: {offered}"
    );
    assert!(
        admitted >= budget * 0.75,
        "admitted {admitted}, budget {budget}"
    );
}

/// Redis refuses a key once; the instance refuses it again until its retry time without
/// asking Redis.
#[tokio::test]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn a_key_redis_refused_is_refused_locally_until_its_retry_time() {
    let redis = RedisServer::start().await;
    let s = no_backend().await;
    let gw = gateway_with(
        &shared("1/min", 1, "{timeout: 2s}"),
        &s,
        &[("REDIS_URL", redis.url())],
    )
    .await;
    let url = format!("http://{}/x", gw.addr);
    let c = client(false);
    assert_eq!(hit(&c, &url, &[]).await.status, 200);
    assert_eq!(redis.keys("t:rl:fleet:*").await, vec!["t:rl:fleet:all"]);
    let pttl = redis.pttl("t:rl:fleet:all").await;
    assert!(
        (1..=60_001).contains(&pttl),
        "the key lives as long as its budget refills: {pttl}"
    );
    for _ in 0..3 {
        assert_eq!(hit(&c, &url, &[]).await.status, 429);
    }
    let p = counters(&gw, "fleet");
    assert_eq!((n(&p, "denied"), n(&p, "denied_locally")), (3, 2), "{p}");
}

/// Redis frozen (SIGSTOP), thawed, then killed under a stream of requests: never a 5xx; the
/// instance with `on_failure: local` decides alone at its share, the one with `deny` refuses,
/// and both count the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn redis_frozen_then_killed_mid_run_is_never_a_5xx_and_falls_back_as_configured() {
    let mut redis = RedisServer::start().await;
    let s = no_backend().await;
    let vars = [("REDIS_URL", redis.url())];
    let local = shared(
        "1000/s",
        100,
        "{timeout: 50ms, fleet_share: 0.5, retry_after: 200ms}",
    );
    let deny = shared(
        "1000/s",
        100,
        "{timeout: 50ms, on_failure: deny, retry_after: 200ms}",
    );
    let a = gateway_with(&local, &s, &vars).await;
    let b = gateway_with(&deny, &s, &vars).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ha = tokio::spawn(hammer(format!("http://{}/x", a.addr), 2, stop.clone()));
    let hb = tokio::spawn(hammer(format!("http://{}/x", b.addr), 2, stop.clone()));
    wait_until("both instances decide through redis", || {
        n(&counters(&a, "fleet"), "allowed") > 20 && n(&counters(&b, "fleet"), "allowed") > 20
    })
    .await;

    redis.signal("-STOP");
    wait_until("both instances fall back while redis is frozen", || {
        n(&counters(&a, "fleet"), "fallback") > 20 && n(&counters(&b, "fleet"), "fallback") > 20
    })
    .await;
    // the local fallback admits; the fail-closed one refuses
    let before = n(&counters(&a, "fleet"), "allowed");
    wait_until("the local fallback admits", || {
        n(&counters(&a, "fleet"), "allowed") > before + 20
    })
    .await;
    redis.signal("-CONT");
    let denied_b = n(&counters(&b, "fleet"), "denied");
    wait_until("redis is used again after its retry time", || {
        // the fail-closed instance admits again only through redis
        let p = counters(&b, "fleet");
        n(&p, "allowed") > 40 && n(&p, "denied") >= denied_b
    })
    .await;

    redis.kill();
    let (fa, fb) = (
        n(&counters(&a, "fleet"), "fallback"),
        n(&counters(&b, "fleet"), "fallback"),
    );
    wait_until("both instances fall back once redis is gone", || {
        n(&counters(&a, "fleet"), "fallback") > fa + 20
            && n(&counters(&b, "fleet"), "fallback") > fb + 20
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    // hammer panics on any 5xx
    let (ok_a, _) = ha.await.unwrap();
    let (_, limited_b) = hb.await.unwrap();
    assert!(ok_a > 0 && limited_b > 0);
    let pa = counters(&a, "fleet");
    assert!(n(&pa, "redis_errors") > 0, "{pa}");
    let st = a.gateway.status_json();
    assert!(st["errors"].get("internal_error").is_none(), "{st}");
}

#[test]
fn explain_shows_each_routes_rate_limits() {
    let path = std::env::temp_dir().join(format!(
        "fanout-ratelimit-explain-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, LOCAL).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["explain", "--config"])
        .arg(&path)
        .env_remove("LISTEN")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let route = |p: &str| {
        text.split("\n\n")
            .find(|r| r.starts_with(&format!("GET {p}\n")))
            .unwrap_or_else(|| panic!("no {p} in {text}"))
            .to_string()
    };
    assert!(
        route("/limited").contains(
            "  rate limit per-user: 1/min, burst 3, per `$request.headers[\"x-user\"]` (local); over it: 429 rate_limited"
        ),
        "{text}"
    );
    assert!(
        route("/client").contains(
            "rate limit by-client: 1/min, burst 2, per `$request.client.address` (local)"
        ),
        "{text}"
    );
    assert!(!route("/open").contains("rate limit"), "{text}");
}

/// A backend's own limit: calls past its burst that cannot get a slot within their time fail
/// at once, unsent, as the backend's refusal (503 `backend_rejected`).
#[tokio::test]
async fn a_backends_rate_limit_fails_calls_fast_as_backend_rejected() {
    let s = stubs(
        "services:\n  slowpoke:\n    listen: \"${SLOWPOKE_ADDR}\"\n    routes: [{path: /x, body: '1'}]\n",
    )
    .await;
    let yaml = r#"
backends:
  slowpoke:
    url: "http://${SLOWPOKE_ADDR}"
    rate_limit: { rate: 1/min, burst: 2 }
routes:
  - path: /a
    flow:
      x: { http: { backend: slowpoke, path: '"/x"' } }
    respond: { body: '$x' }
  - path: /b
    flow:
      x: { http: { backend: slowpoke, path: '"/x"' }, optional: true, default: 0 }
    respond: { body: '$x' }
"#;
    let gw = gateway(yaml, &s).await;
    let c = client(false);
    let a = format!("http://{}/a", gw.addr);
    assert_eq!(hit(&c, &a, &[]).await.status, 200);
    // the budget is shared by every route
    let b = format!("http://{}/b", gw.addr);
    assert_eq!(hit(&c, &b, &[]).await.text(), "1");
    let r = hit(&c, &a, &[]).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.code(), "backend_rejected");
    // an optional step takes its default
    assert_eq!(hit(&c, &b, &[]).await.text(), "0");
    assert_eq!(calls(&s, "slowpoke"), 2);
}

#[test]
fn bad_rate_limits_are_config_errors_at_their_line() {
    let no_env = |_: &str| None;
    let err = |yaml: &str| match fanout::load_gateway("f.yaml", yaml, &no_env) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    };
    let e = err("rate_limits:\n  per-user: {rate: 10/day}\nroutes: []\n");
    assert!(
        e.contains("f.yaml:2:20: rate_limits.per-user.rate `10/day` is not a rate"),
        "{e}"
    );
    let e = err(
        "rate_limits:\n  per-user: {rate: 10/s}\nroutes:\n  - path: /a\n    rate_limit: [per-usr]\n    respond: {body: '1'}\n",
    );
    assert!(
        e.contains("f.yaml:5:18: unknown rate limit `per-usr`"),
        "{e}"
    );
    assert!(e.contains("did you mean `per-user`?"), "{e}");
    let e = err("rate_limits:\n  p: {rate: 1/s, store: redis}\nroutes: []\n");
    assert!(
        e.contains("`store: redis` needs a top-level `redis:` section"),
        "{e}"
    );
    let e = err("rate_limits:\n  p: {rate: 1/s, key: '$request.headers['}\nroutes: []\n");
    assert!(e.contains("rate_limits.p.key"), "{e}");
    let e = err("server: {trusted_proxies: [\"10.0.0.0/40\"]}\nroutes: []\n");
    assert!(e.contains("`10.0.0.0/40` is not an address or CIDR"), "{e}");
}

/// A reload that keeps a policy keeps its state; one that changes it starts it afresh.
#[tokio::test]
async fn a_reload_keeps_an_unchanged_policys_state() {
    let s = no_backend().await;
    let gw = gateway(LOCAL, &s).await;
    let c = client(false);
    let url = format!("http://{}/limited", gw.addr);
    let ann = [("x-user", "ann")];
    for _ in 0..3 {
        assert_eq!(hit(&c, &url, &ann).await.status, 200);
    }
    assert_eq!(hit(&c, &url, &ann).await.status, 429);
    let same = format!("{LOCAL}\n  - path: /new\n    respond: {{ body: '2' }}\n");
    gw.gateway
        .reload(crate::support::config(&same, &s))
        .await
        .unwrap();
    assert_eq!(hit(&c, &url, &ann).await.status, 429, "state kept");
    let changed = LOCAL.replace("burst: 3", "burst: 4");
    gw.gateway
        .reload(crate::support::config(&changed, &s))
        .await
        .unwrap();
    assert_eq!(
        hit(&c, &url, &ann).await.status,
        200,
        "a changed policy starts afresh"
    );
}
