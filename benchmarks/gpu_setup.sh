# Prepares the lent GPU machine for the scripts here; source it from the repository root:
#     source benchmarks/gpu_setup.sh
# Each step runs only where its parts were carried with the call (all git-ignored folders of the root):
#   .ortgpuN/   onnxruntime-gpu in parts (../shared/device/ort-gpu-prepare; each part copied to /tmp/ortgpu/ as it
#               arrives); installed under /tmp/ortgpu-site
#   .whl/       other wheels the image lacks, installed under /tmp/site
#   .servewheels/  fastapi, uvicorn, py-spy ... for `serve` (benchmarks/serve_wheels.sh), under /tmp/serve-site
#   .nvimg/     nvImageCodec + nvJPEG wheels, into the image's site-packages
#   /tmp/daliparts + .dalideps/   DALI (benchmarks/dali_wheels.sh)
# Then: PYTHONPATH = ${SRC:-$PWD/src} and the site folders above, then the caller's PYTHONPATH entries (OA_SITE holds
# all but a src, for scripts that put another tree's src first), PATH gets /tmp/serve-site/bin, ONNXACCEL_CACHE_DIR defaults to /tmp/oa-cache.
_oa_prev=${PYTHONPATH:-}  # the caller's entries (an onnxruntime-gpu installed elsewhere) stay in OA_SITE
for _oa_install in .ortgpu*/install.sh; do
  [ -f "$_oa_install" ] || continue
  if [ ! -d /tmp/ortgpu-site/onnxruntime ]; then mkdir -p /tmp/ortgpu && { cp -n .ortgpu*/part.* /tmp/ortgpu/ 2>/dev/null || true; }; fi
  source "$_oa_install" >/dev/null 2>&1 || echo "gpu_setup: $_oa_install failed (parts missing?)" >&2
done
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || echo "gpu_setup: pip install failed" >&2
fi
if compgen -G ".servewheels/*.whl" >/dev/null && [ ! -d /tmp/serve-site/fastapi ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .servewheels/*.whl || echo "gpu_setup: pip install failed" >&2
fi
if [ -d .nvimg ] && ! python3 -c 'import nvidia.nvimgcodec' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .nvimg/*.whl || echo "gpu_setup: pip install failed" >&2
fi
if [ -d /tmp/daliparts ] && [ -d .dalideps ] && ! python3 -c 'import nvidia.dali' 2>/dev/null; then
  bash benchmarks/dali_wheels.sh install || echo "gpu_setup: DALI install failed" >&2
fi
OA_SITE=
for _oa_dir in /tmp/serve-site /tmp/ortgpu-site /tmp/site; do
  if [ -d "$_oa_dir" ]; then OA_SITE=${OA_SITE:+$OA_SITE:}$_oa_dir; fi
done
IFS=: read -r -a _oa_entries <<< "$_oa_prev"
for _oa_dir in "${_oa_entries[@]}"; do  # a tree's src does not count as a site folder
  case ":$OA_SITE:" in *":$_oa_dir:"*) continue ;; esac
  if [ -n "$_oa_dir" ] && [[ $_oa_dir != */src ]]; then OA_SITE=${OA_SITE:+$OA_SITE:}$_oa_dir; fi
done
export OA_SITE
export PYTHONPATH=${SRC:-$PWD/src}${OA_SITE:+:$OA_SITE}
export PATH=/tmp/serve-site/bin:$PATH ONNXACCEL_CACHE_DIR=${ONNXACCEL_CACHE_DIR:-/tmp/oa-cache} PYTHONUNBUFFERED=1
unset _oa_install _oa_dir _oa_prev _oa_entries
