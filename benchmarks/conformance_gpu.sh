set -x
source .ortgpu5/install.sh && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=$PWD/src:/tmp/site:$PYTHONPATH
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
D=$(python3 -c "import onnx,os; print(os.path.dirname(onnx.__file__))")/backend/test/data
python3 benchmarks/fp16_overflow_probe.py -t cuda $D/real/test_* --out $OUT/probe_cuda.json > $OUT/probe_cuda.log 2>&1 &
P1=$!
ONNXACCEL_CACHE_DIR=/tmp/oa1 python3 benchmarks/conformance.py -t cuda --no-fp16 --out $OUT/conformance_h200_cuda > $OUT/c1.log 2>&1 &
P2=$!
ONNXACCEL_CACHE_DIR=/tmp/oa2 python3 benchmarks/conformance.py -t cuda -p fp16 --no-fp16 --out $OUT/conformance_h200_cuda_fp16 > $OUT/c2.log 2>&1
wait $P1 $P2
tail -3 $OUT/c1.log $OUT/c2.log; head -14 $OUT/conformance_h200_cuda.md $OUT/conformance_h200_cuda_fp16.md; cut -c1-400 $OUT/probe_cuda.log
