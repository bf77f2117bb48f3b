"""Triton's system shared memory extension against a real server on loopback, with tritonclient's own client code
(HTTP and gRPC, tritonclient.utils.shared_memory and its libcshm.so): tensors read from and written into regions
of /dev/shm objects equal an in-process ONNX Runtime run; inputs and outputs mix shared memory and the body;
status and unregister; every bad request is a 400 / INVALID_ARGUMENT naming what is wrong; CUDA shared memory is
refused; ``--shared-memory none`` keeps the old refusal. Several worker processes: test_shared_memory_workers.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.serve.conftest import SERVE, ServerProcess, make_echo
from tests.serve.shm_client import make_two_outputs, new_key, shm_object, triton_shm

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size  # noqa: E402

X = np.array([[0.1, -0.4, 0.9, 0.3], [1.5, 0.2, -0.7, 0.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("shm-repo")
    for name in ("two", "echo"):
        (root / name).mkdir()
    make_two_outputs(root / "two" / "model.onnx")
    make_echo(root / "echo" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def shm_server(repo, tmp_path_factory):
    server = ServerProcess(repo, "--shared-memory", "system", log=tmp_path_factory.mktemp("shm-logs") / "server.log")
    try:
        yield server.wait_ready()
    finally:
        assert server.stop() == 0, server.log()


@pytest.fixture(params=["http", "grpc"])
def client(request, shm_server):
    """(tritonclient module, a client of it); every region is unregistered afterwards."""
    module = tritonhttp if request.param == "http" else tritongrpc
    url = shm_server.url.removeprefix("http://") if request.param == "http" else shm_server.grpc_url
    triton = module.InferenceServerClient(url)
    yield module, triton
    triton.unregister_system_shared_memory()
    triton.close()


def reference(repo, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / "two" / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))


def shm_input(module, region: str, byte_size: int, offset: int = 0, shape=(2, 4)):
    tensor = module.InferInput("x", list(shape), "FP32")
    tensor.set_shared_memory(region, byte_size, offset=offset)
    return tensor


def shm_output(module, name: str, region: str, byte_size: int, offset: int = 0):
    output = module.InferRequestedOutput(name)
    output.set_shared_memory(region, byte_size, offset=offset)
    return output


def output_entries(module, result) -> dict[str, dict]:
    """Each output's metadata (and whether data came back) as the client received it."""
    if module is tritonhttp:
        return {o["name"]: {"parameters": o.get("parameters", {}),
                            "data": "data" in o or "binary_data_size" in o.get("parameters", {})}
                for o in result.get_response()["outputs"]}
    response = result.get_response()
    return {o.name: {"parameters": {k: v.string_param or v.int64_param for k, v in o.parameters.items()},
                     "data": bool(response.raw_output_contents[i])} for i, o in enumerate(response.outputs)}


def test_inputs_and_outputs_through_shared_memory_equal_onnxruntime(client, repo):
    module, triton = client
    shm = triton_shm()
    expected = reference(repo, X)
    with shm_object(4096 + 512) as (in_key, in_handle), shm_object(256) as (out_key, out_handle):
        # The input region starts past the first page and off a page boundary; the tensor at offset 16 in it.
        shm.set_shared_memory_region(in_handle, [X], offset=4096 + 100 + 16)
        triton.register_system_shared_memory("in", in_key, 200, offset=4096 + 100)
        triton.register_system_shared_memory("out", out_key, 256)
        assert "system_shared_memory" in (triton.get_server_metadata() if module is tritonhttp else
                                          triton.get_server_metadata(as_json=True))["extensions"]
        result = triton.infer("two", [shm_input(module, "in", 32, offset=16)],
                              outputs=[shm_output(module, "probs", "out", 24), shm_output(module, "logits", "out",
                                                                                             24, offset=64)])
        for name, offset in (("probs", 0), ("logits", 64)):
            got = shm.get_contents_as_numpy(out_handle, np.float32, [2, 3], offset=offset)
            np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-6)
        entries = output_entries(module, result)
        if module is tritonhttp:  # no parameters, as Triton's HTTP front end (its C++ client needs that)
            assert entries["probs"] == entries["logits"] == {"data": False, "parameters": {}}
        else:
            assert entries["probs"] == {"data": False, "parameters": {"shared_memory_region": "out",
                                                                       "shared_memory_byte_size": 24}}
            assert entries["logits"] == {"data": False, "parameters": {"shared_memory_region": "out",
                                                                        "shared_memory_byte_size": 24,
                                                                        "shared_memory_offset": 64}}
        assert result.get_output("probs") is not None


def test_input_in_shared_memory_outputs_mixed_and_the_reverse(client, repo):
    """An output in shared memory first and one in the body second: over gRPC the body's output is still found
    at its position in raw_output_contents (the shared one has an empty entry there)."""
    module, triton = client
    shm = triton_shm()
    expected = reference(repo, X)
    with shm_object(32) as (in_key, in_handle), shm_object(64) as (out_key, out_handle):
        shm.set_shared_memory_region(in_handle, [X])
        triton.register_system_shared_memory("in", in_key, 32)
        triton.register_system_shared_memory("out", out_key, 64)
        body_output = module.InferRequestedOutput("probs", **({"binary_data": True} if module is tritonhttp else {}))
        result = triton.infer("two", [shm_input(module, "in", 32)],
                              outputs=[shm_output(module, "logits", "out", 64), body_output])
        np.testing.assert_allclose(result.as_numpy("probs"), expected["probs"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(shm.get_contents_as_numpy(out_handle, np.float32, [2, 3]), expected["logits"],
                                   rtol=1e-5, atol=1e-6)
        entries = output_entries(module, result)
        assert entries["probs"]["data"] and not entries["logits"]["data"]

        # The reverse: the input in the body, the output into shared memory.
        tensor = module.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(2 * X)
        triton.infer("two", [tensor], outputs=[shm_output(module, "probs", "out", 24, offset=32)])
        np.testing.assert_allclose(shm.get_contents_as_numpy(out_handle, np.float32, [2, 3], offset=32),
                                   reference(repo, 2 * X)["probs"], rtol=1e-5, atol=1e-6)


def test_bytes_tensors_through_shared_memory(client):
    module, triton = client
    shm = triton_shm()
    text = np.array([b"hello", "wörld".encode()], dtype=np.object_)
    serialized = serialize_byte_tensor(text)
    size = serialized_byte_size(serialized)
    with shm_object(size) as (in_key, in_handle), shm_object(64) as (out_key, out_handle):
        shm.set_shared_memory_region(in_handle, [serialized])
        triton.register_system_shared_memory("text-in", in_key, size)
        triton.register_system_shared_memory("text-out", out_key, 64)
        tensor = module.InferInput("text", [2], "BYTES")
        tensor.set_shared_memory("text-in", size)
        result = triton.infer("echo", [tensor], outputs=[shm_output(module, "echo", "text-out", 64)])
        got = shm.get_contents_as_numpy(out_handle, np.object_, [2])
        assert [bytes(v) for v in got] == [b"hello", "wörld".encode()]
        if module is tritongrpc:
            assert output_entries(module, result)["echo"]["parameters"]["shared_memory_byte_size"] == size


def status(module, triton, name: str = "") -> dict[str, dict]:
    """Registered regions by name, as {name, key, offset, byte_size} (gRPC's JSON leaves zero values out)."""
    if module is tritonhttp:
        return {r["name"]: r for r in triton.get_system_shared_memory_status(name)}
    regions = triton.get_system_shared_memory_status(name, as_json=True).get("regions", {})
    return {n: {"name": r["name"], "key": r["key"], "offset": int(r.get("offset", 0)),
                "byte_size": int(r["byte_size"])} for n, r in regions.items()}


def test_status_lists_regions_and_unregister_removes_them(client):
    module, triton = client
    with shm_object(128) as (key_a, _), shm_object(64) as (key_b, _):
        triton.register_system_shared_memory("a", key_a, 96, offset=32)
        triton.register_system_shared_memory("b", key_b, 64)
        assert status(module, triton) == {
            "a": {"name": "a", "key": key_a, "offset": 32, "byte_size": 96},
            "b": {"name": "b", "key": key_b, "offset": 0, "byte_size": 64}}
        assert list(status(module, triton, "b")) == ["b"]
        triton.unregister_system_shared_memory("a")
        assert list(status(module, triton)) == ["b"]
        with pytest.raises(InferenceServerException, match="No system shared memory region 'a' is registered"):
            status(module, triton, "a")
        with pytest.raises(InferenceServerException, match="region 'a', which is not registered"):
            triton.infer("two", [shm_input(module, "a", 32)])
        triton.unregister_system_shared_memory("never-registered")  # no error, as Triton
        triton.unregister_system_shared_memory()
        assert status(module, triton) == {}


def register(triton, name, key, byte_size, offset=0):
    return lambda: triton.register_system_shared_memory(name, key, byte_size, offset=offset)


def bad_cases(module, triton, keys: dict):
    """(case, call, message) for every refusal; ``keys``: objects made by the test (small: 64 bytes; big: 4096)."""
    infer_x = (lambda region, size=32, offset=0, shape=(2, 4), outputs=None:
               lambda: triton.infer("two", [shm_input(module, region, size, offset, shape)], outputs=outputs))
    return [
        ("unknown region", infer_x("nope"), "Input 'x' names shared memory region 'nope', which is not registered"),
        ("tensor out of bounds", infer_x("small", 32, 48),
         "Input 'x': shared_memory_offset 48 + shared_memory_byte_size 32 = 80 passes the end of region 'small' "
         "(64 bytes)"),
        ("input byte size", infer_x("small", 16),
         "Input 'x' is FP32 of shape [2, 4]: 32 bytes, but its shared_memory_byte_size is 16 (region 'small')"),
        ("output too small", infer_x("big", 32, 0, (2, 4), [shm_output(module, "probs", "small", 8)]),
         "Output 'probs' is FP32 of shape [2, 3]: 24 bytes, but its shared_memory_byte_size is 8 (region 'small'); "
         "give at least 24"),
        ("output out of bounds", infer_x("big", 32, 0, (2, 4), [shm_output(module, "probs", "small", 24, 48)]),
         "Output 'probs': shared_memory_offset 48 + shared_memory_byte_size 24 = 72 passes the end of region 'small'"),
        ("region past the object", register(triton, "r", keys["small"], 64, offset=8),
         f"offset 8 + byte_size 64 = 72 passes the end of the shared memory object '{keys['small']}' (64 bytes)"),
        ("name taken", register(triton, "small", keys["big"], 64), "a region of that name is registered already"),
        ("missing object", register(triton, "r", "/onnxaccel-test-missing", 64),
         "no shared memory object '/onnxaccel-test-missing' exists"),
        *[(f"bad key {key!r}", register(triton, "r", key, 64), "is not a shared memory object's name")
          for key in ("../etc/passwd", "/a/b", "//x", "/..", "", "/" + "n" * 256)],
        ("symbolic link", register(triton, "r", keys["link"], 8), "cannot open the shared memory object"),
        ("cuda", lambda: triton.register_cuda_shared_memory(
            "c", base64.b64encode(b"\0" * 64).decode() if module is tritonhttp else b"\0" * 64, 0, 64),
         "CUDA shared memory is not offered by this server"),
    ]


@pytest.mark.parametrize("case", ["unknown region", "tensor out of bounds", "input byte size", "output too small",
                                  "output out of bounds", "region past the object", "name taken", "missing object",
                                  "bad key", "symbolic link", "cuda"])
def test_bad_requests_are_refused_with_the_reason(client, case):
    module, triton = client
    link = new_key()
    os.symlink("/etc/hostname", f"/dev/shm/{link.strip('/')}")
    try:
        with shm_object(64) as (small, _), shm_object(4096) as (big, _):
            triton.register_system_shared_memory("small", small, 64)
            triton.register_system_shared_memory("big", big, 4096)
            matching = [c for c in bad_cases(module, triton, {"small": small, "big": big, "link": link})
                        if c[0].startswith(case)]
            assert matching
            for name, call, message in matching:
                with pytest.raises(InferenceServerException) as refused:
                    call()
                assert message in refused.value.message(), (name, refused.value.message())
                assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), name
            assert set(status(module, triton)) == {"small", "big"}  # nothing was registered by the refusals
    finally:
        os.unlink(f"/dev/shm/{link.strip('/')}")


def test_an_object_replaced_or_truncated_after_registration_is_refused(client):
    module, triton = client
    with shm_object(64) as (key, _):
        triton.register_system_shared_memory("r", key, 32)
    # The object is unlinked now; made again under the same key, it is another object.
    with shm_object(64, key):
        with pytest.raises(InferenceServerException, match="was replaced .* since the region was registered"):
            triton.infer("two", [shm_input(module, "r", 32)])
        triton.unregister_system_shared_memory("r")
        triton.register_system_shared_memory("r", key, 32)
        triton.infer("two", [shm_input(module, "r", 32)])  # mapped now
        os.truncate(f"/dev/shm/{key.strip('/')}", 16)
        with pytest.raises(InferenceServerException, match="is 16 bytes now, shorter than region 'r'"):
            triton.infer("two", [shm_input(module, "r", 32)])


def test_cuda_shared_memory_registers_nothing_and_unregisters_nothing(client):
    """perf_analyzer --shared-memory system unregisters every CUDA region before it starts (client_backend/triton/
    triton_client_backend.cc UnregisterAllSharedMemory): that must succeed; a status lists none."""
    module, triton = client
    triton.unregister_cuda_shared_memory()
    regions = triton.get_cuda_shared_memory_status() if module is tritonhttp else \
        triton.get_cuda_shared_memory_status(as_json=True).get("regions", {})
    assert not regions
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not offered"):
        triton.get_cuda_shared_memory_status("c")


PARAMETER_CASES = [
    ({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"shared_memory_byte_size": 32}}]},
     "Input 'x' sets shared_memory_byte_size without shared_memory_region"),
    ({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 32, "shared_memory_offset": -1}}]},
     "Input 'x': shared_memory_offset must be a non-negative integer (bytes), got -1"),
    ({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": "32"}}]},
     "Input 'x': shared_memory_byte_size must be a non-negative integer (bytes), got '32'"),
    ({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 32, "binary_data_size": 32}}]},
     "Input 'x' names shared memory region 'r' and also has binary_data_size"),
    ({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0] * 8}],
      "outputs": [{"name": "probs", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 24,
                                                    "binary_data": True}}]},
     "Output 'probs' asks for binary_data and names shared memory region 'r'"),
    ({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0] * 8}],
      "parameters": {"shared_memory_region": "r"}},
     "the request sets shared_memory_region; the shared-memory parameters belong on an input or a requested output"),
]


def test_malformed_shared_memory_parameters_and_bodies_get_400(shm_server):
    with shm_object(64) as (key, _):
        assert httpx.post(f"{shm_server.url}/v2/systemsharedmemory/region/r/register",
                          json={"key": key, "byte_size": 64}).status_code == 200
        try:
            for body, message in PARAMETER_CASES:
                response = httpx.post(f"{shm_server.url}/v2/models/two/infer", json=body)
                assert response.status_code == 400 and message in response.json()["error"], (body, response.text)
            for body in (None, [], {"key": key}, {"key": key, "byte_size": True}, {"key": 5, "byte_size": 8},
                         {"key": key, "byte_size": 0}, {"key": key, "byte_size": 8, "offset": 1.5}):
                response = httpx.post(f"{shm_server.url}/v2/systemsharedmemory/region/q/register",
                                      content=b"" if body is None else json.dumps(body))
                assert response.status_code == 400 and "error" in response.json(), (body, response.text)
        finally:
            httpx.post(f"{shm_server.url}/v2/systemsharedmemory/unregister")


def test_shared_memory_is_off_by_default_and_keeps_the_refusal(repo, tmp_path):
    """Off unless --shared-memory system is given, as Triton's client shared memory since
    triton-inference-server/server PR #8739 (--allow-client-shm=false by default)."""
    server = ServerProcess(repo, log=tmp_path / "none.log").wait_ready()
    try:
        http = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
        grpc = tritongrpc.InferenceServerClient(server.grpc_url)
        assert "system_shared_memory" not in http.get_server_metadata()["extensions"]
        with shm_object(32) as (key, _):
            for triton in (http, grpc):
                with pytest.raises(InferenceServerException, match=r"off on this server \(--shared-memory none\)"):
                    triton.register_system_shared_memory("r", key, 32)
            for module, triton in ((tritonhttp, http), (tritongrpc, grpc)):
                with pytest.raises(InferenceServerException) as refused:
                    triton.infer("two", [shm_input(module, "r", 32)])
                assert "uses the shared-memory extension (shared_memory_region), which this server does not offer" \
                    in refused.value.message()
    finally:
        assert server.stop() == 0, server.log()
    cuda = subprocess.run([sys.executable, "-c", SERVE, "serve", str(repo), "--shared-memory", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert cuda.returncode == 2 and "CUDA shared memory is not offered" in cuda.stdout + cuda.stderr
