# call 5 (carries .ortgpu5, .sw1): ORT install, the model variant, plain script figures
mkdir -p /tmp/ortgpu /tmp/sw && cp .ortgpu5/part.* /tmp/ortgpu/ && cp .sw1/*.whl /tmp/sw/ && source .ortgpu5/install.sh
nvidia-smi -L; grep -m1 "model name" /proc/cpuinfo; nproc; date -u
source benchmarks/gpu_setup.sh
python3 benchmarks/startup_gpu.py --parts plain --out /tmp/s > $OUT/plain.log 2>&1; tail -4 $OUT/plain.log
ls -la /tmp/s/zoo-cache/runtime-models/
