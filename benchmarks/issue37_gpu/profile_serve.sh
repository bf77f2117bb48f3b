# Where a default `serve` spends its CPU at 1-row requests, concurrency 256 (the c256 goal's limit):
# CPU seconds of every server process over a 10 s window under perf_analyzer load, and py-spy (GIL-holding
# samples) of the model process and of one HTTP worker. Source from the repository root after call6.sh; needs
# py-spy's wheel in .servewheels/ (setup6.sh) and $M, the model. Writes $OUT/prof-*.
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .servewheels/py_spy-*.whl && SPY=/tmp/spy/bin/py-spy
P=18411
mkdir -p /tmp/prof && cp $M /tmp/prof/resnet50.onnx
python3 -c "import sys; from onnxaccel.cli.main import main; sys.argv[0] = 'onnxaccel'; main()" serve /tmp/prof/resnet50.onnx --target "${TARGET:-cuda:0?enable_cuda_graph=1}" \
  --host 127.0.0.1 --http-port $P --grpc-port $((P + 1)) --max-batch 64 --max-queue-delay-ms 2 ${SERVE_ARGS:-} > $OUT/prof-serve.log 2>&1 &
SP=$!
for i in $(seq 300); do curl -sf localhost:$P/v2/health/ready >/dev/null && break; sleep 0.5; done
${PA_BIN:-/tmp/pa/perf_analyzer} -m resnet50 -u 127.0.0.1:$P -b 1 ${PA_ARGS:-} --concurrency-range 256 -p ${PA_MS:-7000} --max-trials 4 --stability-percentage 100 \
  > $OUT/prof-pa.log 2>&1 &
PA=$!
sleep 8
pids() { for p in $(pgrep -P $SP) $(for c in $(pgrep -P $SP); do pgrep -P $c; done); do
  echo "$p $(cat /proc/$p/comm) $(awk '{print $14+$15}' /proc/$p/stat)"; done; }
pids > $OUT/prof-cpu0.txt; T0=$(date +%s.%N)
MP=$(awk '$2=="onnxaccel-model"{print $1}' $OUT/prof-cpu0.txt | head -1)
W0=$(awk '$2 ~ /^onnxaccel-w/{print $1}' $OUT/prof-cpu0.txt | head -1)
$SPY record -p $MP -d 10 -r 250 --gil --nonblocking --format raw -o $OUT/prof-model-gil.raw > /dev/null 2>&1 &
$SPY record -p $W0 -d 10 -r 250 --gil --nonblocking --format raw -o $OUT/prof-worker-gil.raw > /dev/null 2>&1 &
sleep 10.5; pids > $OUT/prof-cpu1.txt; T1=$(date +%s.%N)
$SPY dump -p $MP > $OUT/prof-model-dump.txt 2>&1
echo "window $(python3 -c "print(round($T1 - $T0, 2))") s; CPU seconds (user+sys, 1/100 s ticks) per process:"
join <(sort $OUT/prof-cpu0.txt) <(sort $OUT/prof-cpu1.txt) | awk -v w="$(python3 -c "print($T1 - $T0)")" \
  '{printf "%-8s %-16s %5.0f%% of a core\n", $1, $2, ($5 - $3) / w}'
wait $PA; grep -i "throughput\|p99" $OUT/prof-pa.log | head -3
kill $SP; wait $SP 2>/dev/null
