"""The built wheel is usable without the repository: scenarios and py.typed ship inside it.

Builds the wheel offline (``pip wheel --no-deps --no-build-isolation``, no index) from a
copy of the source tree (so nothing is written into the checkout), then runs
``fedmem list`` from the unpacked wheel in a folder that has no ``scenarios/``.
Skipped only when the build backend itself (setuptools with wheel support) is not
installed, since it cannot be fetched offline.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.name for p in (REPO / "scenarios").glob("*.toml"))


def _backend_available() -> bool:
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    # setuptools >= 70.1 builds wheels itself; older needs the `wheel` package.
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not _backend_available():
        pytest.skip("build backend (setuptools with bdist_wheel) not installed; it cannot be fetched offline")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "_build_scenarios.py"):
        shutil.copy2(REPO / name, src / name)
    for name in ("fedmem", "scenarios"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(out), str(src)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (whl,) = out.glob("fedmem-*.whl")
    return whl


def test_wheel_contains_every_scenario_and_py_typed(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "fedmem/py.typed" in names
    assert "fedmem/schemas/results.schema.json" in names       # results.json's schema ships with the package
    packaged = sorted(n.split("/")[-1] for n in names if n.startswith("fedmem/_scenarios/"))
    assert packaged == SCENARIOS and len(SCENARIOS) > 0
    # Byte-identical to the source of truth, and nothing from the build step leaks in.
    z = zipfile.ZipFile(wheel)
    for name in SCENARIOS:
        assert z.read(f"fedmem/_scenarios/{name}") == (REPO / "scenarios" / name).read_bytes()
        tomllib.loads(z.read(f"fedmem/_scenarios/{name}").decode())
    assert not any(n.startswith(("_build_scenarios", "scenarios/")) for n in names)


def test_fedmem_list_works_from_the_unpacked_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    code = ("import sys, fedmem, fedmem.cli as c; "
            f"assert fedmem.__file__.startswith({str(site)!r}), fedmem.__file__; "
            "print(c.SCENARIO_DIR); sys.exit(c.main(['list']))")
    env = dict(os.environ, PYTHONPATH=str(site))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=elsewhere, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert str(site / "fedmem" / "_scenarios") in res.stdout
    for name in SCENARIOS:
        assert name.removesuffix(".toml") in res.stdout


def test_bundled_scenarios_by_name_from_the_unpacked_wheel(wheel, tmp_path):
    """`fedmem validate dp_demo` / `fedmem show dp_demo` find the scenario inside the installed package
    from a folder that has no scenarios/ (running it is covered by tests/cli/test_cli.py)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    code = ("import sys, fedmem.cli as c; "
            "rc = c.main(['validate', 'dp_demo', 'support_leak_40.toml']); "
            "rc = rc or c.main(['show', 'dp_demo']); "
            "from fedmem.report import results_schema; assert results_schema()['title']; sys.exit(rc)")
    env = dict(os.environ, PYTHONPATH=str(site), COLUMNS="200")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=elsewhere, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok      dp_demo (dp.demo" in res.stdout
    assert str(site / "fedmem" / "_scenarios" / "dp_demo.toml") in res.stdout
