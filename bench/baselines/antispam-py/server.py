"""The antispam-models baseline: the Mail.ru antispam service's architecture (seed 004).

A Python grpcio server (the gRPC C core, as the seed's C++ server) with its thread pool, 10
onnxruntime InferenceSessions, the same merge as fanout's config
(crates/fanout-lab/src/scenarios/antispam-models.yaml), and a background thread that reloads a
model whose file changed (a new session is built and warmed up, then swapped in by one reference
assignment; a file that fails to load keeps the old session serving).

    python server.py --listen 127.0.0.1:9500 --models DIR --stubs DIR [--workers 16]

`--stubs` is the directory holding antispam_pb2.py and antispam_pb2_grpc.py, generated from
antispam.proto with grpcio-tools (the lab does it; see README.md).
"""

import argparse
import math
import os
import sys
import threading
import time
from concurrent import futures

# (name, kind): "bin" = binary classifier, P(class 1); "multi" = 3-class classifier,
# 1 - P(class 0); "reg" = regressor, sigmoid(value / 100). The score is the mean.
MODELS = [
    ("spam_lr", "bin"),
    ("spam_gbdt", "bin"),
    ("spam_swap", "bin"),
    ("topic_lr", "multi"),
    ("topic_mlp", "multi"),
    ("topic_gbdt", "multi"),
    ("topic_rf", "multi"),
    ("score_gbdt", "reg"),
    ("score_rf", "reg"),
    ("score_lin", "reg"),
]
WIDTH = 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--stubs", required=True)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--poll", type=float, default=1.0)
    args = ap.parse_args()

    sys.path.insert(0, args.stubs)
    import grpc
    import numpy as np
    import onnxruntime as ort

    import antispam_pb2
    import antispam_pb2_grpc

    def session(path):
        opts = ort.SessionOptions()
        # One thread per session: the 16 gRPC threads are the parallelism. onnxruntime's default
        # (a pool per session as wide as the cores, spinning) would give 10 sessions × 2 spinning
        # threads on a 2-core machine.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        x = np.zeros((1, WIDTH), dtype=np.float32)
        s.run(None, {s.get_inputs()[0].name: x})  # warm-up: a file that cannot run is refused
        return s

    def stamp(path):
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    sessions = {}
    stamps = {}
    loads = {name: 0 for name, _ in MODELS}
    failures = {name: 0 for name, _ in MODELS}
    for name, _ in MODELS:
        path = os.path.join(args.models, name + ".onnx")
        stamps[name] = stamp(path)
        sessions[name] = (session(path), None)
        loads[name] += 1
    for name in sessions:
        s = sessions[name][0]
        sessions[name] = (s, s.get_inputs()[0].name)

    def watch():
        while True:
            time.sleep(args.poll)
            for name, _ in MODELS:
                path = os.path.join(args.models, name + ".onnx")
                try:
                    st = stamp(path)
                except OSError:
                    continue  # removed: keep serving
                if st == stamps[name]:
                    continue
                stamps[name] = st
                try:
                    s = session(path)
                except Exception as e:  # noqa: BLE001 - any load error keeps the old version
                    failures[name] += 1
                    print(f"reload {name} failed: {e}", flush=True)
                    continue
                sessions[name] = (s, s.get_inputs()[0].name)  # atomic reference swap
                loads[name] += 1
                print(f"reloaded {name} (loads {loads[name]})", flush=True)

    threading.Thread(target=watch, name="model-watcher", daemon=True).start()

    class Antispam(antispam_pb2_grpc.AntispamServicer):
        def Check(self, request, context):
            x = np.asarray(request.features, dtype=np.float32).reshape(1, -1)
            if x.shape[1] != WIDTH:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{WIDTH} features expected")
            scores = {}
            for name, kind in MODELS:
                s, input_name = sessions[name]  # the version serving when the call started
                out = s.run(None, {input_name: x})
                if kind == "bin":
                    p = float(out[1][0][1])
                elif kind == "multi":
                    p = 1.0 - float(out[1][0][0])
                else:
                    p = 1.0 / (1.0 + math.exp(-float(out[0][0][0]) / 100.0))
                scores[name] = p
            score = sum(scores.values()) / len(scores)
            return antispam_pb2.Verdict(spam=score > 0.5, score=score, scores=scores)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers))
    antispam_pb2_grpc.add_AntispamServicer_to_server(Antispam(), server)
    server.add_insecure_port(args.listen)
    server.start()
    print(f"antispam-py serving on {args.listen} ({args.workers} workers)", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
