"""A tritonclient client of another local user (nobody, uid 65534) for the shared memory ownership tests
(test_shared_memory_users.py), run as ``python -m tests.serve.shm_other_user SCENARIO HTTP GRPC [ARG]``: it
prints one JSON object of what it saw.

It starts as root and drops to nobody itself before any of its clients connects or any object is made: the
interpreter of the venv lies under /root (mode 0700 here), which nobody may not enter, so a process started as
nobody (``preexec_fn``) could not even exec it, nor import a module once it is nobody. So as root it first calls
the server with throwaway clients (nothing that changes root's regions) to import what the calls import on
first use (gevent's resolver, ...), closes them, and only then drops to nobody and makes new clients (gRPC ones
with a subchannel pool of their own: no connection of root's is reused). Every socket and /dev/shm object it
makes afterwards is nobody's, which is all the server sees of a client.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tests.serve.shm_client import new_key, triton_shm

NOBODY = 65534
X = np.array([[0.1, -0.4, 0.9, 0.3], [1.5, 0.2, -0.7, 0.0]], dtype=np.float32)

shm = triton_shm()
import tritonclient.grpc as tritongrpc  # noqa: E402 - after triton_shm (its pkg_resources stand-in)
import tritonclient.http as tritonhttp  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402


def clients(http: str, grpc: str) -> list:
    """(label, module, client) over HTTP and gRPC, each on connections of its own."""
    return [("http", tritonhttp, tritonhttp.InferenceServerClient(http)),
            ("grpc", tritongrpc, tritongrpc.InferenceServerClient(grpc, channel_args=[
                ("grpc.use_local_subchannel_pool", 1)]))]


def refusal(call) -> dict | None:
    """The error ``call`` raised ({"status", "message"}), or None when it succeeded."""
    try:
        call()
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    return None


def names(module, triton) -> list[str]:
    """The regions the status lists."""
    if module is tritonhttp:
        return sorted(r["name"] for r in triton.get_system_shared_memory_status())
    return sorted(triton.get_system_shared_memory_status(as_json=True).get("regions", {}))


def infer(module, triton, region: str, out: str | None = None):
    """Model "two" with x from ``region`` (32 bytes), probs into ``out`` when given."""
    tensor = module.InferInput("x", [2, 4], "FP32")
    tensor.set_shared_memory(region, 32)
    outputs = None
    if out:
        outputs = [module.InferRequestedOutput("probs")]
        outputs[0].set_shared_memory(out, 24)
    return triton.infer("two", [tensor], outputs=outputs)


def foreign(http: str, grpc: str, region: str) -> dict:
    """Name root's ``region``: in a request, a status, an unregister of it and of all."""
    seen = {}
    for label, module, triton in clients(http, grpc):
        seen[label] = {"infer": refusal(lambda: infer(module, triton, region)),
                       "status": names(module, triton),
                       "status_named": refusal(lambda: triton.get_system_shared_memory_status(region)),
                       "unregister_named": refusal(lambda: triton.unregister_system_shared_memory(region)),
                       "unregister_all": refusal(triton.unregister_system_shared_memory)}
        triton.close()
    return seen


def own(http: str, grpc: str, root_key: str) -> dict:
    """Register root's object (refused), then objects of nobody's own, and run the model through them (left
    registered, objects removed: root's status must not list them)."""
    seen = {}
    for label, module, triton in clients(http, grpc):
        in_key, out_key = new_key(), new_key()
        in_handle = shm.create_shared_memory_region(in_key.strip("/"), in_key, 32)
        out_handle = shm.create_shared_memory_region(out_key.strip("/"), out_key, 24)
        try:
            shm.set_shared_memory_region(in_handle, [X])
            seen[label] = {
                "root_object": refusal(lambda: triton.register_system_shared_memory("theirs", root_key, 32)),
                "object_uid": os.stat(f"/dev/shm/{in_key.strip('/')}").st_uid,
                "register": refusal(lambda: (triton.register_system_shared_memory(f"mine-in-{label}", in_key, 32),
                                             triton.register_system_shared_memory(f"mine-out-{label}", out_key, 24))),
                "infer": refusal(lambda: infer(module, triton, f"mine-in-{label}", f"mine-out-{label}")),
                "probs": shm.get_contents_as_numpy(out_handle, np.float32, [2, 3]).tolist(),
                "status": names(module, triton)}
        finally:
            shm.destroy_shared_memory_region(in_handle)
            shm.destroy_shared_memory_region(out_handle)
            triton.close()
    return seen


def warm_up(http: str, grpc: str) -> None:
    """As root, the calls the scenarios make (none that registers or unregisters anything), so that every module
    they import on first use is imported."""
    for _label, module, triton in clients(http, grpc):
        refusal(lambda: infer(module, triton, "warm-up-none", "warm-up-none"))
        names(module, triton)
        refusal(lambda: triton.get_system_shared_memory_status("warm-up-none"))
        refusal(lambda: triton.register_system_shared_memory("warm-up-none", "/onnxaccel-warm-up-missing", 8))
        triton.close()


def main() -> None:
    """Drop to nobody, run the scenario, print what it saw."""
    scenario, http, grpc, arg = sys.argv[1:5]
    warm_up(http, grpc)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    print(json.dumps({"uid": os.getuid(), **{"foreign": foreign, "own": own}[scenario](http, grpc, arg)}))


if __name__ == "__main__":
    main()
