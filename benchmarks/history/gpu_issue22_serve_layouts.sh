#!/usr/bin/env bash
# Issue 22: `serve` layouts around the default one (8 decoding workers, one model process, instances, queue delay)
# with this tree, behind one load generator, at batch 64 and concurrency 64: which one comes nearest in-process IO
# binding. SPECS is serve_throughput.py's --server-workers list (e.g. "default,8s2,8s4 --max-queue-delay-ms 1").
# Run after ort-gpu-prepare's parts; results in $OUT.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
[ -d /tmp/serve-site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl
COMMON=/tmp/serve-site:/tmp/ortgpu-site:/tmp/site
export PATH=/tmp/serve-site/bin:$PATH ONNXACCEL_CACHE_DIR=/tmp/oa-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$COMMON
RES=${OUT:-/tmp}
timeout ${TIMEOUT:-560} python3 benchmarks/serve_throughput.py --model zoo:resnet50 --target "${TARGET:-cuda:0}" --precision fp16 \
  --batch 64 --concurrency 64 --duration ${SECONDS_EACH:-10} --warmup 4 --inprocess-duration 3 --protocol http \
  --request-batch 1 --workers 6 --server-target "${SERVER_TARGET:-cuda:0?enable_cuda_graph=1}" \
  --server-workers "${SPECS:-default,8s2,8s3,8s4 --max-queue-delay-ms 1,8s2 --max-queue-delay-ms 1}" \
  --json "$RES/serve_layouts.json" > "$RES/serve_layouts.log" 2>&1
echo "rc=$?"
grep -E "in-process|  server |of in-process with IO|per batch|http_workers|model_process" "$RES/serve_layouts.log" | cut -c1-330
