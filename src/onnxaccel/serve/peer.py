"""The local user behind a client's TCP connection, and the system shared memory regions that user sees.

System shared memory is for clients on the server's host (the objects are this host's /dev/shm), and a region
belongs to the user that registered it (serve/shared_memory.py). The user of a connection is the owner of its
client's end, a socket of this host whose local address is the client's (address, port) and whose remote one
the server's, found as ``ss -tne`` finds it: the kernel's sock_diag netlink interface (sock_diag(7)) looks that
exact connection up and answers its ``idiag_uid``. Where that is not possible (no netlink, or gRPC on a
wildcard address: grpc names the client's address only, so the server's address is not known) the socket is
looked for in /proc/net/tcp (IPv4) and /proc/net/tcp6 (proc(5): ``local_address``, ``rem_address``, ``uid``).
Reading those walks the kernel's whole connection table, where the netlink lookup finds one connection: the
tables are the fallback. In either, only sockets of a connection count (not TIME_WAIT
entries, whose uid reads 0, nor half-open ones), and in the tables, where several sockets could be the client's
end (the same client address and server port) they must agree on the uid. A client on another host, or in
another network namespace, has no such socket here: it is refused (:data:`UNIDENTIFIED`) as soon as it uses the
extension. The user is looked up only for requests that use shared memory (:class:`ClientRegions`, once per
request).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Callable, Mapping
from urllib.parse import unquote

import numpy as np

from onnxaccel.serve.protocol import ProtocolError

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLMSG_ERROR = 4, 20, 2  # linux/netlink.h, linux/sock_diag.h
#: The states (include/net/tcp_states.h) of a socket that belongs to a connection: ESTABLISHED, FIN_WAIT1,
#: FIN_WAIT2, CLOSE_WAIT, LAST_ACK, CLOSING.
CONNECTED = frozenset({"01", "04", "05", "08", "09", "0B"})
UNIDENTIFIED = ("System shared memory is for clients on this host whose user the server can identify, and no "
                "TCP socket of this host is the client's end of this connection ({client}; the client is on another "
                "host or in another network namespace, or the kernel's socket tables cannot be read). Run the "
                "client on the server's host, or send the tensors in the request.")


def _address(host: object):
    """An IP address (IPv4 for an IPv4-mapped IPv6 one), or None for anything else."""
    if not isinstance(host, str):
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def _proc_address(text: str):
    """The (address, port) of a /proc/net/tcp[6] column: the address in 32-bit words, each in host byte order."""
    hex_address, hex_port = text.split(":")
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address, int(hex_port, 16)


def peer_uid(client_host: object, client_port: object, server_host: object, server_port: object) -> int | None:
    """The uid owning the client's socket of the TCP connection from (client_host, client_port) to
    (server_host, server_port); ``server_host`` None matches any address of the server's port. None when no
    socket of this host is that end (or several owned by different users could be), or it cannot be looked up."""
    client, server = _address(client_host), _address(server_host)
    if client is None or not isinstance(client_port, int) or not isinstance(server_port, int) or client_port <= 0 \
            or (server_host is not None and server is None):
        return None
    if server is not None and server.version == client.version:
        try:
            return diag_uid(client, client_port, server, server_port)
        except OSError:  # no sock_diag here (a sandbox): the tables
            pass
    return scan_uid(client, client_port, server, server_port)


def diag_uid(client, client_port: int, server, server_port: int) -> int | None:
    """The uid of the connected socket (client, client_port) -> (server, server_port) (ipaddress objects of one
    family) by sock_diag's exact lookup, or None when there is none; OSError when netlink cannot be used."""
    family = socket.AF_INET if client.version == 4 else socket.AF_INET6
    sockid = (struct.pack(">HH", client_port, server_port) + client.packed.ljust(16, b"\0")
              + server.packed.ljust(16, b"\0") + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))  # no cookie
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)
        link.sendto(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, 1, 1, 0) + request, (0, 0))
        answer = link.recv(65536)
    length, kind = struct.unpack_from("=IH", answer)
    if kind == NLMSG_ERROR:
        error = -struct.unpack_from("=i", answer, 16)[0]
        if error == 2:  # ENOENT: no such connection
            return None
        raise OSError(error, f"sock_diag: {os.strerror(error)}")
    if kind != SOCK_DIAG_BY_FAMILY or length < 16 + 72:
        raise OSError(f"sock_diag answered message type {kind}")
    state, uid = answer[17], struct.unpack_from("=I", answer, 16 + 64)[0]  # inet_diag_msg: idiag_state, idiag_uid
    return uid if f"{state:02X}" in CONNECTED else None


def scan_uid(client, client_port: int, server, server_port: int) -> int | None:
    """The same from /proc/net/tcp and tcp6 (``server`` None: any address of the server's port): the uid all the
    connected sockets that could be the client's end agree on, else None."""
    uids: set[int] = set()
    for table in TABLES:
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] not in CONNECTED:
                continue
            try:
                if _proc_address(fields[1]) != (client, client_port):
                    continue
                remote, port = _proc_address(fields[2])
            except ValueError:
                continue
            if port == server_port and (server is None or remote == server):
                uids.add(int(fields[7]))
    return uids.pop() if len(uids) == 1 else None


def http_peer(scope: Mapping) -> tuple[object, object, object, object]:
    """(client host, client port, server host, server port) of an ASGI HTTP scope (None where it has none)."""
    client, server = scope.get("client") or (None, None), scope.get("server") or (None, None)
    return client[0], client[1], server[0], server[1]


def grpc_peer(peer: str, server_host: str | None, server_port: int | None) -> tuple[object, object, object, object]:
    """The same from grpc's ``context.peer()`` ("ipv4:127.0.0.1:54321", "ipv6:[::1]:54321", the brackets
    percent-encoded by some grpc versions) and the address the server listens on (grpc names no server address:
    a wildcard one, or a name, gives None, to be matched by the port only)."""
    scheme, _, rest = unquote(peer or "").partition(":")
    host, _, port = rest.rpartition(":")
    listening = _address(server_host)
    server = str(listening) if listening is not None and not listening.is_unspecified else None
    if scheme not in ("ipv4", "ipv6") or not port.isdigit():
        return None, None, server, server_port
    return host, int(port), server, server_port


class ClientRegions:
    """The system shared memory registry as one request's client sees it: only the regions its user registered
    (serve/shared_memory.py). ``peer``: the connection's (client host, client port, server host, server port);
    its user is looked up at the first use, and a client whose user cannot be found is refused (403)."""

    def __init__(self, registry, peer: Callable[[], tuple]):
        self.registry = registry
        self._peer = peer
        self._uid: int | None = None

    @property
    def uid(self) -> int:
        """The client's uid; 403 (:data:`UNIDENTIFIED`) when it cannot be found."""
        if self._uid is None:
            where = self._peer()
            uid = peer_uid(*where)
            if uid is None:
                client = f"from {where[0]} port {where[1]}" if where[0] is not None else "no TCP client address"
                raise ProtocolError(403, UNIDENTIFIED.format(client=client))
            self._uid = uid
        return self._uid

    def register(self, name: str, key: object, offset: object, byte_size: object):
        """SharedMemoryRegistry.register, for this client's user."""
        return self.registry.register(name, key, offset, byte_size, uid=self.uid)

    def register_body(self, name: str, doc: object):
        """SharedMemoryRegistry.register_body, for this client's user."""
        return self.registry.register_body(name, doc, uid=self.uid)

    def unregister(self, name: str = "") -> None:
        """SharedMemoryRegistry.unregister: this client's user's region ``name`` (or all of them) only."""
        self.registry.unregister(name, uid=self.uid)

    def status(self, name: str = "") -> list[dict]:
        """SharedMemoryRegistry.status: this client's user's regions only."""
        return self.registry.status(name, uid=self.uid)

    def input_array(self, params: Mapping, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray | None:
        """SharedMemoryRegistry.input_array, from this client's user's regions (the user is looked up only when
        the parameters name a region)."""
        if "shared_memory_region" not in params:
            return self.registry.input_array(params, datatype, shape, name, uid=None)
        return self.registry.input_array(params, datatype, shape, name, uid=self.uid)

    def output_place(self, params: Mapping, name: str):
        """SharedMemoryRegistry.output_place, into this client's user's regions."""
        if "shared_memory_region" not in params:
            return self.registry.output_place(params, name, uid=None)
        return self.registry.output_place(params, name, uid=self.uid)
