//! M1: swapping models does not change the thread count — the same before and after 100 swaps
//! made while requests run (read from /proc/self/task; gateway, stubs and client share this
//! test's fixed runtime, and this binary runs no other test).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_testkit::*;
use support::gateway_with;

const STUBS: &str = r#"
services:
  unused:
    listen: "${UNUSED_ADDR}"
    routes: [{ path: /, body: '1' }]
"#;

const GATEWAY: &str = r#"
models: { dir: "${MODELS_DIR}", poll: 20ms, settle: 0ms }
routes:
  - path: /score
    method: POST
    flow:
      s: { model: { name: m, input: '$request.body.row' } }
    respond: { body: '$s' }
"#;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn model(name: &str) -> Vec<u8> {
    std::fs::read(repo_root().join(format!("crates/fanout-model/testdata/{name}.onnx"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_count_is_the_same_before_and_after_100_model_swaps_under_requests() {
    let dir = TempDir::new("model-threads");
    let (a, b) = (model("logreg_bin"), model("gbdt_bin"));
    std::fs::write(dir.join("m.onnx"), &a).unwrap();
    let s = stubs(STUBS).await;
    let gw = gateway_with(
        GATEWAY,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    let url = format!("http://{}/score", gw.addr);
    let body = serde_json::json!({ "row": vec![0.5; 20] }).to_string();
    let loads = || {
        gw.gateway().status_json()["models"]["m"]["loads"]
            .as_u64()
            .unwrap_or(0)
    };
    for _ in 0..20 {
        assert_eq!(post(&url, &body).await.status, 200);
    }
    let before = threads();
    for i in 0..100u64 {
        let tmp = dir.join(".m.onnx.tmp");
        std::fs::write(&tmp, if i % 2 == 0 { &b } else { &a }).unwrap();
        std::fs::rename(&tmp, dir.join("m.onnx")).unwrap();
        // Requests go on while the file is replaced; each is answered by one version or the other.
        let since = std::time::Instant::now();
        while loads() < i + 2 {
            let r = post(&url, &body).await;
            assert_eq!(r.status, 200, "swap {i}: {}", r.text());
            assert!(
                since.elapsed() < std::time::Duration::from_secs(60),
                "swap {i} was never picked up"
            );
        }
    }
    assert_eq!(threads(), before, "threads before and after 100 swaps");
    let m = &gw.gateway().status_json()["models"]["m"];
    assert_eq!(m["load_failures"], 0, "{m}");
    assert_eq!(m["failed"], 0, "{m}");
}
