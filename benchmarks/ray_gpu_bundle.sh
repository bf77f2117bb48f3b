#!/usr/bin/env bash
# Prepare Ray for the lent GPU machine (its image has no Ray; one device call carries at most 64 MiB and Ray's
# wheel alone is ~76 MiB). Run here, in the repo root: downloads Ray 2.60.0 and what the GPU image lacks of
# Ray Data and Ray Serve's dependencies for CPython 3.12, and leaves two carry folders (ignored by git):
#   .raypart1/part.0                      first half of a tar of the wheels
#   .raypart2/part.1 + extra/*.whl        second half, Ray Serve's extras, and install.sh
# On the GPU machine: the call carrying .raypart1 copies it to /tmp/raypart (mkdir -p /tmp/raypart && cp
# .raypart1/part.* /tmp/raypart/), the next carrying .raypart2 does the same and then
# `source .raypart2/install.sh` (installs into /tmp/ray-site and puts it on PYTHONPATH).
# Used on 2026-12-02 for `benchmarks/history/gpu_session.sh ray-batch` (docs/BENCHMARKS.md, issue 9).
set -euo pipefail
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$1" "${@:2}"
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Ray itself and what the image (KINDS.md package list) lacks for Ray core and Ray Data.
download "$work/core" ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py
# Ray Serve's extras that the image lacks (its proxy, dashboard agent and gRPC ingress import them).
download "$work/extra" aiohttp-cors colorful opencensus opencensus-context google-api-core google-auth \
  googleapis-common-protos proto-plus pyasn1 pyasn1-modules opentelemetry-api opentelemetry-sdk \
  opentelemetry-exporter-prometheus opentelemetry-proto opentelemetry-semantic-conventions smart-open \
  virtualenv distlib python-discovery watchfiles websockets python-dotenv grpcio-reflection
(cd "$work/core" && tar cf "$work/bundle.tar" ./*.whl)
digest=$(sha256sum "$work/bundle.tar" | cut -d' ' -f1)
rm -rf .raypart1 .raypart2
mkdir -p .raypart1 .raypart2/extra
split -n 2 -d -a 1 "$work/bundle.tar" "$work/part."
mv "$work/part.0" .raypart1/part.0
mv "$work/part.1" .raypart2/part.1
cp "$work"/extra/*.whl .raypart2/extra/
cat > .raypart2/install.sh <<EOF
# Reassembles the Ray bundle on the GPU machine (benchmarks/ray_gpu_bundle.sh); source it.
if [ ! -d /tmp/ray-site/ray ]; then
  cat /tmp/raypart/part.* > /tmp/raybundle.tar
  echo "$digest  /tmp/raybundle.tar" | sha256sum -c --quiet || { echo "ray bundle damaged: carry both parts again"; return 1; }
  mkdir -p /tmp/raywheels && tar xf /tmp/raybundle.tar -C /tmp/raywheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ray-site \\
    /tmp/raywheels/*.whl .raypart2/extra/*.whl || return 1
fi
export PYTHONPATH=\$PYTHONPATH:/tmp/ray-site
EOF
grep -qx '/.raypart1/' .git/info/exclude 2>/dev/null || printf '/.raypart1/\n/.raypart2/\n' >> .git/info/exclude
du -sh .raypart1 .raypart2
