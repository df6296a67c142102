"""Benchmark: CPU of importing CrypTen through ``fedmem._crypten``, deferred ONNX converter vs eager.

Every CrypTen party is a fresh process that imports CrypTen. ``fedmem._crypten`` registers a
stand-in for ``crypten.nn.onnx_converter`` so that ``onnx`` (and ``ml_dtypes``) are imported only
when a converter function is first called. The baseline imports the same way and then calls
``fedmem._crypten._real_converter()``, i.e. imports the real converter (and ``onnx``) as CrypTen
itself would at import time. Trials alternate (deferred, eager, deferred, ...), each in a fresh
interpreter; CPU is the child's user + system time (``resource.RUSAGE_CHILDREN``). Prints the
median of each over ``--repeats`` trials and the ratio eager / deferred.

    .venv/bin/python scripts/bench_crypten_import.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = {"deferred": "from fedmem._crypten import crypten",
        "eager": "from fedmem._crypten import crypten, _real_converter; _real_converter()"}


def trial(variant: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CODE[variant]], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="trials per variant, alternated (default 5)")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1. Found {a.repeats}.")
    got: dict = {"deferred": [], "eager": []}
    for _ in range(a.repeats):
        for variant in ("deferred", "eager"):
            got[variant].append(trial(variant))
    print(f"import of CrypTen through fedmem._crypten, medians over {a.repeats} fresh interpreters each "
          f"(load {os.getloadavg()[0]:.1f}):")
    print(f"{'':12s}{'deferred':>10s}{'eager':>10s}{'eager/deferred':>16s}")
    for i, name in enumerate(("wall_s", "cpu_s")):
        d = statistics.median(t[i] for t in got["deferred"])
        e = statistics.median(t[i] for t in got["eager"])
        print(f"{name:12s}{d:10.2f}{e:10.2f}{e / d:15.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
