#!/usr/bin/env bash
# NVIDIA DALI (nvidia-dali-cuda130, ~200 MB) and its pure-Python/compiled dependencies for the GPU machine's Python
# 3.12 (PYV), split to travel in device calls of <= 64 MiB: .dali1 .. .dali4 hold parts of the DALI wheel, .dalideps
# the dependency wheels (nvImageCodec travels in .nvimg). On the GPU machine: copy each .daliK/part.* into
# /tmp/daliparts (one call each, back to back), then `bash benchmarks/dali_wheels.sh install`.
set -euo pipefail
if [ "${1:-}" = install ]; then
  cat /tmp/daliparts/part.* > /tmp/daliparts/$(cat .dalideps/DALI_WHEEL)
  python3 -m pip install -q --no-index --no-deps --no-compile .dalideps/*.whl /tmp/daliparts/*.whl 2>&1 | tail -2
  python3 -c "import nvidia.dali as d; print('DALI', d.__version__)"
  exit 0
fi
VERSION=${DALI_VERSION:-2.4.0}
tmp=$(mktemp -d)
pip download -q --no-deps --only-binary=:all: --python-version ${PYV:-3.12} --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$tmp" "nvidia-dali-cuda130==$VERSION" astunparse gast optree makefun nvtx "libcst~=1.8" six
rm -rf .dali1 .dali2 .dali3 .dali4 .dalideps && mkdir -p .dalideps
wheel=$(cd "$tmp" && ls nvidia_dali_cuda130-*.whl)
mv "$tmp"/*.whl .dalideps/ && mv ".dalideps/$wheel" "$tmp/"
echo "$wheel" > .dalideps/DALI_WHEEL
split -n 4 -d -a 1 "$tmp/$wheel" "$tmp/part."
for k in 1 2 3 4; do mkdir -p .dali$k && mv "$tmp/part.$((k - 1))" .dali$k/; done
rm -rf "$tmp"
du -sh .dali1 .dali2 .dali3 .dali4 .dalideps
