//! What the `antispam-models` scenario needs besides a config: its 10 models (written into the
//! run directory's `models/`), the swapper that replaces one of them every 10 s while the targets
//! serve, and the Python baseline (`antispam-py`: a venv with grpcio and onnxruntime from PyPI, its
//! stubs generated from the scenario's `.proto`). The run's models report is
//! `crate::report::models`.

// The run's models report (figures, acceptance, text) is `crate::report::models`.
pub use crate::report::models::{
    LEVELS, ModelsLevel, ModelsReport, ModelsTarget, STARTUP_S, SWAP_WINDOW_S, TargetRun,
    acceptance, model_latencies, summarize, text,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The 10 models: (name in `models/`, the committed test model it is, how the merge reads it).
pub const MODELS: [(&str, &str, &[u8]); 10] = [
    ("spam_lr", "logreg_bin", LOGREG_BIN),
    ("spam_gbdt", "gbdt_bin", GBDT_BIN),
    ("spam_swap", "logreg_bin", LOGREG_BIN),
    (
        "topic_lr",
        "logreg",
        include_bytes!("../../fanout-model/testdata/logreg.onnx"),
    ),
    (
        "topic_mlp",
        "mlp",
        include_bytes!("../../fanout-model/testdata/mlp.onnx"),
    ),
    (
        "topic_gbdt",
        "gbdt_clf",
        include_bytes!("../../fanout-model/testdata/gbdt_clf.onnx"),
    ),
    (
        "topic_rf",
        "rf_clf",
        include_bytes!("../../fanout-model/testdata/rf_clf.onnx"),
    ),
    (
        "score_gbdt",
        "gbdt_reg",
        include_bytes!("../../fanout-model/testdata/gbdt_reg.onnx"),
    ),
    (
        "score_rf",
        "rf_reg",
        include_bytes!("../../fanout-model/testdata/rf_reg.onnx"),
    ),
    (
        "score_lin",
        "linreg",
        include_bytes!("../../fanout-model/testdata/linreg.onnx"),
    ),
];
const LOGREG_BIN: &[u8] = include_bytes!("../../fanout-model/testdata/logreg_bin.onnx");
const GBDT_BIN: &[u8] = include_bytes!("../../fanout-model/testdata/gbdt_bin.onnx");

/// The model replaced during the run, and the two files it alternates between (two binary
/// classifiers of 20 features: compatible, so every swap must be taken).
pub const SWAP_MODEL: &str = "spam_swap";
const SWAP_FILES: [(&str, &[u8]); 2] = [("gbdt_bin", GBDT_BIN), ("logreg_bin", LOGREG_BIN)];

/// The baseline's gRPC thread pool (`ThreadPoolExecutor(max_workers=…)`), see
/// bench/baselines/antispam-py/README.md.
pub const PY_WORKERS: usize = 16;
/// The baseline's server, written into the run directory.
pub const PY_SERVER: &str = include_str!("../../../bench/baselines/antispam-py/server.py");
/// The packages the baseline's venv gets from PyPI.
pub const PY_PACKAGES: [&str; 5] = ["grpcio", "grpcio-tools", "protobuf", "onnxruntime", "numpy"];

/// Write the 10 models into `dir` (created).
pub fn write_models(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, _, bytes) in MODELS {
        std::fs::write(dir.join(format!("{name}.onnx")), bytes)?;
    }
    Ok(())
}

/// Replaces `models/spam_swap.onnx` every `every` (written under a hidden name, then renamed
/// over it: what docs/models.md tells a deployer to do), alternating two compatible models;
/// records when (seconds since the lab started).
pub struct Swapper {
    times: Arc<Mutex<Vec<f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Swapper {
    /// Start swapping in `dir`; `since` is the lab's time zero.
    pub fn start(dir: PathBuf, every: Duration, since: tokio::time::Instant) -> Swapper {
        let times = Arc::new(Mutex::new(Vec::new()));
        let out = times.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for i in 0usize.. {
                tick.tick().await;
                let (_, bytes) = SWAP_FILES[i % SWAP_FILES.len()];
                let tmp = dir.join(format!(".{SWAP_MODEL}.onnx.tmp"));
                let dst = dir.join(format!("{SWAP_MODEL}.onnx"));
                let done = tokio::task::spawn_blocking(move || {
                    std::fs::write(&tmp, bytes)?;
                    std::fs::rename(&tmp, &dst)
                })
                .await;
                match done {
                    Ok(Ok(())) => {
                        if let Ok(mut v) = out.lock() {
                            v.push(since.elapsed().as_secs_f64());
                        }
                    }
                    other => tracing::warn!("swapping {SWAP_MODEL}: {other:?}"),
                }
            }
        });
        Swapper { times, task }
    }

    /// Stop; the swap times.
    pub fn finish(self) -> Vec<f64> {
        self.task.abort();
        self.times.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// The baseline's venv: `$FANOUT_LAB_ANTISPAM_VENV`, else `~/.cache/fanout-lab-antispam-venv`.
pub fn venv_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FANOUT_LAB_ANTISPAM_VENV") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache/fanout-lab-antispam-venv")
}

/// The venv's python with every package importable, creating the venv (`python3 -m venv`, then
/// `pip install` from PyPI) when it is missing or incomplete; generates the Python stubs of
/// `proto` into `stubs`. Blocking (minutes the first time). `Err`: why the baseline cannot run.
pub fn ensure_python(proto: &Path, stubs: &Path) -> Result<PathBuf, String> {
    let venv = venv_dir();
    let python = venv.join("bin/python");
    let run = |cmd: &mut std::process::Command, what: &str| -> Result<(), String> {
        let out = cmd
            .output()
            .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
        if out.status.success() {
            Ok(())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            Err(format!(
                "{what} failed ({}): {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ))
        }
    };
    let imports = || {
        run(
            std::process::Command::new(&python).args([
                "-c",
                "import grpc, grpc_tools, google.protobuf, onnxruntime, numpy",
            ]),
            "importing grpcio, onnxruntime, numpy",
        )
    };
    if imports().is_err() {
        let python3 = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
        if !python.exists() {
            tracing::info!("creating the venv of antispam-py in {}", venv.display());
            run(
                std::process::Command::new(&python3)
                    .args(["-m", "venv"])
                    .arg(&venv),
                &format!("creating a venv in {}", venv.display()),
            )?;
        }
        tracing::info!("installing {} from PyPI", PY_PACKAGES.join(", "));
        run(
            std::process::Command::new(&python)
                .args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
                .args(PY_PACKAGES),
            "pip install",
        )?;
        imports()?;
    }
    std::fs::create_dir_all(stubs).map_err(|e| format!("{}: {e}", stubs.display()))?;
    let dir = proto.parent().unwrap_or(Path::new("."));
    run(
        std::process::Command::new(&python)
            .args(["-m", "grpc_tools.protoc"])
            .arg(format!("-I{}", dir.display()))
            .arg(format!("--python_out={}", stubs.display()))
            .arg(format!("--grpc_python_out={}", stubs.display()))
            .arg(proto),
        "generating the Python stubs (grpc_tools.protoc)",
    )?;
    Ok(python)
}

/// Loads per model from the baseline's log (`reloaded NAME (loads N)` lines; 1 each at start).
pub fn python_loads(log: &str) -> serde_json::Value {
    let mut loads: BTreeMap<String, u64> =
        MODELS.iter().map(|(n, _, _)| (n.to_string(), 1)).collect();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("reloaded ")
            && let Some(name) = rest.split_whitespace().next()
        {
            *loads.entry(name.to_string()).or_default() += 1;
        } else if let Some(rest) = line.strip_prefix("reload ")
            && let Some(name) = rest.split_whitespace().next()
        {
            *failures.entry(name.to_string()).or_default() += 1;
        }
    }
    let v: BTreeMap<String, serde_json::Value> = loads
        .into_iter()
        .map(|(n, l)| {
            let f = failures.get(&n).copied().unwrap_or(0);
            (n, serde_json::json!({"loads": l, "load_failures": f}))
        })
        .collect();
    serde_json::json!(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_loads_counts_reloads() {
        let v = python_loads(
            "antispam-py serving\nreloaded spam_swap (loads 2)\nreload spam_swap failed: x\nreloaded spam_swap (loads 3)\n",
        );
        assert_eq!(v["spam_swap"]["loads"], 3);
        assert_eq!(v["spam_swap"]["load_failures"], 1);
        assert_eq!(v["spam_lr"]["loads"], 1);
    }

    #[test]
    fn ten_models_of_twenty_features() {
        assert_eq!(MODELS.len(), 10);
        let names: std::collections::BTreeSet<_> = MODELS.iter().map(|m| m.0).collect();
        assert_eq!(names.len(), 10);
        assert!(names.contains(SWAP_MODEL));
        for (name, _, bytes) in MODELS {
            let m =
                fanout_model::Model::load(bytes, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(m.input_width(), 20, "{name}");
        }
    }
}
