# call 6 (carries .sw2, .tri1, .tri2, .pa): the gRPC grid at 8-row requests, both servers, perf_analyzer's default
# channel sharing (6 clients per connection), then one connection per client at c64 and c256.
source benchmarks/issue37_gpu/setup6.sh
timeout 330 python3 $SVT --serve-instances auto --instances 4 --concurrency 1,16,64,256 --rows 8 --warmup-s 10 \
  --generators perf_analyzer_grpc --triton-config "$TCFG" --out $OUT/grpc.json 2>&1 | grep -v "^WARNING" | tail -14
timeout 200 python3 $SVT --serve-instances auto --instances 4 --concurrency 64,256 --rows 8 --warmup-s 6 \
  --generators perf_analyzer_grpc --grpc-channel-share 1 --triton-config "$TCFG" --out $OUT/grpc-share1.json 2>&1 \
  | grep -v "^WARNING" | tail -12
