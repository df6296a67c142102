"""What confines one isolated agent beyond its uid and network namespace: a fresh uid no live
process holds, a cgroup per agent (killed as a whole at close), resource limits, and the kill
sweep that makes sure nothing of an agent's uid outlives its session.

The session side (:class:`AgentCgroup`, :func:`pick_uids`, :func:`sweep_uid`) runs as root in
the driver; :func:`confine_child` runs in the forked agent process before and after its uid
drop. Every mechanism is tried and what this kernel did not allow is recorded (``enforced``)
and degraded to the next one (docs/agents.md, "Sandbox limits"):

* kill at close: cgroup v2 ``cgroup.kill``; else SIGKILL of every pid in the agent's cgroups
  (v1 or v2), repeated until none; always followed by a sweep of ``/proc`` by uid, repeated
  until no process of the uid is left.
* memory / pids / cpu: cgroup v2 ``memory.max`` / ``pids.max`` / ``cpu.max`` where the
  controllers are delegated, else the v1 controllers (``memory.limit_in_bytes``,
  ``pids.max``, ``cpu.cfs_quota_us``); rlimits (AS, NPROC, FSIZE, NOFILE, CORE) always.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE, MS_BIND, MS_NOSUID, MS_NODEV = 0x4000, 0x40000, 0x1000, 0x2, 0x4


@dataclass(frozen=True)
class Limits:
    """Per-agent resource limits (``IsolatedSession(limits=Limits(...))``; 0 switches one off)."""

    memory_mib: int = 2048        # cgroup memory.max (v2) / memory.limit_in_bytes (v1)
    pids: int = 64                # cgroup pids.max; RLIMIT_NPROC of the agent's own uid
    cpu_percent: int = 100        # cgroup cpu.max / cfs quota, percent of one core
    address_space_mib: int = 0    # RLIMIT_AS (0: off; the MiniLM table and numpy map ~1.5 GiB virtual)
    file_mib: int = 256           # RLIMIT_FSIZE: largest file the agent may write
    open_files: int = 256         # RLIMIT_NOFILE
    tmp_mib: int = 64             # size of the private /tmp and /dev/shm (tmpfs, mount namespace)

    def __post_init__(self):
        for k in ("memory_mib", "pids", "cpu_percent", "address_space_mib", "file_mib", "open_files", "tmp_mib"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{k} must be a non-negative int. Found {v!r}.")


# ------------------------------------------------------------------------------ uids
def held_uids() -> set[int]:
    """Every uid (real, effective, saved, fs) some live process holds."""
    out: set[int] = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        out.update(int(x) for x in line.split()[1:])
                        break
        except OSError:
            continue
    return out


def pids_of_uid(uid: int) -> list[int]:
    """Pids of the live processes holding ``uid`` (any of real, effective, saved, fs)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if uid in (int(x) for x in line.split()[1:]):
                            out.append(int(d))
                        break
        except OSError:
            continue
    return out


def pick_uids(n: int, base: int, span: int, *, reserved=()) -> list[int]:
    """``n`` distinct uids in ``[base, base + span)`` that no live process holds, drawn at random
    (``secrets``: an agent cannot predict the next session's uids), none in ``reserved``."""
    held = held_uids() | set(reserved)
    if span < n:
        raise ValueError(f"uid_span must be >= the number of agents ({n}). Found {span!r}.")
    out: list[int] = []
    tries = 0
    while len(out) < n:
        u = base + secrets.randbelow(span)
        tries += 1
        if u not in held and u not in out:
            out.append(u)
        if tries > 100 * n + 1000:
            raise RuntimeError("no free agent uids in the configured range")
    return out


def sweep_uid(uid: int, *, timeout_s: float = 10.0) -> int:
    """SIGKILL every process of ``uid`` until none is left (a fork between the scan and the
    kill is caught by the next round); returns how many were killed. Never uid 0."""
    if uid <= 0:
        raise ValueError(f"uid must be positive. Found {uid!r}.")
    killed = 0
    end = time.monotonic() + timeout_s
    while True:
        pids = pids_of_uid(uid)
        if not pids:
            return killed
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > end:
            raise RuntimeError(f"processes of agent uid {uid} survive the kill sweep")
        time.sleep(0.01)


# ------------------------------------------------------------------------------ cgroups
def _own_cgroups() -> dict:
    """{controller or '' (v2): path of this process's cgroup in that hierarchy}."""
    out = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in (ctrls.split(",") if ctrls else [""]):
                    out[c] = path
    except OSError:
        pass
    return out


def _mounts() -> dict:
    """{controller or '' (v2): mount point}."""
    out = {}
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fstype, _, opts = (right.split() + ["", "", ""])[:3]
                point = left.split()[4]
                if fstype == "cgroup2":
                    out.setdefault("", point)
                elif fstype == "cgroup":
                    for c in opts.split(","):
                        if c in ("memory", "pids", "cpu", "freezer"):
                            out.setdefault(c, point)
    except OSError:
        pass
    return out


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(value)
        return True
    except OSError:
        return False


class AgentCgroup:
    """The cgroups of one agent (one per available hierarchy), its limits and its kill."""

    def __init__(self, session_tag: str, user: str, limits: Limits):
        self.dirs: dict[str, str] = {}        # controller ('' = v2) -> directory
        self.enforced: dict[str, str] = {}    # limit -> how ('cgroup v2', 'cgroup v1', ...)
        if os.geteuid() != 0:
            return
        mounts, own = _mounts(), _own_cgroups()
        name = f"fedmem-{session_tag}-{user}"
        for ctrl, point in mounts.items():
            base = os.path.join(point, own.get(ctrl, "/").lstrip("/"))
            d = os.path.join(base, name)
            try:
                os.mkdir(d, 0o755)
            except OSError:
                continue
            self.dirs[ctrl] = d
        v2 = self.dirs.get("")
        if v2:
            if os.path.exists(os.path.join(v2, "cgroup.kill")):
                self.enforced["kill"] = "cgroup v2 cgroup.kill"
            have = set(open(os.path.join(v2, "cgroup.controllers")).read().split()) \
                if os.path.exists(os.path.join(v2, "cgroup.controllers")) else set()
            if "memory" in have and limits.memory_mib and _write(f"{v2}/memory.max", str(limits.memory_mib << 20)):
                _write(f"{v2}/memory.swap.max", "0")
                self.enforced["memory"] = "cgroup v2 memory.max"
            if "pids" in have and limits.pids and _write(f"{v2}/pids.max", str(limits.pids)):
                self.enforced["pids"] = "cgroup v2 pids.max"
            if "cpu" in have and limits.cpu_percent and _write(f"{v2}/cpu.max", f"{limits.cpu_percent * 1000} 100000"):
                self.enforced["cpu"] = "cgroup v2 cpu.max"
        d = self.dirs.get("memory")
        if "memory" not in self.enforced and d and limits.memory_mib:
            if _write(f"{d}/memory.limit_in_bytes", str(limits.memory_mib << 20)):
                _write(f"{d}/memory.memsw.limit_in_bytes", str(limits.memory_mib << 20))
                self.enforced["memory"] = "cgroup v1 memory.limit_in_bytes"
        d = self.dirs.get("pids")
        if "pids" not in self.enforced and d and limits.pids and _write(f"{d}/pids.max", str(limits.pids)):
            self.enforced["pids"] = "cgroup v1 pids.max"
        d = self.dirs.get("cpu")
        if "cpu" not in self.enforced and d and limits.cpu_percent:
            if _write(f"{d}/cpu.cfs_period_us", "100000") and \
                    _write(f"{d}/cpu.cfs_quota_us", str(limits.cpu_percent * 1000)):
                self.enforced["cpu"] = "cgroup v1 cpu.cfs_quota_us"
        if "kill" not in self.enforced and self.dirs:
            self.enforced["kill"] = "SIGKILL of every pid in the agent's cgroups"

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the agent process writes its pid into (as root, before its drop)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files():
            try:
                with open(f) as fh:
                    out.update(int(x) for x in fh.read().split())
            except OSError:
                pass
        return out

    def kill(self, *, timeout_s: float = 10.0) -> None:
        v2 = self.dirs.get("")
        if v2 and self.enforced.get("kill", "").startswith("cgroup v2"):
            _write(os.path.join(v2, "cgroup.kill"), "1")
        end = time.monotonic() + timeout_s
        while True:
            left = self.pids()
            if not left or time.monotonic() > end:
                break
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        for d in self.dirs.values():
            for _ in range(200):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)          # the last killed process is still being reaped
        self.dirs = {}


# ------------------------------------------------------------------------------ in the child
def confine_child(req: dict, libc) -> dict:  # pragma: no cover - runs in the agent process (as root)
    """Before the uid drop: join the agent's cgroups, set rlimits, a private /tmp and /dev/shm.
    Returns what was applied (sent back to the session with the hello)."""
    import ctypes
    import resource

    applied = {}
    for f in req.get("cgroup_procs") or ():
        with open(f, "w") as fh:          # fails closed: an agent that cannot be put in its cgroup never runs
            fh.write(str(os.getpid()))
    lim = req.get("limits") or {}
    mib = 1 << 20
    for name, key, scale in (("RLIMIT_AS", "address_space_mib", mib), ("RLIMIT_FSIZE", "file_mib", mib),
                             ("RLIMIT_NOFILE", "open_files", 1), ("RLIMIT_NPROC", "pids", 1)):
        v = int(lim.get(key, 0)) * scale
        if v:
            resource.setrlimit(getattr(resource, name), (v, v))
            applied[name] = v
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if req.get("private_tmp"):
        if libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate / failed")
        keep = sorted({os.path.realpath(p) for p in req.get("keep_dirs") or ()}, key=len)  # parents first
        held = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in keep}
        size = int(lim.get("tmp_mib", 64)) or 64
        for target in ("/tmp", "/dev/shm"):
            if not os.path.isdir(target):
                continue
            opts = f"size={size}m,mode=1777".encode()
            if libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
                raise OSError(ctypes.get_errno(), f"mount tmpfs on {target} failed")
            for p, fd in held.items():          # a folder the agent needs that lies below it (e.g. out_dir in /tmp)
                if p == target or p.startswith(target + os.sep):
                    os.makedirs(p, exist_ok=True)
                    if libc.mount(f"/proc/self/fd/{fd}".encode(), p.encode(), None, MS_BIND | MS_REC, None) != 0:
                        raise OSError(ctypes.get_errno(), f"bind mount of {p} failed")
        for fd in held.values():
            os.close(fd)
        applied["private_tmp"] = size
    return applied


def after_drop(libc, zygote_pid: int) -> None:  # pragma: no cover - runs in the agent process
    """After the uid drop (which clears the parent-death signal): no new privileges, and the
    parent-death signal set again; an agent whose zygote is already gone exits."""
    import ctypes

    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != zygote_pid:
        os._exit(1)
