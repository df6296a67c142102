"""Shared fixtures: heavy services start once per test session, and every test reuses them.

The rule for new tests (the suite must stay under 7 minutes on 2 idle cores; ``make test``
prints the 25 slowest tests, ``make test-fast`` skips the ``slow`` ones):

* **Ray**: take ``ray_local`` (one private Ray instance, 2 CPUs, for the whole session).
  Never call ``ray.init``/``ray.shutdown`` in a test; library code that calls
  ``fedmem._ray.ensure_ray`` attaches to it and does not shut it down. Kill only the actors
  your test created (``ray_local.kill(handle)``).
* **CrypTen**: take ``crypten_parties`` (two warm parties). Start your own
  ``CryptenParties`` only to break them (fault injection) or for another party count or
  provider, and close it in the test.
* **Expensive data** (MiniLM table, projector, shards): a ``scope="module"`` (or session)
  fixture, built once.
* **Subprocesses** only when the process boundary is what is tested (a CLI exit code, a
  SIGKILL, a wheel, a cluster beside the session's). Start them with ``subprocess_env``
  (no inherited ``RAY_ADDRESS``, one OpenMP thread), check several things per process
  rather than one process per check, and mark the test ``@pytest.mark.slow`` when it
  takes more than ~10 s. A Ray cluster of a test's own (``ray start``, ``Cluster``) lives
  in its own temp dir and is stopped by PID, never ``ray stop``.
* **Statistical tests** are sized by the power they need: state in a comment the sample
  size, the test's level and its power (or margin) against the broken variant it must catch.
* **A new test file that takes more than ~15 s** goes into ``FILE_SECONDS`` below with its
  measured seconds, so that ``make test`` starts it early instead of leaving it for the end.
* **Federations** may be built and closed freely: their shard-host actors go back to a pool
  (``fedmem.federation.host_pool``) and the next federation of the worker reuses them.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


# Seconds each of the heaviest test files took in a full run (`make test`'s pytest command, 2 idle cores,
# session 11, 2026-12-02), used only to ORDER the files: `make test` runs pytest-xdist with
# --dist loadfile --no-loadscope-reorder, so files are handed to the two workers in collection
# order, and handing out the longest first (largest-processing-time-first) keeps one worker from
# idling while the other runs a 40 s file at the end (xdist's own reorder sorts by the number of
# tests per file, which put the single-test cluster files last). Stale numbers change the order,
# never what runs; files not listed keep their place after these.
FILE_SECONDS = {
    "tests/experiments/test_support_leak.py": 64, "tests/flower/test_gateway.py": 57,
    "tests/agent/test_actors.py": 57, "tests/agent/dpmind/test_perturb.py": 52,
    "tests/system/test_ray_jobs.py": 43, "tests/federation/test_engine_multinode.py": 42,
    "tests/test_ray_coexist.py": 38, "tests/federation/mpc/test_runtime.py": 38, "tests/agent/test_brace.py": 38,
    "tests/system/test_flower_app.py": 34, "tests/agent/test_isolated.py": 29, "tests/cli/test_cli.py": 18,
    "tests/federation/test_aggregator.py": 17, "tests/federation/test_engine.py": 16,
    "tests/dp/test_accountant.py": 16, "tests/experiments/test_memview.py": 15,
    "tests/agent/dpmind/test_loop.py": 14, "tests/attacks/test_memview_auditor.py": 13,
}


def pytest_collection_modifyitems(config, items):
    """Longest files first (see FILE_SECONDS); a stable sort, so every file keeps its own test order."""
    # node ids start with the file's path relative to the rootdir (the repository: pyproject.toml)
    items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0))


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(scope="session")
def ray_local():
    """A private local Ray (2 CPUs, no dashboard) started once per test session, shut down at the end."""
    import ray

    from fedmem._ray import ensure_ray

    started = False
    if not ray.is_initialized():
        started = ensure_ray("local", num_cpus=2)   # private, beside any cluster, whatever RAY_ADDRESS says
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def crypten_parties(ray_local):
    """Two warm CrypTen compute parties (TFP provider) shared by the whole session.

    A test that breaks them (fault injection) must use its own ``CryptenParties``; if a
    party fails anyway, the next ``run`` restarts them.
    """
    from fedmem.federation.mpc import CryptenParties

    parties = CryptenParties(2, timeout_s=60.0)
    yield parties
    parties.close()


@pytest.fixture(scope="session")
def subprocess_env() -> dict:
    """Environment for a child Python of a test: this checkout first on the path, no
    inherited ``RAY_ADDRESS`` (a child starts or joins only what the test says), one
    OpenMP thread, no ``FEDMEM_DEBUG``. Copy it before changing it."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FEDMEM_DEBUG")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
               OMP_NUM_THREADS="1", RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    return env


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server a test starts itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_processes_started_with(marker: str) -> list[int]:
    """SIGKILL every process whose command line contains ``marker`` (a temp dir only this
    test uses) **and every descendant of one**, except this process; returns their PIDs. How a
    test stops a ``ray start`` cluster of its own: by PID, never ``ray stop`` (which stops
    everyone's Ray). The descendants matter: the raylet's dashboard agent and runtime-env agent
    rename themselves (``ray::DashboardAgent``), so their command lines no longer name the temp
    dir, and once the raylet was gone an orphaned dashboard agent kept running at 40-60% of a
    core (seen after ``tests/system/test_ray_jobs.py``: still there minutes later, killed by hand). The tree is read
    before anything is killed (a killed parent's children are re-parented to init)."""
    import signal

    me = os.getpid()
    parent, roots = {}, []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(d.name)
        parent[pid] = int(stat[stat.rfind(")") + 2:].split()[1])
        if marker in cmdline and pid != me:
            roots.append(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    tree, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in tree or pid == me:
            continue
        tree.add(pid)
        stack.extend(children.get(pid, []))
    killed = []
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def two_adic_valuation(y) -> np.ndarray:
    """``v`` with ``y = odd * 2**v`` for each float (exact; 0 maps to +64): the coarsest
    power-of-two grid the output lies on, i.e. what its low bits say about the grid (the low-bit
    statistic of tests/dp/test_mechanisms.py and tests/agent/test_brace.py)."""
    y = np.asarray(y, dtype=np.float64)
    mant, ex = np.frexp(y)
    M = np.abs(mant * 2.0 ** 53).astype(np.int64)          # exact: |mant| < 1
    low = M & -M
    v = ex.astype(np.int64) - 53 + np.log2(np.maximum(low, 1)).astype(np.int64)
    return np.where(y == 0, 64, v)
