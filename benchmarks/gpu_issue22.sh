#!/usr/bin/env bash
# Issue 22 items 1-3 on the H200 in one device call (docs/SCALE.md "Pipelined batch"): bench's tuned model-only
# ResNet-50 FP16 throughput at batch 64 and 256; `batch` from uint8 .npy shards (goal >= 85% of bench) and from
# 10,000 JPEGs re-encoded from scikit-image's sample photographs (goal >= 60%), both with --embed-preprocess
# imagenet and the stage breakdown; CPU decode pool vs nvJPEG (torchvision, where the image has it).
# Run by the lead with SRC=<snapshot>/src; results land in $OUT. TINY=1 runs the CPU proof (squeezenet, 200 JPEGs).
set -uo pipefail
RES=${OUT:-/tmp}
if [ -z "${TINY:-}" ]; then
  source .ortgpu5/install.sh >/dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  bash benchmarks/gpu_session.sh setup > "$RES/setup.log" 2>&1
  export PYTHONPATH=${SRC:-$PWD/src}:/tmp/ortgpu-site:/tmp/site
  PY=python3
  TARGET=${TARGET:-'cuda/fp16?prefer_nhwc=1&enable_cuda_graph=1'}
  timeout 560 $PY benchmarks/gpu_issue22_batch.py --model zoo:resnet50 --target "$TARGET" --batches 64,256 \
    --jpegs 10000 --npy-rows 20480 --work /tmp/i22 --out "$RES/issue22_batch.json" --timeout 200
else
  export PYTHONPATH=${SRC:-$PWD/src}
  PY=${PY:-.venv/bin/python}
  $PY benchmarks/gpu_issue22_batch.py --tiny --work "${WORK:-/tmp/i22-tiny}" --out "$RES/issue22_batch_tiny.json"
fi
echo "rc=$?"
