#!/usr/bin/env bash
# Wheels the GPU machine's image lacks for serve/tune/bench sessions (benchmarks/history/gpu_session.sh `setup` installs
# them into /tmp/serve-site). Run here, in the repo root: fills .servewheels/ (git-ignored, ~20 MB).
set -euo pipefail
DEST=.servewheels
mkdir -p "$DEST"
grep -qx '/.servewheels/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.servewheels/ >> .git/info/exclude; }
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" -d "$DEST" \
  "fastapi>=0.110" "uvicorn>=0.30" httptools uvloop "httpx>=0.27" "grpcio>=1.60" "prometheus-client>=0.20" \
  "typer>=0.12,<0.29" "rich>=13.7" platformdirs packaging nvidia-ml-py py-spy
# The image has these (numpy, protobuf); two versions of one package would shadow the image's.
rm -f "$DEST"/numpy-*.whl "$DEST"/protobuf-*.whl
du -sh "$DEST"; ls "$DEST"
