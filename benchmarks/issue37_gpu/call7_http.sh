# call 7 (after call 6 on the same machine; carries .tri1, .tri2 where call 6 did not): the issue's Must-show grid
# in one run: Triton and onnxaccel over HTTP, perf_analyzer and loadtest, rows 1 and 8, c1/16/64/256, the
# in-process reference beside them. SERVE_ARGS: onnxaccel's serve options (empty: the layout serve picks; unset:
# what call_streams.sh chose in the call before on this machine, /tmp/s/serve_args, else empty).
source benchmarks/issue37_gpu/setup6.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=/tmp/pa/lib
if [ -z "${SERVE_ARGS+set}" ]; then
  if [ -f /tmp/s/serve_args ]; then SERVE_ARGS=$(cat /tmp/s/serve_args)
  else echo "no /tmp/s/serve_args (call_streams.sh did not finish on this machine): serve's default layout"; fi
fi
echo "serve args: '${SERVE_ARGS:-}'"
[ -e /tmp/triton/bin/tritonserver ] || { echo "call 7 needs calls 1-5 and Triton: carry .tri1, .tri2"; return 1; }
timeout ${LIMIT:-560} python3 $SVT --serve-instances auto --instances 4 --serve-args="${SERVE_ARGS:-}" \
  --concurrency ${CONC:-1,16,64,256} --rows ${ROWS:-1,8} --warmup-s ${WARMUP:-6} --generators perf_analyzer,loadtest \
  --triton-config "$TCFG" --out $OUT/http-grid.json 2>&1 | tee $OUT/http-grid.log | grep -v "^WARNING\|{" | tail -30
