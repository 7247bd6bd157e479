//! ai.onnx.ml `TreeEnsembleClassifier` and `TreeEnsembleRegressor`, evaluated straight from the
//! node's attributes. The semantics are onnxruntime's CPU kernel (`tree_ensemble_common.h`,
//! `tree_ensemble_aggregator.h`): f32 thresholds and sums in tree order, all `BRANCH_*` modes,
//! `nodes_missing_value_tracks_true`, SUM/AVERAGE/MIN/MAX, `base_values`, the post transforms,
//! and its binary-classifier rules (one score column expanded to two).

use std::collections::HashMap;

use crate::attrs::{Attrs, index};
use crate::ops::{Post, logistic, probit};
use crate::tensor::{Tensor, elements};
use crate::{Cap, Limits, OpError, TREE_NODES_CEILING};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Leaf,
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Aggregate {
    Sum,
    Average,
    Min,
    Max,
}

/// One node; for a leaf, `t` is its first weight and `f` the number of its weights.
#[derive(Clone, Debug)]
struct Node {
    feature: u32,
    value: f32,
    mode: Mode,
    missing_true: bool,
    t: u32,
    f: u32,
}

/// What a classifier adds to the ensemble.
#[derive(Clone, Debug)]
struct Classes {
    labels: Vec<i64>,
    /// Two labels and every weight on one class: the other class's score is derived.
    binary_case: bool,
    weights_all_positive: bool,
}

/// A parsed tree ensemble.
#[derive(Clone, Debug)]
pub(crate) struct TreeEnsemble {
    nodes: Vec<Node>,
    roots: Vec<u32>,
    /// `(target or class, weight)` of the leaves.
    weights: Vec<(u32, f32)>,
    targets: usize,
    aggregate: Aggregate,
    post: Post,
    base_values: Vec<f32>,
    /// Smallest input width the trees can read.
    width: usize,
    classes: Option<Classes>,
    /// The deepest tree's branches on a root-to-leaf path (at most `max_tree_depth`).
    depth: usize,
}

impl TreeEnsemble {
    /// Parses the attributes of a `TreeEnsembleClassifier` (`classifier`) or
    /// `TreeEnsembleRegressor`, within the tree limits of `limits`.
    pub fn parse(
        a: &Attrs<'_>,
        classifier: bool,
        limits: &Limits,
    ) -> Result<TreeEnsemble, OpError> {
        a.refuse(&[
            "base_values_as_tensor",
            "nodes_values_as_tensor",
            "class_weights_as_tensor",
            "target_weights_as_tensor",
            "classlabels_strings",
        ])?;
        let (ids, nodeids, treeids, weights, labels, targets) = if classifier {
            let labels = a.ints("classlabels_int64s").to_vec();
            if labels.len() < 2 {
                return Err(OpError(format!(
                    "a classifier with {} class labels",
                    labels.len()
                )));
            }
            let n = labels.len();
            (
                a.ints("class_ids"),
                a.ints("class_nodeids"),
                a.ints("class_treeids"),
                a.floats("class_weights"),
                labels,
                n,
            )
        } else {
            let n = index(a.int("n_targets", 0), "n_targets")?;
            if n == 0 {
                return Err(OpError("n_targets is missing or 0".into()));
            }
            (
                a.ints("target_ids"),
                a.ints("target_nodeids"),
                a.ints("target_treeids"),
                a.floats("target_weights"),
                vec![],
                n,
            )
        };
        let post = Post::parse(&a.string("post_transform", "NONE")?)?;
        let aggregate = match a.string("aggregate_function", "SUM")?.as_str() {
            "SUM" => Aggregate::Sum,
            "AVERAGE" => Aggregate::Average,
            "MIN" => Aggregate::Min,
            "MAX" => Aggregate::Max,
            f => {
                return Err(OpError(format!(
                    "aggregate_function {f:?} is not supported"
                )));
            }
        };

        let n_treeids = a.ints("nodes_treeids");
        let n_nodeids = a.ints("nodes_nodeids");
        let features = a.ints("nodes_featureids");
        let values = a.floats("nodes_values");
        let modes = a.strings("nodes_modes")?;
        let trues = a.ints("nodes_truenodeids");
        let falses = a.ints("nodes_falsenodeids");
        let missing = a.ints("nodes_missing_value_tracks_true");
        let n = n_treeids.len();
        if n > limits.max_tree_nodes {
            return Err(OpError(format!(
                "{n} tree nodes, more than {} ({})",
                limits.name("max_tree_nodes"),
                limits.max_tree_nodes
            )));
        }
        if n > TREE_NODES_CEILING {
            return Err(OpError(format!(
                "{n} tree nodes, more than {TREE_NODES_CEILING} (nodes are indexed in 32 bits)"
            )));
        }
        if [
            n_nodeids.len(),
            features.len(),
            values.len(),
            modes.len(),
            trues.len(),
            falses.len(),
        ]
        .iter()
        .any(|&l| l != n)
            || (!missing.is_empty() && missing.len() != n)
        {
            return Err(OpError(
                "the nodes_* attributes have different lengths".into(),
            ));
        }
        if ids.len() != nodeids.len() || ids.len() != treeids.len() || ids.len() != weights.len() {
            return Err(OpError(
                "the leaf weight attributes have different lengths".into(),
            ));
        }

        // Nodes by (tree, node id); a tree's root is its first node, trees are contiguous.
        let mut by_id: HashMap<(i64, i64), u32> = HashMap::with_capacity(n);
        let mut nodes = Vec::with_capacity(n);
        let mut roots = Vec::new();
        let mut tree_ids = std::collections::HashSet::new();
        let mut width = 0;
        for i in 0..n {
            let tree = n_treeids[i];
            if i == 0 || n_treeids[i - 1] != tree {
                if roots.len() >= limits.max_trees {
                    return Err(OpError(format!(
                        "more trees than {} ({})",
                        limits.name("max_trees"),
                        limits.max_trees
                    )));
                }
                if !tree_ids.insert(tree) {
                    return Err(OpError(format!(
                        "the nodes of tree {tree} are not contiguous"
                    )));
                }
                roots.push(i as u32);
            }
            if by_id.insert((tree, n_nodeids[i]), i as u32).is_some() {
                return Err(OpError(format!(
                    "node {} of tree {tree} is defined twice",
                    n_nodeids[i]
                )));
            }
            let mode = match modes[i].as_str() {
                "LEAF" => Mode::Leaf,
                "BRANCH_LEQ" => Mode::Leq,
                "BRANCH_LT" => Mode::Lt,
                "BRANCH_GTE" => Mode::Gte,
                "BRANCH_GT" => Mode::Gt,
                "BRANCH_EQ" => Mode::Eq,
                "BRANCH_NEQ" => Mode::Neq,
                m => return Err(OpError(format!("node mode {m:?} is not supported"))),
            };
            let feature = index(features[i], "feature id")?;
            if mode != Mode::Leaf {
                width = width.max(feature + 1);
            }
            nodes.push(Node {
                feature: u32::try_from(feature).map_err(|_| {
                    OpError(format!("a branch reads input[{feature}], past any row"))
                })?,
                value: values[i],
                mode,
                missing_true: missing.get(i).is_some_and(|&m| m == 1),
                t: 0,
                f: 0,
            });
        }
        // Children, as node indexes.
        for i in 0..n {
            if nodes[i].mode == Mode::Leaf {
                continue;
            }
            let tree = n_treeids[i];
            let child = |id: i64| -> Result<u32, OpError> {
                match by_id.get(&(tree, id)) {
                    Some(&c) if c as usize != i => Ok(c),
                    Some(_) => Err(OpError(format!(
                        "node {id} of tree {tree} is its own child"
                    ))),
                    None => Err(OpError(format!("tree {tree} has no node {id}"))),
                }
            };
            nodes[i].t = child(trues[i])?;
            nodes[i].f = child(falses[i])?;
        }
        // Leaf weights, sorted by (tree, node) as onnxruntime does; weights on a branch are ignored.
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&k| (treeids[k], nodeids[k]));
        let mut leaf_weights = Vec::with_capacity(ids.len());
        for k in order {
            let &leaf = by_id.get(&(treeids[k], nodeids[k])).ok_or_else(|| {
                OpError(format!(
                    "a weight names node {} of tree {}, which does not exist",
                    nodeids[k], treeids[k]
                ))
            })?;
            let node = &mut nodes[leaf as usize];
            if node.mode != Mode::Leaf {
                continue;
            }
            let class = index(ids[k], "target id")?;
            if class >= targets {
                return Err(OpError(format!("a weight for target {class} of {targets}")));
            }
            if node.f == 0 {
                node.t = u32::try_from(leaf_weights.len())
                    .map_err(|_| OpError("more leaf weights than 32-bit indexes reach".into()))?;
            }
            node.f += 1;
            leaf_weights.push((class as u32, weights[k]));
        }
        if let Some(i) = nodes.iter().position(|n| n.mode == Mode::Leaf && n.f == 0) {
            return Err(OpError(format!(
                "leaf {} of tree {} has no weight",
                n_nodeids[i], n_treeids[i]
            )));
        }
        // Every tree is a tree (each node reached once) no deeper than the limit: evaluation
        // then ends within `deepest` (≤ max_tree_depth) steps.
        let mut seen = vec![false; n];
        let mut stack = Vec::new();
        let mut deepest = 0;
        for &root in &roots {
            stack.push((root, 0usize));
            while let Some((i, depth)) = stack.pop() {
                if depth > limits.max_tree_depth {
                    return Err(OpError(format!(
                        "a tree deeper than {} ({})",
                        limits.name("max_tree_depth"),
                        limits.max_tree_depth
                    )));
                }
                deepest = deepest.max(depth);
                if std::mem::replace(&mut seen[i as usize], true) {
                    return Err(OpError(format!(
                        "node {} of tree {} is reached twice",
                        n_nodeids[i as usize], n_treeids[i as usize]
                    )));
                }
                let node = &nodes[i as usize];
                if node.mode != Mode::Leaf {
                    stack.push((node.t, depth + 1));
                    stack.push((node.f, depth + 1));
                }
            }
        }

        let base_values = a.floats("base_values").to_vec();
        let classes = if classifier {
            let distinct: std::collections::HashSet<i64> = ids.iter().copied().collect();
            Some(Classes {
                binary_case: targets == 2 && distinct.len() == 1,
                weights_all_positive: weights.iter().all(|&w| w >= 0.0),
                labels,
            })
        } else {
            None
        };
        Ok(TreeEnsemble {
            nodes,
            roots,
            weights: leaf_weights,
            targets,
            aggregate,
            post,
            base_values,
            width,
            classes,
            depth: deepest,
        })
    }

    /// The class labels of a classifier.
    pub fn labels(&self) -> Option<&[i64]> {
        self.classes.as_ref().map(|c| c.labels.as_slice())
    }

    /// The leaf a row ends in.
    fn leaf(&self, root: u32, x: &[f32]) -> &Node {
        let mut node = &self.nodes[root as usize];
        for _ in 0..=self.depth {
            if node.mode == Mode::Leaf {
                break;
            }
            let v = x[node.feature as usize];
            let t = node.value;
            let go_true = match node.mode {
                Mode::Leq => v <= t,
                Mode::Lt => v < t,
                Mode::Gte => v >= t,
                Mode::Gt => v > t,
                Mode::Eq => v == t,
                Mode::Neq => v != t,
                Mode::Leaf => false,
            } || (node.missing_true && v.is_nan());
            node = &self.nodes[(if go_true { node.t } else { node.f }) as usize];
        }
        node
    }

    /// Evaluates rows `x` (`rows × cols`): labels (classifiers) and `rows × targets` scores,
    /// at most `limit` of them (checked before they are allocated).
    pub fn eval(&self, x: &Tensor, limit: Cap<'_>) -> Result<Vec<Tensor>, OpError> {
        let (rows, cols) = x.as_matrix()?;
        if cols < self.width {
            return Err(OpError(format!(
                "rows have {cols} values, the trees read input[{}]",
                self.width - 1
            )));
        }
        let xs = x.floats()?;
        let k = self.targets;
        elements(&[rows, k], limit)?;
        let mut labels = Vec::with_capacity(if self.classes.is_some() { rows } else { 0 });
        let mut out = vec![0.0f32; rows * k];
        let mut scores = vec![0.0f32; k];
        let mut has = vec![false; k];
        for r in 0..rows {
            let row = &xs[r * cols..(r + 1) * cols];
            scores.iter_mut().for_each(|s| *s = 0.0);
            has.iter_mut().for_each(|h| *h = false);
            for &root in &self.roots {
                let leaf = self.leaf(root, row);
                let ws = &self.weights[leaf.t as usize..(leaf.t + leaf.f) as usize];
                if k == 1 && self.classes.is_none() {
                    // onnxruntime's one-target path takes the leaf's first weight.
                    let w = ws[0].1;
                    self.fold(&mut scores[0], &mut has[0], w);
                } else {
                    for &(c, w) in ws {
                        self.fold(&mut scores[c as usize], &mut has[c as usize], w);
                    }
                }
            }
            let dst = &mut out[r * k..(r + 1) * k];
            match &self.classes {
                None => self.finish_regression(&mut scores, &has, dst),
                Some(c) => labels.push(self.finish_classification(c, &mut scores, &mut has, dst)),
            }
        }
        let scores = Tensor::f32(vec![rows, k], out);
        Ok(match self.classes {
            None => vec![scores],
            Some(_) => vec![Tensor::i64(vec![rows], labels), scores],
        })
    }

    fn fold(&self, score: &mut f32, has: &mut bool, w: f32) {
        let classifier = self.classes.is_some();
        *score = match self.aggregate {
            _ if classifier => *score + w,
            Aggregate::Sum | Aggregate::Average => *score + w,
            Aggregate::Min if !*has || w < *score => w,
            Aggregate::Max if !*has || w > *score => w,
            Aggregate::Min | Aggregate::Max => *score,
        };
        *has = true;
    }

    fn finish_regression(&self, scores: &mut [f32], has: &[bool], dst: &mut [f32]) {
        let n_trees = self.roots.len() as f32;
        if self.targets == 1 {
            let origin = if self.base_values.len() == 1 {
                self.base_values[0]
            } else {
                0.0
            };
            let s = match self.aggregate {
                Aggregate::Sum => scores[0] + origin,
                Aggregate::Average => scores[0] / n_trees + origin,
                Aggregate::Min | Aggregate::Max if has[0] => scores[0] + origin,
                Aggregate::Min | Aggregate::Max => origin,
            };
            dst[0] = if self.post == Post::Probit {
                probit(s)
            } else {
                s
            };
            return;
        }
        let use_base = self.base_values.len() == self.targets;
        for (j, s) in scores.iter_mut().enumerate() {
            let base = if use_base { self.base_values[j] } else { 0.0 };
            *s = match self.aggregate {
                Aggregate::Sum => *s + base,
                Aggregate::Average => *s / n_trees + base,
                Aggregate::Min | Aggregate::Max => base + if has[j] { *s } else { 0.0 },
            };
        }
        self.post.apply(scores);
        dst.copy_from_slice(scores);
    }

    /// onnxruntime's `TreeAggregatorClassifier::FinalizeScores`; returns the label.
    fn finish_classification(
        &self,
        c: &Classes,
        p: &mut [f32],
        has: &mut [bool],
        dst: &mut [f32],
    ) -> i64 {
        let base = &self.base_values;
        if self.targets > 2 {
            for (k, &b) in base.iter().enumerate().take(self.targets) {
                p[k] = if has[k] { p[k] + b } else { b };
                has[k] = true;
            }
            let mut best: Option<usize> = None;
            for k in 0..self.targets {
                if has[k] && best.is_none_or(|b| p[k] > p[b]) {
                    best = Some(k);
                }
            }
            for k in 0..self.targets {
                if !has[k] {
                    p[k] = 0.0;
                }
            }
            self.post.apply(p);
            dst.copy_from_slice(p);
            return c.labels[best.unwrap_or(0)];
        }
        // Two classes.
        let mut write_additional = -1;
        let mut two = true;
        match base.len() {
            2 if has[1] => {
                p[1] = base[1] + p[0];
                p[0] = -p[1];
            }
            2 => {
                p[1] += base[1];
                p[0] += base[0];
            }
            1 => {
                p[0] += base[0];
                two = has[1];
            }
            0 => {
                write_additional = 3;
                two = has[1];
            }
            _ => {}
        }
        let pos_weight = if two && has[1] {
            p[1]
        } else if has[0] {
            p[0]
        } else {
            0.0
        };
        let label = if c.binary_case {
            let (positive, code) = if c.weights_all_positive {
                (pos_weight > 0.5, 0)
            } else {
                (pos_weight > 0.0, 2)
            };
            write_additional = code + i32::from(!positive);
            c.labels[usize::from(positive)]
        } else if pos_weight > 0.0 {
            1
        } else {
            0
        };
        if two {
            for k in 0..2 {
                if !has[k] {
                    p[k] = 0.0;
                }
            }
            self.post.apply(p);
            dst.copy_from_slice(p);
        } else {
            let s = p[0];
            let pair = match (self.post, write_additional) {
                (Post::Probit, _) => [probit(s), 0.0],
                (_, 0 | 1) => [1.0 - s, s],
                (Post::Logistic, 2 | 3) => [logistic(-s), logistic(s)],
                (_, 2 | 3) => [-s, s],
                _ => [s, 0.0],
            };
            dst.copy_from_slice(&pair);
        }
        label
    }
}
