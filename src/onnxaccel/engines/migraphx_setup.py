"""What the native MIGraphX engine needs before it compiles: the ``migraphx`` module and its own options.

``migraphx`` is a pybind11 module that ships with ROCm, not with pip: ``apt install migraphx`` from AMD's
repositories puts ``migraphx.cpython-*.so`` in ``/opt/rocm/lib``, and the docs say to
``export PYTHONPATH=/opt/rocm/lib:$PYTHONPATH``. The PyPI project ``migraphx`` 0.0.1 is an empty placeholder
("Placeholder reserving the AMD MIGraphX Python package name"), dist-info only (its wheel, downloaded
2026-12-02). Install steps: ROCm/AMDMIGraphX README.md at f729a52.

The engine's options are arguments of ``parse_onnx``, ``program.compile`` and the engine's program cache, not
ONNX Runtime provider options: ``migraphx@migraphx?exhaustive_tune=1&fast_math=0``. Defaults are MIGraphX's
own: ``compile(t, offload_copy=True, fast_math=True, exhaustive_tune=False)`` (src/py/migraphx_py.cpp).

Which MIGraphX target it compiles for is not an option: always ``get_target("gpu")``, except where the
environment says ``ONNXACCEL_MIGRAPHX_TARGET=ref`` (MIGraphX's reference target, for the test suite and
``doctor`` against a MIGraphX built without GPU support: scripts/build-migraphx-ref).
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from onnxaccel.install import install_command
from onnxaccel.errors import MissingDependencyError, ProviderOptionError, TargetError
from onnxaccel.target import PROVIDER_OPTIONS, SESSION_OPTIONS, Target

#: Where ROCm installs the module (ROCm/AMDMIGraphX README.md at f729a52: PYTHONPATH=/opt/rocm/lib).
ROCM_PYTHON_DIR = "/opt/rocm/lib"
#: The name the native engine reports where ONNX Runtime reports execution providers.
NATIVE = "MIGraphX"

#: Native engine option keys and value kinds. target.py should carry the same table for engine=migraphx.
NATIVE_OPTIONS: dict[str, str] = {
    "offload_copy": "bool",         # compile(): the program copies inputs/outputs host<->device itself
    "fast_math": "bool",            # compile(): "slight accuracy degradation when enabled" (MIGraphX docs)
    "exhaustive_tune": "bool",      # compile(): tune every kernel (slow compile, sometimes faster run)
    "default_dim_value": "int",     # parse_onnx(): size of a symbolic dim that map_input_dims does not set
    "cache": "bool",                # reuse/fill the engine's .mxr program cache
    "model_cache_dir": "str",       # where the .mxr programs live (default: <cache_root>/compile)
    "calibration": "str",           # INT8: images folder, .npz, .npy, folder of arrays, or `synthetic`
    "calibration_samples": "int",   # INT8: how many samples quantize_int8 calibrates on
}
_DEFAULTS = {"offload_copy": "1", "fast_math": "1", "exhaustive_tune": "0", "default_dim_value": "1", "cache": "1",
             "model_cache_dir": "", "calibration": "", "calibration_samples": "128"}

# ONNX Runtime MIGraphX EP keys that have a native counterpart (microsoft/onnxruntime
# onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h at 03c1250).
_EP_EQUIVALENT = {
    "migraphx_exhaustive_tune": "exhaustive_tune=1",
    "migraphx_fp16_enable": "the /fp16 precision (migraphx/fp16@migraphx)",
    "migraphx_bf16_enable": "the /bf16 precision (migraphx/bf16@migraphx)",
    "migraphx_int8_enable": "the /int8 precision with calibration=DATA",
    "migraphx_int8_calibration_table_name": "calibration=DATA (a folder of inputs, not an ORT table)",
    "migraphx_model_cache_dir": "model_cache_dir=DIR",
    "device_id": "the device id in the target (migraphx:0@migraphx)",
}

#: shape.type_string() -> numpy dtype (migraphx::shape type names, src/include/migraphx/shape.hpp).
TYPE_TO_NUMPY = {
    "float_type": np.float32, "half_type": np.float16, "double_type": np.float64,
    "int8_type": np.int8, "uint8_type": np.uint8, "int16_type": np.int16, "uint16_type": np.uint16,
    "int32_type": np.int32, "uint32_type": np.uint32, "int64_type": np.int64, "uint64_type": np.uint64,
    "bool_type": np.bool_,
}


class MigraphxNotInstalledError(MissingDependencyError):
    """The ``migraphx`` module cannot be imported, or what imports is not AMD's module."""

    def __init__(self, message: str, hint: str, details: str | None = None):
        # MissingDependencyError's own message is about pip extras; MIGraphX does not come from pip.
        Exception.__init__(self, message)
        self.message, self.hint, self.details = message, hint, details
        self.package, self.extra = "migraphx", "migraphx"


def import_migraphx():
    """Import AMD's ``migraphx`` module, or explain how to get it and why what is there is not it."""
    try:
        import migraphx
    except ImportError as exc:
        raise _not_installed(exc) from exc
    if not hasattr(migraphx, "parse_onnx"):
        where = getattr(migraphx, "__file__", None) or ", ".join(getattr(migraphx, "__path__", [])) or "?"
        raise MigraphxNotInstalledError(
            f"The module 'migraphx' imported from {where} is not AMD's MIGraphX (it has no parse_onnx).",
            _placeholder_hint() + _install_hint(),
        )
    return migraphx


def _not_installed(exc: ImportError) -> MigraphxNotInstalledError:
    text = str(exc)
    absent = isinstance(exc, ModuleNotFoundError) and exc.name == "migraphx"
    rocm_module = sorted(glob.glob(os.path.join(ROCM_PYTHON_DIR, "migraphx*.so")))
    if rocm_module and ROCM_PYTHON_DIR not in sys.path and absent:
        return MigraphxNotInstalledError(
            f"MIGraphX is installed ({rocm_module[0]}) but Python does not look in {ROCM_PYTHON_DIR}.",
            f"export PYTHONPATH={ROCM_PYTHON_DIR}:$PYTHONPATH (the MIGraphX docs' setup step), then rerun.",
            details=text,
        )
    if not absent:  # the module is there but a shared library it links is not
        return MigraphxNotInstalledError(
            f"The MIGraphX Python module is present but does not load: {text}",
            "Its ROCm libraries are missing or from another release: install ROCm and migraphx from one "
            "release (docs/AMD.md) and make /opt/rocm/lib visible (ldconfig or LD_LIBRARY_PATH).",
            details=text,
        )
    return MigraphxNotInstalledError(
        "The native MIGraphX engine needs AMD's 'migraphx' Python module, which is not installed.",
        _placeholder_hint() + _install_hint(), details=text,
    )


def _placeholder_hint() -> str:
    with contextlib.suppress(metadata.PackageNotFoundError):
        version = metadata.version("migraphx")
        return (f"The PyPI package migraphx {version} is installed: it is an empty placeholder, not MIGraphX; "
                "pip uninstall -y migraphx. ")
    return ""


def _install_hint() -> str:
    return ("MIGraphX comes with ROCm, not from PyPI: on Ubuntu with AMD's ROCm repository, "
            f"`sudo apt install migraphx`, then `export PYTHONPATH={ROCM_PYTHON_DIR}:$PYTHONPATH`; or use a ROCm "
            "container (docker/Dockerfile.rocm). See docs/AMD.md. Without it, --target migraphx runs through "
            f"ONNX Runtime's MIGraphX EP ({install_command('migraphx')}).")


def migraphx_version(mgx) -> str:
    """``migraphx.__version__``: VERSION_INFO when the build defines it, else "MAJOR.MINOR.PATCH.dev" plus
    "+TWEAK" where rocm_setup_version set one, the git hash of a checkout (ROCm/AMDMIGraphX
    src/py/migraphx_py.cpp since rocm-6.3.0, "dev" alone before; ROCm/rocm-cmake ROCMSetupVersion.cmake at
    67ae770). The reference build from a source archive says "2.16.0.dev". The version does not tell two builds of one release apart: the program cache keys
    the build's files too (migraphx_cache.migraphx_build_identity)."""
    return str(getattr(mgx, "__version__", "unknown"))


#: Which MIGraphX target the native engine compiles for. Users get "gpu". "ref" is MIGraphX's reference
#: target (plain C++ on the CPU, slow): for the test suite and `doctor` against a MIGraphX built without GPU
#: support (scripts/build-migraphx-ref), so the engine's own code runs against the real module. It is an
#: environment setting, not a target option, because it is not something a user should choose.
TARGET_ENV = "ONNXACCEL_MIGRAPHX_TARGET"
MIGRAPHX_TARGETS = ("gpu", "ref")


def migraphx_target_name() -> str:
    """The MIGraphX target name from ``ONNXACCEL_MIGRAPHX_TARGET`` (default "gpu")."""
    value = os.environ.get(TARGET_ENV, "").strip().lower() or "gpu"
    if value not in MIGRAPHX_TARGETS:
        raise TargetError(f"{TARGET_ENV}={value!r} is not a MIGraphX target the native engine can use.",
                          f"Unset {TARGET_ENV} (the GPU target). 'ref' (MIGraphX's reference target on the CPU) "
                          "exists for tests and doctor only.")
    return value


@dataclass(frozen=True)
class NativeOptions:
    """The native engine's settings read from a target's options (compile flags, cache, calibration),
    checked once so a typo fails before any compile."""
    offload_copy: bool = True
    fast_math: bool = True
    exhaustive_tune: bool = False
    default_dim_value: int = 1
    cache: bool = True
    model_cache_dir: str = ""
    calibration: str = ""
    calibration_samples: int = 128

    @classmethod
    def from_target(cls, target: Target) -> NativeOptions:
        """Read and check the target's options; EP and session options get a hint naming the native key."""
        values = dict(_DEFAULTS)
        for key, value in target.options:
            if key not in NATIVE_OPTIONS:
                raise ProviderOptionError(*_unknown(key))
            values[key] = _check(key, value, NATIVE_OPTIONS[key])
        return cls(
            offload_copy=values["offload_copy"] == "1", fast_math=values["fast_math"] == "1",
            exhaustive_tune=values["exhaustive_tune"] == "1", default_dim_value=int(values["default_dim_value"]),
            cache=values["cache"] == "1", model_cache_dir=values["model_cache_dir"],
            calibration=values["calibration"], calibration_samples=int(values["calibration_samples"]),
        )

    def compile_args(self) -> dict[str, bool]:
        """The keyword arguments ``program.compile`` takes (ROCm/AMDMIGraphX src/py/migraphx_py.cpp)."""
        return {"offload_copy": self.offload_copy, "fast_math": self.fast_math,
                "exhaustive_tune": self.exhaustive_tune}

    def to_dict(self) -> dict:
        """The settings as JSON-ready values, for the runner's ``describe()``."""
        return dict(self.__dict__)


def _unknown(key: str) -> tuple[str, str]:
    valid = ", ".join(sorted(NATIVE_OPTIONS))
    if key in _EP_EQUIVALENT:
        return (f"'{key}' is an option of ONNX Runtime's MIGraphX EP, not of the native MIGraphX engine.",
                f"Use {_EP_EQUIVALENT[key]}, or drop @migraphx to run through the EP. Native options: {valid}.")
    if key in SESSION_OPTIONS:
        return (f"'{key}' is an ONNX Runtime session option; the native MIGraphX engine has no session.",
                f"Remove it. Native options: {valid}.")
    if key in PROVIDER_OPTIONS["migraphx"]:
        return (f"'{key}' is an option of ONNX Runtime's MIGraphX EP, not of the native MIGraphX engine.",
                f"Drop @migraphx to use it. Native options: {valid}.")
    return f"'{key}' is not an option of the native MIGraphX engine.", f"Native options: {valid}."


def _check(key: str, value: str, kind: str) -> str:
    text = value.strip()
    if kind == "bool":
        low = text.lower()
        if low in ("1", "true", "on", "yes"):
            return "1"
        if low in ("0", "false", "off", "no"):
            return "0"
        raise ProviderOptionError(f"Option {key}={value!r}: the value must be 0 or 1.", f"e.g. {key}=1")
    if kind == "int":
        if not text.isdigit() or (key == "calibration_samples" and int(text) < 1):
            raise ProviderOptionError(f"Option {key}={value!r}: the value must be a whole number"
                                      f"{' of at least 1' if key == 'calibration_samples' else ''}.",
                                      f"e.g. {key}={_DEFAULTS[key]}")
        return text
    return text


def check_device(target: Target) -> None:
    """The Python API has no device argument: MIGraphX compiles for the current HIP device, which is the
    first one HIP_VISIBLE_DEVICES leaves visible. Refuse ids it cannot honour instead of silently using 0."""
    if target.engine != "migraphx" or target.device != "migraphx":
        raise TargetError(f"{target} is not a native MIGraphX target.", "Use migraphx@migraphx.")
    if target.device_id in (None, 0):
        return
    raise TargetError(
        f"The native MIGraphX engine cannot pick GPU {target.device_id}: migraphx.program.compile() has no device "
        "argument and uses the first GPU the process sees.",
        f"Run with HIP_VISIBLE_DEVICES={target.device_id} and --target migraphx@migraphx (device 0 of what is "
        f"visible), or use --target migraphx:{target.device_id} (ONNX Runtime's EP takes a device id).",
    )


def module_origin(mgx) -> str | None:
    """The resolved file of the imported ``migraphx`` module (None for a module without one): keys the
    .mxr cache to the build that wrote a program."""
    path = getattr(mgx, "__file__", None)
    return str(Path(path).resolve()) if path else None
