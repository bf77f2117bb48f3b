#!/usr/bin/env bash
# Issue 22: `serve` with default options, this session's start (d512acc) against this tree, alternated, behind one
# load generator (this tree's benchmarks/serve_throughput.py): a lease whose cores were slower read 4,228 infer/s
# where an earlier lease read 6,296, with no serve change between; this says whether the code or the machine moved.
# Needs .old_trees/d512acc/src (git archive d512acc src) carried with the call, after ort-gpu-prepare's parts.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
[ -d /tmp/serve-site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl
export PATH=/tmp/serve-site/bin:$PATH ONNXACCEL_CACHE_DIR=/tmp/oa-cache PYTHONUNBUFFERED=1
RES=${OUT:-/tmp}
COMMON=/tmp/serve-site:/tmp/ortgpu-site:/tmp/site
n=0
for tree in ${TREES:-d512acc HEAD d512acc HEAD}; do
  n=$((n+1)); src=$PWD/src; [ $tree != HEAD ] && src=$PWD/.old_trees/$tree/src
  SERVE_PYTHONPATH=$src:$COMMON PYTHONPATH=$PWD/src:$COMMON timeout 110 python3 benchmarks/serve_throughput.py \
    --model zoo:resnet50 --target cuda:0 --precision fp16 --batch 64 --concurrency 64 --duration 12 --warmup 4 \
    --inprocess-duration 3 --server-workers default --protocol http --request-batch 1 --workers 6 \
    --json "$RES/serve_ab_${n}_${tree}.json" > "$RES/serve_ab_${n}_${tree}.log" 2>&1
  echo "== $n $tree rc=$?"; grep -E "in-process|server default|event loop|per batch" "$RES/serve_ab_${n}_${tree}.log" | head -5
done
