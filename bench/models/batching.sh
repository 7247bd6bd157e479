#!/usr/bin/env bash
# The batching gain of model steps (issue 24 §2): one route running 10 models of 20 features in
# parallel (the committed test models), served with batching (models.batch.max_batch: 64, the
# default) and without (max_batch: 1), at several open-model rates. Prints, per (rate, variant):
# the achieved rate, p50/p99 from the intended send time, errors, and the gateway's CPU-µs per
# request and mean batch from /__fanout/status. Needs a release build (cargo build --release).
#
#   bench/models/batching.sh [RATES...]     # default: 1000 2000 4000 6000
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${FANOUT_BIN:-$root/target/release/fanout}
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(1000 2000 4000 6000)
dur=${DURATION:-10s}
work=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/models"
models=(logreg logreg_bin mlp gbdt_clf gbdt_bin rf_clf gbdt_reg rf_reg linreg)
for m in "${models[@]}"; do cp "$root/crates/fanout-model/testdata/$m.onnx" "$work/models/"; done
cp "$root/crates/fanout-model/testdata/logreg_bin.onnx" "$work/models/logreg_bin2.onnx"
models+=(logreg_bin2)
row=$(python3 -c "import json;print(json.dumps(json.load(open('$root/crates/fanout-model/testdata/gbdt_bin.ref.json'))['inputs'][0]))")
for variant in batched:64 unbatched:1; do
  name=${variant%%:*}; mb=${variant##*:}
  {
    echo "listen: 127.0.0.1:18480"
    echo "admin: { listen: 127.0.0.1:18481 }"
    echo "models: { dir: $work/models, batch: { max_batch: $mb } }"
    echo "routes:"
    echo "  - path: /check"
    echo "    method: POST"
    echo "    coalesce: false   # every request evaluated (identical bodies would share a run)"
    echo "    flow:"
    for m in "${models[@]}"; do echo "      $m: { model: { name: $m, input: '\$request.body.f' } }"; done
    echo "    respond: { body: '{n: 10}' }"
  } > "$work/$name.yaml"
done
cpu_of() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
printf "%-6s %-10s %9s %8s %8s %7s %10s %10s\n" rate variant achieved p50_ms p99_ms errors cpu_us/req mean_batch
for rate in "${rates[@]}"; do
  for name in batched unbatched; do
    "$bin" serve "$work/$name.yaml" >"$work/$name.log" 2>&1 & pid=$!
    for _ in $(seq 100); do curl -sf localhost:18481/healthz >/dev/null && break; sleep 0.1; done
    "$bin" load -X POST -d "{\"f\": $row}" -s "const(200,2s)" http://127.0.0.1:18480/check >/dev/null 2>&1
    c0=$(cpu_of $pid)
    "$bin" load -X POST -d "{\"f\": $row}" -s "const($rate,$dur)" --json "$work/r.json" http://127.0.0.1:18480/check >/dev/null 2>&1 || true
    c1=$(cpu_of $pid)
    batch=$(curl -s localhost:18481/__fanout/status | python3 -c "import json,sys;m=json.load(sys.stdin)['models'];print('%.1f'%(sum(v['rows'] for v in m.values())/max(1,sum(v['batches'] for v in m.values()))))")
    python3 - "$work/r.json" "$c0" "$c1" "$hz" "$rate" "$name" "$batch" <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); c0,c1,hz=float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])
ok=r["ok"]; n=max(1, r["sent"]); lat=r["latency_ms"]
lag="" if r["valid"] else " (generator behind)"
print("%-6s %-10s %9.0f %8.2f %8.2f %7d %10.1f %10s%s" % (sys.argv[5], sys.argv[6], r["achieved_rps"], lat["p50"], lat["p99"], r["sent"]-ok, (c1-c0)/hz*1e6/n, sys.argv[7], lag))
PY
    kill $pid; wait $pid 2>/dev/null || true
  done
done
