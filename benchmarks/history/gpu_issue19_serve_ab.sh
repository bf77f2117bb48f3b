#!/usr/bin/env bash
# Issue 19: serve 5s4 before (.old_src + .old_bench: the tree of c47b559) and after the redesign, alternating in
# one call, two rounds each (docs/BENCHMARKS.md "Issue 19").
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
[ -d /tmp/serve-site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl
export PATH=/tmp/serve-site/bin:$PATH ONNXACCEL_CACHE_DIR=/tmp/oa-cache PYTHONUNBUFFERED=1
RES=${OUT:-/tmp}
for round in 1 2; do
  for tree in old new; do
    src=$PWD/src; script=benchmarks/serve_throughput.py
    [ $tree = old ] && src=$PWD/.old_src && script=.old_bench/serve_throughput.py
    PYTHONPATH=$src:/tmp/serve-site:/tmp/ortgpu-site:/tmp/site timeout 250 python3 $script --model zoo:resnet50 \
      --target cuda:0 --precision fp16 --batch 64 --concurrency 64 --duration 12 --warmup 5 --inprocess-duration 8 \
      --server-target 'cuda:0?enable_cuda_graph=1' --server-workers 5s4 --protocol http --serve-args "" \
      --request-batch 1 --delay-ms 2 --py-spy 0 --workers 6 --json "$RES/serve_${tree}_${round}.json" \
      > "$RES/serve_${tree}_${round}.log" 2>&1
    echo "== $tree round $round rc=$?"; grep -E "in-process|server 5s4" "$RES/serve_${tree}_${round}.log"
  done
done
