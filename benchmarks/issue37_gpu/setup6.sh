# Sourced by call 6 (carries .sw2, .tri1, .tri2, .pa) after calls 1-5: serve wheels, Triton, perf_analyzer, $M.
# Sourced again by call 7: what is unpacked already is kept; Triton is unpacked once .tri1 and .tri2 are here.
mkdir -p .servewheels && cp /tmp/sw/*.whl .sw2/*.whl .servewheels/
source benchmarks/gpu_setup.sh
[ -e /tmp/triton/bin/tritonserver ] || { [ -d .tri1 ] && mkdir -p /tmp/triton && cat .tri1/part.* .tri2/part.* | xz -d \
  | tar -x -C /tmp/triton && chmod +x /tmp/triton/bin/*; }
[ -x /tmp/pa/perf_analyzer ] || { mkdir -p /tmp/pa && xz -dc .pa/perf_analyzer.xz > /tmp/pa/perf_analyzer \
  && chmod +x /tmp/pa/perf_analyzer && cp -r .pa/lib /tmp/pa/; }
python3 -c "import fastapi, uvicorn, grpc, onnxruntime as o; print(o.__version__, o.get_available_providers())"
export LD_LIBRARY_PATH=/tmp/pa/lib; M=$(ls /tmp/s/zoo-cache/runtime-models/resnet50-*-fp16-v2-cuda.onnx | head -1); echo $M
SVT="benchmarks/serve_vs_triton.py --model $M --name resnet50 --kind gpu --target cuda:0?enable_cuda_graph=1 --max-batch 64 --delay-us 2000 --interval-ms 1000 --stability 30 --triton /tmp/triton/bin/tritonserver --perf-analyzer /tmp/pa/perf_analyzer"
TCFG='parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }'
