"""The wire protocol between the session and an isolated agent: length-prefixed pickle frames
on a Unix socket, and the allow-list unpickler that decodes what an agent sends."""

from __future__ import annotations

import io
import pickle
import socket
import struct

MAX_FRAME = 64 * 1024 * 1024
CALLS = ("connect", "retrieve", "spent", "bookings", "project", "respond")

_ALLOWED = {
    ("fedmem.agent.client", "StepResult"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "float64"), ("numpy", "int64"), ("numpy", "bool_"),
    ("builtins", "frozenset"), ("builtins", "set"), ("builtins", "complex"),
}


class AgentDied(RuntimeError):
    """The agent's process went away (or broke the protocol) while a command was outstanding."""


class AgentTaskError(RuntimeError):
    """A command raised inside a live agent (its text only)."""


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed from an agent")
        return super().find_class(module, name)


def loads_untrusted(data: bytes):
    return _SafeUnpickler(io.BytesIO(data)).load()


def _mappingproxy(d: dict):
    from types import MappingProxyType

    return MappingProxyType(d)


def dumps(obj) -> bytes:
    from types import MappingProxyType

    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = {MappingProxyType: lambda m: (_mappingproxy, (dict(m),))}
    p.dump(obj)
    return buf.getvalue()


def send(sock: socket.socket, obj) -> None:
    data = dumps(obj)
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv_bytes(sock: socket.socket) -> bytes:
    head = _recv_exact(sock, 4)
    n = struct.unpack(">I", head)[0]
    if n > MAX_FRAME:
        raise AgentDied(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return _recv_exact(sock, n)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)

