"""The RunnerPool on real ONNX Runtime CPU sessions: instances built and warmed in their own threads, one
capture gate, a session per bucket, bound sessions replayed, direct copies, the row join and its GIL setting,
arena shrinkage, and the process-level helpers (GPU wait, pinning) that callers outside engines use.

ONNX Runtime's CPU provider binds inputs and outputs the same way a GPU provider does but captures nothing;
the graph path here is therefore the bind/update/replay logic, not a CUDA graph (measured on GPUs:
docs/BENCHMARKS.md)."""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
import pytest
from host_libraries import library_loads

import onnxaccel.engines.pool as pool_module
import onnxaccel.engines.pool_io as pool_io
from onnxaccel.engines.pool import (CaptureGate, RunnerPool, pin_for_copies, set_gpu_wait, unpin_for_copies)
from onnxaccel.engines.pool_io import join_rows
from onnxaccel.errors import InputError
from onnxaccel.target import parse_target


def rows(*counts: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.random((n, 4), dtype=np.float32)} for n in counts]


# -- the row join ---------------------------------------------------------------------------------------

def reference_join(values, size):
    joined = np.concatenate(values, axis=0)
    pad = size - joined.shape[0]
    return np.concatenate([joined, np.repeat(joined[-1:], pad, axis=0)]) if pad else joined


@pytest.mark.parametrize("size", [6, 8])
def test_join_rows_copies_parts_in_order_and_pads_with_the_last_row(size):
    rng = np.random.default_rng(3)
    values = [rng.random((n, 3, 4), dtype=np.float32) for n in (1, 2, 3)]
    buffer = np.full((size, 3, 4), -1.0, dtype=np.float32)
    join_rows(buffer, values)
    assert np.array_equal(buffer, reference_join(values, size))


def test_join_rows_refuses_more_rows_than_the_buffer_holds():
    buffer = np.zeros((3, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="more than the buffer's 3 rows"):
        join_rows(buffer, [np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)])


def test_join_rows_handles_strided_and_other_dtype_parts():
    rng = np.random.default_rng(4)
    base = rng.random((4, 6), dtype=np.float32)
    strided = base[:, ::2]  # not C-contiguous: copied by numpy, not memmove
    other = rng.random((1, 3)).astype(np.float64)  # cast on assignment
    buffer = np.zeros((5, 3), dtype=np.float32)
    join_rows(buffer, [strided, other])
    assert np.array_equal(buffer[:4], strided)
    assert np.array_equal(buffer[4], other[0].astype(np.float32))


@pytest.mark.parametrize("holds", [True, False])
def test_joins_keep_the_gil_only_where_the_pool_says(compiled, reference, monkeypatch, holds):
    """``join_holds_gil`` is a setting of each pool (serve's model process turns it off on its pools): the
    join copies with the GIL-holding memmove, or with ctypes.memmove, which releases it."""
    used = []
    holding, releasing = pool_io._memmove_holding_gil, ctypes.memmove
    monkeypatch.setattr(pool_io, "_memmove_holding_gil", lambda *a: (used.append("holds"), holding(*a))[1])
    monkeypatch.setattr(ctypes, "memmove", lambda *a: (used.append("releases"), releasing(*a))[1])
    pool = RunnerPool([compiled.runner], owns=False, join_holds_gil=holds)
    try:
        parts = rows(2, 3)
        outputs, _ = pool.submit(0, pool.run_rows, 0, parts).result()
        np.testing.assert_array_equal(outputs["probs"], reference(np.concatenate([p["x"] for p in parts])))
        assert used == ["holds" if holds else "releases"] * 2 and "join" in pool.phases[0]
    finally:
        pool.close()


# -- the capture gate -------------------------------------------------------------------------------------

def test_a_capture_waits_for_running_batches_and_holds_new_ones_back():
    gate, events = CaptureGate(), []
    batch_running, release_batch = threading.Event(), threading.Event()

    def batch(name, hold=None):
        with gate.shared():
            events.append(f"{name} start")
            if hold is not None:
                batch_running.set()
                hold.wait(5)
            events.append(f"{name} end")

    def capture():
        with gate.exclusive():
            events.append("capture start")
            time.sleep(0.1)
            events.append("capture end")

    first = threading.Thread(target=batch, args=("a", release_batch))
    first.start()
    batch_running.wait(5)
    capturing = threading.Thread(target=capture)
    capturing.start()
    time.sleep(0.1)
    later = threading.Thread(target=batch, args=("b",))  # arrives while the capture waits: goes after it
    later.start()
    time.sleep(0.1)
    assert events == ["a start"]
    release_batch.set()
    for thread in (first, capturing, later):
        thread.join(5)
    assert events == ["a start", "a end", "capture start", "capture end", "b start", "b end"]


def test_warm_ups_hold_the_gate_exclusively_and_padded_runs_share_it(compiled):
    gate = CaptureGate()
    pool = RunnerPool([compiled.runner, compiled.new_runner()], buckets=(1, 2, 4), one_capture_at_a_time=True,
                      gate=gate, name="gated")
    seen = []
    real = pool._execute

    def spy(index, feeds, **how):
        seen.append((index, threading.current_thread().name, gate._writing, gate._readers))
        return real(index, feeds, **how)

    pool._execute = spy
    try:
        assert pool.warm_up() == [1, 2, 4]
        assert {s[2:] for s in seen} == {(True, 0)}  # every warm-up alone, under the exclusive gate
        assert {(i, name.rsplit("_", 1)[0]) for i, name, *_ in seen} == {(0, "run-gated-0"), (1, "run-gated-1")}
        seen.clear()
        pool.submit(1, pool.run_rows, 1, rows(1, 2)).result()
        assert seen[0][2:] == (False, 1)  # a padded run holds it shared
    finally:
        pool.close()


# -- building and running ------------------------------------------------------------------------------------

def test_build_makes_each_runner_in_the_thread_that_runs_it(compiled, reference):
    made = []

    def make():
        made.append(threading.current_thread().name)
        return compiled.new_runner()

    pool = RunnerPool.build(make, 2, buckets=(1, 2, 4), session_per_bucket=True, name="built")
    try:
        assert made == ["run-built-0_0"] * 3 + ["run-built-1_0"] * 3
        assert [sorted(s) for s in pool.sessions] == [[1, 2, 4], [1, 2, 4]]
        assert all(s[1] is r for s, r in zip(pool.sessions, pool.runners))
        parts = rows(1, 2)
        outputs, _ = pool.submit(1, pool.run_rows, 1, parts).result()
        assert outputs["probs"].shape == (3, 3)  # the padding row is dropped
        np.testing.assert_array_equal(outputs["probs"], reference(np.concatenate([p["x"] for p in parts])))
    finally:
        pool.close()
    assert all(r.session is None for r in pool.runners)  # the pool owned them


def test_build_closes_what_it_built_when_an_instance_fails(compiled):
    made = []

    def make():
        if len(made) == 3:
            raise RuntimeError("out of device memory")
        made.append(compiled.new_runner())
        return made[-1]

    with pytest.raises(RuntimeError, match="out of device memory"):
        RunnerPool.build(make, 2, buckets=(1, 2), session_per_bucket=True)
    assert len(made) == 3 and all(r.session is None for r in made)


def test_the_padded_size_is_the_smallest_bucket_that_holds_the_rows(compiled):
    pool = RunnerPool([compiled.runner], owns=False, buckets=(1, 2, 4, 8))
    try:
        assert [pool.bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 9]
        pool.buckets = ()
        assert pool.bucket(7) == 7
    finally:
        pool.close()


def test_bound_sessions_per_size_answer_like_a_plain_session(compiled, reference):
    """The graph path (inputs and outputs bound once per instance and size, new values copied in before each
    run), on ONNX Runtime's CPU provider, which binds the same way but captures nothing."""
    sizes = {size: compiled.new_runner() for size in (1, 2, 4, 8)}
    pool = RunnerPool([sizes[1]], model=compiled.model, sessions=[sizes], buckets=(1, 2, 4, 8), graph=True)
    try:
        assert pool.warm_up() == [1, 2, 4, 8]
        assert sorted(pool.bound) == [(0, 1), (0, 2), (0, 4), (0, 8)]
        for counts in ((1, 2), (3,), (2, 2, 1), (8,)):  # padded to 4, 4, 8, 8: each size's binding is reused
            parts = rows(*counts, seed=sum(counts))
            outputs, _ = pool.submit(0, pool.run_rows, 0, parts).result()
            want = reference(np.concatenate([p["x"] for p in parts]))
            np.testing.assert_array_equal(outputs["probs"], want)  # new inputs every time: no stale values
            assert set(pool.phases[0]) >= {"copy_in", "replay", "copy_out"}
    finally:
        pool.close()
    assert not pool.bound


class Spanned:
    """A real call (a session's run_unchecked, a bound run's run or update) that records when it began and ended,
    with a tag, held open a little so that two threads' calls would overlap if nothing kept them apart."""

    def __init__(self, call, spans: list, tag: tuple, hold_s: float = 0.03):
        self.call, self.spans, self.tag, self.hold_s = call, spans, tag, hold_s

    def __call__(self, *args):
        began = time.perf_counter()
        result = self.call(*args)
        time.sleep(self.hold_s)
        self.spans.append((began, time.perf_counter(), self.tag))
        return result


class SpannedBinding:
    """A bound run whose ``run`` and ``update`` (the copy in) are Spanned; the rest is the real binding's."""

    def __init__(self, bound, spans: list, index: int):
        self.bound = bound
        self.run = Spanned(bound.run, spans, ("run", index))
        self.update = Spanned(bound.update, spans, ("copy", index), hold_s=0.02)

    def __getattr__(self, name):
        return getattr(self.bound, name)


def overlapping(spans: list, first: str, second: str) -> int:
    """How many pairs of a ``first`` span and a ``second`` span of another instance overlap in time."""
    return sum(1 for a0, a1, (kind_a, i) in spans for b0, b1, (kind_b, j) in spans
               if kind_a == first and kind_b == second and i != j and a0 < b1 and b0 < a1)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("serial", [False, True])
def test_runs_take_turns_only_where_the_pool_says(compiled, reference, graph, serial):
    """``one_run_at_a_time`` (serve --streams serial): two instances' runs never overlap, each waits for its turn
    (the ``turn`` phase, outside ``run``/``replay`` and inside the seconds returned), the copies in go on beside
    the other instance's run (the turn holds the run alone), and the answers are the plain session's; without
    it the same runs overlap. Both the plain run path and the bound (graph) path; warm-ups take no turn."""
    spans: list = []
    if graph:
        sizes = [{size: compiled.new_runner() for size in (1, 2, 4)} for _ in range(2)]
        pool = RunnerPool([s[1] for s in sizes], model=compiled.model, sessions=sizes, buckets=(1, 2, 4),
                          graph=True, one_run_at_a_time=serial)
        pool.warm_up()
        pool.bound = {key: SpannedBinding(bound, spans, key[0]) for key, bound in pool.bound.items()}
    else:
        pool = RunnerPool([compiled.new_runner(), compiled.new_runner()], one_run_at_a_time=serial)
        for index, runner in enumerate(pool.runners):
            runner.run_unchecked = Spanned(runner.run_unchecked, spans, ("run", index))
    try:
        def run(index, parts):  # in the instance's thread: the run, and the phases it recorded
            outputs, seconds = pool.run_rows(index, parts)
            return outputs, seconds, dict(pool.phases[index])

        batches = [rows(4 if graph else 3, seed=k) for k in range(8)]
        futures = [pool.submit(k % 2, run, k % 2, parts) for k, parts in enumerate(batches)]
        waited = 0.0
        for parts, future in zip(batches, futures):
            outputs, seconds, phases = future.result()
            np.testing.assert_array_equal(outputs["probs"], reference(parts[0]["x"]))
            assert ("turn" in phases) is serial
            own = phases["replay"] if graph else phases["run"]
            assert own >= 0.03 and seconds >= own + phases.get("turn", 0.0)  # the wait: in seconds, not the run's
            waited += phases.get("turn", 0.0)
        assert sum(1 for *_, (kind, _) in spans if kind == "run") == 8
        assert (overlapping(spans, "run", "run") == 0) if serial else (overlapping(spans, "run", "run") > 0)
        assert (waited > 0.01) is serial  # both instances' first runs were asked for at once: one waited
        if graph and serial:
            assert overlapping(spans, "copy", "run") > 0  # a copy in beside the other instance's run
        assert (pool.turns.lock is not None) is serial
        pool.turns = type(pool.turns)(True)  # warm-ups take no turn: a held turn does not stop one
        with pool.turns.lock:
            pool.submit(0, pool._warm, 0, 1).result(timeout=10)
    finally:
        pool.close()


class HostCopier:
    """Stand-in for DeviceCopier where no GPU exists: the same ``copy(jobs)``/``close()`` API, with host memory as
    the "device" and the runtime's error text when told to fail at a given piece."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.pieces, self.kinds = fail_at, 0, []

    def copy(self, jobs, kind=1):
        self.kinds.append(kind)
        for destination, pieces in jobs:
            at = destination
            for address, nbytes in pieces:
                self.pieces += 1
                if self.pieces == self.fail_at:
                    raise RuntimeError("cudaMemcpyAsync failed: error 1")
                ctypes.memmove(at, address, nbytes)
                at += nbytes

    def close(self):
        pass


class HostAddressed:
    """A CPU IO binding that tells its input addresses, as a GPU binding does (input_addresses)."""

    def __init__(self, bound):
        self.bound = bound

    def input_addresses(self):
        return {name: value.data_ptr() for name, value in self.bound.values.items()}

    def __getattr__(self, name):
        return getattr(self.bound, name)


def _host_device_pool(compiled) -> RunnerPool:
    """A graph pool with a session per bucket (1, 2, 4, 8), warmed, whose "device" is host memory: bindings that
    tell their input addresses and the HostCopier stand-in."""
    sizes = {size: compiled.new_runner() for size in (1, 2, 4, 8)}
    pool = RunnerPool([sizes[1]], model=compiled.model, sessions=[sizes], buckets=(1, 2, 4, 8), graph=True)
    pool.warm_up()
    pool.bound = {k: HostAddressed(v) for k, v in pool.bound.items()}
    pool.copiers = [HostCopier()]
    return pool


def test_direct_copies_place_each_part_in_its_rows_and_fall_back_to_the_host_join(compiled, reference,
                                                                                   monkeypatch):
    """The --shared-models graph path copies each request from page-locked memory into its rows of the bound
    input. Here the "device" is host memory (a CPU binding and the HostCopier stand-in; page-locking is
    assumed): every batch shape gives exactly the unbatched rows, no host join happens, and a copy that fails
    part-way falls back to the host join with the reason kept."""
    pool = _host_device_pool(compiled)
    try:
        monkeypatch.setattr(pool_module, "is_pinned", lambda address, nbytes: True)
        for counts in ((1, 2), (3,), (2, 2, 1), (8,), (1,), (5, 3), (1, 1, 1)):
            parts = rows(*counts, seed=len(counts))
            out, _ = pool.run_rows(0, parts)
            np.testing.assert_array_equal(out["probs"], reference(np.concatenate([p["x"] for p in parts])))
            assert "copy_in" in pool.phases[0] and "join" not in pool.phases[0]
        pool.copiers = [HostCopier(fail_at=2)]
        parts = rows(2, 1, seed=9)
        out, _ = pool.run_rows(0, parts)
        np.testing.assert_array_equal(out["probs"], reference(np.concatenate([p["x"] for p in parts])))
        assert pool.copiers[0] is None and "cudaMemcpyAsync failed" in pool.direct_copy_note
        assert "join" in pool.phases[0]
    finally:
        pool.close()


class OnDevice:
    """An array in "device memory" as a GPU library hands it on (``__cuda_array_interface__``, e.g. a torch
    tensor from a GPU decoder); here the memory is the host's, as the HostCopier stand-in's "device" is."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.shape = self.array.shape
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.array.dtype.str, "strides": None,
                                         "data": (self.array.ctypes.data, False), "version": 3}


class TorchOnDevice(OnDevice):
    """A torch CUDA tensor's way back to the host: ``cpu()`` (a copy; ``numpy()`` on it)."""

    def __init__(self, array):
        super().__init__(array)
        self.copied_back = 0

    def cpu(self):
        self.copied_back += 1
        return self.array.copy()


def test_rows_in_device_memory_are_copied_device_to_device(compiled, reference, monkeypatch):
    """A GPU decoder's batch stays on the device: the pool copies it device to device (cudaMemcpyDeviceToDevice,
    3) into the bound input and answers as for host rows. Where a device copy fails (or the instance has none)
    the rows come back to the host through their library (torch's cpu()) and are joined there, with the same
    answers; rows with no way back are refused with the reason, never joined from device pointers."""
    from onnxaccel.engines.pool_io import device_address

    pool = _host_device_pool(compiled)
    try:
        for counts in ((3,), (2, 2), (8,)):
            parts = rows(*counts, seed=sum(counts))
            out, _ = pool.run_rows(0, [{"x": OnDevice(p["x"])} for p in parts])
            np.testing.assert_array_equal(out["probs"], reference(np.concatenate([p["x"] for p in parts])))
        assert pool.copiers[0].kinds == [3, 3, 3]
        monkeypatch.setattr(pool_module, "is_pinned", lambda address, nbytes: True)
        for counts in ((2, 3), (1, 1, 2), (4, 4)):  # a hybrid decoder's unit: host rows, then device rows, mixed
            parts = rows(*counts, seed=len(counts))
            mixed = [{"x": OnDevice(p["x"]) if i % 2 else p["x"]} for i, p in enumerate(parts)]
            pool.copiers[0].kinds.clear()
            out, _ = pool.run_rows(0, mixed)
            np.testing.assert_array_equal(out["probs"], reference(np.concatenate([p["x"] for p in parts])))
            assert sorted(pool.copiers[0].kinds) == [1, 3] and "join" not in pool.phases[0]
        pool.copiers = [HostCopier(fail_at=1)]  # the device copy fails: the batch comes to the host instead
        parts = rows(2, 3, seed=5)
        fed = [TorchOnDevice(p["x"]) for p in parts]
        out, _ = pool.run_rows(0, [{"x": f} for f in fed])
        np.testing.assert_array_equal(out["probs"], reference(np.concatenate([p["x"] for p in parts])))
        assert pool.copiers[0] is None and [f.copied_back for f in fed] == [1, 1] and "join" in pool.phases[0]
        strided = TorchOnDevice(rows(3, seed=7)[0]["x"])  # a transposed view on the device: no direct copy
        strided.__cuda_array_interface__ = {**strided.__cuda_array_interface__, "strides": (4, 12)}
        out, _ = pool.run_rows(0, [{"x": strided}])
        np.testing.assert_array_equal(out["probs"], reference(strided.array))
        assert strided.copied_back == 1
        with pytest.raises(ValueError, match="direct copies to the GPU failed .* got rows in device memory "
                                             r"\(OnDevice\) with no way to copy them to the host"):
            pool.run_rows(0, [{"x": OnDevice(rows(2, seed=1)[0]["x"])}])
    finally:
        pool.close()
    strided = OnDevice(np.zeros((4, 3), np.float32))
    strided.__cuda_array_interface__["strides"] = (4, 16)  # a transposed view: not C-contiguous
    assert device_address(strided) is None and device_address(np.zeros(3)) is None
    assert device_address(OnDevice(np.zeros((4, 3), np.float32)))[1] == 48


def test_a_timing_loop_gets_the_bare_bound_call_made_in_its_thread(compiled, reference):
    pool = RunnerPool([compiled.runner] * 2, owns=False)
    feeds = {"x": np.ones((1, 4), np.float32)}
    try:
        call = pool.submit(1, pool.call, 1, feeds).result()
        assert call.__self__ is pool.bound[(1, -1)] and call.__name__ == "run"  # nothing wrapped around it
        pool.submit(1, call).result()
        np.testing.assert_array_equal(pool.bound_outputs(1)()["probs"], reference(feeds["x"]))
        assert pool.bound_outputs(0) is None
        plain = pool.call(0, feeds, iobinding=False)
        np.testing.assert_array_equal(plain()["probs"], reference(feeds["x"]))
        with pytest.raises(InputError, match="expects float32"):  # checked once, when bound
            pool.call(0, {"x": np.ones((1, 4), np.float64)})
    finally:
        pool.close()
    assert compiled.runner.session is not None  # not the pool's to close


def test_arena_shrinkage_is_set_on_every_session_but_not_under_graphs(compiled):
    sizes = {size: compiled.new_runner() for size in (1, 2)}
    pool = RunnerPool([sizes[1]], sessions=[sizes], buckets=(1, 2), arena_shrinkage=True)
    try:
        pool.warm_up()
        for runner in sizes.values():
            assert runner._run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    finally:
        pool.close()
    graphed = RunnerPool([compiled.new_runner()], buckets=(1,), graph=True, arena_shrinkage=True)
    try:
        assert graphed.runners[0]._run_options is None
    finally:
        graphed.close()


# -- the process's GPU runtime for callers outside engines ---------------------------------------------------

def test_gpu_wait_and_pinning_of_a_cpu_target_do_nothing():
    cpu = parse_target("cpu")
    assert set_gpu_wait(cpu, "block") == ""
    buffer = np.zeros(4096, np.uint8)
    assert pin_for_copies(cpu, buffer.ctypes.data, buffer.nbytes) == "no GPU runtime (CPU target)"
    unpin_for_copies(cpu, buffer.ctypes.data)


@pytest.mark.skipif(library_loads("libcuda.so.1"), reason="an NVIDIA driver is present")
def test_gpu_wait_of_a_cuda_target_says_why_it_was_not_set():
    assert "libcuda.so.1" in set_gpu_wait(parse_target("cuda"), "block")


@pytest.mark.skipif(os.path.isdir("/sys/module/amdgpu"), reason="the amdgpu driver is loaded")
def test_pinning_for_a_migraphx_target_says_why_not_and_holds_the_gate_shared():
    buffer = np.zeros(4096, np.uint8)
    reason = pin_for_copies(parse_target("migraphx"), buffer.ctypes.data, buffer.nbytes)
    assert "libamdhip64" in reason
