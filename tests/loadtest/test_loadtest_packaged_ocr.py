"""`onnxaccel loadtest` against a real server serving ddddocr's packaged text recognizer (issue 38, item 7 on a
real model of its kind): input1[1, 1, 64, image_wdith], whose batch axis is fixed to 1 (the server's metadata
gives [1, 1, 64, -1]). tests/loadtest/test_loadtest_shapes.py covers a built model with a free batch axis."""

from __future__ import annotations

import json

import pytest

from tests.loadtest.test_loadtest import run_loadtest
from tests.serve.conftest import ServerProcess


@pytest.fixture(scope="module")
def ddddocr_server(ddddocr_model, tmp_path_factory):
    proc = ServerProcess(ddddocr_model, "--max-queue-delay-ms", "1",
                         log=tmp_path_factory.mktemp("ddddocr") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


def loadtest(server, *args):
    return run_loadtest(server.url, "--model", "common", "-c", "1", "--duration", "0.3", "--warmup", "0",
                        "--workers", "1", *args)


def test_named_width_binds_and_requests_succeed(ddddocr_server):
    done = loadtest(ddddocr_server, "--shape", "image_wdith=160", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["input_shapes"] == {"input1": [1, 1, 64, 160]}
    level = data["levels"][0]
    assert level["requests"] > 0 and level["error_count"] == 0
    assert level["inferences_per_s"] == pytest.approx(level["requests_per_s"])


def test_unbound_width_suggests_a_shape_with_the_fixed_dims(ddddocr_server):
    done = loadtest(ddddocr_server)
    text = " ".join(done.stderr.split())
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "input 'input1' axis 3" in text and "1x3x224x224" not in text
    assert f"onnxaccel loadtest {ddddocr_server.url} --model common --shape input1=1x1x64x" in text, text
    done = loadtest(ddddocr_server, "--shape", "input1=2x1x64x160")
    text = " ".join(done.stderr.split())
    assert done.returncode != 0 and "axis 0 is fixed to 1" in text, text


def test_batch_beyond_a_fixed_batch_axis_is_refused_or_counted_as_sent(ddddocr_server):
    """--batch 2 on an axis fixed to 1: either refused (as the full shape 2x1x64x160 is), or the report counts
    the rows the requests really carry, never rows it did not send."""
    done = loadtest(ddddocr_server, "--shape", "image_wdith=160", "--batch", "2", "--json")
    if done.returncode != 0:
        # With --json an error is a JSON object on stdout (cli/common.py report_error), as for every command.
        assert "Traceback" not in done.stderr, done.stderr
        error = json.loads(done.stdout)
        text = " ".join(f"{error['message']} {error.get('hint') or ''}".split())
        assert error["error"] == "ShapeError" and done.returncode == 2, done.stdout
        assert "input1" in text and "axis 0" in text and "fixed to 1" in text, text
        plain = loadtest(ddddocr_server, "--shape", "image_wdith=160", "--batch", "2")
        text = " ".join(plain.stderr.split())
        assert plain.returncode == 2 and "Traceback" not in plain.stderr and "fixed to 1" in text, text
        return
    data = json.loads(done.stdout)
    sent = data["input_shapes"]["input1"][0]
    level = data["levels"][0]
    assert level["error_count"] == 0
    assert level["inferences_per_s"] == pytest.approx(level["requests_per_s"] * sent), (
        f"batch {data['config']['batch']} asked, input_shapes {data['input_shapes']}, "
        f"{level['requests_per_s']:.1f} req/s reported as {level['inferences_per_s']:.1f} inferences/s")
