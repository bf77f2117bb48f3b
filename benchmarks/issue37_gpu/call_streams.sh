# After calls 1-5 (docs/TRITON_ORT_BACKEND.md), one call carrying .sw2 and .pa (about 330 s): serve --streams shared
# against the default (own streams). 1) replay_overlap.py: serve's run path on 1, 2 and 4 instances, model only,
# own streams, one replay at a time, one shared stream. 2) serve_graph_check.py with --streams shared: 48 images
# answered as a plain session answers them. 3) call 6 at c64 and c256, rows 1 and 8: default and shared.
source benchmarks/issue37_gpu/call_overlap.sh
ONNXACCEL_CACHE_DIR=/tmp/s/zoo-cache timeout 240 python3 benchmarks/serve_graph_check.py --serve-args "--streams shared" \
  > $OUT/graph-check-shared.json 2>&1; tail -c 600 $OUT/graph-check-shared.json; echo
CONC=${CONC:-64,256} ROWS=${ROWS:-1,8} VARIANTS="default shared:--streams=shared" source benchmarks/issue37_gpu/call6.sh
