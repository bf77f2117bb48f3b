# After calls 1-5 (docs/TRITON_ORT_BACKEND.md): how N graph-replaying instances share the GPU (replay_overlap.py;
# OVERLAP_LIMIT: its seconds at most)
source benchmarks/gpu_setup.sh >/dev/null 2>&1
M=$(ls /tmp/s/zoo-cache/runtime-models/resnet50-*-fp16-v2-cuda.onnx | head -1)
nvidia-smi -L; grep -m1 "model name" /proc/cpuinfo; date -u; git rev-parse --short HEAD 2>/dev/null
timeout ${OVERLAP_LIMIT:-300} python3 benchmarks/issue37_gpu/replay_overlap.py "$M" --batch 64 \
    --instances ${OVERLAP_N:-1,2,4} \
    --host-ms ${OVERLAP_HOST:-0,4} --duration ${OVERLAP_S:-3} --json $OUT/overlap.json 2>&1 \
    | grep -v -i "warning" | tee $OUT/overlap.log
