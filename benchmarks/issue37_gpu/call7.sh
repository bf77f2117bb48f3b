# call 7 (carries nothing; after call 6 on the same machine): the gRPC grid at 8-row requests, both servers, with
# perf_analyzer's default channel sharing (6 clients per TCP connection), then one connection per client.
[ -e /tmp/triton/bin/tritonserver ] || { echo "call 7 needs calls 1-6 on this machine"; return 1; }
source benchmarks/issue37_gpu/setup6.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=/tmp/pa/lib
timeout 330 python3 $SVT --serve-instances auto --instances 4 --concurrency 1,16,64,256 --rows 8 --warmup-s 10 \
  --generators perf_analyzer_grpc --triton-config "$TCFG" --out $OUT/grpc.json 2>&1 | grep -v "^WARNING" | tail -14
[ "${SHARE1:-1}" = 1 ] && timeout 200 python3 $SVT --serve-instances auto --instances 4 --concurrency 64,256 --rows 8 \
  --warmup-s 6 --generators perf_analyzer_grpc --grpc-channel-share 1 --triton-config "$TCFG" \
  --out $OUT/grpc-share1.json 2>&1 | grep -v "^WARNING" | tail -12
