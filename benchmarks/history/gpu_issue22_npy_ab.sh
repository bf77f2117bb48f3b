#!/usr/bin/env bash
# The .npy `batch` job (ResNet-50 FP16, tuned target, graph capture) with an older tree's src (.old_trees/<commit>/src,
# made with `git archive <commit> src | tar -x -C .old_trees/<commit>`) and this tree's, alternated twice in one
# call: a regression check on the GPU machine after `gpu_issue22.sh batch` made /tmp/i22/npy. OLD=<commit>, B=<batch>.
set -uo pipefail
source .ortgpu5/install.sh >/dev/null 2>&1
export PYTHONPATH_BASE=/tmp/serve-site:/tmp/ortgpu-site:/tmp/site ONNXACCEL_CACHE_DIR=/tmp/oa-cache
T='cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1'
for round in 1 2; do for tree in .old_trees/${OLD:-a813453}/src src; do
  rm -rf /tmp/i22/ab-out
  PYTHONPATH=$tree:$PYTHONPATH_BASE timeout 120 python3 -m onnxaccel.cli.main batch zoo:resnet50 --input /tmp/i22/npy --output /tmp/i22/ab-out --target "$T" --batch ${B:-256} --embed-preprocess imagenet --overwrite --images-per-shard 4096 --json > /tmp/ab.json 2>/tmp/ab.err
  python3 -c "import json; d=json.load(open('/tmp/ab.json')); print('$round', '$tree', round(d['rows_per_s']), d['stages']['bottleneck'])" || tail -3 /tmp/ab.err
done; done
