#!/usr/bin/env bash
# Issue 22: the GPU's rows/s for ResNet-50 FP16 (tuned target, IO binding, graph capture) at the batch sizes a
# server forms from one-row requests, with one session and with four side by side (serve's default instances):
# what the model process could reach at most, against in-process batch 64. Run after ort-gpu-prepare's parts.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/src:/tmp/ortgpu-site:/tmp/site ONNXACCEL_CACHE_DIR=/tmp/oa-cache PYTHONUNBUFFERED=1
RES=${OUT:-/tmp}
timeout ${TIMEOUT:-270} python3 -m onnxaccel.cli.main bench zoo:resnet50 -t "${TARGET:-cuda?prefer_nhwc=1&fuse_conv_bias=1}" \
  -p fp16 --iobinding on --graph on -b ${BATCHES:-8,16,32,64} --instances ${INSTANCES:-1,4} --duration ${SECONDS_EACH:-2} \
  --no-telemetry --report "$RES/gpu_curve.json" --report "$RES/gpu_curve.md" > "$RES/gpu_curve.log" 2>&1
echo "rc=$?"; tail -30 "$RES/gpu_curve.log" | cut -c1-160
