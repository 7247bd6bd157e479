#!/usr/bin/env bash
# Memory and threads across model swaps (issue 24 §4): `fanout serve` with one model whose file
# is replaced N times (write a hidden file, rename it over; alternating two compatible models),
# each swap waited for in /__fanout/status and followed by requests. Prints RSS and threads after
# the warm-up swaps and at the end. Needs a release build.
#
#   bench/models/swaps.sh [SWAPS] [WARMUP]     # default: 1000 100
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${FANOUT_BIN:-$root/target/release/fanout}
swaps=${1:-1000}; warm=${2:-100}
work=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/models"
a="$root/crates/fanout-model/testdata/gbdt_bin.onnx"; b="$root/crates/fanout-model/testdata/logreg_bin.onnx"
cp "$a" "$work/models/m.onnx"
cat > "$work/fanout.yaml" <<YAML
listen: 127.0.0.1:18490
admin: { listen: 127.0.0.1:18491 }
models: { dir: $work/models, settle: 0ms, poll: 50ms }
routes:
  - path: /score
    method: POST
    flow:
      s: { model: { name: m, input: '\$request.body.f' } }
    respond: { body: '\$s' }
YAML
"$bin" serve "$work/fanout.yaml" >"$work/log" 2>&1 & pid=$!
for _ in $(seq 100); do curl -sf localhost:18491/healthz >/dev/null && break; sleep 0.1; done
body='{"f": [0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9]}'
loads() { curl -s localhost:18491/__fanout/status | python3 -c "import json,sys;print(json.load(sys.stdin)['models']['m']['loads'])"; }
rss() { awk '/VmRSS/{print $2}' /proc/$pid/status; }
threads() { ls /proc/$pid/task | wc -l; }
for i in $(seq 1 "$swaps"); do
  if (( i % 2 )); then src=$b; else src=$a; fi
  cp "$src" "$work/models/.m.onnx.tmp"; mv "$work/models/.m.onnx.tmp" "$work/models/m.onnx"
  until [ "$(loads)" -ge $((i + 1)) ]; do :; done
  for _ in 1 2 3; do curl -sf -d "$body" localhost:18490/score >/dev/null; done
  if [ "$i" -eq "$warm" ]; then r0=$(rss); t0=$(threads); echo "after $warm swaps: RSS ${r0} kB, threads $t0"; fi
done
r1=$(rss); t1=$(threads)
echo "after $swaps swaps: RSS ${r1} kB, threads $t1"
python3 -c "print('RSS growth after warm-up: %.1f %%' % (100.0*($r1-$r0)/$r0))"
curl -s localhost:18491/__fanout/status | python3 -c "import json,sys;m=json.load(sys.stdin)['models']['m'];print('loads', m['loads'], 'load_failures', m['load_failures'], 'failed rows', m['failed'])"
