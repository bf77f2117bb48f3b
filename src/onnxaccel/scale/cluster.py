"""Connect to a Ray cluster, or start a local one on loopback; say what it has (CPUs, GPUs, nodes).

``--ray`` values: ``auto`` (RAY_ADDRESS, else a cluster already running on this machine, else a new local one),
``local`` (always a new local one), or an address (``HOST:PORT`` of a head node's GCS, or ``ray://HOST:10001``
for Ray Client).

A local cluster listens on 127.0.0.1 only: Ray binds its node to the loopback address when
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is false (ray/_private/ray_constants.py ``ENABLE_RAY_CLUSTER``, read by
ray/_private/services.py ``get_node_ip_address``; Ray 2.60.0, ray-project/ray#18730). Without it, Ray 2.60 binds
its GCS, raylet and workers to every interface (seen with ``ss -ltn`` on this machine).

GPUs: Ray counts NVIDIA GPUs with NVML and AMD GPUs with amdsmi, and both appear as the resource ``GPU``; an
actor given ``num_gpus=1`` sees only its GPU, through CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES
(ray/_private/accelerators/nvidia_gpu.py, amd_gpu.py in Ray 2.60.0; amd_gpu.py refuses ROCR_VISIBLE_DEVICES
without HIP_VISIBLE_DEVICES). So inside an actor the GPU is always device 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from onnxaccel.errors import MissingDependencyError, OnnxAccelError

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Object store of a cluster started here: Ray's default is 30% of RAM, far more than batch inference needs.
DEFAULT_OBJECT_STORE_MB = 1024


class ClusterError(OnnxAccelError):
    """Ray could not be reached or started."""


@dataclass(frozen=True)
class ClusterInfo:
    """The Ray cluster a batch job ran on: address, whether started here, and its resources."""
    address: str
    started_here: bool
    nodes: int
    cpus: float
    gpus: float

    def to_dict(self) -> dict:
        """JSON-ready form of the cluster description."""
        return {"address": self.address, "started_here": self.started_here, "nodes": self.nodes,
                "cpus": self.cpus, "gpus": self.gpus}


def import_ray():
    """Import ray with the local-cluster binding set to loopback (it is read when ray is imported)."""
    os.environ.setdefault(LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError("ray", "ray", "Running on Ray (--ray)") from exc
    return ray


def _loopback_only(ray) -> None:
    # When ray was imported before this module set the variable, patch the constant it was read into.
    if os.environ.get(LOOPBACK_ENV, "0").lower() in ("0", "false"):
        with contextlib.suppress(Exception):
            from ray._private import ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False


@contextlib.contextmanager
def ray_cluster(address: str = "auto", *, num_cpus: int | None = None,
                object_store_mb: int | None = None) -> Iterator[ClusterInfo]:
    """Use the Ray of this process if already initialized, else connect/start per ``address``; a cluster
    started here is shut down on exit."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        started = _init(ray, address, num_cpus, object_store_mb)
    try:
        yield describe(ray, started)
    finally:
        if started:
            ray.shutdown()


def _init(ray, address: str, num_cpus: int | None, object_store_mb: int | None) -> bool:
    """Connect or start; True when this call started (and so owns) a local cluster."""
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING, "include_dashboard": False}
    address = (address or "auto").strip()
    if address not in ("auto", "local"):
        problem = _unreachable(address)
        if problem:
            raise ClusterError(f"Cannot reach the Ray cluster at {address}: {problem}.",
                               "Check the address (HOST:PORT of the head's GCS, as `ray start --head` prints it, "
                               "or ray://HOST:10001) and that the head node is up; --ray local starts a cluster "
                               "on this machine.")
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ClusterError(f"Cannot connect to the Ray cluster at {address}: {exc}",
                               "Check the address (HOST:PORT of the head's GCS, as `ray start --head` prints it, "
                               "or ray://HOST:10001), or use --ray local for a cluster on this machine.") from None
        return False
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if address == "auto" and env and env != "auto":
        return _init(ray, env, num_cpus, object_store_mb)  # set on purpose: connect (or start, if "local") or fail
    if address == "auto" and _running_cluster():
        with contextlib.suppress(ConnectionError):  # a stale address file: start a local cluster instead
            ray.init(address="auto", log_to_driver=False, logging_level=logging.WARNING)
            return False
    _loopback_only(ray)
    store = (object_store_mb or DEFAULT_OBJECT_STORE_MB) * 1024 * 1024
    try:
        ray.init(address="local", num_cpus=num_cpus, object_store_memory=store, **quiet)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ClusterError(f"Cannot start a local Ray cluster: {exc}",
                           "Check free shared memory (/dev/shm) for the object store, or pass --ray ADDRESS.") from None
    return True


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why a TCP connection to the address fails, or None. Ray itself retries an unreachable GCS for minutes
    (seen with Ray 2.60: over 3 minutes of "Failed to connect to GCS" before giving up)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if not parts.hostname or not parts.port:
        return "expected HOST:PORT or ray://HOST:PORT"
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def _running_cluster() -> bool:
    """A cluster started with `ray start` on this machine leaves its address in Ray's temp folder."""
    with contextlib.suppress(Exception):
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address("auto") is not None
    return False


def describe(ray, started_here: bool) -> ClusterInfo:
    """Describe the connected Ray cluster: live nodes and total CPUs and GPUs."""
    resources = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    context = ray.get_runtime_context()
    address = getattr(context, "gcs_address", None) or "local"
    return ClusterInfo(address, started_here, len(nodes), float(resources.get("CPU", 0)),
                       float(resources.get("GPU", 0)))
