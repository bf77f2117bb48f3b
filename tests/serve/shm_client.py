"""The client side of the system shared memory tests: tritonclient's own helpers (tritonclient.utils.shared_memory,
which drives the libcshm.so its wheel ships), regions made and removed with them, a two-output model, and the
server processes that map a /dev/shm object.

tritonclient 2.41.0's shared_memory module imports pkg_resources only to find libcshm.so
(tritonclient/utils/shared_memory/__init__.py: ``pkg_resources.resource_filename``), and setuptools 82.0.0 removed
pkg_resources (its changelog, "Deprecations and Removals"). Where it is missing, a stand-in with that one function
(importlib.resources) is installed before the import, so tritonclient's code itself runs unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import sys
import types
import uuid
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tests.conftest import make_mlp


def triton_shm():
    """tritonclient.utils.shared_memory, importable without pkg_resources."""
    try:
        import pkg_resources  # noqa: F401 - present with setuptools < 82
    except ModuleNotFoundError:
        stand_in = types.ModuleType("pkg_resources")
        stand_in.resource_filename = lambda package, name: str(importlib.resources.files(package) / name)
        sys.modules["pkg_resources"] = stand_in
    import tritonclient.utils.shared_memory as shm

    return shm


def new_key() -> str:
    """A fresh POSIX shared memory key (``/name``, as tritonclient's examples use)."""
    return f"/onnxaccel-test-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def shm_object(byte_size: int, key: str | None = None):
    """A shared memory object made by tritonclient (create_shared_memory_region): yields (key, handle); unlinked
    at the end (destroy_shared_memory_region)."""
    shm = triton_shm()
    key = key or new_key()
    handle = shm.create_shared_memory_region(key.strip("/"), key, byte_size)
    try:
        yield key, handle
    finally:
        with contextlib.suppress(Exception):
            shm.destroy_shared_memory_region(handle)


def make_two_outputs(path: Path) -> Path:
    """The tests' mlp (x[batch, 4] -> probs[batch, 3]) with its logits as a second output."""
    make_mlp(path)
    model = onnx.load(str(path))
    model.graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3]))
    onnx.save(model, str(path))
    return path


def children(pid: int) -> list[int]:
    """Every process below ``pid`` (a supervisor's workers and model process)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").iterdir():
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    found.append(int(child))
                    todo.append(int(child))
    return found


def mapping(pids: list[int], key: str) -> list[int]:
    """The processes among ``pids`` that map the /dev/shm object of ``key`` (their /proc/PID/maps name it)."""
    path = f"/dev/shm/{key.strip('/')}"
    holders = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if path in Path(f"/proc/{pid}/maps").read_text():
                holders.append(pid)
    return holders
