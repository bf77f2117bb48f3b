"""What travels between a worker and the model process (serve --shared-models): numeric tensors inside messages go
as raw bytes, not as pickled numpy arrays (whose reduce and reconstruct the one model process would pay on every
request), and come back equal, of the same dtype and shape, and writable."""

from __future__ import annotations

import asyncio
import pickle

import ml_dtypes
import numpy as np
import pytest

from onnxaccel.serve.batcher import BatchTiming
from onnxaccel.serve.model_host import ModelHost, _Worker
from onnxaccel.serve.model_link import ModelLink, decode_arrays

ARRAYS = {
    "view_of_a_batch": np.split(np.arange(64 * 10, dtype=np.float32).reshape(64, 10), [3, 4])[1],
    "fp16": np.full((2, 3), 1.5, dtype=np.float16),
    "bool": np.array([[True, False]]),
    "int64_0d": np.array(7, dtype=np.int64),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "strided": np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],
    "bfloat16": np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16),  # its dtype string is '<V2'
    "float8": np.array([0.5, 1.0], dtype=ml_dtypes.float8_e4m3fn),
}


class Sent:
    """A worker connection that keeps what the model process sends it."""

    def __init__(self):
        self.messages: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.messages.append(message)


def answer(outputs: dict) -> tuple:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        future.set_result((outputs, BatchTiming(0.001, 0.002, 4)))
        worker = Sent()
        ModelHost._answer(worker, 9, "m", future)
        return worker.messages[0]
    finally:
        loop.close()


def test_an_answer_carries_its_outputs_as_raw_bytes_that_decode_to_the_same_arrays():
    message = answer(ARRAYS)
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"_reconstruct" not in data  # no ndarray pickled: nothing for numpy to reconstruct at the worker
    got = decode_arrays(pickle.loads(data)[2])
    assert set(got) == set(ARRAYS)
    for name, want in ARRAYS.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert np.array_equal(got[name], want), name
        assert got[name].flags.writeable, name
    got["fp16"][0, 0] = 3  # the worker owns its copy


def test_a_large_bfloat16_input_keeps_its_dtype_through_the_arena():
    """Past INLINE_BYTES a tensor goes through the worker's arena, described by dtype: bfloat16's dtype string
    ('<V2') would come back as raw bytes."""
    link = ModelLink("/nonexistent", lambda described: None, lambda reason: None, arena_bytes=1 << 22)
    value = np.linspace(-4, 4, 64 * 1024).astype(ml_dtypes.bfloat16).reshape(64, 1024)
    try:
        described, slots = link._place({"x": value})
        assert described["x"][0] == "arena" and slots
        flat = np.frombuffer(link.arena.memory, dtype=np.uint8)
        got = _Worker(None, link.arena.memory, flat).tensor(pickle.loads(pickle.dumps(described))["x"])
        assert got.dtype == value.dtype and np.array_equal(got, value)
    finally:
        link.arena.close()


def test_string_outputs_still_travel_as_arrays():
    strings = np.array([["a", "bc"]], dtype=object)
    got = decode_arrays(pickle.loads(pickle.dumps(answer({"labels": strings})))[2])
    assert got["labels"].tolist() == [["a", "bc"]]


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_small_inputs_sent_inline_reach_the_model_process_unchanged(name):
    """A tensor under INLINE_BYTES rides in the message; the model process reads it back as it was sent."""
    link = ModelLink("/nonexistent", lambda described: None, lambda reason: None, arena_bytes=1 << 20)
    try:
        described, slots = link._place({"x": ARRAYS[name]})
    finally:
        if link.arena is not None:
            link.arena.close()
    assert not slots and described["x"][0] == "inline"
    data = pickle.dumps(described, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"_reconstruct" not in data
    value = _Worker(None, None).tensor(pickle.loads(data)["x"])
    assert value.dtype == ARRAYS[name].dtype and np.array_equal(value, ARRAYS[name])
    assert value.flags.writeable
