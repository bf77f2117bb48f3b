# After calls 1-5 (docs/TRITON_ORT_BACKEND.md), one call carrying .sw2 and .pa (about 330 s, at most about 560 s):
# which serve --streams mode the grid runs with. 1) call 6 at c256, rows 1 and 8, perf_analyzer: the default (own
# streams) beside --streams shared and --streams serial. 2) serve_graph_check.py with --streams shared: 48 images
# answered as a plain session answers them, and the server ran shared. 3) choose_streams.py writes the chosen serve
# options to /tmp/s/serve_args, which call7_http.sh reads in the next call (no person in between). 4)
# replay_overlap.py: serve's run path on 1, 2 and 4 instances, model only, own streams, serial, shared.
rm -f /tmp/s/serve_args
CONC=${CONC:-256} ROWS=${ROWS:-1,8} T6=${T6:-110} VARIANTS="default shared:--streams=shared serial:--streams=serial" \
  source benchmarks/issue37_gpu/call6.sh
ONNXACCEL_CACHE_DIR=/tmp/s/zoo-cache timeout 120 python3 benchmarks/serve_graph_check.py \
  --serve-args "--streams shared" > $OUT/graph-check-shared.json 2> $OUT/graph-check-shared.err
tail -c 400 $OUT/graph-check-shared.json; echo
python3 benchmarks/issue37_gpu/choose_streams.py $OUT --write /tmp/s/serve_args --json $OUT/streams-choice.json
OVERLAP_S=${OVERLAP_S:-2} OVERLAP_LIMIT=${OVERLAP_LIMIT:-90} source benchmarks/issue37_gpu/call_overlap.sh
