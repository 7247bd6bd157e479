//! Models: `models:` (the directory of ONNX files, how it is watched, how inferences are
//! batched) and `model:` steps.

use crate::{ConfigError, Dur, ExprSrc, Located};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// The models `model` steps run: every `NAME.onnx` file of one directory, loaded at start and
/// reloaded while the gateway runs when a file is added or replaced (docs/models.md).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// The directory holding the models (`NAME.onnx`; the model's name is the file's stem),
    /// relative to the config file's directory. Default: none (no `model` steps).
    pub dir: Option<Located<String>>,
    /// How often the directory is scanned for added or replaced files, besides file-system
    /// events (which may be missing: network file systems, some container volumes). Default 1s.
    pub poll: Dur,
    /// A changed file is loaded once its size and modification time stayed the same for this
    /// long (a file still being copied is not read half-written). Default 200ms. Replace a model
    /// by writing a temporary file and renaming it over the old one.
    pub settle: Dur,
    /// Largest model file read, in bytes. Default 64 MiB.
    pub max_file_bytes: u64,
    /// Most models in the directory. Default 100.
    pub max_models: usize,
    /// The watcher is *stalled* when it has not finished a scan for `poll` plus this long (a hung
    /// file system, a read that never returns): `/readyz` answers not ready, naming what it was
    /// doing, until it finishes one. Default 60s.
    pub stall_timeout: Dur,
    /// How inferences are batched, for every model (see `per_model`).
    pub batch: ModelBatch,
    /// Per model (by name): what differs from `batch`.
    #[serde(default)]
    pub per_model: IndexMap<String, ModelBatchOverride>,
    /// What a model file may declare and compute: a file over a limit is not loaded (the
    /// error, naming the limit, is in the status).
    pub limits: ModelLimits,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        ModelsConfig {
            dir: None,
            poll: Dur::secs(1),
            settle: Dur::millis(200),
            max_file_bytes: 64 << 20,
            max_models: 100,
            stall_timeout: Dur::secs(60),
            batch: ModelBatch::default(),
            per_model: IndexMap::new(),
            limits: ModelLimits::default(),
        }
    }
}

impl ModelsConfig {
    /// The batching of the model `name`: `batch` with its `per_model` entry applied.
    pub fn batch_of(&self, name: &str) -> ModelBatch {
        let mut b = self.batch;
        if let Some(o) = self.per_model.get(name) {
            b.queue = o.queue.unwrap_or(b.queue);
            b.max_batch = o.max_batch.unwrap_or(b.max_batch);
            b.max_delay = o.max_delay.unwrap_or(b.max_delay);
            b.slice = o.slice.unwrap_or(b.slice);
            b.inline_below = o.inline_below.unwrap_or(b.inline_below);
        }
        b
    }
}

/// Most tree nodes `models.limits.max_tree_nodes` may allow: the model runtime indexes them in
/// 32 bits.
pub const MAX_TREE_NODES_CEILING: usize = u32::MAX as usize;

/// `models.limits`: the limits of the model runtime, checked on what a file declares before
/// anything of that size is allocated. The defaults are the runtime's (`fanout_model::MAX_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelLimits {
    /// Most nodes in a model's graph. Default 4096.
    #[schemars(range(min = 1))]
    pub max_graph_nodes: usize,
    /// Most trees in one tree-ensemble node. Default 100000.
    #[schemars(range(min = 1))]
    pub max_trees: usize,
    /// Most nodes (branches and leaves) of all the trees of one tree-ensemble node. Default
    /// 4000000; at most 4294967295.
    #[schemars(range(min = 1, max = 4_294_967_295u64))]
    pub max_tree_nodes: usize,
    /// Most branches on a tree's root-to-leaf path. Default 1000.
    #[schemars(range(min = 1))]
    pub max_tree_depth: usize,
    /// Most elements in one tensor: an initializer, the input's fixed shape, the values of a
    /// batch, each tensor computed while evaluating a batch (a batch over it fails). Default
    /// 67108864 (2^26).
    #[schemars(range(min = 1))]
    pub max_tensor_elements: usize,
    /// Most features per row (the width of the graph's input `[N, width]`). Default 65536.
    #[schemars(range(min = 1))]
    pub max_input_width: usize,
    /// Most elements of all the tensors computed for one row (the warm-up inference at load,
    /// input included). Default 1048576 (2^20).
    #[schemars(range(min = 1))]
    pub max_row_elements: usize,
}

impl Default for ModelLimits {
    fn default() -> Self {
        ModelLimits {
            max_graph_nodes: 4096,
            max_trees: 100_000,
            max_tree_nodes: 4_000_000,
            max_tree_depth: 1000,
            max_tensor_elements: 1 << 26,
            max_input_width: 1 << 16,
            max_row_elements: 1 << 20,
        }
    }
}

impl ModelLimits {
    /// Every limit with its field name, in the documented order.
    pub fn fields(&self) -> [(&'static str, usize); 7] {
        [
            ("max_graph_nodes", self.max_graph_nodes),
            ("max_trees", self.max_trees),
            ("max_tree_nodes", self.max_tree_nodes),
            ("max_tree_depth", self.max_tree_depth),
            ("max_tensor_elements", self.max_tensor_elements),
            ("max_input_width", self.max_input_width),
            ("max_row_elements", self.max_row_elements),
        ]
    }

    /// Config errors: a limit of 0, `max_tree_nodes` above [`MAX_TREE_NODES_CEILING`].
    pub(crate) fn check(&self, errs: &mut Vec<ConfigError>) {
        let mut bad = |message: String, hint: String| {
            errs.push(
                ConfigError {
                    path: None,
                    file: String::new(),
                    pos: None,
                    message,
                    hint: None,
                }
                .hint(hint),
            )
        };
        let defaults = ModelLimits::default();
        for ((name, v), (_, default)) in self.fields().into_iter().zip(defaults.fields()) {
            if v == 0 {
                bad(
                    format!("models.limits.{name} must be at least 1 (is 0)"),
                    format!(
                        "leave it out for the default, {default}; see docs/config.md, `models.limits`"
                    ),
                );
            }
        }
        if self.max_tree_nodes > MAX_TREE_NODES_CEILING {
            bad(
                format!(
                    "models.limits.max_tree_nodes must be at most {MAX_TREE_NODES_CEILING} (is {})",
                    self.max_tree_nodes
                ),
                "the model runtime indexes tree nodes in 32 bits".into(),
            );
        }
    }
}

/// How the inferences of one model are run on the compute pool.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelBatch {
    /// Most rows waiting for the model; one more is refused at once with 503
    /// `model_queue_full`. Default 1024.
    pub queue: usize,
    /// Most rows evaluated in one batch. Default 64.
    pub max_batch: usize,
    /// How long the first waiting row may wait for others before its batch starts. Default 0:
    /// no added delay — rows that arrive while the model is busy are run together when it is
    /// free (as Triton and TF Serving do by default).
    pub max_delay: Dur,
    /// How long one evaluation of the model should take at most: a batch is cut to the rows the
    /// model evaluates in about this long (from its measured time per row; at least one row,
    /// at most `max_batch`), so a large request (a `for_each` of 1 000 rows) is evaluated in
    /// chunks and the other models' rows run between them. Default 2ms.
    pub slice: Dur,
    /// A model whose rows of one step evaluate in less than this (from its measured time per
    /// row) is evaluated on the request's own thread when no other rows wait for it and no
    /// evaluation of it runs, instead of being handed to a compute thread and its answer handed
    /// back: for a model of a few microseconds per row the two hand-offs cost more than the
    /// evaluation. Rows that arrive meanwhile wait and are batched on the compute pool as usual.
    /// Only with `max_delay: 0`. Default 50us; `0s`: always on the compute pool.
    pub inline_below: Dur,
}

impl Default for ModelBatch {
    fn default() -> Self {
        ModelBatch {
            queue: 1024,
            max_batch: 64,
            max_delay: Dur::millis(0),
            slice: Dur::millis(2),
            inline_below: Dur::micros(50),
        }
    }
}

/// `per_model.NAME`: the batching settings of one model that differ from `models.batch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelBatchOverride {
    /// See `models.batch.queue`.
    pub queue: Option<usize>,
    /// See `models.batch.max_batch`.
    pub max_batch: Option<usize>,
    /// See `models.batch.max_delay`.
    pub max_delay: Option<Dur>,
    /// See `models.batch.slice`.
    pub slice: Option<Dur>,
    /// See `models.batch.inline_below`.
    pub inline_below: Option<Dur>,
}

/// A `model` step: one inference of a model of `models.dir` (one per element with `for_each`,
/// run as one batch).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelCall {
    /// The model's name (its file `NAME.onnx` in `models.dir`).
    pub name: Located<String>,
    /// One expression per feature, in the model's input order: their count must be the model's
    /// input width (checked at load). Each gives a number (or a boolean: 1 or 0).
    #[serde(default)]
    pub features: Vec<ExprSrc>,
    /// Instead of `features`: one expression giving the whole row, an array of numbers (its
    /// length is checked per request: a wrong one fails the step).
    pub input: Option<ExprSrc>,
}
