#!/usr/bin/env bash
# Issue 19's "same GPU figures after the redesign", in one device call (docs/BENCHMARKS.md "Issue 19"):
# bench tuned ResNet-50 at batch 1 and 256 (layout + fusion + CUDA graph + IO binding) beside the plain session,
# then serve ResNet-50 FP16 at concurrency 64 with the 5s4 layout against in-process numpy.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site:$PYTHONPATH
RES=${OUT:-/tmp}
bash benchmarks/history/gpu_session.sh setup > "$RES/setup.log" 2>&1
export PYTHONPATH=$PWD/src:/tmp/serve-site:/tmp/ortgpu-site:/tmp/site
T='cuda?fuse_conv_bias=1&prefer_nhwc=1'
python3 -m onnxaccel.cli.main bench zoo:resnet50 -t cuda -t "$T" -p fp32,fp16 -b 1 --graph both --iobinding on \
  --warmup 100 --runs 2000 --report "$RES/bench_b1.json" > "$RES/bench_b1.txt" 2>&1
echo "bench b1 rc=$?"; tail -22 "$RES/bench_b1.txt"
python3 -m onnxaccel.cli.main bench zoo:resnet50 -t cuda -t "$T" -p fp16 -b 256 --graph both --iobinding on \
  --warmup 10 --runs 60 --report "$RES/bench_b256.json" > "$RES/bench_b256.txt" 2>&1
echo "bench b256 rc=$?"; tail -14 "$RES/bench_b256.txt"
OUT=$RES SERVE_SECONDS=12 SERVE_TAG=_i19 PY_SPY_SECONDS=0 SERVER_TARGET='cuda:0?enable_cuda_graph=1' \
  SERVER_WORKERS='5s4' SERVE_TAIL=30 timeout 330 bash benchmarks/history/gpu_session.sh serve-workers
cp -r /tmp/gpu-out/* "$RES/" 2>/dev/null
