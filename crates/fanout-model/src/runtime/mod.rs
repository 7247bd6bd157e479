//! Models (M1): the ONNX models of `models.dir`, each behind a [`ModelSlot`] — its current
//! version, swapped atomically when its file is replaced, and its batch queue on the compute pool.
//!
//! - **Loading.** [`ModelSet::open`] reads every `NAME.onnx` of the directory once (the flow
//!   compiler reads no file: the caller opens the set and hands it to the compiler in
//!   [`crate::Carry`]). [`ModelSet::watch`] starts one thread that rescans the directory every
//!   `models.poll`; a file whose size, modification time and inode stayed the same for
//!   `models.settle` is loaded (decoded, planned and run once on zeros by
//!   [`crate::Model::load_with`], under `models.limits`) and swapped in. A file that fails to load, or whose input
//!   width or kind (classifier, regressor) differs from the version serving, never replaces it:
//!   the error is kept in the slot's status and the file is tried again when it changes. A
//!   removed file changes nothing (the model keeps serving until a config without the steps that
//!   use it is loaded).
//! - **Batching.** A `model` step [`ModelSlot::submit`]s its rows with the version it read when
//!   it started. Rows wait in the slot's bounded queue (full: 503 `model_queue_full`); one
//!   drain job at a time runs on the compute pool and evaluates the waiting rows of one version
//!   together, up to `max_batch`, so rows that arrive while the model is busy share one
//!   evaluation without any added delay (`max_delay` may add one). A row whose deadline passed
//!   or whose request has gone is dropped from the queue, never evaluated.
//! - **Lifetime.** A version is an `Arc`: requests in flight finish on the version they started
//!   with, and the old version is freed when the last of them ends.
//!
//! Files: this one holds what the others share — the [`Evaluator`] of a loaded model, the file
//! [`FORMATS`], a [`Version`], [`RunError`] and a step's value ([`output_value`]); `watch.rs` the
//! [`ModelSet`] (opening `models.dir`, the watcher thread, the scan); `slot.rs` the
//! [`ModelSlot`] (loading and swapping a version, the queue, inline evaluation, counters and
//! [`ModelStatus`]) and under it `slot/scheduler.rs` the run list the compute jobs share;
//! `status.rs` the set as a gateway runtime ([`RUNTIME`]: readiness, status section, metric
//! families).

mod slot;
mod status;
#[cfg(test)]
mod testing;
mod watch;

pub use crate::{ModelKind, Output};
use fanout_config::ModelsConfig;
use fanout_expr::{Map, Val};
pub use slot::{ModelSlot, ModelStatus};
pub use status::RUNTIME;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;
pub use watch::{ModelSet, WatcherStatus, slots};

/// A panic's message (its payload when it is a string).
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A loaded model of some format: what evaluates its rows. Implementations are immutable and
/// shared by the threads of the compute pool.
pub trait Evaluator: Send + Sync + std::fmt::Debug + 'static {
    /// Features per row.
    fn input_width(&self) -> usize;
    /// What the model computes (its outputs' shape).
    fn kind(&self) -> &ModelKind;
    /// Evaluate `rows` (`n × input_width()` values, row-major) as one batch.
    fn run(&self, rows: &[f32]) -> Result<Output, String>;
}

/// A format's loader: (file bytes, model name, the `models:` config whose limits apply) → the
/// planned model, or why not.
pub type Load = fn(&[u8], &str, &ModelsConfig) -> Result<Box<dyn Evaluator>, String>;

/// A model file format: files `NAME.EXTENSION` of `models.dir` are loaded by `load` (bytes,
/// name, config), which plans the model under `models.limits` and runs it once (a model that
/// loads runs).
pub struct Format {
    /// The file name's extension, without the dot.
    pub extension: &'static str,
    /// Decode and plan a file.
    pub load: Load,
}

/// Every format `models.dir` reads. A new format or runtime: a module with its [`Format`], and
/// its line here.
#[cfg(not(any(test, feature = "test-hooks")))]
pub const FORMATS: &[Format] = &[onnx::FORMAT];

/// Every format `models.dir` reads; with the `test-hooks` feature (tests only), also
/// `NAME.panics`, whose loader panics.
#[cfg(any(test, feature = "test-hooks"))]
pub const FORMATS: &[Format] = &[onnx::FORMAT, hooks::PANICS];

/// What tests use to break the loading (feature `test-hooks`, never in a release build).
#[cfg(any(test, feature = "test-hooks"))]
mod hooks {
    use super::Format;

    /// `NAME.panics`: a loader that panics, as a bug in a format's code would on a hostile file.
    pub(super) const PANICS: Format = Format {
        extension: "panics",
        load: |_, name, _| panic!("test hook: the loader of `{name}` panics"),
    };

    /// While `models.dir` holds this file, the watcher panics before each scan (outside any
    /// load).
    pub(super) const WATCHER_PANICS: &str = ".fanout-test-watcher-panics";

    /// While `models.dir` holds this file, the watcher's scan blocks (as a read on a hung file
    /// system would).
    pub(super) const WATCHER_HANGS: &str = ".fanout-test-watcher-hangs";
}

/// ONNX files, evaluated by `fanout-model` (pure Rust).
mod onnx {
    use super::{Evaluator, Format, ModelKind, ModelsConfig, Output};

    pub(super) const FORMAT: Format = Format {
        extension: "onnx",
        load: |bytes, name, cfg| {
            let m =
                crate::Model::load_with(bytes, name, &limits(cfg)).map_err(|e| e.to_string())?;
            Ok(Box::new(m))
        },
    };

    /// The runtime's limits from `models:` — errors name them as config fields
    /// (`models.limits.max_input_width`). The file's size is `models.max_file_bytes`, checked
    /// by the scan before (and after) the file is read, so the runtime's own file limit never
    /// refuses a file that limit allows.
    pub(super) fn limits(cfg: &ModelsConfig) -> crate::Limits {
        let l = &cfg.limits;
        crate::Limits {
            max_model_bytes: usize::try_from(cfg.max_file_bytes).unwrap_or(usize::MAX),
            max_graph_nodes: l.max_graph_nodes,
            max_trees: l.max_trees,
            max_tree_nodes: l.max_tree_nodes,
            max_tree_depth: l.max_tree_depth,
            max_tensor_elements: l.max_tensor_elements,
            max_input_width: l.max_input_width,
            max_row_elements: l.max_row_elements,
            named_as: Some("models.limits"),
        }
    }

    impl Evaluator for crate::Model {
        fn input_width(&self) -> usize {
            crate::Model::input_width(self)
        }
        fn kind(&self) -> &ModelKind {
            crate::Model::kind(self)
        }
        fn run(&self, rows: &[f32]) -> Result<Output, String> {
            crate::Model::run(self, rows).map_err(|e| e.to_string())
        }
    }
}

/// One loaded version of a model.
#[derive(Debug)]
pub struct Version {
    /// The evaluation plan.
    pub model: Box<dyn Evaluator>,
    /// The first 16 hex digits of the file's SHA-256.
    pub hash: String,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// The file's size.
    pub bytes: u64,
}

/// What became of submitted rows.
#[derive(Debug)]
pub enum RunError {
    /// The queue was full (rows waiting: the queue's size).
    QueueFull(usize),
    /// The deadline passed while the rows waited.
    Expired,
    /// The compute pool refused the drain job or stopped.
    Pool(fanout_runtime::compute::ComputeError),
    /// The model failed on the batch.
    Failed(String),
}

/// `classifier` or `regressor`.
pub fn kind_name(k: &ModelKind) -> &'static str {
    match k {
        ModelKind::Classifier { .. } => "classifier",
        ModelKind::Regressor { .. } => "regressor",
    }
}

/// A number as JSON: the shortest text that reads back as the same `f32` (`null` for NaN and
/// infinities).
fn num(x: f32) -> Val {
    if !x.is_finite() {
        return Val::Null;
    }
    let mut b = ryu::Buffer::new();
    Val::from(b.format_finite(x).parse::<f64>().unwrap_or(f64::from(x)))
}

/// The keys of a step's value, made once (a `Val` string is shared, not copied).
struct Keys {
    label: Val,
    probabilities: Val,
    value: Val,
    values: Val,
    /// `"0"` … `"15"`: the usual class labels.
    small: Vec<Val>,
}

static KEYS: std::sync::LazyLock<Keys> = std::sync::LazyLock::new(|| Keys {
    label: Val::from("label".to_string()),
    probabilities: Val::from("probabilities".to_string()),
    value: Val::from("value".to_string()),
    values: Val::from("values".to_string()),
    small: (0..16).map(|i: i64| Val::from(i.to_string())).collect(),
});

fn label_key(l: i64) -> Val {
    usize::try_from(l)
        .ok()
        .and_then(|i| KEYS.small.get(i).cloned())
        .unwrap_or_else(|| Val::from(l.to_string()))
}

/// Row `r` of `out` as the step's value: a classifier's `{label, probabilities: {LABEL: p}}`
/// (one entry per column: a binary classifier of one score column has one, its class's),
/// a regressor's `{value}` (one target) or `{values: [...]}`.
pub fn output_value(model: &dyn Evaluator, out: &Output, r: usize) -> Val {
    // Each map made at its final size: no growth, no rehash.
    let mut m = Map::with_capacity_and_hasher(2, Default::default());
    let keys = &*KEYS;
    match (model.kind(), out) {
        (ModelKind::Classifier { columns, .. }, Output::Classifier { .. }) => {
            let label = out.label(r).unwrap_or_default();
            m.insert(keys.label.clone(), Val::from(label as isize));
            let mut p = Map::with_capacity_and_hasher(columns.len(), Default::default());
            for (l, v) in columns.iter().zip(out.row(r)) {
                p.insert(label_key(*l), num(*v));
            }
            m.insert(keys.probabilities.clone(), Val::obj(p));
        }
        (_, out) => {
            let row = out.row(r);
            if let [v] = row {
                m.insert(keys.value.clone(), num(*v));
            } else {
                let vals = row.iter().map(|v| num(*v)).collect::<Vec<_>>();
                m.insert(keys.values.clone(), Val::Arr(vals.into()));
            }
        }
    }
    Val::obj(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::testing::{rows, version};

    #[test]
    fn outputs_are_json_in_their_documented_shape() {
        let v = version();
        let out = v.model.run(&rows(1)).unwrap();
        let val = output_value(&*v.model, &out, 0);
        let text = fanout_expr::json::to_string(&val);
        assert!(text.starts_with("{\"values\":["), "{text}");
        assert_eq!(num(0.1), Val::from(0.1f64), "the shortest exact form");
        assert_eq!(num(f32::NAN), Val::Null);
    }
}
