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
import fedmem.federation.engine, fedmem.federation.aggregator, fedmem.dp
heavy = [m for m in HEAVY if m in sys.modules]
import dp_accounting
from fedmem import _lazy_dpa
lazy = type(dp_accounting).__name__
table = dict(dp_accounting._fedmem_reexports)
got = {name: getattr(dp_accounting, name) for name in table}       # resolved one by one
_lazy_dpa.load_fully()                                              # the real __init__, in place
full = {k: v for k, v in vars(dp_accounting).items() if not k.startswith("_")}
print(json.dumps({
    "heavy": heavy, "lazy": lazy, "after": type(dp_accounting).__name__,
    "same": sorted(n for n in got if full.get(n) is got[n]),
    "missing_from_table": sorted(set(full) - set(table) - {"dp_event", "pld", "rdp", "privacy_accountant",
                                                            "dp_event_builder", "mechanism_calibration",
                                                            "gaussian_mechanism"}),
    "names": len(table),
}))
"""


def test_fedmem_imports_no_heavy_module_and_lazy_dp_accounting_is_the_real_one():
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{CODE}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["heavy"] == [], res            # none of these at import: each is loaded where used
    assert res["lazy"] == "_LazyPackage" and res["after"] == "module", res
    # Every name of the real package resolved lazily to the identical object (a wrong
    # submodule in the table, or a name the table misses, would show here).
    assert res["names"] >= 30 and len(res["same"]) == res["names"], res
    assert res["missing_from_table"] == [], res


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
