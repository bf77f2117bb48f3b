# call 6: serve wheels, Triton, perf_analyzer; the HTTP grid (perf_analyzer + loadtest), both servers
mkdir -p .servewheels && cp /tmp/sw/*.whl .sw2/*.whl .sw3/*.whl .servewheels/
source benchmarks/gpu_setup.sh
mkdir -p /tmp/triton && cat .tri1/part.* .tri2/part.* | xz -d | tar -x -C /tmp/triton && chmod +x /tmp/triton/bin/*
mkdir -p /tmp/pa && xz -dc .pa/perf_analyzer.xz > /tmp/pa/perf_analyzer && chmod +x /tmp/pa/perf_analyzer && cp -r .pa/lib /tmp/pa/
python3 -c "import fastapi, uvicorn, grpc, onnxruntime as o; print(o.__version__, o.get_available_providers())"
export LD_LIBRARY_PATH=/tmp/pa/lib; M=$(ls /tmp/s/zoo-cache/runtime-models/resnet50-*-fp16-v2-cuda.onnx | head -1); echo $M
timeout 480 python3 benchmarks/serve_vs_triton.py --model $M --name resnet50 --kind gpu --target "cuda:0?enable_cuda_graph=1" --serve-instances auto --instances 4 --max-batch 64 --delay-us 2000 --concurrency 1,16,64,256 --rows 1,8 --interval-ms 1000 --warmup-s 24 --generators perf_analyzer,loadtest --triton /tmp/triton/bin/tritonserver --perf-analyzer /tmp/pa/perf_analyzer --triton-config 'parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }' --out $OUT/svt-http.json 2>&1 | grep -v "^WARNING" | tail -45
