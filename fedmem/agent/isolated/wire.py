"""The wire protocol between the session and an isolated agent: length-prefixed pickle frames
on a Unix socket, and the allow-list unpickler that decodes what an agent sends."""

from __future__ import annotations

import io
import pickle
import socket
import struct

import threading
import time

MAX_FRAME = 64 * 1024 * 1024          # session -> agent (trusted side)
AGENT_MAX_FRAME = 8 * 1024 * 1024     # agent -> session, per frame (IsolatedSession(max_frame=...))
FRAME_DEADLINE_S = 20.0               # once a frame's first byte arrived, all of it within this (frame_deadline_s)
FRAME_BUDGET = 64 * 1024 * 1024       # bytes of agent frames the session buffers at once, all agents (frame_budget)
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


class FrameBudget:
    """Bytes of untrusted frames buffered at once, over all connections: a reader reserves a
    frame's announced size before reading its body (and waits at most ``timeout_s`` for room)."""

    def __init__(self, total: int):
        self.total = int(total)
        self.used = 0
        self.peak = 0
        self._cv = threading.Condition()

    def acquire(self, n: int, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        with self._cv:
            while self.used + n > self.total:
                left = end - time.monotonic()
                if left <= 0:
                    raise AgentDied(f"no frame budget for {n} bytes")
                self._cv.wait(left)
            self.used += n
            self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        with self._cv:
            self.used -= n
            self._cv.notify_all()


def recv_bytes(sock: socket.socket, *, max_frame: int = MAX_FRAME, deadline_s: float | None = None,
               budget: FrameBudget | None = None) -> bytes:
    """One frame. The wait for its first byte follows the socket's timeout; from then on the whole
    frame (header and body) must arrive within ``deadline_s`` (None: no deadline), an announced
    size above ``max_frame`` is refused before any of the body is read, and the body's bytes are
    reserved in ``budget`` while it is read."""
    first = sock.recv(1)
    if not first:
        raise EOFError("connection closed")
    end = None if deadline_s is None else time.monotonic() + deadline_s
    head = first + _recv_exact(sock, 3, end)
    n = struct.unpack(">I", head)[0]
    if n > max_frame:
        raise AgentDied(f"frame of {n} bytes exceeds {max_frame}")
    if budget is None:
        return _recv_exact(sock, n, end)
    budget.acquire(n, 5.0 if deadline_s is None else deadline_s)
    try:
        return _recv_exact(sock, n, end)
    finally:
        budget.release(n)


def _recv_exact(sock: socket.socket, n: int, end: float | None = None) -> bytes:
    buf = bytearray()
    old = sock.gettimeout() if end is not None else None
    try:
        while len(buf) < n:
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    raise AgentDied("frame deadline passed")
                sock.settimeout(left)
            try:
                chunk = sock.recv(min(n - len(buf), 1 << 20))
            except socket.timeout:
                raise AgentDied("frame deadline passed") from None
            if not chunk:
                raise EOFError("connection closed")
            buf += chunk
    finally:
        if end is not None:
            sock.settimeout(old)
    return bytes(buf)

