# call 7 (carries nothing): 1-row and 8-row requests at c64 and c256 over HTTP, onnxaccel's layout variants (label:
# serve arguments; "default" is the layout serve picks), each cell with the machine's busy cores, perf_analyzer's
# and the server's, the rows per batch and the mean phase times of a batch.
[ -e /tmp/triton/bin/tritonserver ] || { echo "call 7 needs calls 1-6 on this machine"; return 1; }
source benchmarks/issue37_gpu/setup6.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=/tmp/pa/lib
for V in ${VARIANTS:-default i2:--workers=8,--shared-models,--instances=2 i3:--workers=8,--shared-models,--instances=3}; do
  ARGS=$(echo "${V#*:}" | tr ',' ' '); [ "$V" = default ] && ARGS=""
  timeout 170 python3 $SVT --servers onnxaccel --serve-instances auto --serve-args "$ARGS" --concurrency 64,256 \
    --rows 1,8 --warmup-s 6 --generators perf_analyzer --out $OUT/http-${V%%:*}.json 2>&1 | grep "^onnxaccel\|in-process"
done
