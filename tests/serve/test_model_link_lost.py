"""A request sent just as the model process dies is a 503 the client may retry, never a 500. Under load after a
SIGKILL of the model process, uvloop's transport refused the write ("unable to perform operation on
<UnixTransport closed=True>; the handler is closed") before the link's reader had noticed the connection end, and
that RuntimeError reached the client as HTTP 500. Real ModelLink and, where installed, a real uvloop transport."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from onnxaccel.serve.model_link import ModelLink
from onnxaccel.serve.protocol import ProtocolError


def _link() -> ModelLink:
    return ModelLink("/nonexistent", on_models=lambda models: None, on_lost=lambda reason: None)


class RefusingWriter:
    """A writer whose transport is gone but not yet marked closing: uvloop's error text on write."""

    def is_closing(self) -> bool:
        return False

    def writelines(self, data) -> None:
        raise RuntimeError("unable to perform operation on <UnixTransport closed=True reading=False "
                           "0x7f0000000000>; the handler is closed")

    def close(self) -> None:
        pass


def test_a_refused_write_is_a_503_and_frees_what_it_took():
    async def scenario():
        link = _link()
        link._writer = RefusingWriter()
        try:
            with pytest.raises(ProtocolError) as refused:
                await link.request("infer", "mlp", tensors={"x": np.ones((1, 4), np.float32)})
            return refused.value, link
        finally:
            if link.arena is not None:
                link.arena.close()

    error, link = asyncio.run(scenario())
    assert error.status == 503 and error.retry_after == 1 and "restarting" in error.message
    assert link.inflight["mlp"] == 0 and not link._pending


def test_a_closed_uvloop_transport_is_a_503():
    uvloop = pytest.importorskip("uvloop")

    async def scenario():
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        theirs.close()
        writer.transport.abort()  # the model process is gone
        await asyncio.sleep(0)
        link = _link()
        link._writer = writer
        try:
            with pytest.raises(ProtocolError) as refused:
                await link.request("infer", "mlp", tensors={"x": np.ones((1, 4), np.float32)})
            return refused.value
        finally:
            if link.arena is not None:
                link.arena.close()

    error = uvloop.run(scenario())
    assert error.status == 503
