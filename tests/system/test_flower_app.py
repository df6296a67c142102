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

The Flower-defaults tests run a fresh copy of the app exactly as its README says, with a fresh
``FLWR_HOME`` (no ``config.toml``: Flower writes its default, 2 SuperNodes) and ``flwr run`` starting
its own local SuperLink (on free ports; the test stops that SuperLink, found by its ``FLWR_HOME``, at
the end): the run completes without SecAgg+ (one warning line: SecAgg+ needs >= 3) and prints the
privacy spent; a ClientApp that replies its real dataset size as ``num-examples`` ends the run with one
``fedmem: error:`` line saying what was expected and what came back. (Flower 1.42's ``flwr run``
returns 0 whatever the run's outcome; the run itself fails with Flower's exit code 700.)
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


def _flwr_defaults_run(tmp_path, patch=None, args=()):
    """``flwr run . --stream`` in a fresh copy of the app with a fresh FLWR_HOME (Flower's defaults)."""
    flwr = shutil.which("flwr", path=str(BIN)) or shutil.which("flwr")
    if not flwr:
        pytest.skip("Flower's CLI (flwr) is not installed")
    app = tmp_path / "flower-app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    if patch is not None:
        patch(app)
    home = tmp_path / "flwr-home"
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(_free_port()), FLWR_LOCAL_CONTROL_API_PORT=str(_free_port()),
               RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               RAY_ADDRESS="local")
    try:
        proc = subprocess.run([flwr, "run", ".", "--stream", *args], cwd=app, env=env, capture_output=True,
                              text=True, timeout=400)
    finally:
        _stop_superlink_of(home)
    return proc, proc.stdout + proc.stderr


def _stop_superlink_of(home: Path) -> None:
    """Stop the local SuperLink ``flwr run`` started for ``home`` (its command line names home's database)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"flower-superlink" in c for c in cmd) and any(str(home).encode() in c for c in cmd):
            try:
                os.kill(int(d.name), signal.SIGTERM)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_flwr_run_with_flowers_defaults_completes_without_secagg_and_prints_the_privacy_spent(tmp_path):
    proc, out = _flwr_defaults_run(tmp_path)
    assert proc.returncode == 0, out[-4000:]
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("fedmem: warning: SecAgg+ needs >= 3 SuperNodes, found 2") for ln in lines), out[-4000:]
    assert [ln for ln in lines if ln.startswith("round ")] == ["round 1: admitted", "round 2: admitted",
                                                              "round 3: admitted"], out[-4000:]
    line = next(ln for ln in lines if ln.startswith("privacy spent: epsilon="))
    from fedmem.flower.core import epsilon_of

    assert float(line.split("epsilon=")[1].split()[0]) == pytest.approx(epsilon_of(2.0, 1e-6, rounds=3), abs=1e-4)
    assert "Traceback" not in out


@pytest.mark.slow
def test_a_client_reporting_its_dataset_size_ends_the_run_with_one_readable_line(tmp_path):
    def real_size(app: Path) -> None:
        f = app / "fedmem_app" / "client_app.py"
        src = f.read_text()
        new = src.replace('MetricRecord({"num-examples": k})', 'MetricRecord({"num-examples": len(keys)})')
        assert new != src
        f.write_text(new)

    proc, out = _flwr_defaults_run(tmp_path, patch=real_size)
    lines = proc.stdout.splitlines()
    expected = ("round 1 refused (num_examples: every reply must carry num-examples = 5 (run config k-local, the "
                "public constant of the contract); the replies carried [20]): nothing released, nothing booked")
    assert expected in lines, out[-4000:]
    err = [ln for ln in lines if ln.startswith("fedmem: error:")]
    assert len(err) == 1 and "1 round(s) refused (max-refused-rounds = 1)" in err[0], out[-4000:]
    assert not any(ln.startswith("privacy spent") for ln in lines)
