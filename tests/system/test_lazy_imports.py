"""Start-up: heavy imports happen where used, not when fedmem is imported.

Every Ray actor process imports fedmem; ``dp_accounting``'s package ``__init__`` imports
``pld`` (scipy.signal, scipy.stats) and ``mechanism_calibration`` (scipy.optimize), about
1.7 s of an idle core (``python -X importtime -c "import fedmem.federation.engine"``).
``fedmem._lazy_dpa`` registers the package without running that ``__init__``. One
subprocess (a fresh interpreter) checks both halves: nothing heavy is imported, and every
name of the package resolves, lazily, to the very object the full import binds.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("dp_accounting.pld", "dp_accounting.mechanism_calibration", "dp_accounting.rdp", "scipy.signal",
         "scipy.stats", "scipy.optimize", "torch", "crypten", "ray")

CODE = r"""
import json, sys
def loaded(names):
    return [m for m in names if m in sys.modules]
import fedmem.federation.engine, fedmem.federation.aggregator, fedmem.dp
import dp_accounting
out = {"heavy": loaded(HEAVY), "lazy": type(dp_accounting).__name__}
import fedmem.federation.sharing, fedmem.federation.mpc
out["mpc"] = loaded(("torch", "crypten"))
import fedmem.flower, fedmem.flower.harness
from fedmem.flower import GatewayStrategy
out["flower"] = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "crypten", "ray"))
print(json.dumps(out))
"""


def test_fedmem_imports_no_heavy_module():
    """A fresh interpreter (what a Ray actor is): importing the engine loads none of HEAVY;
    then the sharing layer and mpc (what shard hosts import: numpy only) load no torch or
    CrypTen; then ``fedmem.flower`` (and its harness) loads no torch, CrypTen or Ray. One
    interpreter for the three checks, in that order: a module is never unloaded, so a
    later stage can only see more modules than a fresh interpreter would, never fewer."""
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{CODE}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"heavy": [], "lazy": "_LazyPackage", "mpc": [], "flower": []}, res     # each is loaded where used


def test_lazy_dp_accounting_resolves_every_name_to_the_real_object():
    """Every name the real ``__init__`` binds resolves, on a fresh lazy package module, to
    the identical object the imported package holds; running the real ``__init__`` in
    place then binds exactly those names. A wrong submodule in the table, or a name it
    misses, shows here. (In-process, so it works whether this process imported
    ``dp_accounting`` lazily or eagerly: submodules are shared through ``sys.modules``.)"""
    import importlib

    from fedmem import _lazy_dpa

    real = importlib.import_module("dp_accounting")
    _lazy_dpa.load_fully(real)          # this process's package, whole (a no-op when eager)
    lazy = _lazy_dpa.new_lazy_module()
    assert type(lazy).__name__ == "_LazyPackage"
    table = dict(lazy._fedmem_reexports)
    full = {k: v for k, v in vars(real).items() if not k.startswith("_")}
    assert len(table) >= 30 and all(getattr(lazy, n) is full[n] for n in table)
    submodules = {"dp_event", "pld", "rdp", "privacy_accountant", "dp_event_builder", "mechanism_calibration",
                  "gaussian_mechanism"}
    assert set(full) - set(table) - submodules == set()
    fresh = _lazy_dpa.new_lazy_module()
    _lazy_dpa.load_fully(fresh)          # the real __init__, run in place on a lazy module
    assert type(fresh).__name__ == "module"
    names = {k for k in vars(fresh) if not k.startswith("_")}   # (submodule attributes land on sys.modules')
    assert set(table) <= names <= set(full) and all(vars(fresh)[k] is full[k] for k in names)


def test_reexport_table_is_read_from_the_source_and_refuses_other_shapes(tmp_path):
    from fedmem._lazy_dpa import _reexports

    ok = tmp_path / "ok.py"
    ok.write_text('"""doc"""\nfrom dp_accounting import pld\nfrom dp_accounting.dp_event import GaussianDpEvent\n')
    assert _reexports(str(ok)) == {"pld": "pld", "GaussianDpEvent": "dp_event"}
    for body in ("import os\n", "from dp_accounting.x import y as z\n", "X = 1\n", "from .dp_event import A\n"):
        bad = tmp_path / "bad.py"
        bad.write_text(body)
        assert _reexports(str(bad)) is None, body     # anything else: install() keeps the eager import


def test_accountants_of_both_kinds_still_compose():
    from fedmem.dp import Accountant, GaussianMechanism

    for kind in ("rdp", "pld"):
        acc = Accountant(kind)
        acc.book(GaussianMechanism.from_noise_multiplier(2.0).event(), label="x")
        assert 0.0 < acc.spent(1e-6) < 10.0, kind
