#!/usr/bin/env bash
# Issue 19: batch-1 latency before (.old_src = the tree before the redesign, carried beside) and after the
# redesign, side by side in one call, alternating, three rounds (docs/BENCHMARKS.md "Issue 19").
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
RES=${OUT:-/tmp}
T='cuda/fp16?enable_cuda_graph=1&fuse_conv_bias=1&prefer_nhwc=1'
T32='cuda?enable_cuda_graph=1&fuse_conv_bias=1&prefer_nhwc=1'
for round in 1 2 3; do
  for tree in old new; do
    src=$PWD/src; [ $tree = old ] && src=$PWD/.old_src
    PYTHONPATH=$src:/tmp/site:/tmp/ortgpu-site python3 -m onnxaccel.cli.main bench zoo:resnet50 -t "$T" -t "$T32" -b 1 \
      --iobinding on --warmup 100 --runs 2000 --json > "$RES/ab_${tree}_${round}.json" 2> "$RES/ab_${tree}_${round}.err"
    python3 - "$RES/ab_${tree}_${round}.json" "$tree" "$round" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["cells"]:
    print(sys.argv[2], sys.argv[3], c["target"], round(c["latency"]["p50_ms"], 4), round(c["throughput_items_per_s"]))
PY
  done
done
