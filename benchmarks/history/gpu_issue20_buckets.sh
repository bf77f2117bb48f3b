#!/usr/bin/env bash
# Issue 20 item 3, "Shape buckets", on the H200 in one device call (docs/BENCHMARKS.md "Issue 20"):
#  1. bench --shape-sweep: zoo:bert-base on cuda FP16 with sequence buckets 32/64/128/256: compile (session)
#     seconds, warm-up (first run: cuDNN/cuBLAS algorithm search) seconds and latency per bucket, plus one mixed
#     length (sequence=50 through bucket 64) to show the padded cost.
#  2. serve under mixed-length load (loadtest --shape-mix sequence=20,50,100,200), the same server with
#     --shape-buckets sequence=32,64,128,256 and without (requests at their own lengths): throughput and p99
#     side by side. Needs serve --shape-buckets and loadtest --shape-mix (issue 20 item 4, helper "serve").
# Run by the lead with SRC=.snap20/src (a snapshot of the tree; see docs/BENCHMARKS.md). Results land in $OUT.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
[ -d /tmp/serve-site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl
RES=${OUT:-/tmp}
bash benchmarks/history/gpu_session.sh setup > "$RES/setup.log" 2>&1
export PATH=/tmp/serve-site/bin:$PATH ONNXACCEL_CACHE_DIR=/tmp/oa-cache PYTHONUNBUFFERED=1
export PYTHONPATH=${SRC:-$PWD/src}:/tmp/serve-site:/tmp/ortgpu-site:/tmp/site
OA="python3 -m onnxaccel.cli.main"
BUCKETS=sequence=32,64,128,256
MIX=sequence=20,50,100,200

# -- 1. bench: compile / warm / latency per bucket ------------------------------------------------------------
# SKIP_BENCH=1 runs only part 2.
if [ -z "${SKIP_BENCH:-}" ]; then
timeout 150 $OA bench zoo:bert-base -t cuda:0 -p fp16 --shape-buckets $BUCKETS --shape-sweep --warmup 20 --runs 300 \
  --json > "$RES/bucket_sweep.json" 2> "$RES/bucket_sweep.err"
echo "bench --shape-sweep rc=$?"
timeout 90 $OA bench zoo:bert-base -t cuda:0 -p fp16 --shape-buckets $BUCKETS --shape sequence=50 --warmup 20 --runs 300 \
  > "$RES/bucket_len50.txt" 2>&1
echo "bench sequence=50 via bucket rc=$?"; tail -6 "$RES/bucket_len50.txt"
# The same lengths without buckets (one session, each length its own shape): first-run cost per new length.
for L in 32 64 128 256; do
  timeout 60 $OA bench zoo:bert-base -t cuda:0 -p fp16 --shape sequence=$L --warmup 20 --runs 300 --iobinding on \
    > "$RES/plain_seq$L.txt" 2>&1
  echo "plain sequence=$L rc=$?"; tail -4 "$RES/plain_seq$L.txt"
done
python3 - "$RES/bucket_sweep.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"per-bucket sessions: {r['per_bucket_sessions']}")
for row in r["rows"]:
    lat = row["latency"]
    print(f"{row['bucket']:>14}  compile {row['compile_seconds']:7.2f} s  warm {row['warm_seconds']:7.3f} s  "
          f"p50 {lat['p50_ms']:8.3f} ms  p99 {lat['p99_ms']:8.3f} ms")
PY

fi

# -- 2. serve under mixed-length load: buckets vs none --------------------------------------------------------
wait_ready() {  # $1: port; up to 600 s (bert-base FP16, four buckets compiled and warmed at load)
  python3 - "$1" <<'PY'
import sys, time, urllib.request
for _ in range(600):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(1)
sys.exit(1)
PY
}
serve_ab() {  # $1: tag, rest: extra serve flags
  local tag=$1; shift
  local start=$(date +%s.%N)
  $OA serve zoo:bert-base -t 'cuda:0' -p fp16 --http-port 8000 --no-grpc --max-batch 8 "$@" \
    > "$RES/serve_$tag.log" 2>&1 &
  local pid=$!
  if ! wait_ready 8000; then echo "serve $tag never became ready"; tail -20 "$RES/serve_$tag.log"; kill $pid; return; fi
  echo "serve $tag ready after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  timeout 300 $OA loadtest http://127.0.0.1:8000 -m bert-base -c 16,64 -d 15 --warmup 5 --shape-mix $MIX --binary \
    --report "$RES/loadtest_$tag.json" > "$RES/loadtest_$tag.txt" 2>&1
  echo "loadtest $tag rc=$?"; tail -8 "$RES/loadtest_$tag.txt"
  grep -E "warmed|READY|ready" "$RES/serve_$tag.log" | head -5
  kill -TERM $pid; wait $pid
}
serve_ab buckets --shape-buckets $BUCKETS
serve_ab plain
python3 - "$RES" <<'PY'
import json, sys, pathlib
res = pathlib.Path(sys.argv[1])
for tag in ("buckets", "plain"):
    path = res / f"loadtest_{tag}.json"
    if not path.exists():
        print(f"{tag}: no report"); continue
    report = json.loads(path.read_text())
    for level in report.get("levels", []):
        lat = level.get("latency", {})
        lat = lat or {}
        print(f"{tag:>8} c={level['concurrency']}: {level['requests_per_s']:.1f} req/s, "
              f"p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms, errors {level['error_count']}")
PY
cp -r /tmp/gpu-out/* "$RES/" 2>/dev/null
