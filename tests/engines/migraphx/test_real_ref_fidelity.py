"""The stand-in against the REAL module: where they disagree, the real one wins (and the stand-in is fixed).

Compared: the names the engine uses, the binding's argument names and defaults (pybind11's docstrings), the
outcome and text of the same calls on both (errors included), buffer lifetime and the version text. Only what
the reference-target build has is compared; allocate_gpu/to_gpu/from_gpu/gpu_sync exist only in GPU builds
(#ifdef HAVE_GPU, upstream/mgx_py_functions.txt) and stay held by the snippet alone. Skipped, with the reason,
where the build is absent.
"""

from __future__ import annotations

import gc
import re
import weakref

import numpy as np
import pytest

from mgx_upstream import read_snippet, signatures
from onnxaccel.engines.migraphx import short_message

GPU_ONLY = {"allocate_gpu", "to_gpu", "from_gpu", "gpu_sync"}
#: What the engine touches on each class (engines/migraphx.py, migraphx_setup.py).
CLASS_API = {"program": {"compile", "run", "get_parameter_shapes", "get_parameter_names", "get_output_shapes",
                         "is_compiled"},
             "argument": {"get_shape", "tolist", "data_ptr"},
             "shape": {"lens", "strides", "type_string", "elements", "bytes", "ndim", "standard"}}


def stand_in_public(module) -> set[str]:
    return {n for n in vars(module) if not n.startswith("_") and n not in {"annotations", "base64", "json", "os",
                                                                           "time", "weakref", "np"}}


def doc_arguments(func) -> list[tuple[str, str | None]]:
    """pybind11's signature line: ``name(a: T, b: T = default, ...) -> R`` as [(a, None), (b, 'default')]."""
    first = func.__doc__.strip().splitlines()[0]
    inner = first[first.index("(") + 1:first.rindex(") ->")]
    parts, depth, current = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += ch in "([{<"
        depth -= ch in ")]}>"
        current += ch
    if current.strip():
        parts.append(current.strip())
    out = []
    for part in parts:
        name, _, rest = part.partition(":")
        default = rest.split(" = ", 1)[1] if " = " in rest else None
        out.append((name.strip(), default))
    return [a for a in out if a[0] != "self"]


def used_defs() -> dict[str, list]:
    found = {}
    for name in ("mgx_py_signatures.txt", "mgx_py_functions.txt", "mgx_py_argument.txt"):
        found.update(signatures(read_snippet(name).text))
    return {k: v for k, v in found.items() if k not in GPU_ONLY}


def test_the_real_module_has_every_name_of_the_stand_in(real_mgx_module, fake_mgx):
    real = set(dir(real_mgx_module))
    assert stand_in_public(fake_mgx) - GPU_ONLY <= real, sorted(stand_in_public(fake_mgx) - GPU_ONLY - real)
    assert not GPU_ONLY & real  # a reference-only build: these are the GPU build's
    for cls, methods in CLASS_API.items():
        assert methods <= set(dir(getattr(real_mgx_module, cls))), cls
        assert methods <= set(dir(getattr(fake_mgx, cls))), cls
    # an argument offers the buffer protocol and these methods, nothing numpy-like
    assert not {"shape", "astype", "dtype"} & set(dir(real_mgx_module.argument))


def test_argument_names_and_defaults_match_the_real_binding(real_mgx_module, fake_mgx):
    import inspect

    for name in used_defs():
        method = name in {"compile", "run", "get_parameter_shapes"}
        real = getattr(real_mgx_module.program if method else real_mgx_module, name)
        stand_in = getattr(fake_mgx.program if method else fake_mgx, name)
        real_args = doc_arguments(real)
        params = list(inspect.signature(stand_in).parameters.values())[1 if method else 0:]
        assert len(params) == len(real_args), name
        for param, (arg, default) in zip(params, real_args):
            if not re.fullmatch(r"arg\d+", arg):  # pybind's argN: positional only, any Python name will do
                assert param.name == arg, name
            assert (default is None) == (param.default is inspect.Parameter.empty), (name, arg)
            if default is not None and param.default is not None and "object at" not in default:
                assert _same_default(default, param.default), (name, arg, default, param.default)


def _same_default(real_repr: str, value) -> bool:
    if isinstance(value, (tuple, list, set, frozenset, dict)) and real_repr in ("{}", "[]", "set()"):
        return len(value) == 0
    if isinstance(value, (tuple, list)):
        return real_repr == repr(list(value))
    if isinstance(value, (set, frozenset)):
        return set(re.findall(r"'([^']*)'", real_repr)) == set(value)
    return real_repr == repr(value)


def outcome(call):
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return type(exc).__name__, short_message(str(exc))
    return "ok", type(result).__name__


@pytest.mark.parametrize("case", ["missing file", "both default dims", "path object", "run without params",
                                  "run with wrong dtype", "run with strided", "int8 ins_names", "int8 numpy",
                                  "int8 ins_names list", "int8 missing param", "compile str bool", "unknown target",
                                  "save json load", "load missing", "load unknown format", "load damaged",
                                  "load cut short"])
def test_the_same_calls_end_the_same_way(real_mgx_module, fake_mgx, mlp_file, tmp_path, case):
    from pathlib import Path

    def scenario(mgx):
        prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [2, 4]})
        ref = mgx.get_target("ref")
        calls = {
            "missing file": lambda: mgx.parse_onnx(str(tmp_path / "missing.onnx")),
            "both default dims": lambda: mgx.parse_onnx(str(mlp_file), default_dim_value=2,
                                                        default_dyn_dim_value=mgx.shape.dynamic_dimension(1, 4)),
            "path object": lambda: mgx.parse_onnx(Path(mlp_file)),
            "int8 ins_names": lambda: mgx.quantize_int8(prog, ref, ins_names={"dot"}),
            "int8 ins_names list": lambda: mgx.quantize_int8(prog, ref, ins_names=["dot", "convolution"]),
            "int8 numpy": lambda: mgx.quantize_int8(prog, ref, calibration=[{"x": np.ones((2, 4), np.float32)}]),
            "int8 missing param": lambda: mgx.quantize_int8(prog, ref, calibration=[{}]),
            "compile str bool": lambda: prog.compile(ref, offload_copy="1"),
            "unknown target": lambda: mgx.get_target("cpu"),
        }
        if case in calls:
            return calls[case]()
        prog.compile(ref)
        if case == "run without params":
            return prog.run({})
        if case == "run with wrong dtype":
            return prog.run({"x": np.ones((2, 4))})
        if case == "run with strided":
            return prog.run({"x": np.ones((4, 2), np.float32).T})
        path = tmp_path / f"{id(mgx)}.mxr"
        mgx.save(prog, str(path))
        if case == "save json load":
            return mgx.load(str(path), format="json")
        if case == "load missing":
            return mgx.load(str(tmp_path / "missing.mxr"))
        if case == "load unknown format":
            return mgx.load(str(path), format="yaml")
        path.write_bytes(b"truncated" if case == "load damaged" else b"\x92\x01")
        return mgx.load(str(path))

    real, stand_in = outcome(lambda: scenario(real_mgx_module)), outcome(lambda: scenario(fake_mgx))
    if real[0] == "TypeError":  # pybind11's listing of overloads differs in detail: the type is the fact
        assert stand_in[0] == "TypeError" and "incompatible function arguments" in stand_in[1]
    elif real[0] == "UnicodeDecodeError":  # the byte offset counts MIGraphX's message around the file's bytes
        assert stand_in[0] == real[0]
    else:
        assert stand_in == real


def test_argument_keeps_only_the_address_of_its_buffer(real_mgx_module):
    """migraphx::argument(to_shape(info), info.ptr) without keep_alive (upstream/mgx_py_argument.txt): the
    real argument neither copies nor references the array. (Its memory is not read after the array dies.)"""
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    arg = real_mgx_module.argument(array)
    assert arg.data_ptr() == array.__array_interface__["data"][0]
    np.testing.assert_array_equal(np.array(arg), array)
    alive = weakref.ref(array)
    del array
    gc.collect()
    assert alive() is None


def test_the_version_is_release_dot_dev(real_mgx_module):
    """Since rocm-6.3.0: "X.Y.Z.dev", "+tweak" when rocm_setup_version found one (not from an archive)."""
    assert re.fullmatch(r"\d+\.\d+\.\d+\.dev(\+\S+)?", real_mgx_module.__version__)
    assert real_mgx_module.__version__.startswith("2.16.0")  # rocm_setup_version(VERSION 2.16.0) at f729a52
