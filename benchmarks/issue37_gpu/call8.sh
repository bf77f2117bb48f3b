# call 8 (carries nothing; after call 7 on the same machine, if device time is left): onnxaccel alone over gRPC
# at 8-row requests, c64 and c256, perf_analyzer's default channel sharing (6 clients per TCP connection, so c64
# opens 11 connections; SO_REUSEPORT spreads connections, not requests, over the workers): the default layout
# (8 workers) against 16 workers, and the fill queue delay.
[ -e /tmp/triton/bin/tritonserver ] || { echo "call 8 needs calls 1-6 on this machine"; return 1; }
source benchmarks/issue37_gpu/setup6.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=/tmp/pa/lib
for V in ${VARIANTS:-w16:--workers=16,--shared-models,--instances=4 fill:--queue-delay=fill}; do
  ARGS=$(echo "${V#*:}" | tr ',' ' ')
  timeout 140 python3 $SVT --servers onnxaccel --serve-instances auto --serve-args "$ARGS" \
    --concurrency ${CONC:-64,256} \
    --rows 8 --warmup-s 6 --generators perf_analyzer_grpc --out $OUT/grpc-${V%%:*}.json 2>&1 | grep "^onnxaccel\|^ *8 "
done
