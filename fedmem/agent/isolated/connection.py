"""The session's end of one isolated agent's connection: commands to the agent, and the
narrow RPC (``CALLS``) served to it."""

from __future__ import annotations

import pickle
import secrets
import socket
import struct
import threading

import numpy as np

from fedmem.agent.isolated.wire import CALLS, AgentDied, AgentTaskError, loads_untrusted, recv_bytes, send


class AgentConnection:
    """The session's end of one agent's connection: sends commands, serves the agent's calls."""

    def __init__(self, session, user: str, index: int):
        self.session, self.user, self.index = session, user, index
        self.secret = secrets.token_hex(16)
        self.sock: socket.socket | None = None
        self.connected = threading.Event()
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.capability = None            # the Principal issued to this agent (connect, once)

    def command(self, name: str, *args, timeout_s: float | None = None):
        with self.lock:
            if self.sock is None:
                raise AgentDied("agent not connected")
            try:
                self.sock.settimeout(timeout_s)
                send(self.sock, ("cmd", name, args))
                while True:
                    msg = loads_untrusted(recv_bytes(self.sock, max_frame=self.session.max_frame,
                                                     deadline_s=self.session.frame_deadline_s,
                                                     budget=self.session.frame_budget))
                    if not isinstance(msg, tuple) or not msg:
                        raise AgentDied("malformed message")
                    if msg[0] == "done":
                        return msg[1]
                    if msg[0] == "error":
                        raise AgentTaskError(str(msg[1])[:300])
                    if msg[0] == "call" and len(msg) == 3:
                        # anything but the six calls is answered like a failed call (and logged)
                        ok = msg[1] in CALLS and isinstance(msg[2], tuple)
                        if not ok:
                            self.session.call_errors.append((self.user, str(msg[1])[:40], "not served"))
                        send(self.sock, self._serve(msg[1], msg[2]) if ok else ("fail", "call failed"))
                        continue
                    raise AgentDied(f"unexpected message {str(msg[0])[:40]!r}")
            except (OSError, EOFError, pickle.UnpicklingError, struct.error, ValueError, TypeError, AgentDied,
                    MemoryError, RecursionError, AttributeError, KeyError, IndexError) as exc:
                self.close()
                raise AgentDied(f"{type(exc).__name__}: {str(exc)[:200]}") from None

    def _serve(self, name: str, args: tuple):
        """One RPC call of the agent: only what its user may do."""
        import ray

        from fedmem.agent.federation_service import REFUSED  # lazy: ~9 ms, no heavy package

        s = self.session
        try:
            if name == "connect":
                if self.capability is None:
                    self.capability = ray.get(s.fed.connect.remote(), timeout=s.timeout_s)
                    s.principals[self.user] = str(self.capability)
                return ("reply", (str(self.capability), self.capability.capability))
            if name == "retrieve":
                cap, q, family, retry_of = args
                q = _array(q, "q")
                if q.ndim != 1 or q.shape[0] != s.key_dim:
                    raise ValueError(f"q must have shape ({s.key_dim},). Found {q.shape}.")
                out = ray.get(s.fed.retrieve.remote(cap if isinstance(cap, str) else "-", q,
                                                    None if family is None else str(family)[:200],
                                                    None if retry_of is None else int(retry_of)),
                              timeout=s.timeout_s)
                if isinstance(out, tuple) and len(out) == 2 and out[0] == REFUSED:
                    return ("refused", out[1])
                return ("reply", out)
            if name == "spent":
                return ("reply", float(ray.get(s.fed.principal_spent.remote(args[0] if isinstance(args[0], str)
                                                                             else "-"), timeout=s.timeout_s)))
            if name == "bookings":
                return ("reply", ray.get(s.fed.bookings.remote(args[0] if isinstance(args[0], str) else "-"),
                                         timeout=s.timeout_s))
            if name == "project":
                pts = _array(args[0], "points")
                if pts.ndim != 2 or pts.shape[1] != s.table_dim or pts.shape[0] > 1_000_000:
                    raise ValueError(f"points must have shape (n, {s.table_dim}). Found {pts.shape}.")
                proj = s.projectors[self.index % len(s.projectors)]
                return ("reply", np.asarray(ray.get(proj.project.remote(pts), timeout=s.timeout_s)))
            if name == "respond":
                kind, messages = args
                obs = {"app": s.app, "external": s.external}.get(kind)
                if obs is None:
                    raise ValueError("kind must be 'app' or 'external'.")
                msgs = _messages(messages)
                return ("reply", str(ray.get(obs.respond.remote(self.user, msgs), timeout=s.timeout_s)))
        except Exception as exc:  # noqa: BLE001 - the agent learns only that its call failed
            s.call_errors.append((self.user, name, f"{type(exc).__name__}: {str(exc)[:200]}"))
            return ("fail", "call failed")
        return ("fail", "call failed")

    def close(self) -> None:
        self.session._release_fd(self.sock)
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None



MAX_MESSAGES = 64              # per respond call
MAX_MESSAGE_CHARS = 1 << 20    # all messages of one respond call together


def _array(x, name: str) -> np.ndarray:
    """A float array from an agent: only an ``ndarray`` (a list could hold one array a million
    times by pickle memo references, and ``np.asarray`` would expand it)."""
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiu" or x.size > 64_000_000:
        raise ValueError(f"{name} must be a numeric ndarray. Found {type(x).__name__}.")
    return np.asarray(x, dtype=np.float64)


def _messages(messages) -> list:
    """The messages of one respond call, bounded before anything is copied or forwarded."""
    if not isinstance(messages, list) or len(messages) > MAX_MESSAGES:
        raise ValueError("messages must be a list of at most 64 dicts")
    out, total = [], 0
    for m in messages:
        if not isinstance(m, dict) or len(m) > 8:
            raise ValueError("each message must be a dict of at most 8 fields")
        d = {}
        for k, v in m.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError("message fields must be strings")
            total += len(k) + len(v)
            if total > MAX_MESSAGE_CHARS:
                raise ValueError("messages too long")
            d[k] = v
        out.append(d)
    return out
