"""Isolated agents: each agent in its own OS process, outside the Ray cluster.

Ray confines nothing between the processes of one cluster: any code in it can list every
actor, rebuild a handle from the GCS and run code inside it (``__ray_call__``). So in
this mode an agent's code never runs in the cluster. :class:`IsolatedSession` keeps the
federation (shard hosts, parties, aggregator, gateway in
:class:`~fedmem.agent.federation_service.FederationService`), the projector services
and the two boundary observers in Ray, and runs every agent's
:class:`~fedmem.agent.client.AgentClient` in a process of its own:

* **spawned outside Ray**: a *zygote* (``python -c ...`` with a scrubbed environment: no
  ``RAY_*`` variable, no address) imports the agent code and the MiniLM table once, then
  ``fork``s one child per agent. Neither ever calls into Ray or receives a Ray address,
  handle or object reference.
* **under its own uid** when the session runs as root (as CI does): the child drops to
  ``uid_base + i`` / gid ``gid`` (no supplementary groups) before any agent code runs,
  so agents cannot read each other's memory (``/proc/<pid>/mem``), signal each other,
  read the federation's ledger (mode 0600, root) or the raylet's file descriptors
  (``/proc/<raylet>/fd``, the plasma file). Not root: the child keeps the session's
  uid and this is reported (``IsolatedSession.enforced``).
* **in its own network namespace** (root only: ``unshare(CLONE_NEWNET)``): no TCP to
  the GCS, raylet, object manager or anything else on the host; only the RPC below, a
  Unix socket in the file system.
* **one narrow RPC** (:class:`_Conn`, length-prefixed frames on that Unix socket, the
  child authenticated by a 128-bit secret it received from the zygote): the agent may
  ``connect`` (once: its capability), ``retrieve`` under a capability, read the
  ``spent`` and ``bookings`` of a capability, ``project`` noisy embeddings (DP-MIND's
  shared nearest-token search) and ``respond`` (send messages to the third-party app or
  the external model, as its own user only). Nothing else is served: no ``audit``, no
  ground truth, no other principal's spend, no file path. What the agent sends is
  decoded by an allow-list unpickler (numpy arrays, plain containers, ``StepResult``),
  never by ``pickle.loads``, so an agent cannot run code in the session's process.

The driver talks to each agent over the same connection (commands ``init``, ``step``,
``spend``, ``composed``, ``check``, ``exposures``, ``pid``), and the agent's own RPC
calls are served while a command is outstanding. Each agent keeps its own ledger file
(``ledgers/<user>.sqlite``, created for its uid, mode 0600, in a sticky 1733 directory);
it reads its federation bookings through the RPC, never from ``federation.sqlite``.

What stays simulated (docs/agents.md, "What is enforced where"): everything *inside* the
Ray cluster (hosts, parties, services share Ray's trust domain), and the in-cluster mode
(:class:`~fedmem.agent.session.ActorSession`).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import queue
import secrets
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np

MAX_FRAME = 64 * 1024 * 1024
DEFAULT_UID_BASE = 200000
DEFAULT_GID = 65534            # nogroup
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# Imported by the zygote before it forks: an agent that dropped to another uid may not be
# able to read the interpreter's standard library (e.g. a pyenv Python under /root, 0700),
# so everything the agent path imports lazily is imported here (measured from a run). This
# is a fast path, not a requirement: a pure-Python module missing from it is read after the
# drop through directory descriptors opened before it (:class:`_DirFdFinder`).
PRELOAD = ("getpass", "glob", "html", "html.entities", "shlex", "termios", "timeit", "uuid", "bdb", "xml.dom.minidom",
           "importlib.resources.readers", "encodings.idna", "sqlite3", "hashlib", "secrets", "traceback", "fedmem.bench.pairedmem",
           "fedmem.bench.shards", "fedmem.dp", "dp_accounting.rdp", "dp_accounting.pld", "fedmem.agent.actors",
           "fedmem.agent.session", "fedmem.agent.federation_service", "fedmem.federation.engine", "scipy.stats",
           "pytest")
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


def _loads_untrusted(data: bytes):
    return _SafeUnpickler(io.BytesIO(data)).load()


def _mappingproxy(d: dict):
    from types import MappingProxyType

    return MappingProxyType(d)


def _dumps(obj) -> bytes:
    from types import MappingProxyType

    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = {MappingProxyType: lambda m: (_mappingproxy, (dict(m),))}
    p.dump(obj)
    return buf.getvalue()


def _send(sock: socket.socket, obj) -> None:
    data = _dumps(obj)
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_bytes(sock: socket.socket) -> bytes:
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


# ============================================================================ session side
class _Conn:
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
                _send(self.sock, ("cmd", name, args))
                while True:
                    msg = _loads_untrusted(_recv_bytes(self.sock))
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
                        _send(self.sock, self._serve(msg[1], msg[2]) if ok else ("fail", "call failed"))
                        continue
                    raise AgentDied(f"unexpected message {str(msg[0])[:40]!r}")
            except (OSError, EOFError, pickle.UnpicklingError, struct.error, ValueError, TypeError) as exc:
                self.close()
                raise AgentDied(f"{type(exc).__name__}: {str(exc)[:200]}") from None

    def _serve(self, name: str, args: tuple):
        """One RPC call of the agent: only what its user may do."""
        import ray

        from fedmem.agent.federation_service import REFUSED

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


def _scrubbed_env() -> dict:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["HOME"] = "/nonexistent"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _zygote_preexec():  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except Exception:  # noqa: BLE001
        pass


def os_isolation_available() -> dict:
    """What this machine lets the session enforce: a uid drop and a network namespace need root."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return {"uid": root, "netns": root and sys.platform.startswith("linux")}


class IsolatedSession:
    """Agents in OS processes outside Ray (module docstring); the :class:`ActorSession` API.

    ``uid_base`` / ``gid``: agent ``i`` runs as ``uid_base + i`` (root only).
    ``netns``: give each agent an empty network namespace (root only). ``out_dir`` must be
    traversable by those uids (its parents need ``o+x``) when they are used.
    """

    mode = "isolated"

    def __init__(self, worlds, fed_config, data, config, out_dir, *, seed: int, agent_cls=None,
                 step_delay_s: float = 0.0, projector=None, projectors: int = 2, uid_base: int = DEFAULT_UID_BASE,
                 gid: int = DEFAULT_GID, netns: bool = True, timeout_s: float = 300.0, start_batch: int = 16,
                 **_ignored):
        import ray

        from fedmem import _validate as V
        from fedmem.agent.actors import start_observer
        from fedmem.agent.dpmind import load_minilm
        from fedmem.agent.federation_service import start_federation_service, start_projector_service

        if not ray.is_initialized():
            raise RuntimeError("IsolatedSession needs Ray (for the federation): call fedmem._ray.ensure_ray() first.")
        projectors = V.positive_int("projectors", projectors)
        start_batch = V.positive_int("start_batch", start_batch)
        avail = os_isolation_available()
        self.enforced = {"own_process_outside_ray": True, "own_uid": avail["uid"],
                         "network_namespace": bool(netns and avail["netns"])}
        self.worlds = list(worlds)
        self.config = config
        self.timeout_s = float(timeout_s)
        self.key_dim = int(fed_config.key_dim)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        led_dir = self.out_dir / "ledgers"
        led_dir.mkdir(parents=True, exist_ok=True)
        self.fed_path = self.out_dir / "federation.sqlite"
        self.ledger_paths = {w.user: led_dir / f"{w.user}.sqlite" for w in self.worlds}
        self.principals: dict[str, str] = {}
        self.dead: dict[str, dict] = {}
        self.failed: dict[str, list] = {}
        self.call_errors: list = []
        self.timings: dict[str, float] = {}
        self._handles, self._conns, self._pids = [], {}, []
        self._zygote = None
        self._sockdir = None
        self._server = None
        self._closed = False
        ss = np.random.SeedSequence(int(seed))
        s_fed, s_agents = ss.spawn(2)
        t0 = time.perf_counter()
        try:
            self.fed = start_federation_service(fed_config, data, self.fed_path, seed=int(s_fed.generate_state(1)[0]))
            self._handles.append(self.fed)
            self.fed_info = ray.get(self.fed.info.remote())
            if projector is None:
                projector = [start_projector_service() for _ in range(projectors)]
                self._handles += projector
            self.projectors = list(projector) if isinstance(projector, (list, tuple)) else [projector]
            self.projector = self.projectors[0]
            self.app, self.external = start_observer("app"), start_observer("external")
            self._handles += [self.app, self.external]
            table, _ = load_minilm()
            self.table_dim = int(table.dim)
            self.timings["services_s"] = time.perf_counter() - t0
            self._start_server()
            self._start_zygote()
            uids = {}
            if self.enforced["own_uid"]:
                shut = [str(q) for q in self.out_dir.resolve().parents if not os.stat(q).st_mode & 0o001]
                if shut:
                    raise ValueError(f"out_dir must be reachable by the agents' uids (every parent needs o+x). "
                                     f"Found {shut[0]} without it.")
                os.chmod(self.out_dir, os.stat(self.out_dir).st_mode | 0o001)
                os.chmod(led_dir, 0o1733)      # agents create their files; none can list or delete another's
            for i, w in enumerate(self.worlds):
                self._conns[w.user] = _Conn(self, w.user, i)
                uids[w.user] = uid_base + i if self.enforced["own_uid"] else None
                if uids[w.user] is not None:
                    for suffix in ("", "-wal", "-shm"):
                        p = Path(f"{self.ledger_paths[w.user]}{suffix}")
                        p.touch(mode=0o600, exist_ok=True)
                        os.chown(p, uids[w.user], gid)
                        os.chmod(p, 0o600)
            seeds = s_agents.generate_state(len(self.worlds), dtype=np.uint64)
            public = ray.get(self.fed.public_info.remote())
            for b in range(0, len(self.worlds), start_batch):
                batch = self.worlds[b:b + start_batch]
                for w in batch:
                    c = self._conns[w.user]
                    req = {"sock": self._sockpath, "secret": c.secret, "uid": uids[w.user], "gid": gid,
                           "netns": self.enforced["network_namespace"]}
                    self._zygote.stdin.write(json.dumps(req) + "\n")
                    self._zygote.stdin.flush()
                    rep = json.loads(self._zygote.stdout.readline() or "{}")
                    if "pid" not in rep:
                        raise RuntimeError(f"the agent zygote failed to fork: {rep.get('error', 'no answer')}")
                    c.pid = int(rep["pid"])
                    self._pids.append(c.pid)
                for w in batch:
                    if not self._conns[w.user].connected.wait(self.timeout_s):
                        raise RuntimeError(f"agent {w.user} did not connect within {self.timeout_s:g} s")
                idx = {w.user: self.worlds.index(w) for w in batch}
                payloads = {w.user: {"world": w, "config": config, "seed": int(seeds[idx[w.user]]),
                                     "fed_info": public, "ledger_path": str(self.ledger_paths[w.user]),
                                     "agent_cls": agent_cls.get(w.user) if isinstance(agent_cls, dict) else agent_cls,
                                     "step_delay_s": float(step_delay_s)} for w in batch}
                self._parallel({w.user: ("init", payloads[w.user]) for w in batch})
            self.timings["actors_s"] = time.perf_counter() - t0 - self.timings["services_s"]
        except BaseException:
            self.close()
            raise
        self._pending: dict[str, list] = {}

    # ------------------------------------------------------------------ plumbing
    def _start_server(self) -> None:
        import tempfile

        self._sockdir = tempfile.mkdtemp(prefix="fedmem-rpc-")
        os.chmod(self._sockdir, 0o711)                  # agents may reach the socket, not list the directory
        self._sockpath = os.path.join(self._sockdir, f"{secrets.token_hex(8)}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(self._sockpath)
        os.chmod(self._sockpath, 0o666)                 # any local process may connect; only a secret is served
        srv.listen(256)
        self._server = srv
        by_secret = self._conns

        def accept_loop():
            while not self._closed:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=self._hello, args=(conn, by_secret), daemon=True).start()

        threading.Thread(target=accept_loop, daemon=True, name="fedmem-isolated-accept").start()

    def _hello(self, conn: socket.socket, conns: dict) -> None:
        try:
            conn.settimeout(30)
            msg = _loads_untrusted(_recv_bytes(conn))
            ok = isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "hello" and isinstance(msg[1], str)
            match = next((c for c in list(conns.values()) if ok and secrets.compare_digest(c.secret, msg[1])), None)
            if match is None or match.sock is not None:
                conn.close()
                return
            match.sock = conn
            match.connected.set()
        except Exception:  # noqa: BLE001 - anyone may knock; nothing is said to them
            conn.close()

    def _start_zygote(self) -> None:
        import subprocess

        code = "from fedmem.agent.isolated import _zygote_main; _zygote_main()"
        env = _scrubbed_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._zygote = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True, close_fds=True, preexec_fn=_zygote_preexec,
                                        cwd="/")
        ready = self._zygote.stdout.readline()
        if not ready.startswith("{"):
            raise RuntimeError(f"the agent zygote failed to start: {ready!r}")

    def _parallel(self, jobs: dict) -> dict:
        """Run ``{user: (command, *args)}`` concurrently; returns {user: value or exception}."""
        out: dict = {}

        def run(u, cmd):
            try:
                out[u] = self._conns[u].command(cmd[0], *cmd[1:], timeout_s=self.timeout_s)
            except Exception as exc:  # noqa: BLE001
                out[u] = exc

        ts = [threading.Thread(target=run, args=(u, cmd), daemon=True) for u, cmd in jobs.items()]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for u, v in out.items():
            if isinstance(v, AgentDied):
                self.dead.setdefault(u, {"task": None, "error": f"AgentDied: {v}", "lost_tasks": []})
            elif jobs[u][0] == "init" and isinstance(v, Exception):
                raise RuntimeError(f"agent {u} failed to start: {v}")
        return out

    # ------------------------------------------------------------------ the ActorSession API
    def submit(self):
        for w in self.worlds:
            if w.user not in self.dead:
                self._pending[w.user] = [t.index for t in w.tasks]
        return list(self._pending)

    def gather(self) -> dict:
        out: dict[str, list] = {w.user: [] for w in self.worlds}
        step_s: list[float] = []
        lock = threading.Lock()

        def run(user, tasks):
            c = self._conns[user]
            for i, t in enumerate(tasks):
                try:
                    res, dt = c.command("step", int(t), timeout_s=self.timeout_s)
                except AgentDied as exc:
                    with lock:
                        self.dead[user] = {"task": t, "error": f"AgentDied: {exc}", "lost_tasks": list(tasks[i:])}
                    return
                except AgentTaskError as exc:
                    with lock:
                        self.failed.setdefault(user, []).append({"task": t, "error": str(exc)})
                    continue
                with lock:
                    out[user].append(res)
                    step_s.append(float(dt))

        ts = [threading.Thread(target=run, args=(u, tasks), daemon=True) for u, tasks in self._pending.items()]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self._pending = {}
        for u in out:
            out[u].sort(key=lambda r: r.task)
        self.step_s = step_s
        return out

    def run(self) -> dict:
        self.submit()
        return self.gather()

    def alive(self) -> list[str]:
        return [w.user for w in self.worlds if w.user not in self.dead]

    def call(self, method: str, *args) -> dict:
        """``method`` (step, spend, composed, check, exposures, pid) on every live agent."""
        got = self._parallel({u: (method, *args) for u in self.alive()})
        bad = {u: v for u, v in got.items() if isinstance(v, AgentTaskError)}
        if bad:
            u, v = next(iter(bad.items()))
            raise AgentTaskError(f"{method} failed in {u}: {v}")
        return {u: v for u, v in got.items() if not isinstance(v, Exception)}

    def service_stats(self) -> dict:
        import ray

        return {"federation": ray.get(self.fed.stats.remote()),
                "projectors": ray.get([p.stats.remote() for p in self.projectors])}

    def reopen_ledger(self, user: str):
        from fedmem.agent.session import reopen_agent_ledger

        return reopen_agent_ledger(self, user)

    def agent_pids(self) -> dict:
        return {u: c.pid for u, c in self._conns.items() if c.pid is not None}

    def memory(self) -> dict:
        """Proportional set size (PSS, shared pages split) of the agent processes and the zygote, MiB."""
        pids = list(self.agent_pids().values()) + ([self._zygote.pid] if self._zygote else [])
        return {"agents_pss_mib": sum(pss_mib(p) for p in pids), "processes": len(pids)}

    def kill_agent(self, user: str) -> None:
        """SIGKILL one agent's process (fault injection)."""
        import signal

        pid = self._conns[user].pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        import signal

        if self._closed:
            return
        self._closed = True
        for c in self._conns.values():
            c.close()
        for pid in self._pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._zygote is not None:
            try:
                self._zygote.kill()
                self._zygote.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
        if self._server is not None:
            try:
                self._server.close()
            except OSError:
                pass
        if self._sockdir:
            import shutil

            shutil.rmtree(self._sockdir, ignore_errors=True)
        from fedmem.agent.session import close_actors

        close_actors(getattr(self, "fed", None), self._handles)
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pss_mib(pid: int) -> float:
    """PSS of one process in MiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return 0.0
    return 0.0


# ============================================================================ agent side
def _zygote_main() -> None:  # pragma: no cover - runs in the zygote process
    """Import the agent code once, then fork one child per request line on stdin."""
    import signal

    import fedmem.agent.brace  # noqa: F401
    import fedmem.agent.client  # noqa: F401
    import fedmem.agent.dpmind  # noqa: F401
    import fedmem.agent.llm  # noqa: F401
    import fedmem.agent.memview  # noqa: F401
    import fedmem.federation.gateway  # noqa: F401
    from fedmem.agent.dpmind import load_minilm

    table, codec = load_minilm()
    import importlib

    for name in PRELOAD:      # after the uid drop the interpreter's own files may be unreadable
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - optional (e.g. pytest outside the test suite)
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)        # children are reaped automatically
    print("{}", flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        try:
            req = json.loads(line)
            pid = os.fork()
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            continue
        if pid == 0:
            code = 1
            try:
                _child(req, table, codec)
                code = 0
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)


def _child(req: dict, table, codec) -> None:  # pragma: no cover - runs in the agent process
    import ctypes
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)                                  # never write into the zygote's pipe
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if req.get("netns"):
        if libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
    if req.get("uid") is not None:
        finder = _DirFdFinder([q for q in sys.path if q and os.path.isabs(q)])   # opened while still root
        os.setgroups([])
        os.setgid(int(req["gid"]))
        os.setuid(int(req["uid"]))
        if os.getuid() != int(req["uid"]) or os.geteuid() != int(req["uid"]):
            raise OSError("failed to drop privileges")
        sys.meta_path.append(finder)       # after the interpreter's own finders: only what they cannot read
    os.umask(0o077)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(req["sock"])
    _send(sock, ("hello", req["secret"]))
    _AgentProcess(sock, table, codec).serve()


class _SourceBytesLoader:
    """Executes a module's source read through :class:`_DirFdFinder` (``importlib`` loader API)."""

    def __init__(self, origin: str, source: bytes):
        self.origin, self.source = origin, source

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(compile(self.source, self.origin, "exec", dont_inherit=True), module.__dict__)  # noqa: S102

    def get_source(self, fullname: str) -> str:
        import importlib.util

        return importlib.util.decode_source(self.source)


class _DirFdFinder:
    """The import fallback of an agent that dropped to another uid (:data:`PRELOAD` is only a
    fast path): a module that the zygote did not import, and that the agent's uid cannot read
    by its path (e.g. the standard library of a Python under ``/root``, mode 0700), is read
    through a directory descriptor of each ``sys.path`` entry, opened *before* the uid drop.

    Path resolution from such a descriptor checks permissions only below it, so the agent
    reads the interpreter's files (modes 0644/0755 below the entry) and nothing more: ``..``
    leads back to the closed directory, whose entries its uid still cannot search or list.
    Appended to ``sys.meta_path`` after the interpreter's own finders, it answers only what
    they could not. Pure-Python modules and packages only (an extension module still has to
    be in :data:`PRELOAD`).
    """

    def __init__(self, roots):
        self._fds: dict[str, int] = {}
        for r in roots:
            r = os.path.abspath(r)
            if r == os.sep or r in self._fds:
                continue
            try:
                self._fds[r] = os.open(r, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue

    def _locate(self, directory: str):
        directory = os.path.abspath(directory)
        for root, fd in self._fds.items():
            if directory == root:
                return fd, "."
            if directory.startswith(root + os.sep):
                return fd, os.path.relpath(directory, root)
        return None

    def find_spec(self, fullname: str, path=None, target=None):
        import importlib.util

        name = fullname.rpartition(".")[2]
        for d in (list(self._fds) if path is None else list(path)):
            loc = self._locate(d)
            if loc is None:
                continue
            fd, rel = loc
            for cand, is_pkg in ((os.path.join(rel, name, "__init__.py"), True),
                                 (os.path.join(rel, name + ".py"), False)):
                try:
                    src = os.open(cand, os.O_RDONLY, dir_fd=fd)
                except OSError:
                    continue
                with os.fdopen(src, "rb") as fh:
                    source = fh.read()
                origin = os.path.normpath(os.path.join(d, cand[len(rel) + 1:] if rel != "." else cand))
                spec = importlib.util.spec_from_loader(fullname, _SourceBytesLoader(origin, source), origin=origin,
                                                       is_package=is_pkg)
                if is_pkg:
                    spec.submodule_search_locations = [os.path.join(os.path.abspath(d), name)]
                spec.has_location = True
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


class _Rpc:
    """The agent's end: ``call(name, *args)`` while a command is outstanding."""

    def __init__(self, sock):
        self.sock = sock

    def call(self, name: str, *args):
        _send(self.sock, ("call", name, args))
        msg = pickle.loads(_recv_bytes(self.sock))          # from the session (trusted by the agent)
        if msg[0] == "reply":
            return msg[1]
        if msg[0] == "refused":
            from fedmem.federation.gateway import refusal

            raise refusal(msg[1])
        raise RuntimeError(f"{name}: {msg[1]}")


class RpcMemoryClient:
    """The ``MemoryClient`` API over the isolated RPC, with the agent's own capability."""

    def __init__(self, rpc: _Rpc, principal):
        self._rpc = rpc
        self.principal = principal
        self.family = None
        self.responses: list = []
        self.refusals: list = []

    def _cap(self) -> str:
        return getattr(self.principal, "capability", self.principal)

    def retrieve(self, q, *, family: str | None = None, retry_of: int | None = None):
        from fedmem.errors import SupportPrivacyViolation

        try:
            r = self._rpc.call("retrieve", self._cap(), np.asarray(q, dtype=np.float64), family or self.family,
                               retry_of)
        except SupportPrivacyViolation as exc:
            self.refusals.append(exc)
            raise
        self.responses.append(r)
        return r

    @property
    def epsilon_spent(self) -> float:
        return float(self._rpc.call("spent", self._cap()))

    def bookings(self) -> list:
        return self._rpc.call("bookings", self._cap())


class _RpcProjector:
    name = "remote"

    def __init__(self, rpc: _Rpc, table):
        self._rpc, self.table = rpc, table

    def project(self, points) -> np.ndarray:
        pts = np.asarray(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != self.table.dim:
            raise ValueError(f"points must have shape (n, {self.table.dim}). Found shape {pts.shape}.")
        return np.asarray(self._rpc.call("project", pts))


class _RpcResponder:
    def __init__(self, rpc: _Rpc, kind: str):
        self._rpc, self.kind = rpc, kind

    def respond(self, messages) -> str:
        return self._rpc.call("respond", self.kind, [dict(m) for m in messages])


class _AgentProcess:  # pragma: no cover - runs in the agent process
    def __init__(self, sock, table, codec):
        self.sock, self.table, self.codec = sock, table, codec
        self.rpc = _Rpc(sock)
        self.host = None

    def serve(self) -> None:
        while True:
            try:
                msg = pickle.loads(_recv_bytes(self.sock))
            except EOFError:
                return
            _, name, args = msg
            try:
                if name == "init":
                    value = self._init(*args)
                elif name == "pid":
                    value = os.getpid()
                elif name in ("step", "spend", "composed", "check", "exposures", "ping"):
                    value = getattr(self.host, name)(*args)
                else:
                    raise ValueError(f"unknown command {name!r}")
            except Exception as exc:  # noqa: BLE001
                _send(self.sock, ("error", f"{type(exc).__name__}: {str(exc)[:300]}"))
                continue
            _send(self.sock, ("done", value))

    def _init(self, p: dict) -> str:
        from fedmem.agent.actors import AgentHost
        from fedmem.agent.client import AgentClient
        from fedmem.agent.dpmind import TokenPerturber
        from fedmem.dp import DurableStore, MetricLaplace
        from fedmem.federation.gateway import Principal

        world, config = p["world"], p["config"]
        label, token = self.rpc.call("connect")
        client = RpcMemoryClient(self.rpc, Principal(label, token))
        perturber = TokenPerturber(MetricLaplace(float(config.dpmind_epsilon), self.table.dim), self.table,
                                   _RpcProjector(self.rpc, self.table))
        cls = p["agent_cls"] or AgentClient
        store = DurableStore(p["ledger_path"])
        agent = cls(world.user, policy=world.pair.policy, memory=world.pair.stores["M"], federation=client,
                    bank=world.bank, config=config, store=store, rng=np.random.default_rng(int(p["seed"])),
                    federation_store=None, federation_accountant=p["fed_info"]["accountant"],
                    federation_delta=p["fed_info"]["delta"], perturber=perturber, codec=self.codec,
                    app_responder=_RpcResponder(self.rpc, "app"),
                    external_responder=_RpcResponder(self.rpc, "external"))
        host = AgentHost.__new__(AgentHost)
        host.user, host.ledger_path, host.agent = world.user, p["ledger_path"], agent
        host.tasks = {t.index: t for t in world.tasks}
        host.step_delay_s = float(p["step_delay_s"])
        self.host = host
        return label
