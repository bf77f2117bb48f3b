# call 7 (carries .spy): where the CPU goes at rows 1 c256; onnxaccel worker-count variants at rows 1; then the gRPC grid, both servers
source benchmarks/gpu_setup.sh; export LD_LIBRARY_PATH=/tmp/pa/lib
M=$(ls /tmp/s/zoo-cache/runtime-models/resnet50-*-fp16-v2-cuda.onnx | head -1)
source benchmarks/issue37_gpu/profile_serve.sh
for W in 12 16; do
timeout 100 python3 benchmarks/serve_vs_triton.py --model $M --name resnet50 --kind gpu --target "cuda:0?enable_cuda_graph=1" --servers onnxaccel --serve-instances auto --serve-args "--workers $W --shared-models --instances 4" --max-batch 64 --delay-us 2000 --concurrency 64,256 --rows 1 --interval-ms 1000 --warmup-s 8 --generators perf_analyzer --perf-analyzer /tmp/pa/perf_analyzer --out $OUT/var-w$W.json 2>&1 | grep -v "^WARNING" | grep "^onnxaccel\|in-process"
done
timeout 330 python3 benchmarks/serve_vs_triton.py --model $M --name resnet50 --kind gpu --target "cuda:0?enable_cuda_graph=1" --serve-instances auto --instances 4 --max-batch 64 --delay-us 2000 --concurrency 1,16,64,256 --rows 1,8 --interval-ms 1000 --warmup-s 16 --generators perf_analyzer_grpc --triton /tmp/triton/bin/tritonserver --perf-analyzer /tmp/pa/perf_analyzer --triton-config 'parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }' --out $OUT/svt-grpc.json 2>&1 | grep -v "^WARNING" | tail -14
