"""Artifacts compiled ahead on the REAL MIGraphX (reference target; issue 36, item 3): the second start loads the
saved programs instead of compiling them, for every shape the first one ran, and refuses a shape it did not.
Skipped, with the reason, where the reference-target build is absent (conftest.py ``real_mgx``)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from native_helpers import native
from onnxaccel.engines import artifacts
from onnxaccel.engines.build_counts import build_counts, reset_build_counts
from onnxaccel.errors import ArtifactMismatchError, ArtifactMissingError
from onnxaccel.pipeline import ConvertedModel, RunnerFromVariant
from onnxaccel.transform.artifacts_build import compiling


def _start(model, target, sizes):
    """What a server's start does with one session: build it, run it at each padded batch size."""
    started = time.perf_counter()
    runner = RunnerFromVariant(ConvertedModel(model, target))()
    row = model.input_shapes["x"][1:]
    outputs = [runner.run({"x": np.linspace(-1, 1, n * int(np.prod(row)), dtype=np.float32).reshape(n, *row)})
               for n in sizes]
    return runner, outputs, time.perf_counter() - started


@pytest.mark.parametrize(("name", "precision"), [("mlp", "fp32"), ("mlp", "fp16"), ("cnn", "fp32")])
def test_the_second_start_loads_the_saved_programs_instead_of_compiling(real_mgx, request, tmp_path, name, precision):
    model = request.getfixturevalue(name)  # conftest.py: the MLP, or the small CNN, bound to batch 2
    target, sizes = native(precision), (2, 4, 8)
    reset_build_counts()
    with compiling(tmp_path / "art") as store:
        cold, want, cold_s = _start(model, target, sizes)
    assert build_counts() == {"sessions": 1, "compiled": 3, "loaded": 0}
    assert [b.cache_hit for b in cold.programs()] == [False] * 3
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    programs = [a for a in manifest["artifacts"] if a["kind"] == "migraphx-native"]
    assert sorted(a["key"]["shapes"]["x"][0] for a in programs) == list(sizes)
    assert all(a["size_bytes"] > 0 and a["key"]["runtime"]["migraphx_target"] == "ref" for a in programs)
    assert len(store.manifest.artifacts) == 3

    reset_build_counts()
    with artifacts.use(tmp_path / "art"):
        warm, got, warm_s = _start(model, target, sizes)
        assert build_counts() == {"sessions": 1, "compiled": 0, "loaded": 3}
        assert all(b.cache_hit and b.parse_seconds == 0 for b in warm.programs())
        for a, b in zip(want, got):
            for output in a:
                np.testing.assert_array_equal(a[output], b[output])
        with pytest.raises(ArtifactMissingError, match="x=3x"):  # a shape not compiled ahead: refused
            warm.run({"x": np.ones((3, *model.input_shapes["x"][1:]), np.float32)})
    assert build_counts()["compiled"] == 0
    compile_s = sum(b.seconds for b in cold.programs())
    load_s = sum(b.seconds for b in warm.programs())
    print(f"\nMIGraphX ref, {name} {precision}: first start {cold_s * 1e3:.1f} ms (programs compiled in "
          f"{compile_s * 1e3:.1f} ms), second start {warm_s * 1e3:.1f} ms (programs loaded in {load_s * 1e3:.1f} ms): load/compile "
          f"{load_s / compile_s:.3f}, start ratio {warm_s / cold_s:.3f}")


def test_programs_of_another_migraphx_build_are_refused_naming_it(real_mgx, mlp, tmp_path):
    with compiling(tmp_path / "art"):
        _start(mlp, native(), (2,))
    path = tmp_path / "art" / "manifest.json"
    data = json.loads(path.read_text())
    for artifact in data["artifacts"]:
        artifact["key"]["runtime"]["migraphx"] = "2.15.0.dev"
    path.write_text(json.dumps(data))
    reset_build_counts()
    with artifacts.use(tmp_path / "art"), pytest.raises(ArtifactMismatchError) as caught:
        _start(mlp, native(), (2,))
    assert f"migraphx {real_mgx.__version__} here, 2.15.0.dev in the manifest" in caught.value.message
    assert build_counts() == {"sessions": 0, "compiled": 0, "loaded": 0}
