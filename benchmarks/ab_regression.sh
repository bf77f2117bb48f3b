#!/usr/bin/env bash
# Is the new tree slower than the old one on the GPU? The figures of docs/BENCHMARKS.md, old and new alternated in one
# lease (old, new, old, new: ROUNDS rounds), each tree chosen by PYTHONPATH=<tree>/src:
#   bench   `bench zoo:resnet50 -t 'cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1' -b 1,256 --iobinding on --graph on`
#           (the tuned model-only figure): img/s and p50 at batch 1 and 256
#   batch   `batch zoo:resnet50` over 20,480 uint8 .npy rows, the same target with enable_cuda_graph=1, batch 256:
#           rows/s steady (start-up and shutdown left out, the report's rows_per_s) and all-in (rows_per_s_wall)
#   serve   `serve zoo:resnet50 --target cuda:0 --precision fp16` with no layout flag, --max-batch 64, loaded by
#           benchmarks/serve_throughput.py (the new tree's load generator for both servers) at concurrency 64 and
#           256, 1-image binary HTTP requests: infer/s, p99, and the seconds until the server answered ready
# Usage, on the GPU machine (onnxruntime-gpu importable, or its parts carried: benchmarks/gpu_setup.sh), from the
# repository root of the NEW tree, with the OLD tree's src unpacked at OLD/src (git archive <commit> src | tar -x -C OLD):
#     bash benchmarks/ab_regression.sh OLD
# Writes ${OUT:-/tmp/ab}/ab.csv (one row per figure), ab_table.txt/ab_summary.json and every report; prints the
# table (new/old per metric, the spread within each side). Knobs: ROUNDS (2), PARTS (bench,batch,serve),
# BENCH_SECONDS (3), SERVE_SECONDS (5), NPY_ROWS (20480), NPY_BATCH (256). Each tree keeps its own compile cache
# (round 1 cold, round 2 warm, alike for both). About 7-8 minutes on an H100; any failed step stops it (exit 1).
# AB_CPU_TEST=1 runs the same flow on a CPU with a small model (the script's own check; no figure to keep):
#     AB_CPU_TEST=1 NPY_ROWS=256 bash benchmarks/ab_regression.sh OLD
set -euo pipefail
OLD=${1:?usage: bash benchmarks/ab_regression.sh OLD_TREE, where OLD_TREE/src/onnxaccel is the old src}
OLD=$(cd "$OLD" && pwd)
NEW=$PWD
RES=${OUT:-/tmp/ab}
ROUNDS=${ROUNDS:-2} PARTS=${PARTS:-bench,batch,serve}
MODEL=zoo:resnet50 T='cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1' BT='cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1'
BENCH_BATCHES=1,256 GRAPH=on SERVE_TARGET=cuda:0 SERVE_PRECISION=fp16 SERVE_BATCH=64 LEVELS=64,256 LOADERS=6
if [ -n "${AB_CPU_TEST:-}" ]; then
  MODEL=zoo:squeezenet T=cpu BT=cpu BENCH_BATCHES=1,8 GRAPH=off SERVE_TARGET=cpu SERVE_PRECISION=fp32 SERVE_BATCH=8
  LEVELS=4,8 LOADERS=1 NPY_BATCH=${NPY_BATCH:-8}
fi
DATA=${AB_DATA:-/tmp/ab-data}
fail() { echo "ab_regression: FAILED: $*" >&2; exit 1; }
[ -d "$OLD/src/onnxaccel" ] || fail "$OLD/src/onnxaccel not found (unpack the old tree's src there)"
[ -d "$NEW/src/onnxaccel" ] && [ -f "$NEW/benchmarks/serve_throughput.py" ] || fail "run from the new tree's root"
[ "$OLD" != "$NEW" ] || fail "OLD is this tree"
mkdir -p "$RES" "$DATA"
CSV=$RES/ab.csv
rm -f "$CSV"
source benchmarks/gpu_setup.sh
export PYTHONUNBUFFERED=1
began=$(date +%s)
say() { echo "[$(( $(date +%s) - began )) s] $*"; }

tree_of() { [ "$1" = old ] && echo "$OLD" || echo "$NEW"; }
# python3 -m onnxaccel where the tree has src/onnxaccel/__main__.py, else its CLI module
oa() {  # oa SIDE SECONDS ARGS...: the CLI of that side's tree, with its own compile cache, under a time limit
  local side=$1 seconds=$2 tree mod=onnxaccel.cli.main; tree=$(tree_of "$1"); shift 2
  if [ -f "$tree/src/onnxaccel/__main__.py" ]; then mod=onnxaccel; fi
  PYTHONPATH=$tree/src${OA_SITE:+:$OA_SITE} ONNXACCEL_CACHE_DIR=$DATA/cache-$side timeout "$seconds" python3 -m $mod "$@"
}

say "checks"
if [ -z "${AB_CPU_TEST:-}" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/gpu.txt" || fail "nvidia-smi"
fi
echo "cores: $(nproc)" | tee -a "$RES/gpu.txt"
for side in old new; do
  tree=$(tree_of $side)
  PYTHONPATH=$tree/src${OA_SITE:+:$OA_SITE} python3 - "$tree" "$side" "${AB_CPU_TEST:-}" <<'PY' || fail "$side tree: imports (above)"
import sys, onnxaccel, onnxruntime as ort
tree, side, cpu_test = sys.argv[1:]
assert onnxaccel.__file__.startswith(tree + "/src/"), f"onnxaccel comes from {onnxaccel.__file__}, not {tree}/src"
assert cpu_test or "CUDAExecutionProvider" in ort.get_available_providers(), f"onnxruntime {ort.__version__}: no CUDA EP"
print(f"{side}: onnxaccel {onnxaccel.__file__}, onnxruntime {ort.__version__} from {ort.__file__}")
PY
  if [ -e "$tree/.git" ]; then git -C "$tree" rev-parse --short HEAD | sed "s/^/$side commit: /" || true; fi
done
if [[ $PARTS == *serve* ]]; then
  PYTHONPATH=$NEW/src${OA_SITE:+:$OA_SITE} python3 -c "import fastapi, uvicorn, httpx" \
    || fail "serve needs fastapi, uvicorn, httpx: carry .servewheels (bash benchmarks/serve_wheels.sh here)"
fi
if [[ $PARTS == *batch* ]]; then
  say "making ${NPY_ROWS:-20480} .npy rows in $DATA/npy"
  python3 benchmarks/ab_regression.py npy "$DATA/npy" "${NPY_ROWS:-20480}" || fail "making the .npy rows"
fi

for round in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    tag=r${round}_$side
    if [[ $PARTS == *bench* ]]; then
      say "round $round $side: bench"
      oa $side 240 bench $MODEL -t "$T" -b $BENCH_BATCHES --iobinding on --graph $GRAPH --warmup 20 \
        --duration "${BENCH_SECONDS:-3}" --no-telemetry --json > "$RES/bench_$tag.json" 2> "$RES/bench_$tag.err" \
        || { tail -20 "$RES/bench_$tag.err"; fail "bench, round $round, $side"; }
      python3 benchmarks/ab_regression.py record "$CSV" $round $side bench "$RES/bench_$tag.json" \
        || fail "bench report, round $round, $side"
    fi
    if [[ $PARTS == *batch* ]]; then
      say "round $round $side: batch"
      rm -rf "$DATA/out"
      oa $side 240 batch $MODEL --input "$DATA/npy" --output "$DATA/out" --target "$BT" \
        --batch "${NPY_BATCH:-256}" --embed-preprocess imagenet --overwrite --images-per-shard 4096 --json \
        > "$RES/batch_$tag.json" 2> "$RES/batch_$tag.err" \
        || { tail -20 "$RES/batch_$tag.err"; fail "batch, round $round, $side"; }
      python3 benchmarks/ab_regression.py record "$CSV" $round $side batch "$RES/batch_$tag.json" \
        || fail "batch report, round $round, $side"
    fi
    if [[ $PARTS == *serve* ]]; then
      say "round $round $side: serve"
      tree=$(tree_of $side)
      SERVE_PYTHONPATH=$tree/src${OA_SITE:+:$OA_SITE} PYTHONPATH=$NEW/src${OA_SITE:+:$OA_SITE} \
        ONNXACCEL_CACHE_DIR=$DATA/cache-$side TMPDIR=$RES timeout 300 python3 benchmarks/serve_throughput.py \
        --model $MODEL --target $SERVE_TARGET --precision $SERVE_PRECISION --batch $SERVE_BATCH --concurrency $LEVELS \
        --duration "${SERVE_SECONDS:-5}" --warmup 2 --inprocess-duration 0 --skip-concurrency-1 \
        --server-workers default --workers $LOADERS --load-timeout 200 --json "$RES/serve_$tag.json" \
        > "$RES/serve_$tag.log" 2>&1 \
        || { tail -30 "$RES/serve_$tag.log"; tail -c 2000 "$RES"/serve_throughput_*.log 2>/dev/null; fail "serve, round $round, $side"; }
      grep -E "server default|  c=" "$RES/serve_$tag.log" | cut -c1-200 || true
      python3 benchmarks/ab_regression.py record "$CSV" $round $side serve "$RES/serve_$tag.json" \
        || fail "serve report, round $round, $side"
    fi
  done
done
say "done"
python3 benchmarks/ab_regression.py table "$CSV" --json "$RES/ab_summary.json" | tee "$RES/ab_table.txt"
