# call 6 (carries .sw2, .tri1, .tri2, .pa): setup6.sh (serve wheels, Triton, perf_analyzer), then onnxaccel alone
# over HTTP at 1-row and 8-row requests, c64 and c256, in layout variants (label:serve arguments, commas for
# spaces; "default" is the layout serve picks; "fill": the default with --queue-delay fill); each cell records the
# machine's busy cores, perf_analyzer's and the server's, the rows per batch and the mean phase times of a batch.
source benchmarks/issue37_gpu/setup6.sh
for V in ${VARIANTS:-default i2:--workers=8,--shared-models,--instances=2 i3:--workers=8,--shared-models,--instances=3 fill:--queue-delay=fill}; do
  ARGS=$(echo "${V#*:}" | tr ',' ' '); [ "$V" = default ] && ARGS=""
  timeout ${T6:-140} python3 $SVT --servers onnxaccel --serve-instances auto --serve-args="$ARGS" \
    --concurrency ${CONC:-64,256} \
    --rows ${ROWS:-1,8} --warmup-s 6 --generators perf_analyzer --out $OUT/http-${V%%:*}.json > $OUT/http-${V%%:*}.log 2>&1
  grep "^onnxaccel\|in-process" $OUT/http-${V%%:*}.log || { echo "variant $V gave no figure:"; tail -5 $OUT/http-${V%%:*}.log; }
done
