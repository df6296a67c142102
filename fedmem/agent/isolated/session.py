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
from fedmem.agent.isolated.sandbox import AgentCgroup, Limits, pick_uids, sweep_uid
from fedmem.agent.isolated.wire import (AGENT_MAX_FRAME, FRAME_BUDGET, FRAME_DEADLINE_S, AgentDied, AgentTaskError,
                                        FrameBudget, loads_untrusted, recv_bytes)
from fedmem.agent.isolated.zygote import scrubbed_env, zygote_preexec

DEFAULT_UID_BASE = 200000
DEFAULT_UID_SPAN = 1 << 24     # agent uids are drawn from [uid_base, uid_base + uid_span)
DEFAULT_GID = 65534            # nogroup
SECRET_BYTES = 16
OUTPUT_CAP = 64 * 1024         # bytes of one agent's stdout/stderr relayed to the driver's log


class FederationDied(RuntimeError):
    """The federation service (a Ray actor) is gone: every agent's call would fail."""


def os_isolation_available() -> dict:
    """What this machine lets the session enforce: a uid drop and a network namespace need root."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return {"uid": root, "netns": root and sys.platform.startswith("linux")}


class IsolatedSession:
    """Agents in OS processes outside Ray (module docstring); the :class:`ActorSession` API.

    ``uid_base`` / ``uid_span`` / ``gid``: each agent runs as a uid drawn at random from
    ``[uid_base, uid_base + uid_span)`` that no live process holds (root only); all its
    processes are killed at :meth:`close`. ``netns``: give each agent an empty network
    namespace (root only). ``limits``: :class:`~fedmem.agent.isolated.sandbox.Limits` per agent
    (cgroups where available, else rlimits; ``self.enforced["limits"]`` says which).
    ``max_frame`` / ``frame_deadline_s`` / ``frame_budget``: bounds on what an agent sends
    (per frame, per frame's arrival, all agents' frames buffered at once). ``resume``: reuse
    the ledgers of an earlier session in ``out_dir`` (else a ledger already there is refused).
    ``out_dir`` must be traversable by the agents' uids (its parents need ``o+x``).
    """

    mode = "isolated"

    def __init__(self, worlds, fed_config, data, config, out_dir, *, seed: int, agent_cls=None,
                 step_delay_s: float = 0.0, projector=None, projectors: int = 2, uid_base: int = DEFAULT_UID_BASE,
                 gid: int = DEFAULT_GID, netns: bool = True, timeout_s: float = 300.0, start_batch: int = 16,
                 uid_span: int = DEFAULT_UID_SPAN, limits: Limits | None = None, max_frame: int = AGENT_MAX_FRAME,
                 frame_deadline_s: float = FRAME_DEADLINE_S, frame_budget: int = FRAME_BUDGET,
                 private_tmp: bool = True, resume: bool = False, principals: dict | None = None,
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
        self.limits = limits if limits is not None else Limits()
        self.max_frame = V.positive_int("max_frame", max_frame)
        self.frame_deadline_s = V.positive("frame_deadline_s", frame_deadline_s)
        self.frame_budget = FrameBudget(V.positive_int("frame_budget", frame_budget))
        self.tag = secrets.token_hex(4)
        self.uids: dict[str, int] = {}
        self.cgroups: dict[str, AgentCgroup] = {}
        self.agent_output: dict[str, list] = {}
        self.survivors: dict[str, int] = {}
        self._out_fds: dict[int, str] = {}
        self._out_bytes: dict[str, int] = {}
        self._fd_lock = threading.Lock()
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
            self._start_zygote()
            from fedmem.agent.ledger import LedgerSeal  # lazy: loads dp_accounting (~300 ms)

            existing = [str(p) for p in self.ledger_paths.values() if p.exists()]
            if existing and not resume:
                raise ValueError(f"out_dir holds the ledger of another session ({existing[0]}); ledgers are per "
                                 f"session: use a new out_dir, or resume=True to continue that session")
            self.seal = LedgerSeal(self.out_dir / "ledger_seal.sqlite", self.out_dir / "ledger_seal.key")
            uids = {w.user: None for w in self.worlds}
            if self.enforced["own_uid"]:
                shut = [str(q) for q in self.out_dir.resolve().parents if not os.stat(q).st_mode & 0o001]
                if shut:
                    raise ValueError(f"out_dir must be reachable by the agents' uids (every parent needs o+x). "
                                     f"Found {shut[0]} without it.")
                os.chmod(self.out_dir, os.stat(self.out_dir).st_mode | 0o001)
                os.chmod(led_dir, 0o1733)      # agents create their files; none can list or delete another's
                uids = dict(zip([w.user for w in self.worlds],
                                pick_uids(len(self.worlds), int(uid_base), int(uid_span))))
                self.uids = {u: v for u, v in uids.items() if v is not None}
            for i, w in enumerate(self.worlds):
                self._conns[w.user] = AgentConnection(self, w.user, i)
                if uids[w.user] is not None:
                    self.cgroups[w.user] = AgentCgroup(self.tag, f"a{i}", self.limits)
                    for suffix in ("", "-wal", "-shm"):
                        p = Path(f"{self.ledger_paths[w.user]}{suffix}")
                        if p.is_symlink():
                            p.unlink()
                        p.touch(mode=0o600, exist_ok=True)
                        os.chown(p, uids[w.user], gid, follow_symlinks=False)
                        os.chmod(p, 0o600)
            self.enforced["limits"] = self._limits_enforced()
            seeds = s_agents.generate_state(len(self.worlds), dtype=np.uint64)
            public = ray.get(self.fed.public_info.remote())
            self._resume_principals = dict(principals or {})
            for b in range(0, len(self.worlds), start_batch):
                batch = self.worlds[b:b + start_batch]
                for w in batch:
                    self._spawn(w.user, uids[w.user], gid, led_dir, bool(private_tmp))
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
    def _limits_enforced(self) -> dict:
        """How each limit is enforced on this machine (the first agent's cgroups stand for all)."""
        cg = next(iter(self.cgroups.values()), None)
        how = dict(cg.enforced) if cg is not None else {}
        lim = self.limits
        if not self.enforced["own_uid"]:
            return {"note": "not root: no uid drop, no cgroup, no rlimits, no private /tmp"}
        how.setdefault("memory", "none (no memory cgroup)" if not lim.address_space_mib
                       else f"RLIMIT_AS {lim.address_space_mib} MiB")
        how["pids"] = how.get("pids", "") + (f"; RLIMIT_NPROC {lim.pids} (own uid)" if lim.pids else "")
        how.setdefault("cpu", "none (no cpu cgroup)")
        how.setdefault("kill", "kill sweep of /proc by uid")
        how["kill"] += "; then a kill sweep of /proc by uid"
        how["files"] = f"RLIMIT_FSIZE {lim.file_mib} MiB, RLIMIT_NOFILE {lim.open_files}"
        how["tmp"] = f"private tmpfs /tmp and /dev/shm of {lim.tmp_mib} MiB (mount namespace)"
        how["no_new_privs"] = "PR_SET_NO_NEW_PRIVS"
        return how

    def _spawn(self, user: str, uid, gid: int, led_dir: Path, private_tmp: bool) -> None:
        """Fork one agent: its end of a socketpair (no socket in the file system: nothing else can
        connect) and the write end of its output pipe go to the zygote with the request."""
        c = self._conns[user]
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        r, wfd = os.pipe()
        cg = self.cgroups.get(user)
        req = {"secret": c.secret, "uid": uid, "gid": gid, "netns": self.enforced["network_namespace"],
               "cgroup_procs": cg.procs_files() if cg else [], "limits": vars(self.limits) if uid is not None else {},
               "private_tmp": private_tmp and uid is not None, "keep_dirs": [str(self.out_dir.resolve()), *_code_dirs()]}
        try:
            socket.send_fds(self._ctl, [json.dumps(req).encode()], [theirs.fileno(), wfd])
        finally:
            theirs.close()
            os.close(wfd)
        self._watch_output(r, user)
        rep = json.loads(self._ctl.recv(1 << 16) or b"{}")
        if "pid" not in rep:
            mine.close()
            raise RuntimeError(f"the agent zygote failed to fork: {rep.get('error', 'no answer')}")
        c.pid = int(rep["pid"])
        self._pids.append(c.pid)
        try:
            mine.settimeout(self.timeout_s)
            got = b""
            while len(got) < SECRET_BYTES:         # fixed size first; nothing larger before it matches
                chunk = mine.recv(SECRET_BYTES - len(got))
                if not chunk:
                    raise EOFError("closed")
                got += chunk
            if not secrets.compare_digest(got, bytes.fromhex(c.secret)):
                raise AgentDied("wrong secret")
            hello = loads_untrusted(recv_bytes(mine, max_frame=4096, deadline_s=self.frame_deadline_s))
            if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] == "hello"):
                raise AgentDied("no hello")
        except Exception as exc:  # noqa: BLE001
            mine.close()
            raise RuntimeError(f"agent {user} did not start: {type(exc).__name__}: {str(exc)[:200]}") from None
        c.sock = mine
        c.applied = hello[1] if isinstance(hello[1], dict) else {}
        c.connected.set()

    # ---- the agents' stdout/stderr: one thread, every pipe, prefixed lines into the driver's log
    def _watch_output(self, fd: int, label: str) -> None:
        import selectors

        with self._fd_lock:
            if not hasattr(self, "_sel"):
                self._sel = selectors.DefaultSelector()
                self._wake_r, self._wake_w = os.pipe()
                self._sel.register(self._wake_r, selectors.EVENT_READ, None)
                threading.Thread(target=self._pump, daemon=True, name="fedmem-isolated-output").start()
            os.set_blocking(fd, False)
            self._out_fds[fd] = label
            self._sel.register(fd, selectors.EVENT_READ, label)
            os.write(self._wake_w, b"x")

    def _pump(self) -> None:
        partial: dict[int, bytes] = {}
        while not self._closed:
            try:
                events = self._sel.select(timeout=0.5)
            except (OSError, ValueError):
                return
            for key, _ in events:
                fd = key.fd
                if key.data is None:
                    try:
                        os.read(fd, 4096)
                    except OSError:
                        pass
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    with self._fd_lock:
                        self._sel.unregister(fd)
                        os.close(fd)
                        self._out_fds.pop(fd, None)
                    continue
                self._relay(key.data, partial, fd, data)

    def _relay(self, label: str, partial: dict, fd: int, data: bytes) -> None:
        n = self._out_bytes.get(label, 0)
        if n >= OUTPUT_CAP:
            return
        self._out_bytes[label] = n + len(data)
        buf = partial.get(fd, b"") + data
        *lines, rest = buf.split(b"\n")
        partial[fd] = rest[-4096:]
        if self._out_bytes[label] >= OUTPUT_CAP:
            lines.append(b"... (output cut: more than %d bytes)" % OUTPUT_CAP)
        for raw in lines:
            text = "".join(ch if ch.isprintable() else "?" for ch in raw.decode("utf-8", "replace"))[:400]
            tail = self.agent_output.setdefault(label, [])
            tail.append(text)
            del tail[:-50]
            try:
                sys.stderr.write(f"[agent {label}] {text}\n")
            except Exception:  # noqa: BLE001
                pass

    def _release_fd(self, sock) -> None:
        """Hook of AgentConnection.close (nothing to release: a socketpair has no listener)."""

    def _start_zygote(self) -> None:
        import subprocess

        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"from fedmem.agent.isolated import zygote_main; zygote_main({theirs.fileno()})"
        env = scrubbed_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        r, wfd = os.pipe()
        self._zygote = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=wfd,
                                        stderr=wfd, env=env, close_fds=True, pass_fds=(theirs.fileno(),),
                                        preexec_fn=zygote_preexec, cwd="/")
        theirs.close()
        os.close(wfd)
        self._ctl = ctl
        self._watch_output(r, "zygote")
        ctl.settimeout(self.timeout_s)
        try:
            ready = ctl.recv(64)
        except OSError:
            ready = b""
        if not ready.startswith(b"{"):
            raise RuntimeError("the agent zygote failed to start (see its [agent zygote] lines in the log)")

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
        fed_died: list = []

        def run(user, tasks):
            c = self._conns[user]
            for i, t in enumerate(tasks):
                try:
                    got = c.command("step", int(t), timeout_s=self.timeout_s)
                    res, dt = _step_result(got, int(t))
                except AgentDied as exc:
                    with lock:
                        self.dead[user] = {"task": t, "error": f"AgentDied: {exc}", "lost_tasks": list(tasks[i:])}
                    return
                except (AgentTaskError, ValueError) as exc:    # raised, or a malformed result: this agent only
                    with lock:
                        self.failed.setdefault(user, []).append({"task": t, "error": str(exc)[:300]})
                    try:
                        self._check_federation()
                    except FederationDied as died:
                        fed_died.append(died)
                        return
                    continue
                finally:
                    self._attest(user)
                with lock:
                    out[user].append(res)
                    step_s.append(float(dt))

        ts = [threading.Thread(target=run, args=(u, tasks), daemon=True) for u, tasks in self._pending.items()]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if fed_died:
            raise fed_died[0]
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
        """``method`` (step, spend, composed, check, exposures, pid) on every live agent that has not
        failed: an agent whose command raises is recorded in ``failed`` (task None) and left out;
        the others' values stand. A dead federation service raises :class:`FederationDied`."""
        got = self._parallel({u: (method, *args) for u in self.alive()})
        out = {}
        for u, v in got.items():
            if isinstance(v, AgentTaskError):
                self.failed.setdefault(u, []).append({"task": None, "error": f"{method}: {str(v)[:300]}"})
            elif not isinstance(v, Exception):
                out[u] = v
        if len(out) < len(got):
            self._check_federation()
        return out

    def _check_federation(self) -> None:
        """Raise :class:`FederationDied` if the federation service no longer answers."""
        import ray

        try:
            ray.get(self.fed.ping.remote(), timeout=min(30.0, self.timeout_s))
        except Exception as exc:  # noqa: BLE001
            raise FederationDied(f"the federation service died ({type(exc).__name__}); the session cannot go on") \
                from None

    def _attest(self, user: str) -> None:
        """Seal the rows of ``user``'s ledger written so far (after each of its steps)."""
        if getattr(self, "seal", None) is None:
            return
        try:
            self.seal.attest(user, self.ledger_paths[user], self.uids.get(user))
        except Exception as exc:  # noqa: BLE001
            self.call_errors.append((user, "seal", f"{type(exc).__name__}: {str(exc)[:200]}"))

    def verify_ledgers(self) -> dict:
        """{user: problems} of the driver's integrity check of every agent ledger against its seal
        (rows written outside a step, by another session, removed or changed)."""
        return {w.user: self.seal.verify(w.user, self.ledger_paths[w.user], self.uids.get(w.user))
                for w in self.worlds}

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
        ctl = getattr(self, "_ctl", None)
        if ctl is not None:
            try:
                ctl.close()
            except OSError:
                pass
        # nothing of an agent outlives its session: its cgroups killed as a whole, then its uid swept
        for u, cg in self.cgroups.items():
            try:
                cg.kill()
            except Exception:  # noqa: BLE001
                pass
        for u, uid in self.uids.items():
            try:
                sweep_uid(uid)
            except Exception:  # noqa: BLE001
                pass
        from fedmem.agent.isolated.sandbox import pids_of_uid  # lazy: ~1 ms, no heavy package

        self.survivors = {u: len(pids_of_uid(uid)) for u, uid in self.uids.items() if pids_of_uid(uid)}
        for cg in self.cgroups.values():
            cg.remove()
        from fedmem.agent.lifecycle import close_actors  # lazy: ~1 ms, no heavy package

        close_actors(getattr(self, "fed", None), self._handles)
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _step_result(got, task: int):
    """(StepResult, seconds) from what the agent answered to ``step``; ValueError otherwise."""
    from fedmem.agent.client import StepResult  # lazy: loads dp_accounting (~300 ms)

    if not (isinstance(got, tuple) and len(got) == 2):
        raise ValueError(f"malformed step result: {type(got).__name__}")
    res, dt = got
    if not isinstance(res, StepResult):
        raise ValueError(f"malformed step result: {type(res).__name__}, not StepResult")
    if res.task != task or not isinstance(dt, (float, int, np.floating)):
        raise ValueError("malformed step result: wrong task or time")
    return res, float(dt)


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


def _code_dirs() -> list[str]:
    """The folders the agent's code is imported from (``sys.path`` and the working directory)
    that lie strictly below /tmp or /dev/shm: the private tmpfs mounted there would hide them
    (a project checked out under /tmp, as a CI clone may be); they are bound back read as they
    are. /tmp and /dev/shm themselves are never bound back (that would undo the private tmp)."""
    out = []
    for p in [os.getcwd(), *sys.path]:
        try:
            real = os.path.realpath(p or os.getcwd())
        except OSError:
            continue
        if not os.path.isdir(real):
            continue
        if any(real.startswith(t + os.sep) for t in ("/tmp", "/dev/shm")) and real not in out:
            out.append(real)
    return sorted(out, key=len)
