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
                    msg = loads_untrusted(recv_bytes(self.sock))
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
            except (OSError, EOFError, pickle.UnpicklingError, struct.error, ValueError, TypeError) as exc:
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
                q = np.asarray(q, dtype=np.float64)
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
                pts = np.asarray(args[0], dtype=np.float64)
                if pts.ndim != 2 or pts.shape[1] != s.table_dim or pts.shape[0] > 1_000_000:
                    raise ValueError(f"points must have shape (n, {s.table_dim}). Found {pts.shape}.")
                proj = s.projectors[self.index % len(s.projectors)]
                return ("reply", np.asarray(ray.get(proj.project.remote(pts), timeout=s.timeout_s)))
            if name == "respond":
                kind, messages = args
                obs = {"app": s.app, "external": s.external}.get(kind)
                if obs is None:
                    raise ValueError("kind must be 'app' or 'external'.")
                msgs = [{str(k): str(v) for k, v in dict(m).items()} for m in messages]
                return ("reply", str(ray.get(obs.respond.remote(self.user, msgs), timeout=s.timeout_s)))
        except Exception as exc:  # noqa: BLE001 - the agent learns only that its call failed
            s.call_errors.append((self.user, name, f"{type(exc).__name__}: {str(exc)[:200]}"))
            return ("fail", "call failed")
        return ("fail", "call failed")

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

