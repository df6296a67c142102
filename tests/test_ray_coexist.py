"""A local fedmem run starts its own private Ray, beside a `ray start` cluster on the machine.

Before: `ray.init(num_cpus=2)` found the running cluster and failed with "When connecting
to an existing cluster, num_cpus and num_gpus must not be provided". The test starts a
real head node with `ray start` (its own temp dir), runs `fedmem run` in a subprocess,
and stops only the processes it started, by PID (never `ray stop`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import kill_processes_started_with

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["federation.shards=8", "federation.records_per_shard=10", "federation.key_dim=8", "federation.value_dim=4",
         "federation.n_bound=8", "federation.hosts=1", 'federation.mpc="plaintext"', "data.clusters=3",
         "attack.queries=4", 'attack.attacks=["reconstruction"]', "ray.num_cpus=1"]


def _session_of(gcs_address: str) -> str | None:
    """The session name (``session_...``) of the cluster whose GCS is at ``gcs_address``, read from
    its raylet's command line. Not ``/tmp/ray/session_latest``: that names the latest session of
    ANY Ray started under /tmp/ray (another test process's private instance, a user's), and
    killing by it once took down a parallel pytest worker's Ray (and that worker with it)."""
    import re

    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"--gcs-address={gcs_address}".encode() in args:
            for a in args:
                m = re.match(rb"--session_dir=.*/(session_[^/]+)$", a)
                if m:
                    return m.group(1).decode()
    return None


def test_local_options_come_from_the_machine_and_the_scenario():
    from fedmem._ray import local_options

    o = local_options()
    assert o["address"] == "local" and o["num_cpus"] == (os.cpu_count() or 1) and "object_store_memory" not in o
    o = local_options(3, 256)
    assert o["num_cpus"] == 3 and o["object_store_memory"] == 256 * 1024 * 1024
    with pytest.raises(ValueError, match="num_cpus must be a non-negative integer"):
        local_options(-1)


def test_address_explicit_then_ray_address_then_private(monkeypatch):
    """As ray.init(): an explicit address wins, else RAY_ADDRESS (how a `ray job submit`
    entrypoint finds its cluster); 'local' is a private instance; nothing set is a private
    instance too (fedmem never auto-joins a `ray start` cluster it merely finds)."""
    from fedmem._ray import resolve_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address() is None and resolve_address("local") is None
    assert resolve_address("auto") == "auto" and resolve_address("ray://h:10001") == "ray://h:10001"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert resolve_address() == "10.0.0.1:6379"
    assert resolve_address("local") is None and resolve_address("h:1") == "h:1"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert resolve_address() is None
    with pytest.raises(ValueError, match="ray_address must be a non-empty string"):
        resolve_address("  ")


def test_ensure_ray_attaches_to_ray_address_and_never_owns_it(monkeypatch):
    import fedmem._ray as R

    calls = []

    class FakeRay:
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(**kw):
            calls.append(kw)

    monkeypatch.setattr(R, "_ray", lambda: FakeRay)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert R.ensure_ray(num_cpus=3) is False            # attached: the caller must not shut it down
    assert calls[-1] == {"address": "10.0.0.1:6379", "log_to_driver": False, "logging_level": logging.WARNING}
    assert R.ensure_ray("local", num_cpus=3) is True     # private, owned
    assert calls[-1]["address"] == "local" and calls[-1]["num_cpus"] == 3
    assert calls[-1]["include_dashboard"] is False


@pytest.mark.slow
def test_fedmem_run_beside_a_running_ray_cluster(tmp_path):
    """A real `ray start` head in Ray's default temp dir, so that a plain `ray.init()` finds it
    (the situation of the bug). The old call is shown to fail there, fedmem's run to work."""
    ray_bin = Path(sys.executable).with_name("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    marker = address = None
    try:
        start = subprocess.run([str(ray_bin), "start", "--head", "--port=0", "--num-cpus=1",
                                "--include-dashboard=false", "--disable-usage-stats"],
                               env=env, capture_output=True, text=True, timeout=120)
        assert start.returncode == 0, start.stderr[-2000:]
        address = Path("/tmp/ray/ray_current_cluster").read_text().strip()
        marker = _session_of(address)                     # our session's name, found by our GCS address
        assert marker, f"no raylet of the cluster at {address} found"
        old = subprocess.run([sys.executable, "-c", "import ray; ray.init(num_cpus=2, include_dashboard=False)"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert old.returncode != 0 and "num_cpus and num_gpus must not be provided" in old.stderr
        cmd = [sys.executable, "-m", "fedmem.cli", "run", str(ROOT / "scenarios" / "support_leak_40_gateway.toml"),
               "--json", "--out", str(tmp_path / "out"), *[x for s in SMALL for x in ("--set", s)]]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert run.returncode == 0, run.stderr[-3000:]
        assert '"verdict"' in run.stdout
        assert Path("/tmp/ray/ray_current_cluster").read_text().strip() == address   # the cluster is untouched
    finally:
        if marker:
            kill_processes_started_with(marker)
        cur = Path("/tmp/ray/ray_current_cluster")
        if address and cur.exists() and cur.read_text().strip() == address:
            cur.unlink()     # what `ray stop` would remove, for our cluster only


def test_private_instance_runs_without_the_monitors_and_with_a_quiet_agent(ray_local):
    """fedmem's private instance (``ensure_ray("local")``, as the session's ``ray_local``) has no
    autoscaler monitor, no log monitor and no dashboard head, and its raylet's agents run with a 10-minute report
    interval. Read from the node's own process table and from /proc; a Ray upgrade that moves the
    internals ``lean_private_head`` wraps fails here."""
    import ray._private.ray_constants as rc
    from ray._private import node as ray_node

    from fedmem._ray import QUIET_AGENT_ENV, lean_private_head

    node = ray_local._private.worker._global_node
    kinds = set(node.all_processes)
    assert rc.PROCESS_TYPE_RAYLET in kinds and rc.PROCESS_TYPE_GCS_SERVER in kinds, kinds
    assert not kinds & {rc.PROCESS_TYPE_MONITOR, rc.PROCESS_TYPE_LOG_MONITOR, rc.PROCESS_TYPE_DASHBOARD}, kinds
    assert node.webui_url is None
    session = Path(node.get_session_dir_path()).name
    seen = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if session.encode() in cmd and b"dashboard/agent.py" in cmd:
            seen["agent"] = env
        if session.encode() in cmd and any(m in cmd for m in (b"log_monitor.py", b"autoscaler/_private/monitor.py",
                                                              b"dashboard/dashboard.py")):
            seen.setdefault("monitors", []).append(cmd[:200])
    assert "monitors" not in seen, seen["monitors"]
    want = [f"{k}={v}".encode() for k, v in QUIET_AGENT_ENV.items()]
    assert "agent" in seen and all(w in seen["agent"] for w in want), "dashboard agent not found or not quiet"
    # the wrapper is gone after the start: a later Node (an attach, a Flower simulation's own start) is Ray's
    original = ray_node.Node.__init__
    with lean_private_head():
        assert ray_node.Node.__init__ is not original
    assert ray_node.Node.__init__ is original
