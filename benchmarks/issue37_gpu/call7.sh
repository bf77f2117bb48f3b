# call 7 (carries nothing): 1-row requests at c64 and c256 over HTTP, onnxaccel's instance count (workers 8, shared
# model process), each cell with the machine's busy cores, perf_analyzer's and the server's, and the rows per batch.
[ -e /tmp/triton/bin/tritonserver ] || { echo "call 7 needs calls 1-6 on this machine"; return 1; }
source benchmarks/issue37_gpu/setup6.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=/tmp/pa/lib
for I in ${INSTANCES:-4 2 3}; do
  ARGS="--workers 8 --shared-models --instances $I"; [ $I = 4 ] && ARGS=""   # 4: the default layout
  timeout 170 python3 $SVT --servers onnxaccel --serve-instances auto --serve-args "$ARGS" --concurrency 64,256 \
    --rows 1,8 --warmup-s 6 --generators perf_analyzer --out $OUT/http-i$I.json 2>&1 | grep "^onnxaccel\|in-process"
done
