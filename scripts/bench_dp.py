#!/usr/bin/env python
"""Benchmark: cost of the ``secure`` (exact discrete, CKS20) sampler against ``fast``.

For a d-dimensional release (default 128) of the Gaussian and the Laplace mechanism,
times ``mechanism.release(x, rng, sampling)`` for both sampling modes in the same
process, interleaved, ``--repeats`` times (default 7), and prints the median throughput
in noise samples (coordinates) per second and in releases per second, with the ratio
fast / secure. Each repeat times a fixed number of releases (more for ``fast``, so each
timing is well above timer resolution). Nothing is tuned: the same inputs, the same
``numpy.random.Generator`` type, the same public call.

    .venv/bin/python scripts/bench_dp.py [--dim 128] [--repeats 7] [--rng numpy|torch]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from fedmem.dp import GaussianMechanism, LaplaceMechanism


def _make_rng(kind: str, seed: int):
    if kind == "numpy":
        return np.random.default_rng(seed)
    import torch

    return torch.Generator().manual_seed(seed)


def time_releases(mech, x, rng, sampling: str, n_releases: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n_releases):
        mech.release(x, rng, sampling=sampling)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--fast-releases", type=int, default=2000, help="releases per fast timing")
    p.add_argument("--secure-releases", type=int, default=10, help="releases per secure timing")
    p.add_argument("--rng", choices=("numpy", "torch"), default="numpy")
    args = p.parse_args(argv)

    mechs = {
        "gaussian (eps=1, delta=1e-6, L2=1)": GaussianMechanism.calibrate(1.0, 1e-6, 1.0),
        "laplace (eps=1, L1=1)": LaplaceMechanism.calibrate(1.0, 1.0),
    }
    x = np.random.default_rng(0).normal(size=args.dim)
    n = {"fast": args.fast_releases, "secure": args.secure_releases}
    print(f"fedmem DP sampler benchmark: d={args.dim}, {args.repeats} repeats, rng={args.rng}, "
          f"python {platform.python_version()}, {platform.machine()}")
    print(f"{'mechanism':36s} {'mode':7s} {'median samples/s':>17s} {'releases/s':>11s} "
          f"{'min..max samples/s':>24s}")
    for name, mech in mechs.items():
        rng = {m: _make_rng(args.rng, 1) for m in n}
        for m in n:  # warm-up (imports, caches)
            time_releases(mech, x, rng[m], m, 1)
        rates: dict[str, list[float]] = {m: [] for m in n}
        for _ in range(args.repeats):
            for m in n:  # interleaved so load changes hit both modes alike
                dt = time_releases(mech, x, rng[m], m, n[m])
                rates[m].append(n[m] * args.dim / dt)
        med = {m: statistics.median(r) for m, r in rates.items()}
        for m in n:
            print(f"{name:36s} {m:7s} {med[m]:17.4g} {med[m] / args.dim:11.4g} "
                  f"{min(rates[m]):11.4g}..{max(rates[m]):<11.4g}")
        print(f"{'':36s} ratio fast/secure = {med['fast'] / med['secure']:.0f}x")


if __name__ == "__main__":
    main()
