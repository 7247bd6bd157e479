//! Model steps (M1): the committed models answer through a real gateway as onnxruntime does;
//! a step naming a missing model or the wrong number of features is a config error at its line;
//! a replaced file is swapped in, and a broken, half-written or incompatible one never replaces
//! the version serving; a full queue answers 503 `model_queue_full`.

use crate::support::gateway_with;
use fanout_testkit::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every committed model (crates/fanout-model/testdata).
const MODELS: &[&str] = &[
    "logreg",
    "logreg_bin",
    "mlp",
    "gbdt_clf",
    "gbdt_bin",
    "rf_clf",
    "gbdt_reg",
    "rf_reg",
    "linreg",
    "trees_avg2",
    "trees_max",
    "trees_bin_clf",
    "dense_ops",
];

fn testdata(file: &str) -> PathBuf {
    repo_root().join("crates/fanout-model/testdata").join(file)
}

fn reference(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(testdata(&format!("{name}.ref.json"))).unwrap()).unwrap()
}

fn copy_model(from: &str, dir: &Path, to: &str) {
    std::fs::copy(
        testdata(&format!("{from}.onnx")),
        dir.join(format!("{to}.onnx")),
    )
    .unwrap();
}

/// Replace `dir/NAME.onnx` the documented way: write a hidden temporary file, rename it over.
fn replace_model(dir: &Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!(".{name}.onnx.tmp"));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{name}.onnx"))).unwrap();
}

/// Whether `got` (a step's values, one per row) is the reference's outputs to 1e-5 (relative
/// above 1).
fn check(name: &str, reference: &Value, got: &[Value]) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    let rows = reference["inputs"].as_array().unwrap().len();
    assert_eq!(got.len(), rows, "{name}: one value per row");
    for (r, g) in got.iter().enumerate() {
        if let Some(labels) = reference.get("labels") {
            assert_eq!(g["label"], labels[r], "{name} row {r}: label");
            let classes = reference["classes"].as_array().unwrap();
            for (c, class) in classes.iter().enumerate() {
                let want = reference["probabilities"][r][c].as_f64().unwrap();
                let have = g["probabilities"][class.to_string()].as_f64().unwrap();
                assert!(
                    close(have, want),
                    "{name} row {r} class {class}: {have} vs {want}"
                );
            }
        } else {
            let want: Vec<f64> = reference["values"][r]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let have: Vec<f64> = match want.len() {
                1 => vec![g["value"].as_f64().unwrap()],
                _ => g["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect(),
            };
            assert_eq!(have.len(), want.len(), "{name} row {r}: targets");
            for (h, w) in have.iter().zip(&want) {
                assert!(close(*h, *w), "{name} row {r}: {h} vs {w}");
            }
        }
    }
}

/// A gateway whose `POST /score` evaluates model `m` of `dir` on `$request.body.row`, the
/// directory watched every `poll` with `settle` (and the stub server started beside it).
async fn scoring_gateway(
    dir: &Path,
    poll: &str,
    settle: &str,
) -> (fanout::RunningGateway, fanout_stub::StubServer) {
    let yaml = format!(
        r#"
models: {{ dir: "${{MODELS_DIR}}", poll: {poll}, settle: {settle} }}
routes:
  - path: /score
    method: POST
    flow:
      s: {{ model: {{ name: m, input: '$request.body.row' }} }}
    respond: {{ body: '$s' }}
"#
    );
    let s = no_stubs().await;
    let gw = gateway_with(&yaml, &s, &[("MODELS_DIR", dir.display().to_string())]).await;
    (gw, s)
}

async fn no_stubs() -> fanout_stub::StubServer {
    // No backend is called; a gateway is started beside a stub like every other.
    stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: [{path: /, body: '1'}]\n").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_model_answers_like_onnxruntime_through_the_gateway() {
    let dir = TempDir::new("models-all");
    let mut routes = String::new();
    for name in MODELS {
        copy_model(name, dir.path(), name);
        let width = reference(name)["inputs"][0].as_array().unwrap().len();
        let features: Vec<String> = (0..width)
            .map(|i| format!("'$request.body.row[{i}]'"))
            .collect();
        // Every row in one request (`for_each`: one batch), and one row by `features`.
        routes.push_str(&format!(
            r#"
  - path: /rows/{name}
    method: POST
    flow:
      scores:
        for_each: '$request.body.rows'
        model: {{ name: {name}, input: '$item' }}
    respond: {{ body: '$scores' }}
  - path: /row/{name}
    method: POST
    flow:
      score:
        model: {{ name: {name}, features: [{}] }}
    respond: {{ body: '$score' }}
"#,
            features.join(", ")
        ));
    }
    let yaml = format!("models:\n  dir: ${{MODELS_DIR}}\nroutes:{routes}");
    let s = no_stubs().await;
    let gw = gateway_with(
        &yaml,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    for name in MODELS {
        let r = reference(name);
        let rows = &r["inputs"];
        let all = post(
            &format!("http://{}/rows/{name}", gw.addr),
            &json!({ "rows": rows }).to_string(),
        )
        .await;
        assert_eq!(all.status, 200, "{name}: {}", all.text());
        check(name, &r, all.json().as_array().unwrap());
        // One row at a time: the same values.
        let mut one = Vec::new();
        for row in rows.as_array().unwrap().iter().take(3) {
            let a = post(
                &format!("http://{}/row/{name}", gw.addr),
                &json!({ "row": row }).to_string(),
            )
            .await;
            assert_eq!(a.status, 200, "{name}: {}", a.text());
            one.push(a.json());
        }
        let mut first3 = r.clone();
        for key in ["inputs", "labels", "probabilities", "values"] {
            if let Some(list) = first3.get_mut(key).and_then(Value::as_array_mut) {
                list.truncate(3);
            }
        }
        check(name, &first3, &one);
    }
    // The status endpoint shows each model's version, and the batches run.
    let status = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    for name in MODELS {
        let m = &status["models"][name];
        assert_eq!(m["version"].as_str().map(str::len), Some(16), "{name}: {m}");
        assert_eq!(m["loads"], 1, "{name}");
        assert!(m["rows"].as_u64().unwrap() >= 35, "{name}: {m}");
        assert!(
            m["batches"].as_u64().unwrap() < m["rows"].as_u64().unwrap(),
            "{name}: the rows of one request share evaluations: {m}"
        );
        // Per-model latency: bucket bounds in ms, p50 ≤ p99.
        for (p50, p99) in [
            ("queue_p50_ms", "queue_p99_ms"),
            ("compute_p50_ms", "compute_p99_ms"),
        ] {
            let (a, b) = (m[p50].as_f64(), m[p99].as_f64());
            assert!(
                matches!((a, b), (Some(a), Some(b)) if a > 0.0 && a <= b),
                "{name}: {p50} {p99}: {m}"
            );
        }
    }
}

/// Model steps reading one array convert it once per request (the array's numbers are kept
/// for the next step that reads the same array): every step still scores its own request's
/// row, a step reading another array scores that one, and the next request's rows are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_steps_sharing_one_input_array_score_their_own_requests_row() {
    let dir = TempDir::new("models-shared-row");
    for name in ["logreg", "gbdt_reg", "mlp"] {
        copy_model(name, dir.path(), name);
    }
    let yaml = r#"
models: { dir: "${MODELS_DIR}" }
routes:
  - path: /all
    method: POST
    flow:
      a: { model: { name: logreg, input: '$request.body.row' } }
      b: { model: { name: gbdt_reg, input: '$request.body.row' } }
      c: { model: { name: mlp, input: '$request.body.row' } }
      d: { model: { name: logreg, input: '$request.body.other' } }
      e: { model: { name: mlp, input: '$request.body.row' } }
    respond: { body: '{a: $a, b: $b, c: $c, d: $d, e: $e}' }
  - path: /one/{model}
    method: POST
    flow:
      logreg: { when: '$request.params.model == "logreg"', model: { name: logreg, input: '$request.body.row' } }
      gbdt_reg: { when: '$request.params.model == "gbdt_reg"', model: { name: gbdt_reg, input: '$request.body.row' } }
      mlp: { when: '$request.params.model == "mlp"', model: { name: mlp, input: '$request.body.row' } }
    respond: { body: '$logreg // $gbdt_reg // $mlp' }
"#;
    let s = no_stubs().await;
    let gw = gateway_with(
        yaml,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    let logreg = reference("logreg");
    let inputs = logreg["inputs"].as_array().unwrap().clone();
    let one = |model: &'static str, row: &Value| {
        let url = format!("http://{}/one/{model}", gw.addr);
        let body = json!({ "row": row }).to_string();
        async move {
            let r = post(&url, &body).await;
            assert_eq!(r.status, 200, "{model}: {}", r.text());
            r.json()
        }
    };
    let mut differed = 0;
    let (mut a_scores, mut d_scores) = (Vec::new(), Vec::new());
    for i in 0..8 {
        let (row, other) = (&inputs[i], &inputs[(i + 1) % inputs.len()]);
        let all = post(
            &format!("http://{}/all", gw.addr),
            &json!({ "row": row, "other": other }).to_string(),
        )
        .await;
        assert_eq!(all.status, 200, "{}", all.text());
        let all = all.json();
        assert_eq!(all["a"], one("logreg", row).await, "request {i}");
        assert_eq!(all["b"], one("gbdt_reg", row).await, "request {i}");
        assert_eq!(all["c"], one("mlp", row).await, "request {i}");
        assert_eq!(all["e"], all["c"], "request {i}");
        assert_eq!(all["d"], one("logreg", other).await, "request {i}");
        if all["a"] != all["d"] {
            differed += 1;
        }
        a_scores.push(all["a"].clone());
        d_scores.push(all["d"].clone());
    }
    assert!(differed > 0, "the rows give different scores");
    // And they are onnxruntime's scores of those rows.
    let rows = |from: usize| {
        let mut r = logreg.clone();
        for key in ["inputs", "labels", "probabilities"] {
            let list = r[key].as_array_mut().unwrap();
            let n = list.len();
            *list = (from..from + 8).map(|i| list[i % n].clone()).collect();
        }
        r
    };
    check("logreg", &rows(0), &a_scores);
    check("logreg", &rows(1), &d_scores);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_wrong_feature_is_answered_400_naming_it() {
    let dir = TempDir::new("models-bad-input");
    copy_model("dense_ops", dir.path(), "d");
    let yaml = r#"
models: { dir: "${MODELS_DIR}" }
routes:
  - path: /by-row
    method: POST
    flow:
      s: { model: { name: d, input: '$request.body.row' } }
    respond: { body: '$s' }
  - path: /by-features
    method: POST
    flow:
      s: { model: { name: d, features: ['$request.body.a', '$request.body.b', 1, true] } }
    respond: { body: '$s' }
"#;
    let s = no_stubs().await;
    let gw = gateway_with(
        yaml,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    let ok = post(&url("/by-features"), r#"{"a": 1.5, "b": null}"#).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["values"].as_array().map(Vec::len), Some(3));
    let short = post(&url("/by-row"), r#"{"row": [1, 2, 3]}"#).await;
    assert_eq!(short.status, 400, "{}", short.text());
    assert_eq!(short.code(), "bad_model_input");
    assert!(short.text().contains("takes 4"), "{}", short.text());
    let text = post(&url("/by-features"), r#"{"a": "x", "b": 1}"#).await;
    assert_eq!(text.status, 400, "{}", text.text());
    assert_eq!(text.code(), "bad_model_input");
    // Numbered from 0, as `input[i]` and the model's own messages are.
    assert!(text.text().contains("features[0]"), "{}", text.text());
    let text = post(&url("/by-row"), r#"{"row": [1, 2, 3, "x"]}"#).await;
    assert_eq!(text.status, 400, "{}", text.text());
    assert!(text.text().contains("input[3]"), "{}", text.text());
    // A number where the row is expected: what was given and what was expected (it said "a
    // number out of range").
    let number = post(&url("/by-row"), r#"{"row": 5}"#).await;
    assert_eq!(number.status, 400, "{}", number.text());
    assert_eq!(number.code(), "bad_model_input");
    assert!(
        number
            .text()
            .contains("input is a number, not an array of 4 numbers"),
        "{}",
        number.text()
    );
    // A feature out of a 32-bit float's range is that.
    let big = post(&url("/by-row"), r#"{"row": [1, 2, 3, 1e39]}"#).await;
    assert_eq!(big.status, 400, "{}", big.text());
    assert!(
        big.text().contains("input[3] is a number out of range"),
        "{}",
        big.text()
    );
}

/// A binary LinearSVC (one score column in its export) answers that one score, keyed by the
/// second class, as onnxruntime does (it answered two: `[-s, s]`); and an MLP given features
/// among the largest floats answers onnxruntime's labels and probabilities (it answered `null`
/// where products overflowed): testdata/extremes.ref.json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_svc_answers_one_score_and_huge_features_answer_like_onnxruntime() {
    let dir = TempDir::new("models-svc-extremes");
    copy_model("svc_bin", dir.path(), "svc");
    copy_model("mlp_bin", dir.path(), "mlp");
    let yaml = r#"
models: { dir: "${MODELS_DIR}" }
routes:
  - path: /svc
    method: POST
    flow:
      s: { model: { name: svc, input: '$request.body.row' } }
    respond: { body: '$s' }
  - path: /mlp
    method: POST
    flow:
      s: { for_each: '$request.body.rows', model: { name: mlp, input: '$item' } }
    respond: { body: '$s' }
"#;
    let s = no_stubs().await;
    let gw = gateway_with(
        yaml,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    let svc = reference("svc_bin");
    for r in [0, 2, 3] {
        let a = post(
            &format!("http://{}/svc", gw.addr),
            &json!({ "row": svc["inputs"][r] }).to_string(),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        let v = a.json();
        assert_eq!(v["label"], svc["labels"][r], "row {r}: {v}");
        let p = v["probabilities"].as_object().unwrap();
        assert_eq!(p.len(), 1, "row {r}: one score, as onnxruntime: {v}");
        let (have, want) = (
            p["1"].as_f64().unwrap(),
            svc["probabilities"][r][0].as_f64().unwrap(),
        );
        assert!(
            (have - want).abs() <= 1e-5 * want.abs().max(1.0),
            "row {r}: {v}"
        );
    }
    let extremes: Value =
        serde_json::from_slice(&std::fs::read(testdata("extremes.ref.json")).unwrap()).unwrap();
    let mlp = &extremes["models"]["mlp_bin"];
    let a = post(
        &format!("http://{}/mlp", gw.addr),
        &json!({ "rows": mlp["inputs"] }).to_string(),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let got = a.json();
    for (r, g) in got.as_array().unwrap().iter().enumerate() {
        assert_eq!(g["label"], mlp["labels"][r], "row {r}: {g}");
        for (c, want) in mlp["probabilities"][r]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let have = &g["probabilities"][c.to_string()];
            match want.as_f64() {
                Some(w) => assert!(
                    have.as_f64().is_some_and(|h| (h - w).abs() <= 1e-5),
                    "row {r} class {c}: {g} vs {want}"
                ),
                // NaN and the infinities are `null` in a step's value.
                None => assert!(have.is_null(), "row {r} class {c}: {g} vs {want}"),
            }
        }
    }
}

/// The antispam example's `/check-batch`: one row per message of the request, through
/// `for_each`. A message with a bad row is the client's bad data — 400 `bad_model_input`
/// naming the element and the feature — not the flow's failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_row_inside_for_each_is_the_clients_bad_data_400_bad_model_input() {
    let dir = TempDir::new("models-bad-batch-row");
    std::fs::copy(
        repo_root().join("examples/antispam/models/spam_gbdt.onnx"),
        dir.path().join("spam_gbdt.onnx"),
    )
    .unwrap();
    let yaml = r#"
models: { dir: "${MODELS_DIR}" }
routes:
  - path: /check-batch
    method: POST
    flow:
      gbdt:
        for_each: '$request.body.messages'
        model: { name: spam_gbdt, input: '$item.features' }
        result: '.label == 1'
    respond: { body: '{spam: $gbdt}' }
"#;
    let s = no_stubs().await;
    let gw = gateway_with(
        yaml,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    let url = format!("http://{}/check-batch", gw.addr);
    let good: Vec<f64> = (0..20).map(|i| i as f64 / 10.0).collect();
    let mut text = good.iter().map(|x| json!(x)).collect::<Vec<_>>();
    text[3] = json!("high");
    let ok = post(
        &url,
        &json!({"messages": [{"features": good}, {"features": good}]}).to_string(),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let bad = post(
        &url,
        &json!({"messages": [{"features": good}, {"features": text}]}).to_string(),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(bad.code(), "bad_model_input");
    assert!(bad.text().contains("element 1"), "{}", bad.text());
    assert!(bad.text().contains("input[3]"), "{}", bad.text());
    let short = post(
        &url,
        &json!({"messages": [{"features": [1, 2, 3]}]}).to_string(),
    )
    .await;
    assert_eq!(short.status, 400, "{}", short.text());
    assert_eq!(short.code(), "bad_model_input");
    assert!(short.text().contains("takes 20"), "{}", short.text());
    let missing = post(&url, &json!({"messages": [{"other": 1}]}).to_string()).await;
    assert_eq!(missing.status, 400, "{}", missing.text());
    assert_eq!(missing.code(), "bad_model_input");
}

/// A loader that panics (a bug in a format's code on a hostile file; here the `test-hooks`
/// feature's `NAME.panics` format) refuses its file like any load error — counted, its panic in
/// the status — and the watcher goes on: a good file dropped after it is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loader_that_panics_refuses_its_file_and_the_next_good_file_is_loaded() {
    let dir = TempDir::new("models-loader-panics");
    copy_model("logreg_bin", dir.path(), "m");
    let (gw, _s) = scoring_gateway(dir.path(), "20ms", "40ms").await;
    let status_url = format!("http://{}/__fanout/status", gw.addr);
    std::fs::write(dir.path().join("hostile.panics"), b"\x08\x80\x80").unwrap();
    let hostile = wait_for_async(
        "the panicking file refused",
        Duration::from_secs(20),
        || {
            let status_url = status_url.clone();
            async move {
                let s = get(&status_url).await.json();
                let m = s["models"]["hostile"].clone();
                (m["load_failures"] == 1).then_some(m)
            }
        },
    )
    .await;
    assert_eq!(hostile["loads"], 0, "{hostile}");
    let err = hostile["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("panicked"), "{hostile}");
    // The next good file is loaded (within poll + settle; the wait allows a loaded machine).
    copy_model("gbdt_bin", dir.path(), "next");
    let next = wait_for_async("the next good file loaded", Duration::from_secs(20), || {
        let status_url = status_url.clone();
        async move {
            let s = get(&status_url).await.json();
            let m = s["models"]["next"].clone();
            (m["loads"] == 1).then_some(s)
        }
    })
    .await;
    assert_eq!(
        next["models_watcher"]["restarts"], 0,
        "{}",
        next["models_watcher"]
    );
    assert_eq!(next["models_watcher"]["running"], true);
    let admin = gw.admin_addr.expect("admin listener");
    assert_eq!(get(&format!("http://{admin}/readyz")).await.status, 200);
}

/// The watcher blocked in a scan (the `test-hooks` feature's marker file blocks it, as a read on
/// a hung file system would): after `poll + stall_timeout`, `/readyz` answers not ready saying
/// what it is doing, the status shows the same, requests are still served; once the scan ends it
/// is ready again and loads files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_blocked_in_a_scan_is_not_ready_in_readyz_until_it_finishes() {
    let dir = TempDir::new("models-watcher-hangs");
    copy_model("logreg_bin", dir.path(), "m");
    let (gw, _s) = scoring_gateway(dir.path(), "20ms, stall_timeout: 300ms", "20ms").await;
    let admin = gw.admin_addr.expect("admin listener");
    let readyz = format!("http://{admin}/readyz");
    assert_eq!(get(&readyz).await.status, 200);
    let marker = dir.path().join(".fanout-test-watcher-hangs");
    std::fs::write(&marker, b"").unwrap();
    let reason = readyz_not_ready(&readyz).await;
    assert!(
        reason.contains("has not finished a scan") && reason.contains("models.stall_timeout"),
        "{reason}"
    );
    let status_url = format!("http://{}/__fanout/status", gw.addr);
    let w = get(&status_url).await.json()["models_watcher"].clone();
    assert!(
        w["problem"]
            .as_str()
            .is_some_and(|p| p.contains("scanning the directory")),
        "{w}"
    );
    let row = json!({ "row": reference("logreg_bin")["inputs"][0] }).to_string();
    assert_eq!(
        post(&format!("http://{}/score", gw.addr), &row)
            .await
            .status,
        200
    );
    std::fs::remove_file(&marker).unwrap();
    readyz_ready(&readyz).await;
    copy_model("gbdt_bin", dir.path(), "after");
    wait_for_async(
        "a file loaded after the stall",
        Duration::from_secs(20),
        || {
            let status_url = status_url.clone();
            async move {
                let s = get(&status_url).await.json();
                (s["models"]["after"]["loads"] == 1).then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        get(&status_url).await.json()["models_watcher"]["problem"],
        serde_json::Value::Null
    );
}

/// The watcher panicking outside a load (the `test-hooks` feature's marker file makes it panic
/// before each scan): `/readyz` answers not ready naming it while it is down, it is restarted
/// (counted in the status), and once it runs again, files are loaded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_panics_is_not_ready_in_readyz_and_is_restarted() {
    let dir = TempDir::new("models-watcher-panics");
    copy_model("logreg_bin", dir.path(), "m");
    let (gw, _s) = scoring_gateway(dir.path(), "20ms", "20ms").await;
    let admin = gw.admin_addr.expect("admin listener");
    let readyz = format!("http://{admin}/readyz");
    assert_eq!(get(&readyz).await.status, 200);
    let marker = dir.path().join(".fanout-test-watcher-panics");
    std::fs::write(&marker, b"").unwrap();
    let reason = readyz_not_ready(&readyz).await;
    assert!(reason.contains("models.dir watcher"), "{reason}");
    // Requests are still served by the loaded models.
    let row = json!({ "row": reference("logreg_bin")["inputs"][0] }).to_string();
    assert_eq!(
        post(&format!("http://{}/score", gw.addr), &row)
            .await
            .status,
        200
    );
    std::fs::remove_file(&marker).unwrap();
    readyz_ready(&readyz).await;
    let status_url = format!("http://{}/__fanout/status", gw.addr);
    let w = get(&status_url).await.json()["models_watcher"].clone();
    assert!(w["restarts"].as_u64().unwrap_or(0) >= 1, "{w}");
    assert!(
        w["last_panic"]
            .as_str()
            .unwrap_or_default()
            .contains("test hook"),
        "{w}"
    );
    copy_model("gbdt_bin", dir.path(), "after");
    wait_for_async(
        "a file loaded after the restart",
        Duration::from_secs(20),
        || {
            let status_url = status_url.clone();
            async move {
                let s = get(&status_url).await.json();
                (s["models"]["after"]["loads"] == 1).then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_naming_a_missing_model_or_giving_the_wrong_width_is_a_config_error_at_its_line() {
    let dir = TempDir::new("models-config");
    copy_model("logreg", dir.path(), "logreg");
    std::fs::write(dir.path().join("broken.onnx"), b"not a model").unwrap();
    let yaml = r#"models:
  dir: ${MODELS_DIR}
routes:
  - path: /a
    flow:
      a: { model: { name: logreq, input: '[1]' } }
      b: { model: { name: logreg, features: ['1', '2'] } }
      c: { model: { name: broken, input: '[1]' } }
    respond: { body: '[$a, $b, $c]' }
"#;
    let vars = [("MODELS_DIR", dir.path().display().to_string())];
    let lookup = |n: &str| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
    let err = match fanout::load_gateway("fanout.yaml", yaml, &lookup) {
        Ok(_) => panic!("the config loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("fanout.yaml:6:"), "{err}");
    assert!(err.contains("no model `logreq`"), "{err}");
    assert!(err.contains("did you mean `logreg`"), "{err}");
    assert!(err.contains("fanout.yaml:7:"), "{err}");
    assert!(err.contains("takes 20 features; the step gives 2"), "{err}");
    assert!(err.contains("fanout.yaml:8:"), "{err}");
    assert!(err.contains("model `broken` did not load"), "{err}");
}

/// The model's version hash in the status endpoint.
async fn version(status_url: &str) -> (String, u64, Option<String>) {
    let s = get(status_url).await.json();
    let m = &s["models"]["m"];
    (
        m["version"].as_str().unwrap_or_default().to_string(),
        m["load_failures"].as_u64().unwrap_or(0),
        m["last_error"].as_str().map(str::to_string),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_file_is_swapped_in_and_a_broken_or_incompatible_one_never_replaces_it() {
    let dir = TempDir::new("models-swap");
    copy_model("logreg_bin", dir.path(), "m");
    let (gw, _s) = scoring_gateway(dir.path(), "20ms", "40ms").await;
    let (url, status_url) = (
        format!("http://{}/score", gw.addr),
        format!("http://{}/__fanout/status", gw.addr),
    );
    let row = |name: &str| reference(name)["inputs"][0].clone();
    let prob = |name: &str| reference(name)["probabilities"][0][1].as_f64().unwrap();
    let score = |body: Value| {
        let url = url.clone();
        async move {
            let a = post(&url, &json!({ "row": body }).to_string()).await;
            assert_eq!(a.status, 200, "{}", a.text());
            a.json()["probabilities"]["1"].as_f64().unwrap()
        }
    };
    let (v1, _, _) = version(&status_url).await;
    assert!((score(row("logreg_bin")).await - prob("logreg_bin")).abs() < 1e-5);

    // A new version, written then renamed: picked up, and answers as the new model.
    let gbdt = std::fs::read(testdata("gbdt_bin.onnx")).unwrap();
    replace_model(dir.path(), "m", &gbdt);
    let v2 = wait_for_async("the new version", Duration::from_secs(20), || {
        let (status_url, v1) = (status_url.clone(), v1.clone());
        async move {
            let (v, _, _) = version(&status_url).await;
            (v != v1).then_some(v)
        }
    })
    .await;
    assert!((score(row("gbdt_bin")).await - prob("gbdt_bin")).abs() < 1e-5);

    // Half-written (a truncated copy of another model), not a model, incompatible (a
    // regressor; another width): each is refused and the version serving goes on.
    let mlp = std::fs::read(testdata("mlp.onnx")).unwrap();
    let trees = std::fs::read(testdata("trees_bin_clf.onnx")).unwrap();
    let linreg = std::fs::read(testdata("linreg.onnx")).unwrap();
    let bad: [(&str, &[u8], &str); 4] = [
        ("half-written", &mlp[..mlp.len() / 2], ""),
        (
            "garbage",
            b"\x0a\xff\xff\xff\xff\x0f",
            "not a valid ONNX file",
        ),
        ("another width", &trees, "takes 6 features"),
        ("a regressor", &linreg, "refused"),
    ];
    for (i, (what, bytes, error)) in bad.into_iter().enumerate() {
        replace_model(dir.path(), "m", bytes);
        let (v, _, err) = wait_for_async(what, Duration::from_secs(20), || {
            let status_url = status_url.clone();
            async move {
                let got = version(&status_url).await;
                (got.1 > i as u64).then_some(got)
            }
        })
        .await;
        assert_eq!(v, v2, "{what}: the version serving stays");
        assert!(
            err.as_deref().unwrap_or_default().contains(error),
            "{what}: {err:?}"
        );
        assert!(
            (score(row("gbdt_bin")).await - prob("gbdt_bin")).abs() < 1e-5,
            "{what}: still answers as the version serving"
        );
    }

    // A good file again: swapped in, the error cleared.
    replace_model(
        dir.path(),
        "m",
        &std::fs::read(testdata("logreg_bin.onnx")).unwrap(),
    );
    wait_for_async("the good file again", Duration::from_secs(20), || {
        let (status_url, v1) = (status_url.clone(), v1.clone());
        async move {
            let (v, _, err) = version(&status_url).await;
            (v == v1 && err.is_none()).then_some(())
        }
    })
    .await;
    assert!((score(row("logreg_bin")).await - prob("logreg_bin")).abs() < 1e-5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_rows_than_the_queue_holds_are_refused_503_model_queue_full() {
    let dir = TempDir::new("models-queue");
    copy_model("dense_ops", dir.path(), "d");
    let yaml = r#"
models:
  dir: "${MODELS_DIR}"
  per_model: { d: { queue: 2 } }
routes:
  - path: /rows
    method: POST
    flow:
      s: { for_each: '$request.body.rows', model: { name: d, input: '$item' } }
    respond: { body: '$s' }
"#;
    let s = no_stubs().await;
    let gw = gateway_with(
        yaml,
        &s,
        &[("MODELS_DIR", dir.path().display().to_string())],
    )
    .await;
    let url = format!("http://{}/rows", gw.addr);
    let two = post(&url, r#"{"rows": [[1,2,3,4],[5,6,7,8]]}"#).await;
    assert_eq!(two.status, 200, "{}", two.text());
    let three = post(&url, r#"{"rows": [[1,2,3,4],[5,6,7,8],[9,10,11,12]]}"#).await;
    assert_eq!(three.status, 503, "{}", three.text());
    assert_eq!(three.code(), "model_queue_full");
    assert_eq!(three.header("retry-after"), Some("1"));
    let status = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    assert_eq!(status["models"]["d"]["refused_queue_full"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_file_is_picked_up_from_file_system_events_without_waiting_for_the_poll() {
    let dir = TempDir::new("models-events");
    copy_model("logreg_bin", dir.path(), "m");
    // A poll of an hour: only an event can make the swap happen within the test.
    let (gw, _s) = scoring_gateway(dir.path(), "1h", "20ms").await;
    let status_url = format!("http://{}/__fanout/status", gw.addr);
    let (v1, _, _) = version(&status_url).await;
    replace_model(
        dir.path(),
        "m",
        &std::fs::read(testdata("gbdt_bin.onnx")).unwrap(),
    );
    wait_for_async("the swap on the event", Duration::from_secs(20), || {
        let (status_url, v1) = (status_url.clone(), v1.clone());
        async move {
            let (v, _, _) = version(&status_url).await;
            (v != v1).then_some(())
        }
    })
    .await;
    let a = post(
        &format!("http://{}/score", gw.addr),
        &json!({ "row": reference("gbdt_bin")["inputs"][0] }).to_string(),
    )
    .await;
    let want = reference("gbdt_bin")["probabilities"][0][1]
        .as_f64()
        .unwrap();
    assert!((a.json()["probabilities"]["1"].as_f64().unwrap() - want).abs() < 1e-5);
}

/// An ONNX file of `width` features: X[N, width] → Relu → Y[N, width] (a regressor).
fn relu_model(width: i64) -> Vec<u8> {
    use fanout_model::onnx::*;
    use prost::Message;
    let info = |name: &str| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: vec![
                        Dimension {
                            dim_value: None,
                            dim_param: Some("N".into()),
                        },
                        Dimension {
                            dim_value: Some(width),
                            dim_param: None,
                        },
                    ],
                }),
            }),
        }),
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        producer_name: Some("fanout gateway tests".into()),
        producer_version: None,
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["X".into()],
                output: vec!["Y".into()],
                name: Some("relu".into()),
                op_type: Some("Relu".into()),
                domain: Some(String::new()),
                attribute: vec![],
            }],
            name: Some("g".into()),
            initializer: vec![],
            input: vec![info("X")],
            output: vec![info("Y")],
        }),
    }
    .encode_to_vec()
}

/// `models.limits` (here `max_input_width`) applies to the files loaded: a 10-feature file is
/// refused under a limit of 4, the error naming the config field, while a 3-feature one loads
/// and serves; a reload with a higher limit loads the refused file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_limits_refuse_a_file_over_them_and_a_reload_applies_new_limits() {
    let dir = TempDir::new("models-limits");
    std::fs::write(dir.path().join("wide.onnx"), relu_model(10)).unwrap();
    std::fs::write(dir.path().join("narrow.onnx"), relu_model(3)).unwrap();
    let route = |name: &str| {
        format!(
            "  - path: /{name}\n    method: POST\n    flow:\n      s: {{ model: {{ name: {name}, input: '$request.body.row' }} }}\n    respond: {{ body: '$s' }}\n"
        )
    };
    let yaml = |width: usize, routes: &[&str]| {
        let routes: String = routes.iter().map(|r| route(r)).collect();
        format!(
            "models:\n  dir: \"{}\"\n  poll: 1h\n  limits: {{ max_input_width: {width} }}\nroutes:\n{routes}",
            dir.path().display()
        )
    };
    let s = no_stubs().await;
    let gw = gateway_with(&yaml(4, &["narrow"]), &s, &[]).await;
    let status_url = format!("http://{}/__fanout/status", gw.addr);
    let status = get(&status_url).await.json();
    let wide = &status["models"]["wide"];
    assert_eq!(wide["loads"], 0, "{wide}");
    assert_eq!(wide["load_failures"], 1, "{wide}");
    let err = wide["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("[N, 10]")
            && err.contains("more than models.limits.max_input_width (4 features per row)"),
        "{wide}"
    );
    let narrow = &status["models"]["narrow"];
    assert_eq!(narrow["loads"], 1, "{narrow}");
    assert_eq!(narrow["input_width"], 3, "{narrow}");
    assert!(narrow["last_error"].is_null(), "{narrow}");
    let a = post(
        &format!("http://{}/narrow", gw.addr),
        r#"{"row": [-1, 2, -3]}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json(), json!({"values": [0, 2, 0]}));

    // A config with a higher limit (a new `models:`): its loads apply it.
    gw.gateway
        .reload(crate::support::config(&yaml(16, &["narrow", "wide"]), &s))
        .await
        .unwrap_or_else(|e| panic!("reload: {e}"));
    let status = get(&status_url).await.json();
    let wide = &status["models"]["wide"];
    assert_eq!(wide["loads"], 1, "{wide}");
    assert!(wide["last_error"].is_null(), "{wide}");
    let row: Vec<i64> = (0..10).map(|i| if i % 2 == 0 { -i } else { i }).collect();
    let a = post(
        &format!("http://{}/wide", gw.addr),
        &json!({ "row": row }).to_string(),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["values"].as_array().map(Vec::len), Some(10));
}

/// A limit of 0, a `max_tree_nodes` past what the runtime indexes, or an unknown field under
/// `models.limits` is a config error naming the field.
#[test]
fn a_models_limit_of_0_or_an_unknown_one_is_a_config_error_naming_it() {
    let load = |yaml: &str| match fanout::load_gateway("fanout.yaml", yaml, &|_| None) {
        Ok(_) => panic!("the config loaded:\n{yaml}"),
        Err(e) => e.to_string(),
    };
    let routes = "routes:\n  - path: /a\n    respond: { body: '1' }\n";
    let err = load(&format!(
        "models:\n  limits: {{ max_input_width: 0 }}\n{routes}"
    ));
    assert!(
        err.contains("models.limits.max_input_width must be at least 1 (is 0)"),
        "{err}"
    );
    assert!(err.contains("65536"), "the hint gives the default: {err}");
    let err = load(&format!(
        "models:\n  limits: {{ max_tree_nodes: 5000000000 }}\n{routes}"
    ));
    assert!(
        err.contains("models.limits.max_tree_nodes must be at most 4294967295"),
        "{err}"
    );
    let err = load(&format!("models:\n  limits:\n    max_width: 4\n{routes}"));
    assert!(
        err.contains("max_width") && err.contains("fanout.yaml:3:"),
        "{err}"
    );
}

/// Wait for `/readyz` at `readyz` to answer 503; its reason.
async fn readyz_not_ready(readyz: &str) -> String {
    let r = wait_for_async("readyz not ready", Duration::from_secs(20), || async move {
        let r = get(readyz).await;
        (r.status == 503).then_some(r)
    })
    .await;
    r.json()["reason"].as_str().unwrap_or_default().to_string()
}

/// Wait for `/readyz` at `readyz` to answer 200 again.
async fn readyz_ready(readyz: &str) {
    wait_for_async(
        "readyz ready again",
        Duration::from_secs(30),
        || async move { (get(readyz).await.status == 200).then_some(()) },
    )
    .await;
}
