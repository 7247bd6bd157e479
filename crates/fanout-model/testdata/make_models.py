#!/usr/bin/env python3
"""Make the test models of fanout-model (run by hand; the tests never run Python).

    python3 crates/fanout-model/testdata/make_models.py
    python3 crates/fanout-model/testdata/make_models.py --extremes   # extremes.ref.json alone

Creates a venv in ~/.cache/fanout-models-venv (scikit-learn, skl2onnx, onnx, onnxruntime,
numpy from PyPI) when missing, re-runs itself inside it, trains small models on generated data
(fixed seed, 20 float features, classifiers with 3 classes, one binary classifier) and writes,
next to this script, for each model NAME.onnx and NAME.ref.json: reference input rows and
onnxruntime's outputs for them (label and probabilities for classifiers, values for regressors),
and extremes.ref.json: onnxruntime's outputs for rows of the largest floats, for every model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("FANOUT_MODELS_VENV", Path.home() / ".cache" / "fanout-models-venv"))
PACKAGES = ["scikit-learn", "skl2onnx", "onnx", "onnxruntime", "numpy"]
FEATURES = 20
ROWS = 32  # reference rows per model
SEED = 24


def ensure_venv():
    py = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


def main():
    import numpy as np
    import onnx
    import onnxruntime as ort
    import skl2onnx
    import sklearn
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification, make_regression
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.linear_model import LinearRegression, LogisticRegression, SGDClassifier
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.svm import LinearSVC
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X3, y3 = make_classification(
        n_samples=600, n_features=FEATURES, n_informative=8, n_classes=3, random_state=SEED
    )
    X2, y2 = make_classification(
        n_samples=600, n_features=FEATURES, n_informative=6, n_classes=2, random_state=SEED + 1
    )
    Xr, yr = make_regression(n_samples=600, n_features=FEATURES, n_informative=10, noise=5.0, random_state=SEED)
    X3, X2, Xr = (x.astype(np.float32) for x in (X3, X2, Xr))

    models = {
        "logreg": (make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)), X3, y3, True),
        "logreg_bin": (make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)), X2, y2, True),
        "mlp": (
            make_pipeline(
                StandardScaler(),
                MLPClassifier(hidden_layer_sizes=(16, 8), max_iter=2000, random_state=SEED),
            ),
            X3,
            y3,
            True,
        ),
        "gbdt_clf": (GradientBoostingClassifier(n_estimators=12, max_depth=3, random_state=SEED), X3, y3, True),
        "gbdt_bin": (GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=SEED), X2, y2, True),
        "rf_clf": (RandomForestClassifier(n_estimators=8, max_depth=5, random_state=SEED), X3, y3, True),
        "gbdt_reg": (GradientBoostingRegressor(n_estimators=20, max_depth=3, random_state=SEED), Xr, yr, False),
        "rf_reg": (RandomForestRegressor(n_estimators=8, max_depth=5, random_state=SEED), Xr, yr, False),
        "linreg": (make_pipeline(StandardScaler(), LinearRegression()), Xr, yr, False),
    }

    rng = np.random.default_rng(SEED)
    versions = {
        "python": sys.version.split()[0],
        "scikit-learn": sklearn.__version__,
        "skl2onnx": skl2onnx.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
    }
    def write(name, onx, rows, classes):
        """Writes NAME.onnx and NAME.ref.json with onnxruntime's outputs for `rows` (NaN → null)."""
        data = onx.SerializeToString()
        (HERE / f"{name}.onnx").write_bytes(data)
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        outs = sess.run(None, {sess.get_inputs()[0].name: rows})
        def nulls(a):
            return [[None if np.isnan(v) else float(v) for v in r] for r in a.astype(np.float64)]

        ref = {
            "model": name,
            "versions": versions,
            "ops": sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in onx.graph.node}),
            "inputs": [[None if np.isnan(v) else float(v) for v in r] for r in rows],
        }
        if classes is not None:
            ref["classes"] = [int(c) for c in classes]
            ref["labels"] = [int(v) for v in outs[0].reshape(-1)]
            ref["probabilities"] = nulls(outs[1])
        else:
            ref["values"] = nulls(outs[0])
        (HERE / f"{name}.ref.json").write_text(json.dumps(ref, indent=None, allow_nan=False) + "\n")
        print(f"{name}: {len(data)} bytes, ops {ref['ops']}")

    for name, (est, X, y, is_clf) in models.items():
        est.fit(X, y)
        options = {id(est): {"zipmap": False}} if is_clf else None
        onx = to_onnx(est, X[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        # Reference rows: half from the training data, half outside its range.
        rows = np.concatenate(
            [X[rng.choice(len(X), ROWS // 2, replace=False)], rng.normal(0, 3, (ROWS // 2, FEATURES))]
        ).astype(np.float32)
        write(name, onx, rows, est.classes_ if is_clf else None)

    # Hand-made tree ensembles for what the exports above never use: every BRANCH_* mode,
    # missing-value tracking (NaN inputs), AVERAGE and MAX, two targets, base_values, and the
    # binary classifier with positive weights on one class. 6 features; values on thresholds.
    for name, onx in hand_made_trees().items():
        grid = np.array([np.nan, -2, -1, 0, 0.5, 1, 2, 3], dtype=np.float32)
        rows = grid[rng.integers(0, len(grid), (40, 6))]
        write(name, onx, rows, [0, 1] if "clf" in name else None)

    # Hand-made dense graph for the default-domain ops the MLP export does not use.
    write("dense_ops", hand_made_dense(np.random.default_rng(SEED)), rng.normal(0, 2, (32, 4)).astype(np.float32), None)

    # The binary and SGD classifiers skl2onnx exports with other graphs (one score column,
    # Concat, Exp/Reciprocal/ReduceSum/Not), and MLPs given missing values (NaN through Relu).
    # Their reference rows add NaN: a few single missing values and a row of them.
    rng2 = np.random.default_rng(SEED + 2)
    more = {
        # Not in a pipeline: skl2onnx 1.20 asks a pipeline's LinearSVC for a zipmap option it has not.
        "svc_bin": (LinearSVC(), X2, y2, True),
        "sgd_bin": (SGDClassifier(random_state=SEED), X2, y2, True),
        "mlp_bin": (
            make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(8,), max_iter=2000, random_state=SEED)),
            X2,
            y2,
            True,
        ),
        "sgd_log3": (
            make_pipeline(StandardScaler(), SGDClassifier(loss="log_loss", random_state=SEED)),
            X3,
            y3,
            True,
        ),
        "mlp_reg": (
            make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(8,), max_iter=2000, random_state=SEED)),
            Xr,
            yr,
            False,
        ),
    }
    for name, (est, X, y, is_clf) in more.items():
        est.fit(X, y)
        last = est.steps[-1][1] if hasattr(est, "steps") else est
        # LinearSVC exports scores and has no zipmap option.
        options = {id(last): {"zipmap": False}} if is_clf and not isinstance(last, LinearSVC) else None
        onx = to_onnx(est, X[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        rows = np.concatenate(
            [X[rng2.choice(len(X), ROWS // 2, replace=False)], rng2.normal(0, 3, (ROWS // 2, FEATURES))]
        ).astype(np.float32)
        rows[1, 3] = rows[5, 0] = rows[9, 19] = rows[20, 7] = np.nan
        rows[30, :] = np.nan
        write(name, onx, rows, est.classes_ if is_clf else None)

    # Hand-made: NaN through Relu, ArgMax and Normalizer(MAX), rows with some values missing.
    grid = np.array([np.nan, -1, 0, 0.5, 2], dtype=np.float32)
    write("nan_ops", hand_made_nan(), grid[rng2.integers(0, len(grid), (40, 4))], [0, 1, 2, 3])
    # Hand-made: the three Normalizer norms side by side (Concat), on rows of zeros, negatives and NaN.
    write("norm_ops", hand_made_norms(), grid[rng2.integers(0, len(grid), (40, 4))], None)
    # Hand-made: LinearClassifier of one coefficient row and two labels (the binary case
    # onnxruntime expands to two columns), with the post-transforms NONE, LOGISTIC and SOFTMAX.
    write("linear_bin", hand_made_linear_bin(), grid[rng2.integers(0, len(grid), (40, 4))], None)
    write_extremes()
    print(json.dumps(versions))


# Every committed model, for extremes.ref.json.
MODELS = [
    "logreg", "logreg_bin", "mlp", "gbdt_clf", "gbdt_bin", "rf_clf", "gbdt_reg", "rf_reg", "linreg",
    "trees_avg2", "trees_max", "trees_bin_clf", "dense_ops", "svc_bin", "sgd_bin", "mlp_bin",
    "sgd_log3", "mlp_reg", "nan_ops", "norm_ops", "linear_bin",
]


def write_extremes():
    """Writes extremes.ref.json: for every committed model, rows whose features are partly the
    largest floats (±3.4e38, 1e38, 1e30, 1e20; the rest normal(0, 1)) and onnxruntime's outputs
    for them, where sums and products overflow (NaN → null, ±infinity → "Infinity"/"-Infinity").
    Reads the committed NAME.onnx files: needs onnxruntime and numpy only (`--extremes`)."""
    import numpy as np
    import onnxruntime as ort

    def encode(a):
        def one(v):
            if np.isnan(v):
                return None
            if np.isinf(v):
                return "Infinity" if v > 0 else "-Infinity"
            return short(v)
        return [[one(v) for v in r] for r in np.asarray(a).astype(np.float32).reshape(len(a), -1)]

    def short(v):
        """The shortest decimal that reads back as the same f32."""
        return float(str(np.float32(v)))

    rng = np.random.default_rng(SEED + 3)
    huge = np.array([3.4028235e38, 3.4e38, 1e38, 1e30, 1e20], dtype=np.float32)
    models = {}
    for name in MODELS:
        sess = ort.InferenceSession(str(HERE / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        inp = sess.get_inputs()[0]
        width = inp.shape[1]
        n = 32
        rows = rng.normal(0, 1, (n, width))
        mask = rng.random((n, width)) < rng.random((n, 1)) * 0.5
        signs = np.where(rng.random((n, width)) < 0.5, -1.0, 1.0)
        rows = np.where(mask, signs * rng.choice(huge, (n, width)), rows)
        alternate = np.where(np.arange(width) % 2 == 0, 1.0, -1.0) * 3.4e38
        rows = np.concatenate([rows, [np.full(width, 3.4e38), np.full(width, -3.4e38), alternate, np.full(width, 1e38)]])
        rows = rows.astype(np.float32)
        outs = sess.run(None, {inp.name: rows})
        entry = {"inputs": [[short(v) for v in r] for r in rows]}
        if len(outs) == 2 and outs[0].dtype == np.int64:
            entry["labels"] = [int(v) for v in outs[0].reshape(-1)]
            entry["probabilities"] = encode(outs[1])
        else:
            entry["values"] = encode(outs[0])
        models[name] = entry
    versions = {"onnxruntime": ort.__version__, "numpy": np.__version__}
    (HERE / "extremes.ref.json").write_text(
        json.dumps({"versions": versions, "models": models}, indent=None, allow_nan=False) + "\n"
    )
    print(f"extremes: {len(models)} models, {versions}")


def hand_made_dense(rng):
    """X[N,4] → Flatten → Gemm(transB, alpha, beta) → Tanh → Sub → Mul → Div → Sigmoid → Softmax → Y[N,3]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def const(name, shape):
        return numpy_helper.from_array(rng.normal(0, 1, shape).astype(np.float32), name)

    inits = [const("W", (3, 4)), const("C", (3,)), const("S", (1, 3)), const("M", (3,)), const("D", (1, 1))]
    inits[-1] = numpy_helper.from_array(np.array([[1.5]], dtype=np.float32), "D")
    nodes = [
        helper.make_node("Flatten", ["X"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "W", "C"], ["g"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Tanh", ["g"], ["t"]),
        helper.make_node("Sub", ["t", "S"], ["s"]),
        helper.make_node("Mul", ["s", "M"], ["m"]),
        helper.make_node("Div", ["m", "D"], ["d"]),
        helper.make_node("Sigmoid", ["d"], ["sg"]),
        helper.make_node("Softmax", ["sg"], ["Y"], axis=1),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])
    graph = helper.make_graph(nodes, "dense_ops", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def hand_made_nan():
    """X[N,4] → Relu → r; label = ArgMax(r), probabilities = Normalizer(MAX)(r): a classifier of 4 classes."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["X"], ["r"]),
        helper.make_node("ArgMax", ["r"], ["label"], axis=1, keepdims=0),
        helper.make_node("Normalizer", ["r"], ["probabilities"], domain="ai.onnx.ml", norm="MAX"),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [None])
    proba = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph(nodes, "nan_ops", [x], [label, proba])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8
    )


def hand_made_norms():
    """X[N,4] → Normalizer MAX, L1, L2 → Concat(axis=1) → Y[N,12]."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Normalizer", ["X"], [f"n_{norm}"], domain="ai.onnx.ml", norm=norm)
        for norm in ("MAX", "L1", "L2")
    ]
    nodes.append(helper.make_node("Concat", ["n_MAX", "n_L1", "n_L2"], ["Y"], axis=1))
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 12])
    graph = helper.make_graph(nodes, "norm_ops", [x], [y])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8
    )


def hand_made_linear_bin():
    """X[N,4] → three binary LinearClassifiers (one coefficient row, labels 3 and 7) → Y[N,7]:
    the first one's label (as a float), then the three's two probability columns."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    nodes = []
    for post in ("NONE", "LOGISTIC", "SOFTMAX"):
        nodes.append(
            helper.make_node(
                "LinearClassifier", ["X"], [f"l_{post}", f"p_{post}"], domain="ai.onnx.ml",
                coefficients=[0.5, -1.0, 0.25, 2.0], intercepts=[0.1], classlabels_ints=[3, 7],
                post_transform=post,
            )
        )
    nodes += [
        helper.make_node("Cast", ["l_NONE"], ["lf"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["lf", "col"], ["lr"]),
        helper.make_node("Concat", ["lr", "p_NONE", "p_LOGISTIC", "p_SOFTMAX"], ["Y"], axis=1),
    ]
    col = numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "col")
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 7])
    graph = helper.make_graph(nodes, "linear_bin", [x], [y], [col])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8
    )


def hand_made_trees():
    from onnx import TensorProto, helper

    # (node id, feature, mode, threshold, true id, false id, missing tracks true); leaves: mode LEAF.
    tree0 = [
        (0, 0, "BRANCH_LEQ", 0.5, 1, 2, 1),
        (1, 1, "BRANCH_LT", 1.0, 3, 4, 0),
        (2, 2, "BRANCH_GTE", -1.0, 5, 6, 0),
        (3, 0, "LEAF", 0, 0, 0, 0),
        (4, 0, "LEAF", 0, 0, 0, 0),
        (5, 3, "BRANCH_GT", 2.0, 7, 8, 1),
        (6, 0, "LEAF", 0, 0, 0, 0),
        (7, 0, "LEAF", 0, 0, 0, 0),
        (8, 4, "BRANCH_EQ", 3.0, 9, 10, 0),
        (9, 0, "LEAF", 0, 0, 0, 0),
        (10, 5, "BRANCH_NEQ", 0.0, 11, 12, 1),
        (11, 0, "LEAF", 0, 0, 0, 0),
        (12, 0, "LEAF", 0, 0, 0, 0),
    ]
    tree1 = [(0, 1, "BRANCH_LEQ", 0.0, 1, 2, 0), (1, 0, "LEAF", 0, 0, 0, 0), (2, 0, "LEAF", 0, 0, 0, 0)]
    trees = [tree0, tree1]
    nodes = {
        "nodes_treeids": [t for t, tree in enumerate(trees) for _ in tree],
        "nodes_nodeids": [n[0] for tree in trees for n in tree],
        "nodes_featureids": [n[1] for tree in trees for n in tree],
        "nodes_modes": [n[2] for tree in trees for n in tree],
        "nodes_values": [float(n[3]) for tree in trees for n in tree],
        "nodes_truenodeids": [n[4] for tree in trees for n in tree],
        "nodes_falsenodeids": [n[5] for tree in trees for n in tree],
        "nodes_missing_value_tracks_true": [n[6] for tree in trees for n in tree],
    }
    leaves = [(t, n[0]) for t, tree in enumerate(trees) for n in tree if n[2] == "LEAF"]

    def model(op, outputs, **attrs):
        node = helper.make_node(op, ["X"], [o.name for o in outputs], domain="ai.onnx.ml", **nodes, **attrs)
        x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 6])
        graph = helper.make_graph([node], op, [x], outputs)
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8
        )

    def reg(targets, **attrs):
        ids, nids, tids, ws = [], [], [], []
        for k, (t, n) in enumerate(leaves):
            for j in range(targets):
                tids.append(t), nids.append(n), ids.append(j), ws.append((k + 1) * (1.5 if j else -0.75))
        y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, targets])
        return model(
            "TreeEnsembleRegressor", [y], n_targets=targets, target_ids=ids, target_nodeids=nids,
            target_treeids=tids, target_weights=ws, **attrs,
        )

    label = helper.make_tensor_value_info("label", TensorProto.INT64, [None])
    proba = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])
    return {
        "trees_avg2": reg(2, aggregate_function="AVERAGE", base_values=[0.5, -1.0]),
        "trees_max": reg(1, aggregate_function="MAX", base_values=[0.25]),
        "trees_bin_clf": model(
            "TreeEnsembleClassifier", [label, proba], classlabels_int64s=[0, 1],
            class_ids=[0] * len(leaves), class_nodeids=[n for _, n in leaves],
            class_treeids=[t for t, _ in leaves], class_weights=[0.05 * (k + 1) for k in range(len(leaves))],
        ),
    }


if __name__ == "__main__":
    ensure_venv()
    if sys.argv[1:] == ["--extremes"]:
        write_extremes()
    else:
        main()
