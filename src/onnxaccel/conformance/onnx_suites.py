"""ONNX's own backend test suites as case folders: the data shipped in the onnx wheel, and the node cases
written from onnx's generators in the layout `check` reads.

The onnx wheel ships ``onnx/backend/test/data/{simple,pytorch-converted,pytorch-operator,real,light}`` but not
the ~1900 node cases; ``write_node_cases`` writes them from ``onnx.backend.test.case.node.collect_testcases``
with the layout code of ``backend-test-tools generate-data`` (onnx/onnx, onnx/backend/test/cmd_tools.py
``generate_data``, release 1.23.0), once per onnx version.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import warnings
from pathlib import Path

from onnxaccel.paths import cache_root

#: The suites shipped as data in the onnx wheel, and "node", written by ``write_node_cases``.
SHIPPED_SUITES = ("simple", "pytorch-converted", "pytorch-operator", "real", "light")
SUITES = ("node",) + SHIPPED_SUITES
_DONE = ".complete"


def shipped_data_dir() -> Path:
    """The backend test data folder shipped inside the installed ``onnx`` package."""
    import onnx

    return Path(onnx.__file__).resolve().parent / "backend" / "test" / "data"


def node_cases_dir() -> Path:
    """Where the node cases of the installed onnx are written: <cache>/conformance/onnx-VERSION/node."""
    import onnx


    return cache_root() / "conformance" / f"onnx-{onnx.__version__}" / "node"


def suite_dir(suite: str) -> Path:
    """The folder holding a named suite's test cases, writing the node cases on first use."""
    if suite == "node":
        return write_node_cases(node_cases_dir())
    return shipped_data_dir() / suite


def write_node_cases(dest: Path) -> Path:
    """Write every node case into ``dest/NAME/`` (model.onnx + test_data_set_N/*.pb) unless already there.
    A case whose rtol/atol differ from ONNX's defaults gets them in a data.json, as ONNX's loader reads it."""
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    if (dest / _DONE).exists():
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the generators' own overflow warnings (float8/int4 casts)
        cases = collect_testcases(None)
    for case in cases:
        folder = tmp / case.name
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(case.model.SerializeToString())
        if (case.rtol, case.atol) != (1e-3, 1e-7):
            (folder / "data.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}))
        graph = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets):
            data_set = folder / f"test_data_set_{i}"
            data_set.mkdir()
            for j, value in enumerate(inputs):
                _write(data_set / f"input_{j}.pb", value, graph.input[j], numpy_helper, onnx)
            for j, value in enumerate(outputs):
                _write(data_set / f"output_{j}.pb", value, graph.output[j], numpy_helper, onnx)
    (tmp / _DONE).write_text(onnx.__version__)
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)
    return dest


def _write(path: Path, value, info, numpy_helper, onnx) -> None:
    """One value as generate_data writes it: by the graph's type of that input or output."""
    kind = info.type.WhichOneof("value")
    if kind == "map_type":
        proto = numpy_helper.from_dict(value, info.name)
    elif kind == "sequence_type":
        proto = numpy_helper.from_list(value, info.name)
    elif kind == "optional_type":
        proto = numpy_helper.from_optional(value, info.name)
    elif isinstance(value, onnx.TensorProto):
        proto = value
    else:
        proto = numpy_helper.from_array(value, info.name)
    path.write_bytes(proto.SerializeToString())
