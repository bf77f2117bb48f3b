"""The stand-in `migraphx` module is held to the binding's source: ROCm/AMDMIGraphX src/py/migraphx_py.cpp,
quoted in upstream/mgx_py_*.txt with its commit. A drift on either side fails here: the snippets must still be
the upstream lines (where the source archive is here), and the stand-in's callables must take the arguments
the quoted ``py::arg`` lists declare, in that order, with those defaults.

The comparison with the real module (names, signatures, error texts, buffer lifetime) is in
test_real_ref_fidelity.py; it runs where the reference-target build is present.
"""

from __future__ import annotations

import gc
import inspect
import weakref

import numpy as np
import pytest

from mgx_upstream import DYN_1_1, EMPTY, python_default, read_snippet, signatures, upstream_file
from native_helpers import native
from onnxaccel.engines.migraphx import MigraphxEngine

SNIPPETS = ["mgx_py_signatures.txt", "mgx_py_functions.txt", "mgx_py_argument.txt",
            "mgx_py_version_rocm-6.2.4.txt", "mgx_register_target.txt", "mgx_dynamic_loader.txt"]

#: Defs the engine calls that bind a C++ function without py::arg: pybind11 names their arguments arg0..argN,
#: which Python can pass only by position. How many the C++ takes (besides self), from the quoted code:
#: make_target(const std::string&), gpu::from_gpu(const argument&), the run lambda's py::dict, and none.
POSITIONAL_ONLY = {"get_target": 1, "from_gpu": 1, "run": 1, "gpu_sync": 0, "get_onnx_operators": 0,
                   "get_parameter_shapes": 0}
#: Methods of migraphx.program among the quoted defs; the rest are module functions.
PROGRAM_METHODS = {"compile", "run", "get_parameter_shapes"}


def stand_in_callable(mgx, name: str):
    return getattr(mgx.program, name) if name in PROGRAM_METHODS else getattr(mgx, name)


def quoted_signatures() -> dict[str, list[tuple[str, str | None]]]:
    found = {}
    for name in ("mgx_py_signatures.txt", "mgx_py_functions.txt", "mgx_py_argument.txt"):
        found.update(signatures(read_snippet(name).text))
    return found


@pytest.mark.parametrize("name", SNIPPETS)
def test_snippets_are_the_upstream_lines(name):
    snippet = read_snippet(name)
    assert snippet.runs and all(lines for _, lines in snippet.runs)
    source = upstream_file(snippet)
    if source is None:
        pytest.skip(f"{snippet.repo} {snippet.path} @ {snippet.commit[:7]} is not here (vendored archive "
                    "../shared/vendor/AMDMIGraphX-<commit>.tar.gz or ONNXACCEL_MIGRAPHX_SOURCE)")
    upstream = source.splitlines()
    for start, lines in snippet.runs:
        assert list(lines) == upstream[start - 1:start - 1 + len(lines)], f"{name} @@ {start}"


def test_the_quoted_defs_cover_every_call_the_engine_makes():
    quoted = quoted_signatures()
    used = {"parse_onnx", "compile", "run", "get_parameter_shapes", "get_target", "quantize_fp16",
            "quantize_int8", "quantize_bf16", "save", "load", "allocate_gpu", "to_gpu", "from_gpu", "gpu_sync",
            "get_onnx_operators"}
    assert used <= set(quoted), sorted(used - set(quoted))


@pytest.mark.parametrize("name", sorted(signatures(read_snippet("mgx_py_signatures.txt").text)
                                        | signatures(read_snippet("mgx_py_functions.txt").text)
                                        | signatures(read_snippet("mgx_py_argument.txt").text)))
def test_stand_in_takes_the_arguments_the_binding_declares(fake_mgx, name):
    quoted = quoted_signatures()[name]
    params = list(inspect.signature(stand_in_callable(fake_mgx, name)).parameters.values())
    if name in PROGRAM_METHODS:
        params = params[1:]  # self
    if not quoted:
        assert len(params) == POSITIONAL_ONLY[name]
        return
    assert [p.name for p in params] == [arg for arg, _ in quoted]
    for param, (arg, cpp) in zip(params, quoted):
        if cpp is None:
            assert param.default is inspect.Parameter.empty, arg
            continue
        want = python_default(cpp)
        if want == EMPTY:
            assert param.default in (None, (), [], {}), (arg, param.default)
        elif want == DYN_1_1:  # the stand-in writes None for the binding's dynamic_dimension{1, 1}
            assert param.default is None
        elif isinstance(want, set):
            assert set(param.default) == want, arg
        elif isinstance(want, list):
            assert list(param.default) == want, arg
        else:
            assert param.default == want and type(param.default) is type(want), arg


def test_gpu_memory_functions_exist_only_in_gpu_builds_upstream():
    """allocate_gpu/to_gpu/from_gpu/gpu_sync are under #ifdef HAVE_GPU: a reference-only build lacks them,
    which is why the stand-in stays the only test double for them."""
    text = read_snippet("mgx_py_functions.txt").text
    block = text[text.index("#ifdef HAVE_GPU"):text.index("#endif")]
    assert set(signatures(block)) == {"allocate_gpu", "to_gpu", "from_gpu", "gpu_sync"}


def test_argument_and_run_take_the_buffer_address_without_keep_alive():
    text = read_snippet("mgx_py_argument.txt").text
    assert text.count("migraphx::argument(to_shape(info), info.ptr)") == 2  # argument(buffer) and run()
    assert "keep_alive" not in text


def test_stand_in_argument_keeps_only_the_address(fake_mgx):
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    address = array.__array_interface__["data"][0]
    arg = fake_mgx.argument(array)
    assert arg.data_ptr() == address and np.array_equal(np.array(arg), array)  # no copy
    alive = weakref.ref(array)
    del array
    gc.collect()
    assert alive() is None  # the argument did not keep it
    with pytest.raises(RuntimeError, match="memory behind this migraphx.argument was freed"):
        np.array(arg)
    view_of_kept = np.ones((4, 4), np.float32)
    arg = fake_mgx.argument(view_of_kept[1:3])  # the view dies, the memory it shows does not
    gc.collect()
    assert np.array(arg).tolist() == [[1.0] * 4] * 2


def test_int8_calibration_buffers_outlive_quantize_int8(fake_mgx, cnn):
    """Calibration samples that are not C-contiguous must be copied into buffers that live until
    quantize_int8 returns; an argument made from a temporary points at freed memory."""
    rng = np.random.default_rng(3)
    samples = [{"x": np.asfortranarray(rng.standard_normal((2, 3, 8, 8)).astype(np.float32) * s)} for s in (1, 4)]
    runner = MigraphxEngine().compile(cnn, native("int8", cache=0), calibration=samples)
    contiguous = [{"x": np.ascontiguousarray(s["x"])} for s in samples]
    reference = MigraphxEngine().compile(cnn, native("int8", cache=0), calibration=contiguous)
    x = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(runner.run(x)["logits"], reference.run(x)["logits"])


def test_version_text_upstream_is_never_plain_dev_since_rocm_6_3():
    before = read_snippet("mgx_py_version_rocm-6.2.4.txt").text
    now = read_snippet("mgx_py_argument.txt").text
    assert 'm.attr("__version__") = "dev";' in before
    assert '".dev"' in now and '"+" + tweak' in now and '= "dev"' not in now
