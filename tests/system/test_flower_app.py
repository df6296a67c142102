"""``flwr run . --stream`` of examples/flower-app completes offline in Flower's local
simulation and prints the privacy spent.

The test runs exactly that command in the app folder. Its environment is the one a fedmem user
has: fedmem installed (not on PyPI, not in the app's dependencies) and
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` so Flower's SuperLink runs the app in this
environment instead of installing its dependencies from a registry (README of the app).
``FLWR_HOME`` is a temporary folder whose ``config.toml`` is Flower's default local
connection (``address = ":local:"``) with 3 SuperNodes. ``flwr run`` would start the local
SuperLink itself, detached, and leave it running (and gives it 15 s, too little on a loaded
machine); the test starts that same SuperLink command first, on a free port, in its own
session, and stops exactly that process group at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower-app"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_flwr_run_of_the_example_app_completes_offline_and_prints_the_privacy_spent(tmp_path):
    flwr = shutil.which("flwr", path=str(BIN)) or shutil.which("flwr")
    superlink = shutil.which("flower-superlink", path=str(BIN)) or shutil.which("flower-superlink")
    if not flwr or not superlink:
        pytest.skip("Flower's CLI (flwr, flower-superlink) is not installed")
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
                                      'options.num-supernodes = 3\noptions.backend.init-args.num-cpus = 2\n')
    port, control = _free_port(), _free_port()
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port), FLWR_LOCAL_CONTROL_API_PORT=str(control),
               RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               # Flower's Ray backend calls ray.init(num_cpus=...) without an address, and a bare ray.init() joins
               # the last `ray start` cluster recorded in /tmp/ray/ray_current_cluster (even a stale record), which
               # then fails "When connecting to an existing cluster, num_cpus ... must not be provided".
               RAY_ADDRESS="local")
    # The command `flwr run` uses for its managed local SuperLink (flwr/cli/local_superlink.py), in-memory state.
    link = subprocess.Popen([superlink, "--insecure", "--simulation", "--isolation", "subprocess",
                             "--host", "127.0.0.1", "--port", str(port), "--log-file", str(home / "superlink.log")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(port):
            assert link.poll() is None, (home / "superlink.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the local SuperLink did not come up within 120 s"
            time.sleep(0.5)
        t0 = time.perf_counter()
        proc = subprocess.run([flwr, "run", ".", "--stream"], cwd=APP, env=env, capture_output=True, text=True,
                              timeout=540)
        wall = time.perf_counter() - t0
    finally:
        try:
            os.killpg(link.pid, signal.SIGTERM)      # the SuperLink's own session: it and its SuperExec children
            link.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(link.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("round ")] == [
        "round 1: admitted", "round 2: admitted", "round 3: admitted"], out[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("privacy spent: epsilon="))
    eps = float(line.split("epsilon=")[1].split()[0])
    from fedmem.flower.core import epsilon_of

    assert eps == pytest.approx(epsilon_of(2.0, 1e-6, rounds=3), abs=1e-4)     # run config: sigma 2, delta 1e-6
    assert "Flower accountant: epsilon=" in line
    print(f"flwr run wall time: {wall:.1f} s")
