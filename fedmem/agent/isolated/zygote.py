"""The agent zygote: started by the session with a scrubbed environment, it imports the agent
code once, then forks one agent process per request; the child drops its privileges (own uid,
own network namespace) and imports what the zygote did not through :class:`_DirFdFinder`."""

from __future__ import annotations

import json
import os
import socket
import sys

from fedmem.agent.isolated.agent_process import AgentProcess
from fedmem.agent.isolated.wire import send

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# Imported by the zygote before it forks: an agent that dropped to another uid may not be
# able to read the interpreter's standard library (e.g. a pyenv Python under /root, 0700),
# so everything the agent path imports lazily is imported here (measured from a run). This
# is a fast path, not a requirement: a pure-Python module missing from it is read after the
# drop through directory descriptors opened before it (:class:`_DirFdFinder`). The modules of
# this package need no entry: the zygote's own first import (``from fedmem.agent.isolated import
# zygote_main``) runs the package ``__init__``, which imports all of them before any fork.
PRELOAD = ("getpass", "glob", "html", "html.entities", "shlex", "termios", "timeit", "uuid", "bdb", "xml.dom.minidom",
           "importlib.resources.readers", "encodings.idna", "sqlite3", "hashlib", "secrets", "traceback", "fedmem.bench.pairedmem", "fedmem.experiments.pairedmem",
           "fedmem.bench.shards", "fedmem.dp", "dp_accounting.rdp", "dp_accounting.pld", "fedmem.agent.actors",
           "fedmem.agent.session", "fedmem.agent.federation_service", "fedmem.federation.engine", "scipy.stats",
           "pytest")


def scrubbed_env() -> dict:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["HOME"] = "/nonexistent"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def zygote_preexec():  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except Exception:  # noqa: BLE001
        pass


def zygote_main(ctl_fd: int) -> None:  # pragma: no cover - runs in the zygote process
    """Import the agent code once, then fork one child per request on the control socket
    ``ctl_fd`` (SOCK_SEQPACKET from the session: one JSON request per message, carrying the
    agent's end of its connection and the write end of its output pipe)."""
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
    ctl = socket.socket(fileno=ctl_fd)
    ctl.send(b"{}")
    me = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 2)
        except OSError:
            return
        if not msg:
            return
        try:
            req = json.loads(msg)
            if len(fds) != 2:
                raise ValueError("a request carries two descriptors")
            pid = os.fork()
        except Exception as exc:  # noqa: BLE001
            for fd in fds:
                os.close(fd)
            ctl.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            continue
        if pid == 0:
            code = 1
            try:
                ctl.close()                   # the agent never holds the zygote's control socket
                _child(req, fds[0], fds[1], me, table, codec)
                code = 0
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        ctl.send(json.dumps({"pid": pid}).encode())


def _child(req: dict, sock_fd: int, out_fd: int, zygote_pid: int, table, codec) -> None:  # pragma: no cover
    import ctypes
    import signal

    from fedmem.agent.isolated.sandbox import after_drop, confine_child, pids_of_uid

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)                # stdout and stderr: a pipe the session reads and prefixes
    os.dup2(out_fd, 2)
    os.close(out_fd)
    os.close(devnull)
    sock = socket.socket(fileno=sock_fd)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != zygote_pid:
        os._exit(1)
    applied = {}
    if req.get("uid") is not None:
        applied = confine_child(req, libc)
    if req.get("netns"):
        if libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
    if req.get("uid") is not None:
        uid = int(req["uid"])
        if pids_of_uid(uid):          # an identity is never reused while anything of it lives
            raise OSError(f"uid {uid} still has processes: refusing to start the agent")
        finder = _DirFdFinder([q for q in sys.path if q and os.path.isabs(q)])   # opened while still root
        os.setgroups([])
        os.setgid(int(req["gid"]))
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getresuid() != (uid, uid, uid):
            raise OSError("failed to drop privileges")
        after_drop(libc, zygote_pid)      # no_new_privs; the parent-death signal again (setuid cleared it)
        sys.meta_path.append(finder)       # after the interpreter's own finders: only what they cannot read
        applied["no_new_privs"] = True
    os.umask(0o077)
    secret = bytes.fromhex(req["secret"])
    sock.sendall(secret)                  # fixed size, first: nothing larger is read before it matches
    send(sock, ("hello", applied))
    AgentProcess(sock, table, codec).serve()


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

