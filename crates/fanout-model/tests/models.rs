//! The committed test models (testdata/, made by make_models.py) against onnxruntime's outputs.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;

use fanout_model::onnx::{
    AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
};
use fanout_model::{Limits, Model, ModelError, ModelKind, Output};
use prost::Message;
use serde_json::Value;

/// Exported from scikit-learn (20 features), then hand-made trees (6 features: every branch
/// mode, missing values, AVERAGE/MAX, two targets, the binary classifier with positive weights)
/// and a hand-made dense graph (4 features: the default-domain ops the MLP export does not use);
/// then binary LinearSVC / SGDClassifier / MLPClassifier, a 3-class log-loss SGDClassifier and an
/// MLPRegressor, whose reference rows have missing values (NaN), and a hand-made graph of the
/// ops where NaN handling differs (Relu, ArgMax, Normalizer MAX).
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
    "svc_bin",
    "sgd_bin",
    "mlp_bin",
    "sgd_log3",
    "mlp_reg",
    "nan_ops",
    "norm_ops",
    "linear_bin",
];
/// Largest difference from onnxruntime: 1e-5, relative above 1 — outputs are f32, whose spacing
/// near 500 (regression values) is 6e-5, and onnxruntime's GEMM sums in another order.
const TOLERANCE: f64 = 1e-5;

fn testdata(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(file)
}

fn load(name: &str) -> (Model, Value) {
    let bytes = std::fs::read(testdata(&format!("{name}.onnx"))).unwrap();
    let model = Model::load(&bytes, name).unwrap();
    let reference: Value =
        serde_json::from_slice(&std::fs::read(testdata(&format!("{name}.ref.json"))).unwrap())
            .unwrap();
    (model, reference)
}

/// Reference values; `null` is NaN, `"Infinity"` and `"-Infinity"` the infinities.
fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| match x {
            Value::Null => f64::NAN,
            Value::String(s) if s == "Infinity" => f64::INFINITY,
            Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
            x => x.as_f64().unwrap(),
        })
        .collect()
}

/// The reference rows, flattened (`null` is a missing value, NaN), and their width.
fn inputs(reference: &Value) -> (Vec<f32>, usize) {
    let rows = reference["inputs"].as_array().unwrap();
    let width = rows[0].as_array().unwrap().len();
    let values = rows
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().map_or(f32::NAN, |v| v as f32))
        })
        .collect();
    (values, width)
}

/// Whether `got` is onnxruntime's `want`: NaN and infinities exactly where it has them, the
/// rest within [`TOLERANCE`].
fn same(got: &[f32], want: &[f64]) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(g, w)| {
            let g = f64::from(*g);
            if w.is_nan() || g.is_nan() {
                w.is_nan() && g.is_nan()
            } else if w.is_infinite() || g.is_infinite() {
                g == *w
            } else {
                (g - w).abs() / w.abs().max(1.0) <= TOLERANCE
            }
        })
}

/// Checks one row against onnxruntime's; returns the largest difference (relative above 1).
fn close(name: &str, row: usize, got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(
        got.len(),
        want.len(),
        "{name} row {row}: {got:?} vs {want:?}"
    );
    let mut max = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        // NaN where onnxruntime gives NaN, and only there.
        assert_eq!(
            g.is_nan(),
            w.is_nan(),
            "{name} row {row}: {got:?} vs onnxruntime {want:?}"
        );
        if w.is_nan() {
            continue;
        }
        // An overflow: the same infinity.
        if w.is_infinite() || g.is_infinite() {
            assert!(
                f64::from(*g) == *w,
                "{name} row {row}: {got:?} vs onnxruntime {want:?}"
            );
            continue;
        }
        let d = (f64::from(*g) - w).abs() / w.abs().max(1.0);
        assert!(
            d <= TOLERANCE,
            "{name} row {row}: {got:?} vs onnxruntime {want:?}"
        );
        max = max.max(d);
    }
    max
}

#[test]
fn every_committed_model_matches_onnxruntime() {
    for name in MODELS {
        let (model, reference) = load(name);
        let (rows, width) = inputs(&reference);
        assert_eq!(model.input_width(), width, "{name}");
        let n = rows.len() / width;
        assert!(n >= 20, "{name}: {n} reference rows");
        let out = model.run(&rows).unwrap();
        assert_eq!(out.rows(), n, "{name}");
        let mut max = 0.0f64;
        match (model.kind(), &out) {
            (ModelKind::Classifier { labels, columns }, Output::Classifier { .. }) => {
                let classes: Vec<i64> = reference["classes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c.as_i64().unwrap())
                    .collect();
                assert_eq!(labels, &classes, "{name}");
                // A binary LinearSVC's one column is the second class's score.
                let one_column = reference["probabilities"][0].as_array().unwrap().len() == 1;
                let want_columns = if one_column {
                    vec![classes[1]]
                } else {
                    classes.clone()
                };
                assert_eq!(columns, &want_columns, "{name}");
                let want_labels = reference["labels"].as_array().unwrap();
                let want_probs = reference["probabilities"].as_array().unwrap();
                for i in 0..n {
                    assert_eq!(
                        out.label(i),
                        want_labels[i].as_i64(),
                        "{name} row {i}: label"
                    );
                    // One column where onnxruntime gives one (a binary LinearSVC: the second
                    // class's score alone).
                    let want = floats(&want_probs[i]);
                    max = max.max(close(name, i, out.row(i), &want));
                }
            }
            (ModelKind::Regressor { targets }, Output::Regressor { .. }) => {
                let want = reference["values"].as_array().unwrap();
                assert_eq!(*targets, want[0].as_array().unwrap().len(), "{name}");
                for (i, w) in want.iter().enumerate() {
                    max = max.max(close(name, i, out.row(i), &floats(w)));
                }
            }
            (kind, out) => panic!("{name}: kind {kind:?} but output {out:?}"),
        }
        println!("{name}: {n} rows, largest difference from onnxruntime {max:.3e}");
    }
}

/// Features among the largest floats (±3.4e38, 1e38, 1e30, 1e20), where products and sums
/// overflow: every committed model gives what onnxruntime gives (`extremes.ref.json`) — the
/// same infinities, NaN only where it has NaN, the same labels. Its kernels sum products as
/// fused multiply-adds: a product past the largest float is not an infinity before it is added
/// (multiplied, then added, `inf + -inf` made NaN, and an MLP answered `null` where onnxruntime
/// gives label 1 at probability 1).
#[test]
fn the_largest_floats_give_what_onnxruntime_gives() {
    let all: Value =
        serde_json::from_slice(&std::fs::read(testdata("extremes.ref.json")).unwrap()).unwrap();
    let mut differ = Vec::new();
    for name in MODELS {
        let (model, _) = load(name);
        let reference = &all["models"][name];
        let (rows, width) = inputs(reference);
        let n = rows.len() / width;
        let out = model.run(&rows).unwrap();
        let mut bad = 0;
        let mut first = None;
        for i in 0..n {
            let want = match reference.get("labels") {
                Some(labels) => {
                    if out.label(i) != labels[i].as_i64() {
                        bad += 1;
                        first.get_or_insert(format!(
                            "row {i}: label {:?}, onnxruntime {}",
                            out.label(i),
                            labels[i]
                        ));
                        continue;
                    }
                    floats(&reference["probabilities"][i])
                }
                None => floats(&reference["values"][i]),
            };
            let got = out.row(i);
            if !same(got, &want) {
                bad += 1;
                first.get_or_insert(format!("row {i}: {got:?}, onnxruntime {want:?}"));
            }
        }
        if bad > 0 {
            differ.push(format!(
                "{name}: {bad} of {n} rows differ, first {}",
                first.unwrap()
            ));
        }
    }
    assert!(differ.is_empty(), "\n{}", differ.join("\n"));
}

#[test]
fn a_batch_equals_its_rows_run_one_by_one() {
    for name in MODELS {
        let (model, reference) = load(name);
        let (rows, width) = inputs(&reference);
        let batch = model.run(&rows).unwrap();
        for (i, row) in rows.chunks(width).enumerate() {
            let single = model.run(row).unwrap();
            assert_eq!(single.rows(), 1);
            assert_eq!(single.label(0), batch.label(i), "{name} row {i}");
            // Bit for bit: a row's result does not depend on its batch.
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(single.row(0)), bits(batch.row(i)), "{name} row {i}");
        }
        let empty = model.run(&[]).unwrap();
        assert_eq!(empty.rows(), 0, "{name}");
    }
}

#[test]
fn a_model_is_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Model>();
}

#[test]
fn a_row_of_the_wrong_width_is_an_error() {
    let (model, _) = load("logreg");
    let err = model.run(&[0.0; 21]).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InputWidth {
                len: 21,
                width: 20,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn missing_values_follow_the_trees_rules() {
    // NaN features: every comparison is false, so rows go to the false branches (no tracking
    // in these exports); the result is a valid output, not an error.
    for name in ["gbdt_clf", "rf_reg"] {
        let (model, _) = load(name);
        let out = model.run(&[f32::NAN; 20]).unwrap();
        assert_eq!(out.rows(), 1);
        assert!(out.row(0).iter().all(|v| v.is_finite()), "{name}: {out:?}");
    }
}

fn tensor_info(name: &str, elem_type: i32, dims: &[Option<i64>]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: Some(elem_type),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            dim_value: *d,
                            dim_param: d.is_none().then(|| "N".into()),
                        })
                        .collect(),
                }),
            }),
        }),
    }
}

/// X[N,4] → `op_type` (domain) → Y[N,4].
fn one_node_model(op_type: &str, domain: &str) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            },
            OperatorSetIdProto {
                domain: Some("ai.onnx.ml".into()),
                version: Some(3),
            },
        ],
        producer_name: Some("fanout-model tests".into()),
        producer_version: None,
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["X".into()],
                output: vec!["Y".into()],
                name: Some("the_node".into()),
                op_type: Some(op_type.into()),
                domain: Some(domain.into()),
                attribute: vec![AttributeProto {
                    name: Some("alpha".into()),
                    r#type: Some(1),
                    f: Some(0.5),
                    ..Default::default()
                }],
            }],
            name: Some("g".into()),
            initializer: vec![],
            input: vec![tensor_info("X", 1, &[None, Some(4)])],
            output: vec![tensor_info("Y", 1, &[None, Some(4)])],
        }),
    }
    .encode_to_vec()
}

#[test]
fn an_unsupported_operator_is_named_with_the_model() {
    let err = Model::load(&one_node_model("LeakyRelu", ""), "tiny").unwrap_err();
    assert!(
        matches!(&err, ModelError::Unsupported { op, model } if op == "LeakyRelu" && model == "tiny"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("LeakyRelu") && text.contains("tiny"),
        "{text}"
    );

    let err = Model::load(&one_node_model("ZipMap", "ai.onnx.ml"), "tiny").unwrap_err();
    assert!(
        matches!(&err, ModelError::Unsupported { op, .. } if op == "ZipMap"),
        "{err:?}"
    );

    let err = Model::load(&one_node_model("Thing", "com.example"), "tiny").unwrap_err();
    assert!(
        matches!(&err, ModelError::Unsupported { op, .. } if op == "com.example:Thing"),
        "{err:?}"
    );

    // The same graph with a supported operator loads and runs.
    let model = Model::load(&one_node_model("Relu", ""), "tiny").unwrap();
    assert_eq!(model.input_width(), 4);
    assert_eq!(model.kind(), &ModelKind::Regressor { targets: 4 });
    let out = model.run(&[-1.0, 2.0, -3.0, 4.0]).unwrap();
    assert_eq!(out.row(0), &[0.0, 2.0, 0.0, 4.0]);
}

#[test]
fn a_truncated_or_garbage_file_is_an_error_not_a_panic() {
    for name in MODELS {
        let bytes = std::fs::read(testdata(&format!("{name}.onnx"))).unwrap();
        let (full, reference) = load(name);
        let (rows, _) = inputs(&reference);
        let want = full.run(&rows).unwrap();
        // Every prefix of the small models, a spread of prefixes of the large ones, and the
        // last 64. Protobuf cannot tell a file cut between two of its last fields (the opset
        // imports, after the graph) from a complete one: such a prefix may load, but then it is
        // the same model. Any cut inside the graph is an error.
        let step = (bytes.len() / 400).max(1);
        let tail = bytes.len().saturating_sub(64);
        for len in (0..bytes.len()).step_by(step).chain(tail..bytes.len()) {
            match Model::load(&bytes[..len], name) {
                Err(e) => assert!(e.to_string().contains(name), "{e}"),
                Ok(m) => {
                    assert!(
                        len >= bytes.len() - 24,
                        "{name} cut at {len} of {} loaded",
                        bytes.len()
                    );
                    // Compared as text: NaN equals NaN there.
                    assert_eq!(
                        format!("{:?}", m.run(&rows).unwrap()),
                        format!("{want:?}"),
                        "{name} cut at {len}"
                    );
                }
            }
        }
    }
    let err = Model::load(b"this is not an onnx model", "garbage").unwrap_err();
    assert!(err.to_string().contains("garbage"), "{err}");
    let mut noise = vec![0u8; 4096];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    assert!(Model::load(&noise, "noise").is_err());
}

/// X[N,4] → TreeEnsembleRegressor with the given nodes `(id, feature, mode, true, false)` of
/// tree 0, weight 1.0 on every leaf.
fn tree_model(nodes: &[(i64, i64, &str, i64, i64)]) -> Vec<u8> {
    let ints = |name: &str, v: Vec<i64>| AttributeProto {
        name: Some(name.into()),
        r#type: Some(7),
        ints: v,
        ..Default::default()
    };
    let leaves: Vec<i64> = nodes
        .iter()
        .filter(|n| n.2 == "LEAF")
        .map(|n| n.0)
        .collect();
    let attribute = vec![
        AttributeProto {
            name: Some("n_targets".into()),
            r#type: Some(2),
            i: Some(1),
            ..Default::default()
        },
        ints("nodes_treeids", vec![0; nodes.len()]),
        ints("nodes_nodeids", nodes.iter().map(|n| n.0).collect()),
        ints("nodes_featureids", nodes.iter().map(|n| n.1).collect()),
        AttributeProto {
            name: Some("nodes_modes".into()),
            r#type: Some(8),
            strings: nodes.iter().map(|n| n.2.as_bytes().to_vec()).collect(),
            ..Default::default()
        },
        AttributeProto {
            name: Some("nodes_values".into()),
            r#type: Some(6),
            floats: vec![0.5; nodes.len()],
            ..Default::default()
        },
        ints("nodes_truenodeids", nodes.iter().map(|n| n.3).collect()),
        ints("nodes_falsenodeids", nodes.iter().map(|n| n.4).collect()),
        ints("target_ids", vec![0; leaves.len()]),
        ints("target_treeids", vec![0; leaves.len()]),
        ints("target_nodeids", leaves.clone()),
        AttributeProto {
            name: Some("target_weights".into()),
            r#type: Some(6),
            floats: vec![1.0; leaves.len()],
            ..Default::default()
        },
    ];
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some("ai.onnx.ml".into()),
            version: Some(3),
        }],
        producer_name: None,
        producer_version: None,
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["X".into()],
                output: vec!["Y".into()],
                name: Some("trees".into()),
                op_type: Some("TreeEnsembleRegressor".into()),
                domain: Some("ai.onnx.ml".into()),
                attribute,
            }],
            name: None,
            initializer: vec![],
            input: vec![tensor_info("X", 1, &[None, Some(4)])],
            output: vec![tensor_info("Y", 1, &[None, Some(1)])],
        }),
    }
    .encode_to_vec()
}

#[test]
fn hostile_trees_are_refused_at_load() {
    // A well-formed tree loads and runs.
    let ok = tree_model(&[
        (0, 3, "BRANCH_LEQ", 1, 2),
        (1, 0, "LEAF", 0, 0),
        (2, 0, "LEAF", 0, 0),
    ]);
    let model = Model::load(&ok, "ok").unwrap();
    assert_eq!(model.run(&[0.0, 0.0, 0.0, 1.0]).unwrap().row(0), &[1.0]);

    let cases: &[(&str, Vec<u8>, &str)] = &[
        (
            "cycle",
            tree_model(&[
                (0, 0, "BRANCH_LEQ", 1, 2),
                (1, 0, "BRANCH_LT", 0, 2),
                (2, 0, "LEAF", 0, 0),
            ]),
            "reached twice",
        ),
        (
            "self",
            tree_model(&[(0, 0, "BRANCH_LEQ", 0, 1), (1, 0, "LEAF", 0, 0)]),
            "its own child",
        ),
        (
            "dangling",
            tree_model(&[(0, 0, "BRANCH_LEQ", 1, 7), (1, 0, "LEAF", 0, 0)]),
            "no node 7",
        ),
        (
            "mode",
            tree_model(&[
                (0, 0, "BRANCH_SOMETIMES", 1, 2),
                (1, 0, "LEAF", 0, 0),
                (2, 0, "LEAF", 0, 0),
            ]),
            "BRANCH_SOMETIMES",
        ),
        // Feature 9 of a 4-wide input: found by the warm-up run at load.
        (
            "feature",
            tree_model(&[
                (0, 9, "BRANCH_LEQ", 1, 2),
                (1, 0, "LEAF", 0, 0),
                (2, 0, "LEAF", 0, 0),
            ]),
            "input[9]",
        ),
    ];
    for (name, bytes, want) in cases {
        let err = Model::load(bytes, name).unwrap_err().to_string();
        assert!(err.contains(want) && err.contains(name), "{name}: {err}");
    }

    // Deeper than the limit: a chain of MAX_TREE_DEPTH + 1 branches.
    let depth = fanout_model::MAX_TREE_DEPTH as i64 + 1;
    let mut chain: Vec<(i64, i64, &str, i64, i64)> = (0..depth)
        .map(|i| (i, 0, "BRANCH_LEQ", i + 1, depth + 1 + i))
        .collect();
    chain.push((depth, 0, "LEAF", 0, 0));
    chain.extend((0..depth).map(|i| (depth + 1 + i, 0, "LEAF", 0, 0)));
    let err = Model::load(&tree_model(&chain), "deep")
        .unwrap_err()
        .to_string();
    assert!(err.contains("deeper than"), "{err}");
}

/// X[dims] → Relu → Y, with `initializers` (name, dims, no values) added to the graph.
fn shaped_model(dims: &[Option<i64>], initializers: &[(&str, &[i64])]) -> Vec<u8> {
    let mut model = ModelProto::decode(one_node_model("Relu", "").as_slice()).unwrap();
    let graph = model.graph.as_mut().unwrap();
    graph.input = vec![tensor_info("X", 1, dims)];
    graph.initializer = initializers
        .iter()
        .map(|(name, dims)| fanout_model::onnx::TensorProto {
            name: Some((*name).into()),
            dims: dims.to_vec(),
            data_type: Some(1),
            ..Default::default()
        })
        .collect();
    model.encode_to_vec()
}

#[test]
fn declared_shapes_over_the_limits_are_refused_before_allocating() {
    // The three files: a width past usize arithmetic, one of 4 GB, one of 400 MB.
    let cases: &[(&str, Vec<u8>, &str)] = &[
        (
            "huge",
            shaped_model(&[Some(1), Some(1 << 62)], &[]),
            "[1, 4611686018427387904]",
        ),
        (
            "giga",
            shaped_model(&[None, Some(1_000_000_000)], &[]),
            "[N, 1000000000]",
        ),
        (
            "hundred_m",
            shaped_model(&[Some(1), Some(100_000_000)], &[]),
            "[1, 100000000]",
        ),
    ];
    for (name, bytes, shape) in cases {
        assert!(bytes.len() < 200, "{name}: {} bytes", bytes.len());
        let err = Model::load(bytes, name).unwrap_err();
        assert!(
            matches!(&err, ModelError::Shape { limit, .. } if *limit == fanout_model::MAX_INPUT_WIDTH),
            "{name}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(name)
                && text.contains(shape)
                && text.contains(&fanout_model::MAX_INPUT_WIDTH.to_string()),
            "{text}"
        );
    }

    // The widest input allowed loads and runs.
    let w = fanout_model::MAX_INPUT_WIDTH;
    let model = Model::load(&shaped_model(&[None, Some(w as i64)], &[]), "wide").unwrap();
    assert_eq!(model.input_width(), w);
    assert_eq!(model.run(&vec![-1.0; w]).unwrap().row(0), vec![0.0; w]);

    // Initializers: over the element limit, overflowing, or hiding a huge dimension behind a 0.
    for (name, dims, shape) in [
        ("square", &[1i64 << 14, 1 << 14][..], "[16384, 16384]"),
        (
            "overflow",
            &[1 << 40, 1 << 40][..],
            "[1099511627776, 1099511627776]",
        ),
        ("empty", &[0, 1 << 40][..], "[0, 1099511627776]"),
    ] {
        let bytes = shaped_model(&[None, Some(4)], &[("W", dims)]);
        let err = Model::load(&bytes, name).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, ModelError::Shape { limit, .. } if *limit == fanout_model::MAX_TENSOR_ELEMENTS)
                && text.contains(shape)
                && text.contains("initializer \"W\""),
            "{name}: {text}"
        );
    }
}

#[test]
fn lower_limits_refuse_what_the_defaults_load_and_name_the_limit() {
    // 10 features: within the default width, over a width limit of 4.
    let bytes = shaped_model(&[None, Some(10)], &[]);
    assert_eq!(Model::load(&bytes, "ten").unwrap().input_width(), 10);
    let narrow = Limits {
        max_input_width: 4,
        ..Limits::default()
    };
    let err = Model::load_with(&bytes, "ten", &narrow).unwrap_err();
    assert!(
        matches!(&err, ModelError::Shape { limit: 4, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("ten")
            && text.contains("[N, 10]")
            && text.contains("the limit max_input_width (4 features per row)"),
        "{text}"
    );
    // Loaded by the gateway, the error names the config field.
    let named = Limits {
        named_as: Some("models.limits"),
        ..narrow
    };
    let text = Model::load_with(&bytes, "ten", &named)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("more than models.limits.max_input_width (4 features per row)"),
        "{text}"
    );
    // At the limit, it loads.
    let exact = Limits {
        max_input_width: 10,
        ..Limits::default()
    };
    assert_eq!(
        Model::load_with(&bytes, "ten", &exact)
            .unwrap()
            .input_width(),
        10
    );

    // The model keeps its limits: a batch of more values than max_tensor_elements fails to run.
    let small = Limits {
        max_tensor_elements: 30,
        named_as: Some("models.limits"),
        ..Limits::default()
    };
    let model = Model::load_with(&bytes, "ten", &small).unwrap();
    assert_eq!(model.run(&[-1.0; 30]).unwrap().row(2), vec![0.0; 10]);
    let text = model.run(&[-1.0; 40]).unwrap_err().to_string();
    assert!(
        text.contains("more than models.limits.max_tensor_elements (30)"),
        "{text}"
    );

    // Tree limits: a chain of 5 branches loads by default, not under a depth limit of 3.
    let depth = 5;
    let mut chain: Vec<(i64, i64, &str, i64, i64)> = (0..depth)
        .map(|i| (i, 0, "BRANCH_LEQ", i + 1, depth + 1 + i))
        .collect();
    chain.push((depth, 0, "LEAF", 0, 0));
    chain.extend((0..depth).map(|i| (depth + 1 + i, 0, "LEAF", 0, 0)));
    let trees = tree_model(&chain);
    Model::load(&trees, "chain").unwrap();
    let shallow = Limits {
        max_tree_depth: 3,
        ..Limits::default()
    };
    let text = Model::load_with(&trees, "chain", &shallow)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("a tree deeper than the limit max_tree_depth (3)"),
        "{text}"
    );
}

#[test]
fn a_graph_that_grows_a_row_past_the_limit_is_refused_at_load() {
    // X[N,4] → ArrayFeatureExtractor with 2^21 indices of one column: the warm-up would make
    // 2^21 values of one row; it is refused before they are allocated.
    let mut model =
        ModelProto::decode(one_node_model("ArrayFeatureExtractor", "ai.onnx.ml").as_slice())
            .unwrap();
    let graph = model.graph.as_mut().unwrap();
    graph.node[0].attribute.clear();
    graph.node[0].input.push("I".into());
    let n = fanout_model::MAX_ROW_ELEMENTS * 2;
    graph.initializer = vec![fanout_model::onnx::TensorProto {
        name: Some("I".into()),
        dims: vec![n as i64],
        data_type: Some(7),
        raw_data: Some(vec![0; n * 8]),
        ..Default::default()
    }];
    let err = Model::load(&model.encode_to_vec(), "grows")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("grows") && err.contains(&fanout_model::MAX_ROW_ELEMENTS.to_string()),
        "{err}"
    );
}

#[test]
fn mutated_files_are_errors_or_models_never_panics() {
    // Bytes of every committed model changed at pseudo-random places (a varint made huge, a
    // length or a dimension changed): loading and running is an error or a model, never a
    // panic or an allocation sized by the file.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for name in MODELS {
        let bytes = std::fs::read(testdata(&format!("{name}.onnx"))).unwrap();
        let (_, reference) = load(name);
        let (rows, _) = inputs(&reference);
        for _ in 0..300 {
            let mut b = bytes.clone();
            for _ in 0..1 + next() % 3 {
                let i = (next() % b.len() as u64) as usize;
                b[i] = match next() % 4 {
                    0 => 0xff,
                    1 => 0x7f,
                    2 => 0,
                    _ => next() as u8,
                };
            }
            if let Ok(m) = Model::load(&b, name) {
                let w = m.input_width();
                let _ = m.run(&rows[..rows.len() / w * w]);
            }
        }
    }
}

#[test]
fn extreme_numbers_in_a_model_are_errors_or_models_never_panics() {
    // A dimension, an attribute integer or a shape value of every committed model set to an
    // extreme value, one at a time: an error or a model, never a panic or a huge allocation.
    const EXTREMES: [i64; 8] = [0, 1, -1, 2, 1 << 20, 1 << 31, 1 << 62, i64::MAX];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for name in MODELS {
        let bytes = std::fs::read(testdata(&format!("{name}.onnx"))).unwrap();
        let (_, reference) = load(name);
        let (rows, _) = inputs(&reference);
        let proto = ModelProto::decode(bytes.as_slice()).unwrap();
        for _ in 0..200 {
            let mut p = proto.clone();
            let g = p.graph.as_mut().unwrap();
            let v = EXTREMES[(next() % 8) as usize];
            match next() % 4 {
                0 if !g.initializer.is_empty() => {
                    let i = (next() as usize) % g.initializer.len();
                    let t = &mut g.initializer[i];
                    if t.dims.is_empty() {
                        t.dims.push(v);
                    } else {
                        let d = (next() as usize) % t.dims.len();
                        t.dims[d] = v;
                    }
                }
                1 => {
                    let n = (next() as usize) % g.node.len();
                    let attrs = &mut g.node[n].attribute;
                    if attrs.is_empty() {
                        continue;
                    }
                    let a = (next() as usize) % attrs.len();
                    let a = &mut attrs[a];
                    if a.i.is_some() {
                        a.i = Some(v);
                    } else if !a.ints.is_empty() {
                        let k = (next() as usize) % a.ints.len();
                        a.ints[k] = v;
                    } else {
                        a.i = Some(v);
                    }
                }
                2 if !g.initializer.is_empty() => {
                    // An integer initializer's value (a Reshape's shape, indices, axes).
                    let i = (next() as usize) % g.initializer.len();
                    let t = &mut g.initializer[i];
                    if let Some(raw) = t.raw_data.as_mut().filter(|r| r.len() >= 8) {
                        if t.data_type == Some(7) {
                            let k = (next() as usize) % (raw.len() / 8);
                            raw[k * 8..k * 8 + 8].copy_from_slice(&v.to_le_bytes());
                        }
                    } else if !t.int64_data.is_empty() {
                        let k = (next() as usize) % t.int64_data.len();
                        t.int64_data[k] = v;
                    }
                }
                _ => {
                    let input = &mut g.input[0];
                    let dims = &mut input
                        .r#type
                        .as_mut()
                        .unwrap()
                        .tensor_type
                        .as_mut()
                        .unwrap()
                        .shape
                        .as_mut()
                        .unwrap()
                        .dim;
                    let d = (next() as usize) % dims.len();
                    dims[d].dim_value = Some(v);
                }
            }
            if let Ok(m) = Model::load(&p.encode_to_vec(), name) {
                let w = m.input_width();
                let _ = m.run(&rows[..rows.len() / w * w]);
            }
        }
    }
}
