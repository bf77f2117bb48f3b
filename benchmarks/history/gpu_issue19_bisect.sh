#!/usr/bin/env bash
# Issue 19: which commit made serve 5s4 slower on the H200? The same load generator (this tree's
# benchmarks/serve_throughput.py) drives a server run from each tree (SERVE_PYTHONPATH): c47b559 (before the
# redesign), 91808e6, e6f112b (RunnerPool), and this tree; then c47b559 and this tree once more.
# Needs .old_trees/<commit>/src (git archive <commit> src) carried with the call.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
[ -d /tmp/serve-site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl
export PATH=/tmp/serve-site/bin:$PATH ONNXACCEL_CACHE_DIR=/tmp/oa-cache PYTHONUNBUFFERED=1
RES=${OUT:-/tmp}
COMMON=/tmp/serve-site:/tmp/ortgpu-site:/tmp/site
n=0
for tree in c47b559 91808e6 e6f112b HEAD c47b559 HEAD; do
  n=$((n+1)); src=$PWD/src; [ $tree != HEAD ] && src=$PWD/.old_trees/$tree/src
  SERVE_PYTHONPATH=$src:$COMMON PYTHONPATH=$PWD/src:$COMMON timeout 110 python3 benchmarks/serve_throughput.py \
    --model zoo:resnet50 --target cuda:0 --precision fp16 --batch 64 --concurrency 64 --duration 12 --warmup 4 \
    --inprocess-duration 3 --server-target 'cuda:0?enable_cuda_graph=1' --server-workers 5s4 --protocol http \
    --request-batch 1 --delay-ms 2 --workers 6 --json "$RES/bisect_${n}_${tree}.json" > "$RES/bisect_${n}_${tree}.log" 2>&1
  echo "== $n $tree rc=$?"; grep -E "in-process|server 5s4|event loop|per batch" "$RES/bisect_${n}_${tree}.log" | head -6
done
