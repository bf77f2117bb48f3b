#!/usr/bin/env bash
# py-spy over one JPEG `batch` job on the GPU machine, after `gpu_issue22.sh batch` (which makes /tmp/i22/jpegs
# and installs py-spy from .servewheels): the threads holding the GIL (--gil) and every thread, waiting ones too
# (--idle), as collapsed stacks per thread, to see where the in-process nvJPEG job's start-up and decode time go.
# Results in $OUT: spy-gil.txt, spy-all.txt (py-spy's raw format) and each job's --json report.
set -uo pipefail
RES=${OUT:-/tmp}
export PYTHONPATH=${SRC:-$PWD/src}:/tmp/serve-site:/tmp/ortgpu-site:/tmp/site PATH=/tmp/serve-site/bin:$PATH
export ONNXACCEL_CACHE_DIR=${ONNXACCEL_CACHE_DIR:-/tmp/oa-cache} PYTHONUNBUFFERED=1
TARGET=${TARGET:-'cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1'}
for mode in ${SPY_MODES:-gil idle}; do
  flags="--$mode"; [ "$mode" = native ] && flags="--idle --native"
  timeout ${SPY_TIMEOUT:-120} py-spy record $flags --threads -r ${SPY_RATE:-200} -f raw -o "$RES/spy-$mode.txt" -- \
    python3 -m onnxaccel.cli.main batch zoo:resnet50 --input /tmp/i22/jpegs --output /tmp/i22/spy-$mode \
    --target "$TARGET" --batch ${SPY_BATCH:-64} --embed-preprocess imagenet --decoder ${SPY_DECODER:-nvjpeg} --overwrite --json \
    > "$RES/spy-$mode.json" 2> "$RES/spy-$mode.err"
  echo "$mode rc=$? $(wc -c < "$RES/spy-$mode.txt" 2>/dev/null) bytes"; tail -3 "$RES/spy-$mode.err"
done
