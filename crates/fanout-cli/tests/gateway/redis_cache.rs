//! The shared answer cache in Redis (L2, `redis:` + `cache: {l2: true}`) against a real
//! `redis-server` per test (`fanout_testkit::RedisServer`, ephemeral port):
//! - two gateway *processes* share one Redis: an answer fetched through one is served by the other
//!   without a backend call, and its key expires with the cache's ttl;
//! - Redis killed, or frozen, under a stream of requests: every request still answers 200, the
//!   errors and skipped reads are counted, and a thawed Redis is used again after the breaker;
//! - oversized answers are not written; a corrupt or oversized value in Redis is a miss.
//!
//! Every wait is for a state (a key in Redis, a counter), never a time.

use crate::support::{ServeProcess, gateway_with, stub_vars};
use fanout_testkit::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const STUBS: &str = r#"
services:
  catalog:
    listen: "${CATALOG_ADDR}"
    routes:
      - path: /items/{id}
        body: '{id: $request.params.id, name: "item \($request.params.id)"}'
      - path: /big
        body: '{pad: ([range(100)] | map("0123456789") | join(""))}'
"#;

/// A gateway whose `catalog` cache has a Redis second level. Redis commands get a generous time
/// limit (the machine may be loaded): the tests count outcomes, they time nothing.
fn config(extra_redis: &str, cache: &str) -> String {
    format!(
        r#"
redis:
  url: "${{REDIS_URL}}"
  key_prefix: "t:"
  timeout: 5s
  {extra_redis}
backends:
  catalog:
    url: "http://${{CATALOG_ADDR}}"
    cache: {cache}
routes:
  - path: /items/{{id}}
    flow:
      it: {{ http: {{ backend: catalog, path: '"/items/\($request.params.id)"' }} }}
    respond: {{ body: '$it' }}
  - path: /big
    flow:
      big: {{ http: {{ backend: catalog, path: '"/big"' }} }}
    respond: {{ body: '$big' }}
"#
    )
}

/// `caches.catalog.answers.l2` of a gateway's status.
async fn l2(addr: &str) -> Value {
    let st = get(&format!("http://{addr}/__fanout/status")).await.json();
    st["caches"]["catalog"]["answers"]["l2"].clone()
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {field} in {v}"))
}

/// The issue's scenario: two gateway processes behind one Service, one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn an_answer_fetched_through_one_process_is_served_by_another_from_redis() {
    let redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let yaml = config("", "{ ttl: 60s, l2: true }")
        .replace("${REDIS_URL}", &redis.url())
        .replace("${CATALOG_ADDR}", &stub_vars(&s)["CATALOG_ADDR"]);
    let (pa, pb) = tokio::join!(
        ServeProcess::launch("redis-a", &yaml).start(),
        ServeProcess::launch("redis-b", &yaml).start()
    );
    let (a, b) = (pa.addr().to_string(), pb.addr().to_string());

    let first = get(&format!("http://{a}/items/7")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.json(), json!({"id": "7", "name": "item 7"}));
    assert_eq!(calls(&s, "catalog"), 1);
    wait_until_async("the answer written to redis", || async {
        n(&l2(&a).await, "writes") == 1
    })
    .await;
    assert_eq!(redis.keys("t:v1:catalog:*").await.len(), 1);

    let second = get(&format!("http://{b}/items/7")).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.json(), first.json());
    assert_eq!(calls(&s, "catalog"), 1, "B answered from redis");
    let on_b = l2(&b).await;
    assert_eq!((n(&on_b, "hits"), n(&on_b, "errors")), (1, 0), "{on_b}");
    let on_a = l2(&a).await;
    assert_eq!((n(&on_a, "misses"), n(&on_a, "writes")), (1, 1), "{on_a}");

    // B keeps it in memory now: no second read of redis
    get(&format!("http://{b}/items/7")).await;
    assert_eq!(n(&l2(&b).await, "hits"), 1);
    assert_eq!(calls(&s, "catalog"), 1);
}

/// The key lives in Redis for the cache's ttl plus the longer stale window, then is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn the_redis_entry_expires_with_the_cache_ttl() {
    let redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let cfg = config("", "{ ttl: 2s, stale_if_error: 1s, l2: true }");
    let gw = gateway_with(&cfg, &s, &[("REDIS_URL", redis.url())]).await;
    let addr = gw.addr.to_string();
    assert_eq!(get(&format!("http://{addr}/items/1")).await.status, 200);
    // the counter, not the key: a key that already expired cannot be missed
    wait_until_async("the answer written to redis", || async {
        n(&l2(&addr).await, "writes") == 1
    })
    .await;
    // (absent only if the machine stalled for the whole 3 s since the write)
    for key in redis.keys("t:v1:catalog:*").await {
        let pttl = redis.pttl(&key).await;
        assert!(pttl == -2 || (1..=3000).contains(&pttl), "PTTL {pttl}");
    }
    wait_until_async("the key to expire", || async {
        redis.keys("t:v1:catalog:*").await.is_empty()
    })
    .await;
}

/// Requests with new ids (each a miss in memory, so each asks Redis) until `stop` says so;
/// panics on any answer other than 200, or when `stop` has not held after [`PATIENCE`] × 3.
/// Returns how many were answered.
async fn stream_until(addr: &str, from: usize, mut stop: impl AsyncFnMut() -> bool) -> usize {
    let c = client(false);
    let started = std::time::Instant::now();
    let mut i = from;
    loop {
        let r = send(
            &c,
            http::Method::GET,
            &format!("http://{addr}/items/{i}"),
            &[],
            "",
        )
        .await;
        assert_eq!(
            r.status,
            200,
            "request {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["id"], i.to_string());
        i += 1;
        if stop().await {
            return i - from;
        }
        assert!(
            started.elapsed() < PATIENCE * 3,
            "the stream's condition never held"
        );
    }
}

/// Four clients send requests with new ids (each a miss in memory, so each asks Redis) without
/// pause while Redis is killed under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn redis_killed_under_a_stream_of_requests_costs_no_request() {
    use std::sync::atomic::AtomicBool;
    let mut redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let cfg = config("", "{ ttl: 60s, l2: true }");
    let gw = gateway_with(&cfg, &s, &[("REDIS_URL", redis.url())]).await;
    let addr = gw.addr.to_string();
    let (next, ok, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (next, ok, stop, addr) = (next.clone(), ok.clone(), stop.clone(), addr.clone());
            tokio::spawn(async move {
                let c = client(false);
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let url = format!("http://{addr}/items/{i}");
                    let r = send(&c, http::Method::GET, &url, &[], "").await;
                    let body = String::from_utf8_lossy(&r.body).to_string();
                    assert_eq!(r.status, 200, "request {i}: {body}");
                    assert_eq!(r.json()["id"], i.to_string());
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    wait_until_async("20 answers written to redis", || async {
        n(&l2(&addr).await, "writes") >= 20
    })
    .await;
    let up = l2(&addr).await;
    assert_eq!(n(&up, "errors") + n(&up, "skipped"), 0, "{up}");

    redis.kill();
    let at_kill = ok.load(Ordering::Relaxed);
    wait_until_async_showing(
        "failed commands, skipped reads, and 100 answers since the kill",
        || async {
            let c = l2(&addr).await;
            let since = ok.load(Ordering::Relaxed) - at_kill;
            let running = workers.iter().filter(|w| !w.is_finished()).count();
            // Reads and writes share one breaker: the failures that open it may all be writes
            // (queued answers sent just after the kill), and every later read is then skipped —
            // including the probes, whenever a write takes them. Either kind of failure counts.
            let failed = n(&c, "errors") + n(&c, "write_errors");
            if failed >= 1 && n(&c, "skipped") >= 1 && since >= 100 {
                Ok(())
            } else {
                Err(format!(
                    "l2 {c}, {since} answers since the kill, {running} of 4 clients running"
                ))
            }
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("every request answered 200");
    }
    let answered = ok.load(Ordering::Relaxed);
    assert_eq!(next.load(Ordering::Relaxed), answered, "no request lost");
    assert_eq!(
        calls(&s, "catalog"),
        answered as u64,
        "each answered by the backend"
    );
}

/// A Redis that accepts but never answers: each command waits `timeout`, then the breaker skips
/// Redis; once it answers again, a probe after `open_for` brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn a_frozen_redis_times_out_is_skipped_and_is_used_again_when_back() {
    let redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let cfg = config("", "{ ttl: 60s, l2: true }").replace(
        "timeout: 5s",
        "timeout: 100ms\n  breaker: { consecutive_failures: 2, open_for: 100ms }",
    );
    let gw = gateway_with(&cfg, &s, &[("REDIS_URL", redis.url())]).await;
    let addr = gw.addr.to_string();
    let mut next = stream_until(&addr, 0, async || n(&l2(&addr).await, "writes") >= 1).await;

    redis.signal("-STOP");
    next += stream_until(&addr, next, async || {
        let c = l2(&addr).await;
        n(&c, "errors") >= 2 && n(&c, "skipped") >= 1
    })
    .await;

    redis.signal("-CONT");
    let frozen = l2(&addr).await;
    let answered = |c: &Value| n(c, "hits") + n(c, "misses");
    stream_until(&addr, next, async || {
        answered(&l2(&addr).await) > answered(&frozen)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn oversized_answers_are_not_written_and_corrupt_values_are_misses() {
    let redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let cfg = config("max_value_bytes: 600", "{ ttl: 60s, l2: true }");
    let vars = [("REDIS_URL", redis.url())];
    let gw = gateway_with(&cfg, &s, &vars).await;
    let url = |gw: &fanout::RunningGateway, p: &str| format!("http://{}{p}", gw.addr);

    // /big is ~1 KB: kept in memory, not written
    let big = get(&url(&gw, "/big")).await;
    assert_eq!(big.status, 200);
    assert!(big.body.len() > 1000);
    assert_eq!(get(&url(&gw, "/big")).await.body, big.body, "from memory");
    let c = l2(&gw.addr.to_string()).await;
    assert_eq!((n(&c, "too_large"), n(&c, "writes")), (1, 0), "{c}");

    // a small answer is written; then garbage replaces it
    assert_eq!(get(&url(&gw, "/items/1")).await.status, 200);
    wait_until_async("the answer written to redis", || async {
        redis.keys("t:v1:catalog:*").await.len() == 1
    })
    .await;
    let key = redis.keys("t:v1:catalog:*").await.remove(0);
    assert!(redis.get(&key).await.unwrap().len() <= 600);

    // a second instance (empty memory) reads the key: garbage, an oversized value, a list
    let oversized = "x".repeat(5000);
    let cases: [&[&[&str]]; 3] = [
        &[&["SET", &key, "FOL2\u{1} not an answer"]],
        &[&["SET", &key, &oversized]],
        &[&["DEL", &key], &["RPUSH", &key, "x"]],
    ];
    for (i, commands) in cases.into_iter().enumerate() {
        for c in commands {
            redis.command(c).await;
        }
        let other = gateway_with(&cfg, &s, &vars).await;
        let before = calls(&s, "catalog");
        let r = get(&url(&other, "/items/1")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!({"id": "1", "name": "item 1"}));
        assert_eq!(
            calls(&s, "catalog"),
            before + 1,
            "case {i}: from the backend"
        );
        let c = l2(&other.addr.to_string()).await;
        assert_eq!(
            (n(&c, "corrupt"), n(&c, "misses"), n(&c, "errors")),
            (1, 1, 0),
            "case {i}: {c}"
        );
        // its write of the good answer lands before the next case writes garbage again
        let other_addr = other.addr.to_string();
        wait_until_async("the answer written again", || async {
            n(&l2(&other_addr).await, "writes") == 1
        })
        .await;
        other.shutdown().await.unwrap();
    }
}

/// An instance started while the backend fails answers from another instance's stale answer in
/// Redis, within `stale_if_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn a_new_instance_serves_a_stale_answer_from_redis_when_the_backend_fails() {
    let redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let cfg = config("", "{ ttl: 1s, stale_if_error: 60s, l2: true }");
    let vars = [("REDIS_URL", redis.url())];
    let first = gateway_with(&cfg, &s, &vars).await;
    let fresh = get(&format!("http://{}/items/3", first.addr)).await;
    assert_eq!(fresh.status, 200);
    let first_addr = first.addr.to_string();
    wait_until_async("the answer written to redis", || async {
        n(&l2(&first_addr).await, "writes") == 1
    })
    .await;
    let key = redis.keys("t:v1:catalog:*").await.remove(0);
    // kept for ttl + stale_if_error = 61 s; below 60 s left, the answer is older than its ttl
    wait_until_async("the answer to be stale", || async {
        (0..60_000).contains(&redis.pttl(&key).await)
    })
    .await;

    let mut failing = (*s.behaviour("catalog", "GET /items/{id}").unwrap()).clone();
    failing.status = http::StatusCode::SERVICE_UNAVAILABLE;
    assert!(s.set_behaviour("catalog", "GET /items/{id}", failing));
    let second = gateway_with(&cfg, &s, &vars).await;
    let before = calls(&s, "catalog");
    let stale = get(&format!("http://{}/items/3", second.addr)).await;
    assert_eq!(
        stale.status,
        200,
        "{}",
        String::from_utf8_lossy(&stale.body)
    );
    assert_eq!(stale.json(), fresh.json());
    assert_eq!(
        calls(&s, "catalog"),
        before + 1,
        "the backend was asked, and failed"
    );
    let st = get(&format!("http://{}/__fanout/status", second.addr))
        .await
        .json();
    let answers = &st["caches"]["catalog"]["answers"];
    assert_eq!(answers["stale_served"], 1, "{st}");
    let l2 = &answers["l2"];
    assert_eq!(
        (&l2["hits"], &l2["misses"]),
        (&json!(0), &json!(1)),
        "stale: a miss: {st}"
    );
}

/// Without `l2: true` a backend's cache stays in memory, even with a `redis:` section.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn only_backends_with_l2_use_redis() {
    let redis = RedisServer::start().await;
    let s = stubs(STUBS).await;
    let gw = gateway_with(
        &config("", "{ ttl: 60s }"),
        &s,
        &[("REDIS_URL", redis.url())],
    )
    .await;
    assert_eq!(
        get(&format!("http://{}/items/1", gw.addr)).await.status,
        200
    );
    assert!(l2(&gw.addr.to_string()).await.is_null());
    assert!(redis.keys("*").await.is_empty());
}

/// Config errors of the `redis:` section point at the field, and never print the URL (it may
/// hold a password).
#[test]
fn redis_config_errors_name_the_field_not_the_password() {
    let route = "routes: []\n";
    let backend =
        "backends:\n  b:\n    url: http://127.0.0.1:1\n    cache: { ttl: 1s, l2: true }\n";
    let cases = [
        (
            format!("{backend}{route}"),
            "backend `b`: cache.l2 needs a top-level `redis:` section",
        ),
        (
            format!("redis:\n  url: rediss://h:6380\n{route}"),
            "fanout.yaml:2:8: redis.url: TLS (`rediss://`) is not supported",
        ),
        (
            format!("redis:\n  url: http://h\n{route}"),
            "fanout.yaml:2:8: redis.url must start with `redis://` or `redis+unix://`",
        ),
        (
            format!("redis:\n  url: \"redis://u:s3cret@[::1\"\n{route}"),
            "fanout.yaml:2:8: redis.url is not a valid Redis URL",
        ),
        (
            format!("redis:\n  url: redis://h\n  timeout: 0ms\n{route}"),
            "redis.timeout and connect_timeout must be positive",
        ),
        (
            format!("redis:\n  url: redis://h\n  breaker: {{ consecutive_failures: 0 }}\n{route}"),
            "redis.breaker.consecutive_failures must be at least 1",
        ),
    ];
    for (yaml, expected) in cases {
        let err = match fanout::load_gateway("fanout.yaml", &yaml, &|_: &str| None) {
            Ok(_) => panic!("loaded:\n{yaml}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expected), "{err}\n--- for ---\n{yaml}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}
