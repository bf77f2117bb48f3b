"""System shared memory regions belong to the local user that registered them (issue 37): a real server on
loopback (one process, and two workers sharing the registry file), root's tritonclient clients here and nobody's
in a subprocess (shm_other_user.py). Another user's region is unknown to a client (requests, status, unregister);
a client may register only objects of its own user; the user behind a connection is found from /proc/net/tcp[6]
(serve/peer.py), and a client whose user cannot be found is refused.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.serve.peer import ClientRegions, diag_uid, grpc_peer, peer_uid, scan_uid
from onnxaccel.serve.protocol import ProtocolError
from onnxaccel.serve.shared_memory import SharedMemoryRegistry
from tests.serve.conftest import ServerProcess
from tests.serve.shm_client import make_two_outputs, shm_object, triton_shm

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")

REPO_ROOT = Path(__file__).resolve().parents[2]
X = np.array([[0.1, -0.4, 0.9, 0.3], [1.5, 0.2, -0.7, 0.0]], dtype=np.float32)
UNKNOWN = "Input 'x' names shared memory region 'R', which is not registered"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a client of another user (nobody) needs root to start")


def connected_pair(family: int, host: str):
    """(listener, client, accepted) sockets of one TCP connection on loopback."""
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    return listener, client, accepted


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")],
                         ids=["ipv4", "ipv6"])
def test_peer_uid_finds_the_owner_of_the_clients_socket(family, host):
    try:
        sockets = connected_pair(family, host)
    except OSError as exc:
        pytest.skip(f"no {host} on this host: {exc}")
    listener, client, accepted = sockets
    try:
        client_host, client_port = accepted.getpeername()[:2]  # what the server sees of the client
        server_host, server_port = accepted.getsockname()[:2]
        assert peer_uid(client_host, client_port, server_host, server_port) == os.getuid()
        assert peer_uid(client_host, client_port, None, server_port) == os.getuid()  # gRPC: the port only
        assert peer_uid(client_host, client_port, server_host, server_port + 1) is None
        with socket.socket(family) as unused:  # a port no connection uses
            unused.bind((host, 0))
            free = unused.getsockname()[1]
        assert peer_uid(client_host, free, server_host, server_port) is None
        # Both ways of finding it: sock_diag's exact lookup and the /proc/net/tcp[6] tables.
        ours, theirs = ipaddress.ip_address(client_host), ipaddress.ip_address(server_host)
        assert diag_uid(ours, client_port, theirs, server_port) == os.getuid()
        assert scan_uid(ours, client_port, theirs, server_port) == os.getuid()
        assert diag_uid(ours, free, theirs, server_port) is None and scan_uid(ours, free, theirs, server_port) is None
        assert peer_uid("not-an-address", client_port, server_host, server_port) is None
        if family == socket.AF_INET:  # a dual-stack server sees IPv4 clients as ::ffff:a.b.c.d
            assert peer_uid(f"::ffff:{client_host}", client_port, f"::ffff:{server_host}", server_port) == os.getuid()
    finally:
        for sock in (client, accepted, listener):
            sock.close()


def test_grpc_peer_strings():
    assert grpc_peer("ipv4:127.0.0.1:54321", "127.0.0.1", 8001) == ("127.0.0.1", 54321, "127.0.0.1", 8001)
    assert grpc_peer("ipv6:[::1]:54321", "::1", 8001) == ("[::1]", 54321, "::1", 8001)
    assert grpc_peer("ipv6:%5B::1%5D:54321", "::", 8001) == ("[::1]", 54321, None, 8001)  # wildcard: port only
    assert grpc_peer("ipv4:10.0.0.2:5", "0.0.0.0", 8001) == ("10.0.0.2", 5, None, 8001)
    assert grpc_peer("ipv4:127.0.0.1:5", "localhost", 8001) == ("127.0.0.1", 5, None, 8001)
    assert grpc_peer("unix:/tmp/socket", "127.0.0.1", 8001)[:2] == (None, None)


def test_a_client_whose_user_cannot_be_found_is_refused():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        free = unused.getsockname()[1]
    regions = ClientRegions(SharedMemoryRegistry(), lambda: ("127.0.0.1", free, "127.0.0.1", 8000))
    for call in (lambda: regions.status(), lambda: regions.register("r", "/k", 0, 8), lambda: regions.unregister(),
                 lambda: regions.input_array({"shared_memory_region": "r", "shared_memory_byte_size": 8},
                                             "FP32", (2,), "x")):
        with pytest.raises(ProtocolError) as refused:
            call()
        assert refused.value.status == 403 and refused.value.grpc_code == "PERMISSION_DENIED"
        assert refused.value.message.startswith("System shared memory is for clients on this host whose user the "
                                                "server can identify") and f"port {free}" in refused.value.message
    # A request that names no region never looks the user up.
    assert regions.input_array({}, "FP32", (2,), "x") is None and regions.output_place({}, "y") is None


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("shm-users-repo")
    (root / "two").mkdir()
    make_two_outputs(root / "two" / "model.onnx")
    return root


@pytest.fixture(scope="module", params=[[], ["--workers", "2"]], ids=["one-process", "workers"])
def server(request, repo, tmp_path_factory):
    log = tmp_path_factory.mktemp("shm-users-logs") / "server.log"
    proc = ServerProcess(repo, "--shared-memory", "system", *request.param, log=log)
    try:
        yield proc.wait_ready(120)
    finally:
        assert proc.stop(60) == 0, proc.log()


def as_nobody(scenario: str, server: ServerProcess, arg: str) -> dict:
    """What shm_other_user.py saw as nobody."""
    run = subprocess.run([sys.executable, "-m", "tests.serve.shm_other_user", scenario,
                          server.url.removeprefix("http://"), server.grpc_url, arg], cwd=REPO_ROOT,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "tests")},  # tests/conftest.py's imports
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen.pop("uid") == 65534
    return seen


def infer_root(module, triton):
    tensor = module.InferInput("x", [2, 4], "FP32")
    tensor.set_shared_memory("R", 32)
    return triton.infer("two", [tensor]).as_numpy("probs")


@needs_root
def test_another_users_region_is_unknown_to_a_client(server, repo):
    shm = triton_shm()
    http = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    grpc = tritongrpc.InferenceServerClient(server.grpc_url)
    expected = ort.InferenceSession(str(repo / "two" / "model.onnx"),
                                    providers=["CPUExecutionProvider"]).run(["probs"], {"x": X})[0]
    try:
        with shm_object(32) as (key, handle):
            shm.set_shared_memory_region(handle, [X])
            http.register_system_shared_memory("R", key, 32)
            seen = as_nobody("foreign", server, "R")
            for label in ("http", "grpc"):
                got = seen[label]
                assert got["infer"] is not None and UNKNOWN in got["infer"]["message"], got
                assert "R" not in got["status"]
                assert "No system shared memory region 'R' is registered" in got["status_named"]["message"]
                assert got["unregister_named"] is None and got["unregister_all"] is None  # succeed, as Triton
            # Still registered, still root's: listed and usable over both protocols.
            assert [r["name"] for r in http.get_system_shared_memory_status()] == ["R"]
            for module, triton in ((tritonhttp, http), (tritongrpc, grpc)):
                np.testing.assert_allclose(infer_root(module, triton), expected, rtol=1e-5, atol=1e-6)
    finally:
        http.unregister_system_shared_memory()
        http.close()
        grpc.close()


@needs_root
def test_a_client_registers_only_objects_of_its_own_user(server, repo):
    http = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    expected = ort.InferenceSession(str(repo / "two" / "model.onnx"),
                                    providers=["CPUExecutionProvider"]).run(["probs"], {"x": X})[0]
    try:
        with shm_object(32) as (root_key, _):
            seen = as_nobody("own", server, root_key)
        for label, status in (("http", "403"), ("grpc", "StatusCode.PERMISSION_DENIED")):
            got = seen[label]
            assert got["root_object"] == {"status": status, "message": (
                f"Cannot register system shared memory region 'theirs': the shared memory object '{root_key}' "
                f"belongs to uid 0, and this client's user is uid 65534; a client may register only objects of its "
                "own user. Create the object as the same user that sends the requests.")}
            assert got["object_uid"] == 65534 and got["register"] is None and got["infer"] is None, got
            np.testing.assert_allclose(got["probs"], expected, rtol=1e-5, atol=1e-6)
        assert seen["grpc"]["status"] == ["mine-in-grpc", "mine-in-http", "mine-out-grpc", "mine-out-http"]
        assert http.get_system_shared_memory_status() == []  # nobody's regions are not root's
    finally:
        http.unregister_system_shared_memory()
        http.close()
