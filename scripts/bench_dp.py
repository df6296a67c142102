#!/usr/bin/env python
"""Benchmark: cost of the exact ``secure`` samplers against the ``fast`` float samplers.

For a d-dimensional release (default 128) of the Gaussian and the Laplace mechanism, times
``mechanism.release(x, rng, sampling)`` with

* ``fast``        numpy's float samplers (ziggurat normal, inverse-CDF Laplace): NOT DP as
                  released (their low-order bits leak the input, Mironov 2012);
* ``secure``      the vectorised exact discrete samplers (the default, int64 numpy batches);
* ``python``      the original one-draw-at-a-time exact sampler (Python ints + Fraction),
                  ``samplers.secure_release(..., engine="python")``, same law as ``secure``;
* ``opendp``      OpenDP's ``make_gaussian`` / ``make_laplace`` on a float vector domain,
                  if ``opendp`` is importable (it is NOT a fedmem dependency; install it
                  separately to compare, e.g. ``pip install --target DIR opendp`` and
                  ``PYTHONPATH=DIR``), else reported as "not installed";

in the same process, interleaved (so load changes hit every mode alike), ``--repeats``
times (default 7). It prints the median throughput in noise samples (coordinates) per
second and in releases per second (wall clock and process CPU time), the ratio to
``fast``, and what the engine would spend: ``--qps`` releases per second (default 300)
times the median CPU time of one release, as a fraction of one core. The machine load
(``os.getloadavg``) is printed before and after: on a shared machine numbers move with it.

    .venv/bin/python scripts/bench_dp.py [--dim 128] [--repeats 7] [--rng numpy|torch] [--qps 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from fedmem.dp import GaussianMechanism, LaplaceMechanism
from fedmem.dp import samplers


def _make_rng(kind: str, seed: int):
    if kind == "numpy":
        return np.random.default_rng(seed)
    import torch

    return torch.Generator().manual_seed(seed)


def _opendp_release(kind: str, mech, dim: int):
    """A callable x -> noised x from OpenDP, or None when opendp is not importable."""
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    dom = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=dim)
    if kind == "gaussian":
        meas = dp.m.make_gaussian(dom, dp.l2_distance(T=float), scale=float(mech.sigma))
    else:
        meas = dp.m.make_laplace(dom, dp.l1_distance(T=float), scale=float(mech.scale))
    return lambda x, rng: np.asarray(meas(list(x)))   # OpenDP draws from its own OS-seeded RNG


def _releasers(kind: str, mech, dim: int) -> dict:
    sens = mech.l2_sensitivity if kind == "gaussian" else mech.l1_sensitivity
    scale = mech.sigma if kind == "gaussian" else mech.scale
    out = {
        "fast": lambda x, rng: mech.release(x, rng, sampling="fast"),
        "secure": lambda x, rng: mech.release(x, rng, sampling="secure"),
        "python": lambda x, rng: samplers.secure_release(x, scale, rng, kind=kind, sensitivity=sens,
                                                         engine="python"),
    }
    od = _opendp_release(kind, mech, dim)
    if od is not None:
        out["opendp"] = od
    return out


def _time(fn, x, rng, n: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn(x, rng)
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rng", choices=("numpy", "torch"), default="numpy")
    p.add_argument("--qps", type=float, default=300.0, help="engine release rate for the cost column")
    p.add_argument("--target-s", type=float, default=0.25, help="about this long per timing")
    args = p.parse_args(argv)

    mechs = {
        "gaussian": ("gaussian (eps=1, delta=1e-6, L2=1)", GaussianMechanism.calibrate(1.0, 1e-6, 1.0)),
        "laplace": ("laplace (eps=1, L1=1)", LaplaceMechanism.calibrate(1.0, 1.0)),
    }
    x = np.random.default_rng(0).normal(size=args.dim)
    print(f"fedmem DP sampler benchmark: d={args.dim}, {args.repeats} repeats (medians), rng={args.rng}, "
          f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cpus")
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    try:
        import opendp

        print(f"opendp {getattr(opendp, '__version__', '?')}: make_gaussian / make_laplace on float vectors")
    except ImportError:
        print("opendp: not installed (optional; not a fedmem dependency)")
    hdr = (f"{'mechanism':36s} {'mode':7s} {'samples/s':>10s} {'releases/s':>10s} {'cpu us/rel':>10s} "
           f"{'x fast(cpu)':>11s} {'cost @' + format(args.qps, 'g') + 'qps':>13s}")
    print(hdr)
    for kind, (name, mech) in mechs.items():
        rel = _releasers(kind, mech, args.dim)
        rng = {m: _make_rng(args.rng, 1) for m in rel}
        n = {}
        for m, fn in rel.items():  # warm-up, and size each timing to ~target_s
            fn(x, rng[m])
            w, _ = _time(fn, x, rng[m], 3)
            n[m] = max(2, int(args.target_s / max(w / 3, 1e-7)))
        wall: dict[str, list[float]] = {m: [] for m in rel}
        cpu: dict[str, list[float]] = {m: [] for m in rel}
        for _ in range(args.repeats):
            for m, fn in rel.items():   # interleaved
                w, c = _time(fn, x, rng[m], n[m])
                wall[m].append(w / n[m])
                cpu[m].append(c / n[m])
        med_w = {m: statistics.median(v) for m, v in wall.items()}
        med_c = {m: statistics.median(v) for m, v in cpu.items()}
        for m in rel:
            print(f"{name:36s} {m:7s} {args.dim / med_w[m]:10.4g} {1 / med_w[m]:10.4g} {med_c[m] * 1e6:10.1f} "
                  f"{med_c[m] / med_c['fast']:11.1f} {args.qps * med_c[m]:12.1%}")
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    print("cost @qps: fraction of one core spent drawing noise at that many d-dim releases per second "
          "(median CPU time per release x qps).")


if __name__ == "__main__":
    main()
