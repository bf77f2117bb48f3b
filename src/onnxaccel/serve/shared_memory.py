"""Triton's system shared memory extension: a client registers a region of a POSIX shared memory object (by its
key, an object of /dev/shm), and inference requests name the region for an input (its bytes are read from
there, none travel in the request) or a requested output (its bytes are written there, none travel back).

The protocol (triton-inference-server/server docs/protocol/extension_shared_memory.md): HTTP
``POST /v2/systemsharedmemory/region/NAME/register`` with ``{"key", "offset", "byte_size"}``,
``GET /v2/systemsharedmemory[/region/NAME]/status`` (a list of ``{"name", "key", "offset", "byte_size"}``),
``POST /v2/systemsharedmemory[/region/NAME]/unregister`` (no name: every region); gRPC SystemSharedMemoryStatus,
Register and Unregister; a tensor's parameters ``shared_memory_region``, ``shared_memory_byte_size`` and the
optional ``shared_memory_offset`` (within the region). Where the text is silent this follows Triton's
src/shared_memory_manager.cc (at e1db8a603d86): registering a name twice is an error, unregistering a name that is
not registered succeeds, a region must lie within its object, a tensor within its region. CUDA shared memory is
not offered (:data:`CUDA_REFUSED`).

**One registry for every process of the server.** With ``--workers N`` a client's next connection may reach
any worker (the shared HTTP socket, SO_REUSEPORT for gRPC), so a region registered through one worker must be
usable through all of them, and gone from all once unregistered. The registrations live in one small JSON file
in a private folder the supervisor makes (mode 0700, removed when it exits; ``ServerConfig.shared_memory_dir``):
register and unregister rewrite it under an exclusive ``flock`` (a temporary file renamed over it, so a reader
never sees half of one), and every use of a region (a request naming one, a status) checks it first (a stat;
read again when another file is there). The file is the only truth; a worker holds only its own mappings,
cached per registration (each has a random id) and closed once the worker sees that registration gone: at its
next use of any region, and by a sweep every :data:`SWEEP_S` seconds while it holds any. A server of one process
keeps the registrations in memory. Why a file and not the model process or the supervisor: the model process
exists only with ``--shared-models`` and the supervisor hears from its workers through a one-way queue, while a
file serves both layouts with no new messages, outlives a replaced worker, and costs a stat per use of a region.

Each registration records the object's device and inode; a process that maps it later checks that it opened
the same object, so an object unlinked and created again under the key is refused (unregister and register
again) rather than some workers reading the old bytes and others the new. Inputs are read through a read-only
mapping (the object opened O_RDONLY) and copied out as the request is decoded; outputs are written through a
read-write one (O_RDWR); each mapping spans its region only. Keys name an object of /dev/shm (``/name`` or
``name``, as ``shm_open`` takes them; ``/`` inside, ``.`` and ``..`` are refused), opened with O_NOFOLLOW and
O_NONBLOCK (a FIFO there must not block the event loop), and must be regular files. Before each use the object's
current size is checked: reading past the end of a shrunk object would kill the process with SIGBUS. (A client
that shrinks its own object during the copy can still do that, as with Triton: docs/SECURITY.md. Such a client
is trusted no further than with its own objects: see below.)

**A client names only its own user's regions.** The server (perhaps root) opens what a client names, so a
client must not make it read or write an object the client's user could not open. Each connection's local
user is the owner of its client's socket (serve/peer.py; a client whose user cannot be found, not on this host,
is refused with 403 / PERMISSION_DENIED); a region records the uid that registered it, and may be registered
only over an object that user owns (``fstat().st_uid``; 403 otherwise; root, uid 0, may register any object).
Each user has names of its own: requests, status and unregister see only the caller's regions (root's too),
another user's region answers as an unknown one (no names leak), and unregistering all is the caller's all.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import mmap
import os
import re
import stat
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from onnxaccel.serve.protocol import (
    DATATYPES, ProtocolError, bad_request, datatype_of, element_count, from_bytes, to_bytes,
)

#: Where POSIX shared memory objects live on Linux (glibc's shm_open: /dev/shm/NAME).
SHM_DIR = "/dev/shm"
#: A tensor's parameters naming its place in shared memory (extension_shared_memory.md).
PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
#: Seconds between two sweeps of a worker's mappings of unregistered regions (only while it holds any).
SWEEP_S = 1.0
REGISTRY_FILE = "shm-regions.json"
SCHEMA = "onnxaccel.serve.shm-regions/2"
_KEY = re.compile(r"^/?([^/\x00]{1,255})$")
CUDA_REFUSED = ("CUDA shared memory is not offered by this server (its models read their inputs from host memory). "
                "Use system shared memory (tritonclient.utils.shared_memory; /v2/systemsharedmemory, gRPC "
                "SystemSharedMemoryRegister) or send the tensors in the request.")


@dataclass(frozen=True)
class TensorPlace:
    """Where one tensor of a request lies: a registered region, and its byte size and offset within it."""

    region: str
    byte_size: int
    offset: int = 0
    uid: int | None = None  # the client's user: its regions are the ones it may name (None: none)

    def parameters(self, written: int) -> dict:
        """The response's parameters for an output written here (``shared_memory_byte_size``: the bytes it took)."""
        params: dict = {"shared_memory_region": self.region, "shared_memory_byte_size": written}
        if self.offset:
            params["shared_memory_offset"] = self.offset
        return params


def tensor_place(params: Mapping, what: str, uid: int | None = None) -> TensorPlace | None:
    """The shared memory place a tensor's parameters give (``what``: "Input 'x'"), or None when they name none;
    ``uid``: the user whose regions it may name."""
    region = params.get("shared_memory_region")
    if region is None:
        extra = [key for key in PARAMETERS[1:] if key in params]
        if extra:
            raise bad_request(f"{what} sets {extra[0]} without shared_memory_region; name the registered region "
                              "too, or leave the shared memory parameters out.")
        return None
    if not isinstance(region, str) or not region:
        raise bad_request(f"{what}: shared_memory_region must be the name of a registered region, got {region!r}.")
    if params.get("shared_memory_byte_size") is None:
        raise bad_request(f"{what} names shared memory region '{region}' without shared_memory_byte_size; give the "
                          "tensor's size in bytes.")
    size = _count(params["shared_memory_byte_size"], f"{what}: shared_memory_byte_size")
    return TensorPlace(region, size, _count(params.get("shared_memory_offset", 0), f"{what}: shared_memory_offset"),
                       uid)


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_request(f"{what} must be a non-negative integer (bytes), got {value!r}.")
    return value


@dataclass(frozen=True)
class Region:
    """One registration: the region's name, its object's key, offset and byte size there, the object's identity
    (device, inode) when it was registered, a random id telling this registration from a later one, and the
    user that registered it (the only one that sees it)."""

    name: str
    key: str
    offset: int
    byte_size: int
    device: int
    inode: int
    id: str
    uid: int

    def status(self) -> dict:
        """The region as the status endpoints list it."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def object_path(key: object, where: str) -> str:
    """The /dev/shm path of a shared memory key (``/name`` or ``name``); 400 for anything that could leave
    /dev/shm or is no object name."""
    match = _KEY.match(key) if isinstance(key, str) else None
    if match is None or match.group(1) in (".", ".."):
        raise bad_request(f"{where}: the key {key!r} is not a shared memory object's name; give '/NAME' (one leading "
                          "slash, no other, not '.' or '..', at most 255 bytes), as shm_open and tritonclient's "
                          "create_shared_memory_region take it.")
    return os.path.join(SHM_DIR, match.group(1))


def open_object(key: str, where: str, *, writable: bool) -> int:
    """A descriptor of the regular file behind ``key`` (O_RDWR when ``writable``), or 400 saying why not."""
    path = object_path(key, where)
    access = "read and write" if writable else "read"
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise bad_request(f"{where}: no shared memory object '{key}' exists ({path}); create it first (tritonclient."
                          "utils.shared_memory.create_shared_memory_region).") from None
    except PermissionError:
        raise bad_request(f"{where}: the server's user may not {access} the shared memory object '{key}' ({path}); "
                          "create it as that user or give it the permissions.") from None
    except OSError as exc:  # ELOOP: a symbolic link; EISDIR: a folder
        raise bad_request(f"{where}: cannot open the shared memory object '{key}' ({path}): "
                          f"{exc.strerror or exc}.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise bad_request(f"{where}: '{key}' ({path}) is not a shared memory object (not a regular file).")
    return fd


def check_owner(owner: int, uid: int, key: str, where: str) -> None:
    """403 unless the client's user ``uid`` could have opened the object itself: it owns it (``owner``: its
    st_uid), or it is root. (An object of another user that is open to all is refused too: the rule is the
    owner's, not the mode's, which its owner may change at any time.)"""
    if uid != 0 and owner != uid:
        raise ProtocolError(403, f"{where}: the shared memory object '{key}' belongs to uid {owner}, and this "
                            f"client's user is uid {uid}; a client may register only objects of its own user. "
                            "Create the object as the same user that sends the requests.")


class _Mapping:
    """One process's mapping of a region (read-only or read-write), from the page its offset falls in."""

    __slots__ = ("memory", "skip")

    def __init__(self, region: Region, writable: bool, where: str):
        fd = open_object(region.key, where, writable=writable)
        try:
            found = os.fstat(fd)
            if (found.st_dev, found.st_ino) != (region.device, region.inode):
                raise bad_request(f"{where}: the shared memory object '{region.key}' of region '{region.name}' was "
                                  "replaced (unlinked and created again) since the region was registered; "
                                  "unregister the region and register it again.")
            _check_size(region, found.st_size, where)
            start = region.offset - region.offset % mmap.ALLOCATIONGRANULARITY
            self.memory = mmap.mmap(fd, region.offset + region.byte_size - start, offset=start,
                                    access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
            self.skip = region.offset - start
        finally:
            os.close(fd)  # the mapping keeps its own duplicate (mmap.size() reads the object's size through it)

    def view(self, place: TensorPlace) -> memoryview:
        """The bytes of a tensor at ``place`` within the region."""
        begin = self.skip + place.offset
        return memoryview(self.memory)[begin:begin + place.byte_size]

    def close(self) -> None:
        """Unmap, unless a request still holds arrays over it: then it is unmapped with their last reference."""
        with contextlib.suppress(BufferError):
            self.memory.close()


def _check_size(region: Region, size: int, where: str) -> None:
    if region.offset + region.byte_size > size:
        raise bad_request(f"{where}: the shared memory object '{region.key}' is {size} bytes now, shorter than region "
                          f"'{region.name}' (offset {region.offset} + byte_size {region.byte_size}); it was truncated "
                          "after the region was registered. Unregister the region and register it again.")


class SharedMemoryRegistry:
    """The registered regions of one server (in ``folder``'s registry file, shared by its worker processes, or in
    memory), and this process's mappings of them."""

    def __init__(self, folder: str | None = None):
        self.path = os.path.join(folder, REGISTRY_FILE) if folder else None
        #: The regions by (user, name): each user has names of its own.
        self._memory: dict[tuple[int, str], Region] = {}
        #: The registry file last read, held open (so no other file can get its inode number while it is), its
        #: (device, inode) and its regions.
        self._read: tuple[object, tuple[int, int], dict[tuple[int, str], Region]] | None = None
        self._maps: dict[tuple[str, bool], _Mapping] = {}

    # -- registrations ------------------------------------------------------------------------------------

    def register(self, name: str, key: object, offset: object, byte_size: object, *, uid: int) -> Region:
        """Register ``byte_size`` bytes at ``offset`` of the object ``key`` as user ``uid``'s region ``name``; 400
        when the object is missing, unreadable or too short, or the user has a region of that name; 403 when the
        object is not the user's own (:func:`check_owner`)."""
        where = f"Cannot register system shared memory region '{name}'"
        if not isinstance(name, str) or not name:
            raise bad_request("A system shared memory region needs a name.")
        offset, byte_size = _count(offset, f"{where}: offset"), _count(byte_size, f"{where}: byte_size")
        if byte_size == 0:
            raise bad_request(f"{where}: byte_size is 0; give the region's size in bytes.")
        fd = open_object(key, where, writable=False)
        try:
            found = os.fstat(fd)
        finally:
            os.close(fd)
        check_owner(found.st_uid, uid, key, where)
        if offset + byte_size > found.st_size:
            raise bad_request(f"{where}: offset {offset} + byte_size {byte_size} = {offset + byte_size} passes the "
                              f"end of the shared memory object '{key}' ({found.st_size} bytes).")
        region = Region(name, key, offset, byte_size, found.st_dev, found.st_ino, uuid.uuid4().hex, uid)
        with self._changing() as regions:
            if (uid, name) in regions:
                raise bad_request(f"{where}: a region of that name is registered already (key "
                                  f"'{regions[uid, name].key}'); unregister it first, or choose another name.")
            regions[uid, name] = region
        return region

    def register_body(self, name: str, doc: object, *, uid: int) -> Region:
        """Register from the HTTP route's JSON body ``{"key", "offset", "byte_size"}`` (offset optional)."""
        if not isinstance(doc, dict) or "key" not in doc or "byte_size" not in doc:
            raise bad_request(f"Registering system shared memory region '{name}' needs a JSON body "
                              '{"key": "/NAME", "offset": 0, "byte_size": N}.')
        return self.register(name, doc["key"], doc.get("offset", 0), doc["byte_size"], uid=uid)

    def unregister(self, name: str = "", *, uid: int) -> None:
        """Unregister user ``uid``'s region ``name`` (every region of that user when empty) for every process; a
        name that is not registered is no error (as Triton). This process's mappings of it close at once, the
        other workers' at their next use of any region or sweep."""
        with self._changing() as regions:
            for found in [found for found in regions if found[0] == uid and (not name or found[1] == name)]:
                del regions[found]
        self._sweep(regions)

    def status(self, name: str = "", *, uid: int) -> list[dict]:
        """User ``uid``'s region ``name`` (400 when it has none of that name), or all its regions, as the status
        endpoints list them."""
        regions = {n: r for (owner, n), r in self._regions().items() if owner == uid}
        if name and name not in regions:
            raise bad_request(f"No system shared memory region '{name}' is registered.")
        return [regions[n].status() for n in ([name] if name else sorted(regions))]

    # -- tensors ------------------------------------------------------------------------------------------

    def input_array(self, params: Mapping, datatype: str, shape: tuple[int, ...], name: str, *,
                    uid: int | None) -> np.ndarray | None:
        """Input ``name`` read from user ``uid``'s region its parameters name, or None when they name none; 400 when
        it is not one of that user's regions, or its
        byte size does not match the tensor or the place is not valid. The bytes are copied out at once: nothing
        of a request holds the mapping afterwards (a runner thread keeps its last feeds until its next batch),
        so an unregister unmaps it at once, and the object is read only right after its size was checked."""
        place = tensor_place(params, f"Input '{name}'", uid)
        if place is None:
            return None
        if datatype != "BYTES" and datatype in DATATYPES:
            expected = element_count(shape) * DATATYPES[datatype].itemsize
            if place.byte_size != expected:
                raise bad_request(f"Input '{name}' is {datatype} of shape {list(shape)}: {expected} bytes, but its "
                                  f"shared_memory_byte_size is {place.byte_size} (region '{place.region}').")
        value = from_bytes(self._view(place, f"Input '{name}'", writable=False), datatype, shape, name)
        return value if value.dtype == object else value.copy()

    def output_place(self, params: Mapping, name: str, *, uid: int | None) -> TensorPlace | None:
        """Where requested output ``name`` goes (checked now: the region is one of user ``uid``'s, the place within
        it), or None when its parameters name no region."""
        place = tensor_place(params, f"Output '{name}'", uid)
        if place is not None:
            self._place(place, f"Output '{name}'")
        return place

    def write_output(self, place: TensorPlace, value: np.ndarray, name: str) -> int:
        """Write output ``name`` at ``place``; the bytes it took. 400 when it does not fit the size asked."""
        text = value.dtype == object or value.dtype.kind in "SU"
        data = to_bytes(value) if text else np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        if len(data) > place.byte_size:
            raise bad_request(f"Output '{name}' is {datatype_of(value.dtype)} of shape {list(value.shape)}: "
                              f"{len(data)} bytes, but its shared_memory_byte_size is {place.byte_size} (region "
                              f"'{place.region}'); give at least {len(data)}.")
        self._view(place, f"Output '{name}'", writable=True)[:len(data)] = memoryview(data).cast("B")
        return len(data)

    def _place(self, place: TensorPlace, what: str) -> Region:
        region = self._regions().get((place.uid, place.region))  # another user's region of that name is unknown
        if region is None:
            raise bad_request(f"{what} names shared memory region '{place.region}', which is not registered; register "
                              f"it first (POST /v2/systemsharedmemory/region/{place.region}/register, gRPC "
                              "SystemSharedMemoryRegister). CUDA shared memory is not offered.")
        end = place.offset + place.byte_size
        if end > region.byte_size:
            raise bad_request(f"{what}: shared_memory_offset {place.offset} + shared_memory_byte_size "
                              f"{place.byte_size} = {end} passes the end of region '{region.name}' "
                              f"({region.byte_size} bytes).")
        return region

    def _view(self, place: TensorPlace, what: str, *, writable: bool) -> memoryview:
        region = self._place(place, what)
        where = f"{what} (region '{region.name}')"
        mapping = self._maps.get((region.id, writable))
        if mapping is None:
            mapping = self._maps[region.id, writable] = _Mapping(region, writable, where)
        else:
            _check_size(region, mapping.memory.size(), where)
        return mapping.view(place)

    # -- the store --------------------------------------------------------------------------------------

    def _regions(self) -> dict[tuple[int, str], Region]:
        """The registered regions, this process's stale mappings closed. From the file: read again whenever the
        path names another file than the one read last (a change always renames a new file over it; the one read
        last is held open, so its inode number cannot be reused meanwhile): one stat per use."""
        if self.path is None:
            regions = self._memory
        else:
            try:
                found = os.stat(self.path)
            except FileNotFoundError:
                found = None
            if found is None:
                self._forget()
                regions = {}
            elif self._read is None or self._read[1] != (found.st_dev, found.st_ino):
                self._forget()
                handle = open(self.path, "rb")  # noqa: SIM115 - held open on purpose (see above)
                held = os.fstat(handle.fileno())
                doc = json.loads(handle.read() or b"{}")
                regions = {(r["uid"], r["name"]): Region(**r) for r in doc.get("regions", [])}
                self._read = (handle, (held.st_dev, held.st_ino), regions)
            else:
                regions = self._read[2]
        self._sweep(regions)
        return regions

    def _forget(self) -> None:
        if self._read is not None:
            self._read[0].close()
            self._read = None

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[tuple[int, str], Region]]:
        """The regions to change in place; written back (atomically, under an exclusive lock) unless it raises."""
        if self.path is None:
            yield self._memory
            return
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            regions = dict(self._regions())
            yield regions
            doc = {"schema": SCHEMA, "regions": [asdict(r) for r in regions.values()]}
            temporary = f"{self.path}.{os.getpid()}.tmp"
            with open(temporary, "w") as handle:
                json.dump(doc, handle)
            os.replace(temporary, self.path)

    def _sweep(self, regions: Mapping[tuple[int, str], Region]) -> None:
        """Close this process's mappings of registrations that are gone."""
        if not self._maps:
            return
        live = {region.id for region in regions.values()}
        for key in [key for key in self._maps if key[0] not in live]:
            self._maps.pop(key).close()

    async def sweep_forever(self) -> None:
        """Every SWEEP_S seconds, while this process holds mappings, close those of regions another worker
        unregistered (a worker that sees no more shared memory requests would otherwise keep them)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            if self._maps:
                self._regions()

    def sweeper(self) -> asyncio.Task | None:
        """The sweeping task of a worker of several (None with the registrations in memory: nothing to sweep)."""
        return asyncio.ensure_future(self.sweep_forever()) if self.path is not None else None

    def close(self) -> None:
        """Close every mapping of this process (and the registry file it holds)."""
        for mapping in self._maps.values():
            mapping.close()
        self._maps.clear()
        self._forget()


def registry_for(config) -> SharedMemoryRegistry | None:
    """The server's registry for a ServerConfig: None with ``--shared-memory none``; in the supervisor's folder
    with workers; else in memory."""
    if config.shared_memory == "none":
        return None
    return SharedMemoryRegistry(config.shared_memory_dir)
