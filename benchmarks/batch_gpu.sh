#!/usr/bin/env bash
# How close does `batch` come to the model alone (`bench`), from uint8 .npy shards and from JPEG photographs?
# On the GPU machine, from the repository root (parts carried as benchmarks/gpu_setup.sh says):
#     bash benchmarks/batch_gpu.sh
# = benchmarks/batch_vs_bench.py with the current figures' settings (docs/BENCHMARKS.md "Batch"): ResNet-50 FP16,
# TARGET 'cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1', BATCHES 64,256, 20,480 .npy rows, 10,000
# JPEGs, the automatic decoder, CHECK=200 JPEGs against the CPU target first. JPEGS=50000 WORK=/tmp/oa-batch-50k for
# the long run; TINY=1 proves it on a CPU (squeezenet, 200 JPEGs). JSON in ${OUT:-/tmp}/batch_vs_bench.json.
set -euo pipefail
RES=${OUT:-/tmp}
if [ -n "${TINY:-}" ]; then
  PYTHONPATH=${SRC:-$PWD/src} ${PY:-python3} benchmarks/batch_vs_bench.py --tiny --work "${WORK:-/tmp/oa-batch-tiny}" \
    --out "$RES/batch_vs_bench_tiny.json"
  exit
fi
source benchmarks/gpu_setup.sh
TARGET=${TARGET:-'cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1'}
timeout ${BATCH_TIMEOUT:-560} python3 benchmarks/batch_vs_bench.py --model zoo:resnet50 --target "$TARGET" \
  --batches ${BATCHES:-64,256} --jpeg-decoders ${DECODERS:-auto} --variants ${VARIANTS:-new} \
  --npy-variants ${NPY_VARIANTS:-new} --jpegs ${JPEGS:-10000} --npy-rows ${NPY_ROWS:-20480} --check ${CHECK:-200} \
  --work ${WORK:-/tmp/oa-batch} --out "$RES/batch_vs_bench${TAG:+_$TAG}.json" --timeout ${RUN_TIMEOUT:-200} 2>&1 \
  | grep -v '^ '
