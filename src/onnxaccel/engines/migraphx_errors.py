"""MIGraphX's exceptions, translated into onnxaccel errors with a cause and a fix.

MIGraphX raises ``RuntimeError`` with its own text (``MIGRAPHX_THROW``); these functions read that text and say
what failed, where, and how to fix it. Split from engines/migraphx.py, which raises what they return.
NOT EXECUTED ON AMD HARDWARE: the messages matched here come from MIGraphX's source and from the reference
target build the tests run (scripts/build-migraphx-ref); the GPU target's messages are never seen here.
"""

from __future__ import annotations

import re

from onnxaccel.engines.ort_errors import diagnose
from onnxaccel.errors import InferenceError, ModelFormatError, OnnxAccelError, PlacementError, ProviderUnavailableError
from onnxaccel.model import Model
from onnxaccel.target import Target
#: MIGRAPHX_THROW prefixes its message with "<file>:<line>: <function>: " (src/include/migraphx/errors.hpp);
#: inside the Python binding's lambdas the function is "operator()" (the reference build's
#: ".../src/program.cpp:500: operator(): Parameter not found: x").
_SOURCE_CONTEXT = re.compile(r"^\S+\.[ch]pp:\d+: \S+: ")


def short_message(text: str) -> str:
    """MIGraphX's message without its source-location prefix: the first non-empty line."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return _SOURCE_CONTEXT.sub("", line)


def parse_error(model: Model, version: str, exc: Exception) -> OnnxAccelError:
    """``parse_onnx`` failed: an operator MIGraphX has no parser for, an unreadable file, or anything else."""
    text = str(exc)
    unknown = re.search(r"Unknown operator: (\S+)", text)  # onnx_parser.cpp parse_graph
    if unknown:
        return PlacementError(f"MIGraphX {version} cannot parse {model.source}: it has no parser for the ONNX "
                              f"operator {unknown.group(1)}.",
                              "Use --target migraphx (ONNX Runtime's MIGraphX EP runs such nodes on the CPU), or "
                              "replace the operator in the model.", details=text)
    if "Failed reading onnx file" in text:  # onnx_parser.cpp parse_from
        return ModelFormatError(f"MIGraphX could not read {model.path}: {short_message(text)}",
                                "Check that the file and its external data are readable ONNX.", details=text)
    return InferenceError(f"MIGraphX could not parse {model.source}: {short_message(text)}",
                          "Run `migraphx-driver read MODEL` for MIGraphX's own view; --debug shows the full error.",
                          details=text)


#: make_target dlopens "libmigraphx_<name>.so[.<so major>]" and throws dynamic_loader's dlerror text
#: (ROCm/AMDMIGraphX src/register_target.cpp and src/dynamic_loader.cpp at f729a52).
_NO_TARGET_LIBRARY = re.compile(r"(libmigraphx_(\w+)\.so[\w.]*): cannot open shared object file")


def missing_target(text: str, name: str) -> OnnxAccelError | None:
    """The error for a MIGraphX without the target library ``name`` needs (None when ``text`` is not that)."""
    found = _NO_TARGET_LIBRARY.search(text)
    if not found:
        return None
    library, target_name = found.groups()
    if target_name == "gpu":
        hint = ("Install AMD's MIGraphX for ROCm (`sudo apt install migraphx` from AMD's repository, docs/AMD.md): "
                "its libmigraphx_gpu.so is the GPU target. A MIGraphX built without GPU support (such as "
                "scripts/build-migraphx-ref) has only the reference target; use --target migraphx (ONNX "
                "Runtime's MIGraphX EP) or --target cpu meanwhile.")
    else:
        hint = (f"Unset ONNXACCEL_MIGRAPHX_TARGET to compile for the GPU, or use a MIGraphX built with its "
                f"{name} target.")
    return ProviderUnavailableError(
        f"This MIGraphX has no '{target_name}' target: {library} is not installed with it.", hint, details=text)


def compile_error(target: Target, exc: Exception, target_name: str = "gpu") -> OnnxAccelError:
    """``get_target`` or ``compile`` failed: a missing target library, a known ROCm problem, or MIGraphX's text."""
    text = str(exc)
    missing = missing_target(text, target_name)
    if missing is not None:
        return missing
    found = diagnose(text)
    if found:
        return ProviderUnavailableError(f"MIGraphX could not compile for the GPU: {found.cause}.", found.fix,
                                        details=text)
    return InferenceError(f"MIGraphX could not compile the model for {target}: {short_message(text)}",
                          "Run `onnxaccel doctor --target migraphx@migraphx`; --debug shows the full error.",
                          details=text)


def inference_error(target: Target, exc: Exception) -> InferenceError:
    """``run`` failed: MIGraphX's message, with the fix for a known ROCm problem where ``diagnose`` finds one."""
    text = str(exc)
    found = diagnose(text)
    return InferenceError(f"MIGraphX failed while running on {target}: {short_message(text)}",
                          found.fix if found else "Check input shapes and dtypes (`onnxaccel inspect`); --debug "
                          "shows the full error.", details=text)

