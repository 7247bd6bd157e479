//! ONNX models of fanout: load a model file once, evaluate it on rows of features.
//!
//! [`Model::load`] decodes an ONNX file (hand-written prost types, [`onnx`]), checks it against
//! the supported operators and the limits below, and builds an evaluation plan: the graph's
//! nodes in order, each with its attributes parsed once. [`Model::run`] evaluates a batch of
//! rows on the calling thread (plain CPU work: no async, no threads, no allocation beyond the
//! tensors of the batch).
//!
//! Supported: what scikit-learn exports through skl2onnx for linear and logistic models, MLPs
//! and tree ensembles — ai.onnx.ml `TreeEnsembleClassifier`, `TreeEnsembleRegressor`,
//! `LinearClassifier`, `LinearRegressor`, `Scaler`, `Normalizer`, `ArrayFeatureExtractor`, and
//! `Identity`, `Cast`, `Reshape`, `Flatten`, `MatMul`, `Gemm`, `Add`, `Sub`, `Mul`, `Div`,
//! `Relu`, `Sigmoid`, `Tanh`, `Exp`, `Reciprocal`, `Softmax`, `ArgMax`, `Concat`, `ReduceSum`,
//! `Not` of the default domain. Exported with `zipmap=False` (a `ZipMap` node is refused as
//! unsupported). Numerics follow onnxruntime's CPU kernels, NaN (a missing value) included: the
//! committed test models agree with it to 1e-5 (tests/models.rs).
//!
//! Every shape the file declares is checked against the [`Limits`] before anything of that size
//! is allocated: the input's width (`max_input_width`), the initializers
//! (`max_tensor_elements`), and each tensor an operator computes (at most
//! `max_tensor_elements`; in the warm-up run at load, `max_row_elements` for all the tensors
//! of its one row). [`Model::load`] uses the defaults (the `MAX_*` constants);
//! [`Model::load_with`] takes other limits, which the model keeps for [`Model::run`]. Errors
//! number the features of a row from 0, as `input[3]`, and name the limit broken.
//!
//! [`runtime`]: the model runtime the gateway hosts for `model` steps — the model set read from
//! `models.dir` (watched, swapped without a restart), each model's queue and micro-batches run on
//! the compute pool, its status and metrics.
//!
//! [`STEP_KIND`]: the `model` step kind itself (`step.rs`), given to the flow compiler by the
//! gateway's list of step kinds (`fanout-proxy`'s `STEP_KINDS`).

#![forbid(unsafe_code)]

mod attrs;
pub mod onnx;
mod ops;
pub mod runtime;
mod step;
mod tensor;
mod tree;

pub use step::STEP_KIND;

use std::collections::HashMap;

use prost::Message;

use attrs::Attrs;
use ops::Op;
use tensor::{Data, Tensor};
use tree::TreeEnsemble;

/// Largest model file [`Model::load`] reads (the default of [`Limits::max_model_bytes`]).
pub const MAX_MODEL_BYTES: usize = 256 << 20;
/// Most nodes in a graph.
pub const MAX_GRAPH_NODES: usize = 4096;
/// Most trees in one tree-ensemble node.
pub const MAX_TREES: usize = 100_000;
/// Most nodes (branches and leaves) of all trees of one tree-ensemble node.
pub const MAX_TREE_NODES: usize = 4_000_000;
/// Deepest tree: a root-to-leaf path has at most this many branches.
pub const MAX_TREE_DEPTH: usize = 1000;
/// Most elements in one tensor: an initializer, and any tensor computed while running a batch.
pub const MAX_TENSOR_ELEMENTS: usize = 1 << 26;
/// Most features per row: the width declared by the graph's input (`[N, width]`).
pub const MAX_INPUT_WIDTH: usize = 1 << 16;
/// Most elements of all the tensors computed for one row (the warm-up run at load, input
/// included): a graph whose tensors grow beyond the row it was given is refused at load.
pub const MAX_ROW_ELEMENTS: usize = 1 << 20;
/// Most nodes of one tree ensemble whatever the limits say: nodes are indexed in 32 bits.
pub const TREE_NODES_CEILING: usize = u32::MAX as usize;

/// The limits a model is loaded and run under; [`Limits::default`] is the `MAX_*` constants.
/// Each is checked before anything of that size is allocated; a model over one is refused at
/// load ([`ModelError::TooLarge`], [`ModelError::Shape`], or [`ModelError::Invalid`] for the
/// limits of a tree-ensemble node), a batch over `max_tensor_elements` fails to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest model file, in bytes ([`MAX_MODEL_BYTES`]).
    pub max_model_bytes: usize,
    /// Most nodes in a graph ([`MAX_GRAPH_NODES`]).
    pub max_graph_nodes: usize,
    /// Most trees in one tree-ensemble node ([`MAX_TREES`]).
    pub max_trees: usize,
    /// Most nodes of all the trees of one tree-ensemble node ([`MAX_TREE_NODES`]; above
    /// [`TREE_NODES_CEILING`] a node is refused whatever this says).
    pub max_tree_nodes: usize,
    /// Most branches on a root-to-leaf path ([`MAX_TREE_DEPTH`]).
    pub max_tree_depth: usize,
    /// Most elements in one tensor: an initializer, the input's fixed shape, a batch's values,
    /// any tensor computed while running a batch ([`MAX_TENSOR_ELEMENTS`]).
    pub max_tensor_elements: usize,
    /// Most features per row ([`MAX_INPUT_WIDTH`]).
    pub max_input_width: usize,
    /// Most elements of all the tensors computed for one row in the warm-up run at load
    /// ([`MAX_ROW_ELEMENTS`]).
    pub max_row_elements: usize,
    /// How errors name a limit: `None` (the default) names the field of this struct, as
    /// `the limit max_input_width (65536)`; `Some("models.limits")` names it as a config field
    /// does, `models.limits.max_input_width (65536)`.
    pub named_as: Option<&'static str>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_model_bytes: MAX_MODEL_BYTES,
            max_graph_nodes: MAX_GRAPH_NODES,
            max_trees: MAX_TREES,
            max_tree_nodes: MAX_TREE_NODES,
            max_tree_depth: MAX_TREE_DEPTH,
            max_tensor_elements: MAX_TENSOR_ELEMENTS,
            max_input_width: MAX_INPUT_WIDTH,
            max_row_elements: MAX_ROW_ELEMENTS,
            named_as: None,
        }
    }
}

impl Limits {
    /// How errors name the limit `field` (a field of this struct): see [`Limits::named_as`].
    pub fn name(&self, field: &str) -> String {
        match self.named_as {
            Some(prefix) => format!("{prefix}.{field}"),
            None => format!("the limit {field}"),
        }
    }
}

/// A bound on the elements of one tensor an operator computes, and how errors name it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cap<'a> {
    /// Most elements.
    pub n: usize,
    /// The limit's name, as [`Limits::name`] gives it.
    pub name: &'a str,
}

/// Why a model did not load or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The bytes are not an ONNX model (truncated, or not protobuf).
    #[error("model {model}: not a valid ONNX file: {source}")]
    Decode {
        /// The model's name.
        model: String,
        /// What the protobuf decoder found.
        source: prost::DecodeError,
    },
    /// The graph uses an operator this crate does not evaluate.
    #[error("model {model}: operator {op} is not supported")]
    Unsupported {
        /// The operator (`op_type`, prefixed by its domain outside the default and ai.onnx.ml ones).
        op: String,
        /// The model's name.
        model: String,
    },
    /// The model breaks a limit of its [`Limits`].
    #[error("model {model}: {what} is {count}, more than {name} ({limit})")]
    TooLarge {
        /// The model's name.
        model: String,
        /// What was counted.
        what: &'static str,
        /// The count.
        count: usize,
        /// The limit.
        limit: usize,
        /// The limit's name ([`Limits::name`]).
        name: String,
    },
    /// A declared shape breaks a limit; refused before anything of that size is allocated.
    #[error("model {model}: {what} has shape {shape}, more than {name} ({limit} {unit})")]
    Shape {
        /// The model's name.
        model: String,
        /// What declares the shape (the input, an initializer), with its name.
        what: String,
        /// The shape as declared (`N` for a dimension without a value).
        shape: String,
        /// The limit broken.
        limit: usize,
        /// What the limit counts.
        unit: &'static str,
        /// The limit's name ([`Limits::name`]).
        name: String,
    },
    /// The model decodes but is not usable: inconsistent attributes, shapes or graph.
    #[error("model {model}: {reason}")]
    Invalid {
        /// The model's name.
        model: String,
        /// What is wrong.
        reason: String,
    },
    /// [`Model::run`] was given a number of values that is not a multiple of the input width.
    #[error("model {model}: {len} input values are not rows of {width}")]
    InputWidth {
        /// The model's name.
        model: String,
        /// Values given.
        len: usize,
        /// The model's input width.
        width: usize,
    },
    /// An operator failed while evaluating a batch.
    #[error("model {model}: {op} failed: {reason}")]
    Eval {
        /// The model's name.
        model: String,
        /// The node's operator.
        op: String,
        /// What went wrong.
        reason: String,
    },
}

/// What a model computes.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelKind {
    /// A classifier: a label and one probability (or score) per column of `columns`.
    Classifier {
        /// The class labels.
        labels: Vec<i64>,
        /// The class of each probability (or score) column: `labels`, except for a binary
        /// classifier whose graph gives one score column (a binary `LinearSVC` as skl2onnx
        /// exports it), which answers that column alone, as onnxruntime does: its class (the
        /// second label: the score of sklearn's `decision_function`).
        columns: Vec<i64>,
    },
    /// A regressor: `targets` values per row.
    Regressor {
        /// Values per row.
        targets: usize,
    },
}

/// The result of [`Model::run`] for a batch of rows.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// A classifier's labels and probabilities.
    Classifier {
        /// One label per row.
        labels: Vec<i64>,
        /// `rows × classes` probabilities (or scores), row-major.
        probabilities: Vec<f32>,
        /// Columns of `probabilities`.
        classes: usize,
    },
    /// A regressor's values.
    Regressor {
        /// `rows × targets` values, row-major.
        values: Vec<f32>,
        /// Values per row.
        targets: usize,
    },
}

impl Output {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        match self {
            Output::Classifier { labels, .. } => labels.len(),
            Output::Regressor { values, targets } => values.len() / (*targets).max(1),
        }
    }

    /// The label of row `i` (classifiers).
    pub fn label(&self, i: usize) -> Option<i64> {
        match self {
            Output::Classifier { labels, .. } => labels.get(i).copied(),
            Output::Regressor { .. } => None,
        }
    }

    /// Row `i`'s probabilities (classifiers) or values (regressors).
    pub fn row(&self, i: usize) -> &[f32] {
        let (v, w) = match self {
            Output::Classifier {
                probabilities,
                classes,
                ..
            } => (probabilities, *classes),
            Output::Regressor { values, targets } => (values, *targets),
        };
        v.get(i * w..(i + 1) * w).unwrap_or(&[])
    }
}

/// An operator's failure, turned into a [`ModelError`] with the model's name.
#[derive(Debug)]
pub(crate) struct OpError(pub String);

/// How a node is evaluated.
#[derive(Debug)]
enum Kernel {
    Op(Op),
    Trees(TreeEnsemble),
}

/// One node of the plan: its kernel and value slots.
#[derive(Debug)]
struct Step {
    op_type: String,
    kernel: Kernel,
    /// `None` for an omitted optional input.
    inputs: Vec<Option<usize>>,
    outputs: Vec<usize>,
}

/// A loaded model: an evaluation plan built once, run many times (`&self`, so it can be shared
/// between threads).
#[derive(Debug)]
pub struct Model {
    name: String,
    width: usize,
    kind: ModelKind,
    steps: Vec<Step>,
    /// Initializers by slot; `None` for computed values.
    consts: Vec<Option<Tensor>>,
    input: usize,
    outputs: Vec<usize>,
    /// The limits it was loaded under, which also bound its batches.
    limits: Limits,
    /// How errors name `limits.max_tensor_elements` (made once: [`Model::run`] does not format it).
    tensor_limit: String,
}

impl Model {
    /// Decodes ONNX `bytes` and builds the evaluation plan under the default [`Limits`] (the
    /// `MAX_*` constants); `name` is used in errors. See [`Model::load_with`].
    pub fn load(bytes: &[u8], name: &str) -> Result<Model, ModelError> {
        Model::load_with(bytes, name, &Limits::default())
    }

    /// Decodes ONNX `bytes` and builds the evaluation plan; `name` is used in errors.
    ///
    /// Checks the operators and `limits`, then runs one row of zeros to learn the outputs'
    /// shapes: a model that loads runs. The model keeps `limits`: [`Model::run`] bounds its
    /// batches' tensors by `limits.max_tensor_elements`.
    pub fn load_with(bytes: &[u8], name: &str, limits: &Limits) -> Result<Model, ModelError> {
        let model = name.to_owned();
        let invalid = |reason: String| ModelError::Invalid {
            model: model.clone(),
            reason,
        };
        if bytes.len() > limits.max_model_bytes {
            return Err(ModelError::TooLarge {
                model,
                what: "file size",
                count: bytes.len(),
                limit: limits.max_model_bytes,
                name: limits.name("max_model_bytes"),
            });
        }
        let proto = onnx::ModelProto::decode(bytes).map_err(|source| ModelError::Decode {
            model: model.clone(),
            source,
        })?;
        let graph = proto
            .graph
            .as_ref()
            .ok_or_else(|| invalid("the file has no graph".into()))?;
        if graph.node.is_empty() {
            return Err(invalid("the graph has no nodes".into()));
        }
        if graph.node.len() > limits.max_graph_nodes {
            return Err(ModelError::TooLarge {
                model,
                what: "graph nodes",
                count: graph.node.len(),
                limit: limits.max_graph_nodes,
                name: limits.name("max_graph_nodes"),
            });
        }
        let tensor_limit = limits.name("max_tensor_elements");
        let tensor_cap = Cap {
            n: limits.max_tensor_elements,
            name: &tensor_limit,
        };
        let opset = proto
            .opset_import
            .iter()
            .find(|o| matches!(o.domain.as_deref(), None | Some("" | "ai.onnx")))
            .and_then(|o| o.version)
            .unwrap_or(21);

        // Every domain used has an opset (as the ONNX checker requires): a file cut before its
        // opset_import, which follows the graph, is refused rather than read with defaults.
        for node in &graph.node {
            let domain = match node.domain.as_deref().unwrap_or("") {
                "ai.onnx" => "",
                d => d,
            };
            let imported =
                proto
                    .opset_import
                    .iter()
                    .any(|o| match o.domain.as_deref().unwrap_or("") {
                        "ai.onnx" => domain.is_empty(),
                        d => d == domain,
                    });
            if !imported && matches!(domain, "" | "ai.onnx.ml") {
                return Err(invalid(format!(
                    "no opset_import for the domain {domain:?} of operator {}",
                    node.op_type.as_deref().unwrap_or("")
                )));
            }
        }

        let mut slots: HashMap<&str, usize> = HashMap::new();
        let mut consts: Vec<Option<Tensor>> = Vec::new();
        for t in &graph.initializer {
            let n = t.name.as_deref().unwrap_or("");
            // The declared shape first: nothing is allocated for a tensor over the limit.
            if let Some(d) = t.dims.iter().find(|&&d| d < 0) {
                return Err(invalid(format!(
                    "initializer {n:?}: negative dimension {d}"
                )));
            }
            if elements_within(&t.dims, limits.max_tensor_elements).is_none() {
                return Err(ModelError::Shape {
                    model,
                    what: format!("initializer {n:?}"),
                    shape: shape_text(t.dims.iter().map(|&d| Some(d))),
                    limit: limits.max_tensor_elements,
                    unit: "elements",
                    name: tensor_limit.clone(),
                });
            }
            let tensor = Tensor::from_proto(t, tensor_cap)
                .map_err(|e| invalid(format!("initializer {n:?}: {}", e.0)))?;
            if slots.insert(n, consts.len()).is_some() {
                return Err(invalid(format!("initializer {n:?} is defined twice")));
            }
            consts.push(Some(tensor));
        }

        // The one input that is not an initializer: `[N, width]` floats.
        let inputs: Vec<_> = graph
            .input
            .iter()
            .filter(|i| !slots.contains_key(i.name.as_deref().unwrap_or("")))
            .collect();
        let [input] = inputs.as_slice() else {
            return Err(invalid(format!(
                "the graph has {} inputs; one is supported",
                inputs.len()
            )));
        };
        let tensor_type = input.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        if tensor_type.and_then(|t| t.elem_type) != Some(onnx::data_type::FLOAT) {
            return Err(invalid("the input is not a float tensor".into()));
        }
        let dims = tensor_type
            .and_then(|t| t.shape.as_ref())
            .map(|s| s.dim.as_slice())
            .unwrap_or(&[]);
        let width = match dims {
            [_, w] => w
                .dim_value
                .and_then(|w| usize::try_from(w).ok())
                .filter(|&w| w > 0),
            _ => None,
        }
        .ok_or_else(|| invalid("the input is not of shape [N, width] with a fixed width".into()))?;
        // The declared shape is checked before anything is allocated for a row or a batch.
        let input_shape = |limit: usize, unit: &'static str, field: &str| ModelError::Shape {
            model: model.clone(),
            what: format!("input {:?}", input.name.as_deref().unwrap_or("")),
            shape: shape_text(dims.iter().map(|d| d.dim_value)),
            limit,
            unit,
            name: limits.name(field),
        };
        if width > limits.max_input_width {
            return Err(input_shape(
                limits.max_input_width,
                "features per row",
                "max_input_width",
            ));
        }
        let fixed: Vec<i64> = dims.iter().filter_map(|d| d.dim_value).collect();
        if fixed.iter().any(|&d| d < 0)
            || elements_within(&fixed, limits.max_tensor_elements).is_none()
        {
            return Err(input_shape(
                limits.max_tensor_elements,
                "elements",
                "max_tensor_elements",
            ));
        }
        let input_slot = consts.len();
        slots.insert(input.name.as_deref().unwrap_or(""), input_slot);
        consts.push(None);

        let mut steps = Vec::with_capacity(graph.node.len());
        for node in &graph.node {
            let op_type = node.op_type.clone().unwrap_or_default();
            let domain = node.domain.as_deref().unwrap_or("");
            let a = Attrs::of(node);
            let what = |e: OpError| {
                invalid(format!(
                    "node {:?} ({op_type}): {}",
                    node.name.as_deref().unwrap_or(""),
                    e.0
                ))
            };
            let kernel = match domain {
                "" | "ai.onnx" => Op::standard(&op_type, &a, opset)
                    .map_err(what)?
                    .map(Kernel::Op),
                "ai.onnx.ml" => match op_type.as_str() {
                    "TreeEnsembleClassifier" => Some(Kernel::Trees(
                        TreeEnsemble::parse(&a, true, limits).map_err(what)?,
                    )),
                    "TreeEnsembleRegressor" => Some(Kernel::Trees(
                        TreeEnsemble::parse(&a, false, limits).map_err(what)?,
                    )),
                    _ => Op::ml(&op_type, &a).map_err(what)?.map(Kernel::Op),
                },
                _ => None,
            };
            let Some(kernel) = kernel else {
                let op = if matches!(domain, "" | "ai.onnx" | "ai.onnx.ml") {
                    op_type
                } else {
                    format!("{domain}:{op_type}")
                };
                return Err(ModelError::Unsupported { op, model });
            };
            let mut ins = Vec::with_capacity(node.input.len());
            for i in &node.input {
                ins.push(match i.as_str() {
                    "" => None,
                    i => Some(*slots.get(i).ok_or_else(|| {
                        invalid(format!("node {op_type} reads {i:?} before it is computed (nodes must be in topological order)"))
                    })?),
                });
            }
            let produced = match &kernel {
                Kernel::Op(op) => op.outputs(),
                Kernel::Trees(t) => {
                    if t.labels().is_some() {
                        2
                    } else {
                        1
                    }
                }
            };
            if node.output.len() != produced {
                return Err(invalid(format!(
                    "node {op_type} has {} outputs, not {produced}",
                    node.output.len()
                )));
            }
            let mut outs = Vec::with_capacity(produced);
            for o in &node.output {
                if slots.insert(o.as_str(), consts.len()).is_some() {
                    return Err(invalid(format!("value {o:?} is computed twice")));
                }
                outs.push(consts.len());
                consts.push(None);
            }
            steps.push(Step {
                op_type,
                kernel,
                inputs: ins,
                outputs: outs,
            });
        }
        let outputs = graph
            .output
            .iter()
            .map(|o| {
                let n = o.name.as_deref().unwrap_or("");
                slots
                    .get(n)
                    .copied()
                    .ok_or_else(|| invalid(format!("output {n:?} is not computed")))
            })
            .collect::<Result<Vec<_>, _>>()?;

        let mut m = Model {
            name: model.clone(),
            width,
            kind: ModelKind::Regressor { targets: 1 },
            steps,
            consts,
            input: input_slot,
            outputs,
            limits: *limits,
            tensor_limit: tensor_limit.clone(),
        };
        // Outputs: `label` (int) and `probabilities` for a classifier, one float tensor for a
        // regressor. The warm-up row is `width` ≤ max_input_width values, and every tensor it
        // computes counts against max_row_elements before it is allocated.
        let probe = m.eval(&vec![0.0; width], 1, Some(limits.max_row_elements))?;
        m.kind = match probe.as_slice() {
            [l, p] if matches!(l.data, Data::I64(_)) && matches!(p.data, Data::F32(_)) => {
                let classes = p.len();
                let labels = m
                    .class_labels()
                    .unwrap_or_else(|| (0..classes as i64).collect());
                let columns = if labels.len() == 2 && classes == 1 {
                    // One score column for two classes (a binary LinearSVC as skl2onnx exports
                    // it): answered alone, as onnxruntime does, for its class.
                    let k = m.score_column().ok_or_else(|| {
                        invalid(
                            "2 class labels for 1 probability column that is not a classifier's"
                                .into(),
                        )
                    })?;
                    vec![labels[k]]
                } else if labels.len() != classes {
                    return Err(invalid(format!(
                        "{} class labels for {classes} probabilities",
                        labels.len()
                    )));
                } else {
                    labels.clone()
                };
                ModelKind::Classifier { labels, columns }
            }
            [v] if matches!(v.data, Data::F32(_)) => ModelKind::Regressor { targets: v.len() },
            _ => {
                return Err(invalid(
                    "outputs are neither (label, probabilities) nor one float tensor (export with zipmap=False)".into(),
                ));
            }
        };
        Ok(m)
    }

    /// The model's name, as given to [`Model::load`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Features per row (from the graph's input shape).
    pub fn input_width(&self) -> usize {
        self.width
    }

    /// What the model computes.
    pub fn kind(&self) -> &ModelKind {
        &self.kind
    }

    /// Evaluates `rows` (`n × input_width()` values, row-major) as one batch.
    pub fn run(&self, rows: &[f32]) -> Result<Output, ModelError> {
        if !rows.len().is_multiple_of(self.width) {
            return Err(ModelError::InputWidth {
                model: self.name.clone(),
                len: rows.len(),
                width: self.width,
            });
        }
        let n = rows.len() / self.width;
        let invalid = |what: &str| ModelError::Eval {
            model: self.name.clone(),
            op: "output".into(),
            reason: what.into(),
        };
        if n == 0 {
            return Ok(match &self.kind {
                ModelKind::Classifier { columns, .. } => Output::Classifier {
                    labels: vec![],
                    probabilities: vec![],
                    classes: columns.len(),
                },
                ModelKind::Regressor { targets } => Output::Regressor {
                    values: vec![],
                    targets: *targets,
                },
            });
        }
        if rows.len() > self.limits.max_tensor_elements {
            return Err(ModelError::TooLarge {
                model: self.name.clone(),
                what: "values in a batch",
                count: rows.len(),
                limit: self.limits.max_tensor_elements,
                name: self.tensor_limit.clone(),
            });
        }
        let mut out = self.eval(rows, n, None)?.into_iter();
        match &self.kind {
            ModelKind::Classifier {
                columns: classes, ..
            } => {
                let (Some(l), Some(p)) = (out.next(), out.next()) else {
                    return Err(invalid("missing"));
                };
                match (l.data, p.data) {
                    (Data::I64(labels), Data::F32(probabilities))
                        if labels.len() == n && probabilities.len() == n * classes.len() =>
                    {
                        Ok(Output::Classifier {
                            labels,
                            probabilities,
                            classes: classes.len(),
                        })
                    }
                    _ => Err(invalid("labels or probabilities of an unexpected size")),
                }
            }
            ModelKind::Regressor { targets } => match out.next().map(|v| v.data) {
                Some(Data::F32(values)) if values.len() == n * targets => Ok(Output::Regressor {
                    values,
                    targets: *targets,
                }),
                _ => Err(invalid("values of an unexpected size")),
            },
        }
    }

    /// Runs the plan on `n` rows; returns the graph's outputs. With a `budget` (the warm-up:
    /// `max_row_elements`), the elements of all the tensors computed (the input included) are at
    /// most that many, each checked before it is allocated; each tensor is at most
    /// `max_tensor_elements`.
    fn eval(
        &self,
        rows: &[f32],
        n: usize,
        mut budget: Option<usize>,
    ) -> Result<Vec<Tensor>, ModelError> {
        let mut values: Vec<Option<Tensor>> = vec![None; self.consts.len()];
        let row_limit = match budget {
            Some(_) => self.limits.name("max_row_elements"),
            None => String::new(),
        };
        if let Some(b) = budget.as_mut() {
            *b = b
                .checked_sub(rows.len())
                .ok_or_else(|| ModelError::TooLarge {
                    model: self.name.clone(),
                    what: "values of the warm-up row",
                    count: rows.len(),
                    limit: self.limits.max_row_elements,
                    name: row_limit.clone(),
                })?;
        }
        values[self.input] = Some(Tensor::f32(vec![n, self.width], rows.to_vec()));
        for step in &self.steps {
            let fail = |reason: String| ModelError::Eval {
                model: self.name.clone(),
                op: step.op_type.clone(),
                reason,
            };
            // The smaller of the tensor limit and what is left of the row's budget.
            let limit = match budget {
                Some(b) if b < self.limits.max_tensor_elements => Cap {
                    n: b,
                    name: "what is left of the warm-up row's budget",
                },
                _ => Cap {
                    n: self.limits.max_tensor_elements,
                    name: &self.tensor_limit,
                },
            };
            let ins: Vec<Option<&Tensor>> = step
                .inputs
                .iter()
                .map(|s| s.and_then(|s| self.consts[s].as_ref().or(values[s].as_ref())))
                .collect();
            if ins.len() != step.inputs.len() {
                return Err(fail("an input is missing".into()));
            }
            let outs = match &step.kernel {
                Kernel::Op(op) => op.eval(&ins, limit),
                Kernel::Trees(t) => match ins.first().copied().flatten() {
                    Some(x) => t.eval(x, limit),
                    None => Err(OpError("input 0 is missing".into())),
                },
            }
            .map_err(|e| match budget {
                Some(_) => fail(format!(
                    "{} (in the warm-up run on one row, whose tensors may have {} elements in all: {row_limit})",
                    e.0, self.limits.max_row_elements
                )),
                None => fail(e.0),
            })?;
            if let Some(b) = budget.as_mut() {
                let made: usize = outs.iter().map(Tensor::len).sum();
                *b = b.checked_sub(made).ok_or_else(|| {
                    fail(format!(
                        "the tensors computed for one row have more than {row_limit} ({}) elements",
                        self.limits.max_row_elements
                    ))
                })?;
            }
            if outs.len() != step.outputs.len() {
                return Err(fail(format!(
                    "{} outputs, not {}",
                    outs.len(),
                    step.outputs.len()
                )));
            }
            for (slot, t) in step.outputs.iter().zip(outs) {
                values[*slot] = Some(t);
            }
        }
        self.outputs
            .iter()
            .map(|&s| {
                self.consts[s]
                    .clone()
                    .or_else(|| values[s].take())
                    .ok_or_else(|| ModelError::Eval {
                        model: self.name.clone(),
                        op: "output".into(),
                        reason: "an output was not computed".into(),
                    })
            })
            .collect()
    }

    /// Which of a binary classifier's two classes its one probability column is: traced from
    /// the probabilities output back through `Identity`, `Cast`, `Reshape` and
    /// `ArrayFeatureExtractor` to the classifier node that computes it; the column the
    /// `ArrayFeatureExtractor` takes (skl2onnx: 1), else the second. `None`: not a classifier's.
    fn score_column(&self) -> Option<usize> {
        let mut slot = *self.outputs.get(1)?;
        let mut taken = None;
        for _ in 0..=self.steps.len() {
            let step = self.steps.iter().find(|s| s.outputs.contains(&slot))?;
            match &step.kernel {
                Kernel::Op(Op::LinearClassifier { .. }) => {
                    return Some(taken.filter(|&k| k < 2).unwrap_or(1));
                }
                Kernel::Op(Op::ArrayFeatureExtractor) => {
                    // The last column taken (nearest the output) is the one answered.
                    if taken.is_none() {
                        taken = step
                            .inputs
                            .get(1)
                            .copied()
                            .flatten()
                            .and_then(|i| self.consts[i].as_ref())
                            .and_then(|t| match t.ints() {
                                Ok([k]) => usize::try_from(*k).ok(),
                                _ => None,
                            });
                    }
                    slot = (*step.inputs.first()?)?;
                }
                Kernel::Op(Op::Identity | Op::Cast(_) | Op::Reshape { .. }) => {
                    slot = (*step.inputs.first()?)?
                }
                _ => return None,
            }
        }
        None
    }

    /// The class labels, traced from the label output back through `Identity`, `Cast` and
    /// `Reshape` to the classifier node or the `ArrayFeatureExtractor` of a constant.
    fn class_labels(&self) -> Option<Vec<i64>> {
        let mut slot = *self.outputs.first()?;
        for _ in 0..=self.steps.len() {
            let step = self.steps.iter().find(|s| s.outputs.contains(&slot))?;
            match &step.kernel {
                Kernel::Trees(t) => return t.labels().map(<[i64]>::to_vec),
                Kernel::Op(Op::LinearClassifier { labels, .. }) => return Some(labels.clone()),
                Kernel::Op(Op::ArrayFeatureExtractor) => {
                    return self.consts[(*step.inputs.first()?)?]
                        .as_ref()?
                        .ints()
                        .ok()
                        .map(<[i64]>::to_vec);
                }
                Kernel::Op(Op::Identity | Op::Cast(_) | Op::Reshape { .. }) => {
                    slot = (*step.inputs.first()?)?
                }
                Kernel::Op(_) => return None,
            }
        }
        None
    }
}

/// The elements of a declared shape when they are at most `limit` (checked arithmetic: a
/// product that overflows is over the limit); `None` for a negative dimension. A dimension of
/// 0 does not hide the others: they are bounded as if it were 1 (`[0, 2⁴⁰]` is refused).
fn elements_within(dims: &[i64], limit: usize) -> Option<usize> {
    dims.iter()
        .try_fold((1usize, 1usize), |(bound, count), &d| {
            let d = usize::try_from(d).ok()?;
            let bound = bound.checked_mul(d.max(1)).filter(|&n| n <= limit)?;
            Some((bound, count * d))
        })
        .map(|(_, count)| count)
}

/// A declared shape as errors write it: `[N, 1000000000]` (`N` for a dimension without a value).
fn shape_text(dims: impl Iterator<Item = Option<i64>>) -> String {
    let dims: Vec<String> = dims
        .map(|d| d.map_or_else(|| "N".to_owned(), |d| d.to_string()))
        .collect();
    format!("[{}]", dims.join(", "))
}
