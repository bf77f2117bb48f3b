#!/usr/bin/env bash
# Issue 22's H200 must-shows, one stage per device call (docs/BENCHMARKS.md "Issue 22"). Run from the repo root on
# the GPU machine after onnxruntime-gpu is installed (../shared/device/ort-gpu-prepare); SRC=<snapshot>/src.
#   batch: bench's tuned model-only ResNet-50 FP16 at batch 64 and 256; first the GPU's padded batches checked
#          against the CPU on 200 JPEGs; `batch` from uint8 .npy shards (goal >= 85% of bench) and from 10,000
#          JPEGs re-encoded from scikit-image's photographs (goal >= 60%), embedded preprocessing, stage breakdown;
#          CPU decode pool vs nvJPEG (torchvision). VARIANTS=new,old runs each batch job also with issue 22's
#          third-session changes undone (batch_vs_bench.py VARIANTS), side by side.
#   serve: `serve` with no layout flag against in-process (numpy and IO binding) at batch 64, concurrency 64, then
#          the same server given --preprocess imagenet (embedded on the GPU) sent JPEG files: images/s and p99.
# Results land in $OUT. TINY=1 runs the CPU proof of the batch stage (squeezenet, 200 JPEGs).
set -uo pipefail
RES=${OUT:-/tmp}
STAGE=${1:-batch}
if [ -n "${TINY:-}" ]; then
  export PYTHONPATH=${SRC:-$PWD/src}
  ${PY:-.venv/bin/python} benchmarks/batch_vs_bench.py --tiny --work "${WORK:-/tmp/i22-tiny}" \
    --out "$RES/issue22_batch_tiny.json"
  echo "rc=$?"; exit 0
fi
source .ortgpu5/install.sh >/dev/null 2>&1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
# nvImageCodec and nvJPEG's wheel (optional, carried in .nvimg): into the image's own site-packages, beside its other
# nvidia-* packages (a --target folder's nvidia/__init__.py would hide them).
if [ -d .nvimg ] && ! python3 -c 'import nvidia.nvimgcodec' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .nvimg/*.whl 2>&1 | tail -2
fi
# DALI (optional; parts carried in .dali1-4, copied to /tmp/daliparts by earlier calls, dependencies in .dalideps).
if [ -d /tmp/daliparts ] && [ -d .dalideps ] && ! python3 -c 'import nvidia.dali' 2>/dev/null; then
  bash benchmarks/dali_wheels.sh install
fi
[ "$STAGE" = quick ] || bash benchmarks/history/gpu_session.sh setup > "$RES/setup-$STAGE.log" 2>&1
export PYTHONPATH=${SRC:-$PWD/src}:/tmp/serve-site:/tmp/ortgpu-site:/tmp/site PATH=/tmp/serve-site/bin:$PATH
export ONNXACCEL_CACHE_DIR=${ONNXACCEL_CACHE_DIR:-/tmp/oa-cache} PYTHONUNBUFFERED=1
TARGET=${TARGET:-'cuda/fp16?prefer_nhwc=1&enable_cuda_graph=1'}
case $STAGE in
  batch)
    timeout ${BATCH_TIMEOUT:-560} python3 benchmarks/batch_vs_bench.py --model zoo:resnet50 --target "$TARGET" \
      --batches ${BATCHES:-64,256} --jpeg-decoders ${DECODERS-hybrid,nvjpeg} --variants ${VARIANTS:-new} \
      --npy-variants ${NPY_VARIANTS:-${VARIANTS:-new}} --jpegs ${JPEGS:-10000} --npy-rows ${NPY_ROWS:-20480} --check ${CHECK:-200} --work ${WORK_DIR:-/tmp/i22} \
      --out "$RES/issue22_batch${BATCH_TAG:+_$BATCH_TAG}.json" --timeout ${RUN_TIMEOUT:-200} 2>&1 | grep -v '^ ' | tail -40
    echo "rc=$?" ;;
  quick)  # a short lease: JPEGs only, nvJPEG in the job's process against its own process, outputs compared
    timeout ${BATCH_TIMEOUT:-150} python3 benchmarks/batch_vs_bench.py --model zoo:resnet50 --target "$TARGET" \
      --batches ${BATCHES:-64} --jpeg-decoders nvjpeg --variants ${VARIANTS:-inproc,nvproc} --npy-variants none \
      --npy-rows 0 --jpegs ${JPEGS:-4000} --quick --work /tmp/i22 --out "$RES/issue22_quick.json" --timeout 120 \
      2>&1 | grep -v '^ ' | tail -8
    echo "rc=$?" ;;
  probe)  # where nvJPEG's in-job slowdown comes from: its process's phases beside a light GPU model and a CPU one
    for spec in ${PROBE_SPECS:-"zoo:squeezenet|$TARGET" "zoo:squeezenet|cpu" "zoo:resnet50|$TARGET"}; do
      model=${spec%%|*}; target=${spec#*|}
      timeout 200 python3 -m onnxaccel.cli.main batch "$model" --input /tmp/i22/jpegs --output /tmp/i22/probe \
        --target "$target" --batch 64 --embed-preprocess imagenet --decoder nvjpeg --overwrite --json \
        > "$RES/probe.json" 2> "$RES/probe.err"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['stages']; print(sys.argv[2], sys.argv[3], \
round(d['rows_per_s']), 'rows/s;', s['bottleneck'], '|', ' | '.join(s['notes']))" "$RES/probe.json" "$model" "$target" \
        || tail -5 "$RES/probe.err"
    done ;;
  diag)  # the JPEG job with a light model (squeezenet) and ResNet-50, each nvJPEG library (where the decoder's rate
    # goes inside the job: the model's GPU work or the job's own threads), then A/B VARIANTS at batch 64 (with bench;
    # the trace* variants write a CUPTI summary, benchmarks/history/i22_trace.py)
    [ -d /tmp/i22/jpegs ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import batch_vs_bench as g; from pathlib import Path; g.make_jpegs(Path('/tmp/i22/jpegs'), 10000)"
    for lib in ${DIAG_LIBS-nvimgcodec torchvision}; do for model in ${DIAG_MODELS:-zoo:squeezenet zoo:resnet50}; do
      ONNXACCEL_NVJPEG_LIBRARY=$lib timeout 200 python3 -m onnxaccel.cli.main batch "$model" --input /tmp/i22/jpegs \
        --output /tmp/i22/diag --target "$TARGET" --batch 64 --embed-preprocess imagenet --decoder nvjpeg --overwrite \
        --json > "$RES/diag_${lib}_${model#zoo:}.json" 2> "$RES/diag.err"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['stages']; print(sys.argv[2], sys.argv[3], \
round(d['rows_per_s']), 'rows/s;', s['bottleneck'], '|', ' | '.join(s['notes']))" "$RES/diag_${lib}_${model#zoo:}.json" \
        "$lib" "$model" || tail -5 "$RES/diag.err"
    done; done
    [ -n "${VARIANTS:-}" ] && timeout ${BATCH_TIMEOUT:-420} python3 benchmarks/batch_vs_bench.py --model zoo:resnet50 \
      --target "$TARGET" --batches ${BATCHES:-64} --jpeg-decoders nvjpeg --variants "$VARIANTS" --npy-variants none \
      --npy-rows 0 --jpegs 10000 --work /tmp/i22 --out "$RES/issue22_diag_${DIAG_TAG:-variants}.json" --timeout 120 \
      ${QUICK:+--quick} 2>&1 | grep -v '^ ' | tail -12
    echo "rc=$?" ;;
  pixels)  # each GPU decoder's pixels against Pillow's (benchmarks/decode_pixels.py), on the batch stage's JPEGs
    [ -d /tmp/i22/jpegs ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import batch_vs_bench as g; from pathlib import Path; g.make_jpegs(Path('/tmp/i22/jpegs'), 10000)"
    timeout ${PIXELS_TIMEOUT:-200} python3 benchmarks/decode_pixels.py --jpegs /tmp/i22/jpegs --count ${PIXELS:-200} \
      --out "$RES/issue22_pixels.json" 2>&1 | grep -v "^ " | tail -14
    echo "rc=$?" ;;
  nvjpeg)  # the decoder alone: in this process, in the pipeline's spawned process, and beside a busy GPU
    [ -d /tmp/i22/jpegs ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import batch_vs_bench as g; from pathlib import Path; g.make_jpegs(Path('/tmp/i22/jpegs'), 10000)"
    timeout ${PROBE_TIMEOUT:-300} python3 benchmarks/history/nvjpeg_probe.py --target "$TARGET" --out "$RES/nvjpeg_probe.json" 2>&1 | tail -12
    echo "rc=$?" ;;
  backends)  # nvImageCodec's backends, threads and stream priority: the decoder alone and beside a model
    # (nvjpeg_backends_probe.py, torch only), then inside `batch` at batch 64 (JPEGs only, one run per variant)
    [ -d /tmp/i22/jpegs ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import batch_vs_bench as g; from pathlib import Path; g.make_jpegs(Path('/tmp/i22/jpegs'), 10000)"
    PYNVIMGCODEC_VERBOSITY=4 timeout 60 python3 -c "import nvidia.nvimgcodec as n; n.Decoder(backends=[n.Backend(n.BackendKind.HW_GPU_ONLY)])" 2>&1 \
      | grep -iE "hw decoder|hardware|engines" | head -5
    [ "${PROBE_CONFIGS:-}" = none ] || timeout ${PROBE_TIMEOUT:-240} python3 benchmarks/history/nvjpeg_backends_probe.py ${PROBE_CONFIGS:+--configs $PROBE_CONFIGS} \
      --out "$RES/nvjpeg_backends.json" 2>&1 | grep -v "^ " | tail -14
    [ -n "${VARIANTS:-}" ] && timeout ${BATCH_TIMEOUT:-300} python3 benchmarks/batch_vs_bench.py --model zoo:resnet50 \
      --target "$TARGET" --batches ${BATCHES:-64} --jpeg-decoders nvjpeg --variants "$VARIANTS" --npy-variants none \
      --npy-rows 0 --jpegs ${JPEGS:-10000} --work /tmp/i22 --out "$RES/issue22_backends.json" --timeout 120 \
      2>&1 | grep -v '^ ' | tail -12
    echo "rc=$?" ;;
  serve)
    if [ ! -d /tmp/i22/jpegs-1k ]; then  # 1,000 of the batch stage's JPEGs (made here if that stage did not run)
      python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import batch_vs_bench as g; from pathlib import Path; g.make_jpegs(Path('/tmp/i22/jpegs'), 10000)"
      mkdir -p /tmp/i22/jpegs-1k && ls /tmp/i22/jpegs | head -1000 | while read f; do ln -s /tmp/i22/jpegs/$f /tmp/i22/jpegs-1k/$f; done
    fi
    timeout ${SERVE_TIMEOUT:-560} python3 benchmarks/serve_throughput.py --model zoo:resnet50 --target cuda:0 \
      --precision fp16 --batch 64 --concurrency 64 --duration ${SERVE_SECONDS:-15} --warmup 5 --inprocess-duration 8 \
      --server-workers "${SERVER_SPECS:-default}" --images /tmp/i22/jpegs-1k --workers 6 \
      --json "$RES/issue22_serve.json" > "$RES/issue22_serve.log" 2>&1
    echo "rc=$?"; tail -40 "$RES/issue22_serve.log" | cut -c1-600
    mkdir -p "$RES/serve-logs"; tail -c 3000 /tmp/serve_throughput_*.log > "$RES/serve-logs/tails.txt" 2>/dev/null ;;
esac
