#!/usr/bin/env bash
# How fast is `serve` with no layout flag against the same model in process (numpy and IO binding), and with JPEG
# requests? On the GPU machine, from the repository root (parts carried as benchmarks/gpu_setup.sh says):
#     bash benchmarks/serve_gpu.sh
# = benchmarks/serve_throughput.py, ResNet-50 FP16 on cuda:0, --max-batch 64, 1-image binary HTTP requests from 6
# load-generator processes at CONCURRENCY (default 64,256), SECONDS each; then the same server with --preprocess
# imagenet sent 1,000 JPEG photographs (IMAGES=0 skips it). SPECS: serve_throughput.py --server-workers (default:
# no layout flag). Results in ${OUT:-/tmp}/serve_throughput.{json,log}.
set -euo pipefail
RES=${OUT:-/tmp}
source benchmarks/gpu_setup.sh
images=()
if [ "${IMAGES:-1}" != 0 ]; then
  if [ ! -d /tmp/oa-batch/jpegs-1k ]; then  # 1,000 of batch_gpu.sh's photographs (made here if it did not run)
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import batch_vs_bench as b; from pathlib import Path; \
b.make_jpegs(Path('/tmp/oa-batch/jpegs'), 10000)"
    mkdir -p /tmp/oa-batch/jpegs-1k
    ls /tmp/oa-batch/jpegs | head -1000 | while read -r f; do ln -sf /tmp/oa-batch/jpegs/$f /tmp/oa-batch/jpegs-1k/$f; done
  fi
  images=(--images /tmp/oa-batch/jpegs-1k)
fi
timeout ${SERVE_TIMEOUT:-560} python3 benchmarks/serve_throughput.py --model zoo:resnet50 --target cuda:0 \
  --precision fp16 --batch 64 --concurrency ${CONCURRENCY:-64,256} --duration ${SECONDS_EACH:-15} --warmup 5 \
  --inprocess-duration 8 --server-workers "${SPECS:-default}" "${images[@]}" --workers 6 \
  --json "$RES/serve_throughput.json" 2>&1 | tee "$RES/serve_throughput.log"
