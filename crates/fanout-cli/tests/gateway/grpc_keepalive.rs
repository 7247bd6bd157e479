//! The seed's keepalive lesson (docs/grpc.md#keepalive): two gRPC backend replicas — real
//! `fanout stub` processes — under load, one frozen with SIGSTOP. The frozen replica's
//! connection is closed by the keepalive PING timeout (not the call timeout, 30 s here: the
//! seed's clients hung ~20 s), its calls retried on the other replica and the address ejected;
//! after SIGCONT it is probed back and gets calls again.

use crate::support::ServeProcess;
use fanout_testkit::*;
use http::Method;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PROTO: &str = r#"syntax = "proto3";
package ka.v1;
service Users {
  rpc GetUser(GetUserRequest) returns (User) { option idempotency_level = NO_SIDE_EFFECTS; }
}
message GetUserRequest { string id = 1; }
message User { string id = 1; string replica = 2; }
"#;

/// A `fanout stub` process serving `ka.v1.Users/GetUser` on an ephemeral port as replica `name`.
fn replica(name: &str) -> ServeProcess {
    let stubs = format!(
        "protos: {{ files: [ka.proto] }}\nservices:\n  {name}:\n    listen: 127.0.0.1:0\n    routes:\n      - grpc: ka.v1.Users/GetUser\n        latency: 1ms\n        body: '{{id: $request.body.id, replica: \"{name}\"}}'\n"
    );
    ServeProcess::launch(&format!("keepalive-{name}"), &stubs)
        .stub()
        .file("ka.proto", PROTO)
        .start_blocking()
}

async fn status(addr: std::net::SocketAddr) -> Value {
    get(&format!("http://{addr}/__fanout/status")).await.json()
}

fn address(status: &Value, addr: &str) -> Value {
    status["backends"]["users"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["address"].as_str().unwrap().contains(addr))
        .cloned()
        .unwrap_or_else(|| panic!("no address {addr} in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_is_left_within_the_keepalive_timeout_and_comes_back() {
    let dir = std::env::temp_dir().join(format!("fanout-keepalive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ka.proto"), PROTO).unwrap();
    let a = replica("a");
    let b = replica("b");

    let config = format!(
        r#"
protos: {{ files: [ka.proto], include: ["{dir}"] }}
backends:
  users:
    urls: ["http://{a}", "http://{b}"]
    protocol: grpc
    timeout: 30s
    keepalive: {{ interval: 500ms, timeout: 1s }}
    retry: {{ attempts: 3 }}
    outlier: {{ consecutive_failures: 1, base_ejection: 2s, max_ejection: 2s }}
    # The latency average forgets the frozen period in seconds, not the default 10 s time constant.
    balance: {{ decay: 1s }}
routes:
  - path: /user/{{id}}
    deadline: 30s
    flow:
      user:
        grpc: {{ backend: users, method: ka.v1.Users/GetUser, message: '{{id: $request.params.id}}' }}
    respond:
      body: '$user'
"#,
        dir = dir.display(),
        a = a.addr(),
        b = b.addr()
    );
    let loaded = fanout::load_gateway("fanout.yaml", &config, &|_| None)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    let gw = fanout::start_gateway(loaded, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .expect("bind gateway");
    let addr = gw.addr;

    // Load: 4 clients in a loop; every answer's latency and replica recorded.
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let max_ms = Arc::new(AtomicU64::new(0));
    let served_a = Arc::new(AtomicU64::new(0));
    let served_b = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (stop, failed, max_ms) = (stop.clone(), failed.clone(), max_ms.clone());
        let (sa, sb) = (served_a.clone(), served_b.clone());
        tasks.push(tokio::spawn(async move {
            let c = client(false);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let started = Instant::now();
                let r = send(
                    &c,
                    Method::GET,
                    &format!("http://{addr}/user/{t}-{i}"),
                    &[],
                    "",
                )
                .await;
                max_ms.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                if r.status != 200 {
                    failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                match r.json()["replica"].as_str() {
                    Some("a") => sa.fetch_add(1, Ordering::Relaxed),
                    _ => sb.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let both = |n: u64| {
        let (sa, sb) = (served_a.clone(), served_b.clone());
        move || sa.load(Ordering::Relaxed) >= n && sb.load(Ordering::Relaxed) >= n
    };
    wait_within("both replicas serve", Duration::from_secs(30), both(20)).await;

    // Freeze replica a.
    a.signal("-STOP");
    let frozen_at = Instant::now();
    max_ms.store(0, Ordering::Relaxed);
    let gw_addr = gw.addr;
    let a_addr = a.addr().to_string();
    wait_for_async("a ejected", Duration::from_secs(30), || {
        let a_addr = a_addr.clone();
        async move {
            let st = status(gw_addr).await;
            (address(&st, &a_addr)["ejected"] == true).then_some(())
        }
    })
    .await;
    let detected = frozen_at.elapsed();
    // The load goes on on b alone.
    let b_before = served_b.load(Ordering::Relaxed);
    let a_frozen = served_a.load(Ordering::Relaxed);
    wait_within("b serves alone", Duration::from_secs(30), {
        let sb = served_b.clone();
        move || sb.load(Ordering::Relaxed) >= b_before + 200
    })
    .await;
    assert_eq!(
        served_a.load(Ordering::Relaxed),
        a_frozen,
        "a frozen replica answers nothing"
    );
    let worst_frozen = Duration::from_millis(max_ms.load(Ordering::Relaxed));

    // Thaw: a is probed back after its ejection and serves again.
    a.signal("-CONT");
    let thawed_at = Instant::now();
    wait_within("a serves again", Duration::from_secs(60), {
        let sa = served_a.clone();
        move || sa.load(Ordering::Relaxed) >= a_frozen + 20
    })
    .await;
    let back = thawed_at.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    eprintln!(
        "keepalive failover: a ejected {:.2} s after SIGSTOP; slowest request while frozen {:.2} s; \
         a served again {:.2} s after SIGCONT; failed requests {}",
        detected.as_secs_f64(),
        worst_frozen.as_secs_f64(),
        back.as_secs_f64(),
        failed.load(Ordering::Relaxed)
    );
    // Found by the keepalive (1.5 s), not the 30 s call timeout; generous bounds for a loaded
    // machine, far below the seed's 20 s hang.
    assert!(
        worst_frozen < Duration::from_secs(10),
        "a request waited {worst_frozen:?} on the frozen replica"
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "retries moved the frozen replica's calls to the other one"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
