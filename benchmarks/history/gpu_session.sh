#!/usr/bin/env bash
# The GPU figures of issues 4-7 in few device calls (docs/BENCHMARKS.md). Run from the repo root on the GPU
# machine after onnxruntime-gpu is installed (../shared/device/ort-gpu-prepare); wheels the image lacks
# travel in .servewheels and .whl. Usage: benchmarks/history/gpu_session.sh STAGE... ; results go to $OUT.
set -uo pipefail
PACK=${OUT:-/tmp}/results-$(date +%H%M%S).tgz
OUT=/tmp/gpu-out
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/serve-site:/tmp/ortgpu-site${PYTHONPATH:+:$PYTHONPATH}
export ONNXACCEL_CACHE_DIR=${ONNXACCEL_CACHE_DIR:-/tmp/oa-cache} PYTHONUNBUFFERED=1
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case $stage in
    setup)
      [ -d /tmp/serve-site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl ;;
    optimize)
      timeout 240 python3 benchmarks/optimize_precisions.py --target cuda --batch 8 --runs 50 \
        --models zoo:squeezenet,zoo:resnet50,zoo:bert-base --out "$OUT/optimize" > "$OUT/optimize.md" 2> "$OUT/optimize.err"
      echo "rc=$?"; tail -20 "$OUT/optimize.md"
      python3 -m onnxaccel.cli.main cache warm zoo:resnet50 -t cuda --json > "$OUT/cache_warm1.json" 2>&1
      python3 -m onnxaccel.cli.main cache warm zoo:resnet50 -t cuda --json > "$OUT/cache_warm2.json" 2>&1
      tail -c 600 "$OUT/cache_warm2.json" ;;
    hfbert)
      timeout 200 python3 benchmarks/history/gpu_hf_bert_placement.py /tmp/hf-bert > "$OUT/hf_bert.json" 2> "$OUT/hf_bert.err"
      echo "rc=$?"; head -c 2500 "$OUT/hf_bert.json" ;;
    tune)
      python3 benchmarks/tune_vs_plain.py "$OUT/tune" > "$OUT/tune.md" 2> "$OUT/tune.err"
      echo "rc=$?"; tail -15 "$OUT/tune.md" ;;
    serve)
      timeout 280 python3 benchmarks/serve_throughput.py --model zoo:resnet50 --target cuda:0 --precision fp16 \
        --batch 64 --concurrency 64 --duration 30 --soak 60 --json "$OUT/serve_b1.json" > "$OUT/serve_b1.log" 2>&1
      echo "rc=$?"; tail -12 "$OUT/serve_b1.log"
      timeout 200 python3 benchmarks/serve_throughput.py --model zoo:resnet50 --target cuda:0 --precision fp16 \
        --batch 64 --request-batch 8 --concurrency 64 --duration 30 --json "$OUT/serve_b8.json" > "$OUT/serve_b8.log" 2>&1
      echo "rc=$?"; tail -12 "$OUT/serve_b8.log" ;;
    tune-b1)  # issue 6, session 2: ResNet-50 batch 1 with the new stages (fusion, TunableOp, instances)
      timeout ${TUNE_TIMEOUT:-470} python3 benchmarks/tune_vs_plain.py "$OUT/tune_b1" --cases resnet50-b1 \
        --tune-budget ${TUNE_BUDGET:-120} --rounds ${TUNE_ROUNDS:-3} --duration 2 --deadline ${TUNE_DEADLINE:-330} \
        > "$OUT/tune_b1.md" 2> "$OUT/tune_b1.err"
      echo "rc=$?"; tail -8 "$OUT/tune_b1.md"; grep -E "instances|fusion|TunableOp|tuned" "$OUT/tune_b1.err" | tail -12 ;;
    tune-rest)
      timeout 560 python3 benchmarks/tune_vs_plain.py "$OUT/tune_rest" --cases resnet50-b256,bert-base-s128-b32 \
        --tune-budget 100 --rounds 2 --duration 1.5 --deadline 400 > "$OUT/tune_rest.md" 2> "$OUT/tune_rest.err"
      echo "rc=$?"; tail -6 "$OUT/tune_rest.md" ;;
    serve-workers)  # issue 7: serve --workers N against in-process at batch 64 (SERVE_PROTOCOL http|grpc)
      export PATH=/tmp/serve-site/bin:$PATH
      name=serve_workers_${SERVE_PROTOCOL:-http}${SERVE_TAG:-}
      timeout ${SERVE_TIMEOUT:-500} python3 benchmarks/serve_throughput.py --model zoo:resnet50 --target cuda:0 --precision fp16 \
        --batch 64 --concurrency 64 --duration ${SERVE_SECONDS:-15} --warmup 5 --inprocess-duration 8 \
        ${SERVER_TARGET:+--server-target "$SERVER_TARGET"} \
        --server-workers "${SERVER_WORKERS:-1,4,8}" --protocol ${SERVE_PROTOCOL:-http} --serve-args "${SERVE_ARGS:-}" \
        --request-batch ${REQUEST_BATCH:-1} --delay-ms ${SERVE_DELAY_MS:-2} \
        --py-spy ${PY_SPY_SECONDS:-8} ${SERVE_SOAK:+--soak $SERVE_SOAK} --workers 6 --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
      echo "rc=$?"; tail -${SERVE_TAIL:-80} "$OUT/$name.log" | cut -c1-3000
      mkdir -p "$OUT/$name-server-logs"; cp /tmp/serve_throughput_*.log "$OUT/$name-server-logs/" 2>/dev/null
      grep -h -m3 -i "failed\|error" /tmp/serve_throughput_*.log | cut -c1-400 ;;
    graph-check)  # issue 7: served ResNet-50 with CUDA graphs answers like a plain in-process session
      export PATH=/tmp/serve-site/bin:$PATH
      timeout 300 python3 benchmarks/serve_graph_check.py > "$OUT/serve_graph_check.json" 2> "$OUT/serve_graph_check.err"
      echo "rc=$?"; cat "$OUT/serve_graph_check.json"; tail -5 "$OUT/serve_graph_check.err" ;;
    ray-batch)  # issue 9: batch in-process vs Ray Data (1 GPU), and serve --ray (1 replica)
      timeout ${BATCH_TIMEOUT:-420} python3 benchmarks/batch_throughput.py --target cuda/fp16 --model zoo:resnet50 \
        --gpus 1 --seconds ${BATCH_SECONDS:-40} --workdir /tmp/bt --json "$OUT/batch_h200.json" > "$OUT/batch_h200.log" 2>&1
      echo "rc=$?"; tail -15 "$OUT/batch_h200.log" ;;
    probe)  # why served runs are slower than in-process ones (benchmarks/history/serve_session_probe.py)
      timeout 200 python3 benchmarks/history/serve_session_probe.py > "$OUT/serve_probe.json" 2> "$OUT/serve_probe.err"
      echo "rc=$?"; cat "$OUT/serve_probe.json"; tail -3 "$OUT/serve_probe.err" ;;
    pack)
      tar czf "$PACK" -C "$OUT" --exclude='*.tgz' . && ls -la "$PACK" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
