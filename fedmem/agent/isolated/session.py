"""The session side of isolated agents: :class:`IsolatedSession` starts the federation's Ray
services, the RPC server and the zygote, and drives the agents over their connections."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from fedmem.agent.isolated.connection import AgentConnection
from fedmem.agent.isolated.wire import AgentDied, AgentTaskError, loads_untrusted, recv_bytes
from fedmem.agent.isolated.zygote import scrubbed_env, zygote_preexec

DEFAULT_UID_BASE = 200000
DEFAULT_GID = 65534            # nogroup


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

        from fedmem import _validate as V  # lazy: ~4 ms, no heavy package
        from fedmem.agent.actors import start_observer  # lazy: ~7 ms, no heavy package
        from fedmem.agent.dpmind import load_minilm  # lazy: loads dp_accounting (~240 ms)
        from fedmem.agent.federation_service import start_federation_service, start_projector_service  # lazy: ~15 ms, no heavy package

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
            self.app = start_observer("app", template_book=self.worlds[0].template_book if self.worlds else None)
            self.external = start_observer("external")
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
                self._conns[w.user] = AgentConnection(self, w.user, i)
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
            msg = loads_untrusted(recv_bytes(conn))
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

        code = "from fedmem.agent.isolated import zygote_main; zygote_main()"
        env = scrubbed_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._zygote = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True, close_fds=True, preexec_fn=zygote_preexec,
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
        from fedmem.agent.lifecycle import reopen_agent_ledger  # lazy: ~1 ms, no heavy package

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
        from fedmem.agent.lifecycle import close_actors  # lazy: ~1 ms, no heavy package

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
