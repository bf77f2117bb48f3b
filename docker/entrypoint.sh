#!/bin/sh
# Container start: check the target with `onnxaccel doctor`, then serve. The doctor gate turns "the GPU, the
# driver or the runtime is missing in this container" into a failed start with a diagnosis in the log, instead
# of a server that silently runs on the CPU (ONNX Runtime's CUDA EP falls back quietly: docs/AMD.md).
#
# Environment (all optional):
#   ONNXACCEL_MODEL      model file, zoo:NAME, or a model repository folder   (default /models)
#   ONNXACCEL_TARGET     target string, e.g. migraphx, migraphx@migraphx, cuda:0/fp16, cpu   (image default)
#   ONNXACCEL_HOST       address to listen on                                  (default 0.0.0.0)
#   ONNXACCEL_HTTP_PORT  HTTP port (KServe v2 REST, /metrics)                  (default 8000)
#   ONNXACCEL_GRPC_PORT  gRPC port                                             (default 8001)
#   ONNXACCEL_SKIP_DOCTOR=1  skip the gate (debugging only)
#   ONNXACCEL_ARTIFACTS  a directory `onnxaccel compile` made: serve loads every session from it, read-only, and
#                        refuses to start if it lacks one or was made with other versions or another GPU
# Arguments given to the container are passed on to `onnxaccel serve` (e.g. --max-batch 16 --no-grpc).
#
# `compile` as the first argument compiles ahead instead of serving (an init container, a one-shot compose
# service, an image layer): `onnxaccel compile "$ONNXACCEL_MODEL" --target "$ONNXACCEL_TARGET" -o
# "$ONNXACCEL_ARTIFACTS"`, the rest of the arguments passed on (give it serve's --max-batch, --shape-buckets...).
set -eu

model="${ONNXACCEL_MODEL:-/models}"
target="${ONNXACCEL_TARGET:-cpu}"

if [ "${ONNXACCEL_SKIP_DOCTOR:-0}" != "1" ]; then
    if ! onnxaccel doctor --target "$target"; then
        echo "onnxaccel: target '$target' is not ready in this container (doctor report above); not serving." >&2
        exit 1
    fi
fi

if [ "${1:-}" = "compile" ]; then
    shift
    exec onnxaccel compile "$model" --target "$target" \
        --output "${ONNXACCEL_ARTIFACTS:?set ONNXACCEL_ARTIFACTS to the directory to compile into}" "$@"
fi

exec onnxaccel serve "$model" --target "$target" --host "${ONNXACCEL_HOST:-0.0.0.0}" \
    --http-port "${ONNXACCEL_HTTP_PORT:-8000}" --grpc-port "${ONNXACCEL_GRPC_PORT:-8001}" "$@"
