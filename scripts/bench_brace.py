"""Benchmark: BRACE retrieval throughput vs Naive DAM (papers/001), same process, same noise.

For a bank of n = 1000 memories in d = 2 (digits PCA features) and d = 128 (Gaussian
clusters), horizon T = 5, a batch of queries is answered by BRACE (certificate included)
and by Naive DAM (direct count scale, no certificate) on the same standard-normal
innovations. Prints median queries/s over repeated runs, the ratio Naive/BRACE, and the
share of steps where activation could not be excluded for all neighbours (the steps
that needed the activated-branch search instead of the count bound), for the paper's
kappa = 128 and for a small kappa where the correction activates.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_brace.py [--queries 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedmem.agent.brace import BraceParams, NoiseSource, brace_run, iterative_baseline
from fedmem.bench.digits import digits_features


def banks(rng):
    feats = digits_features(1000, 256, rng=rng)
    centers = rng.normal(scale=3.0, size=(8, 128))
    X128 = centers[rng.integers(8, size=1000)] + rng.normal(size=(1000, 128))
    q128 = centers[rng.integers(8, size=256)] + rng.normal(size=(256, 128)) * 1.5
    return {2: (feats.bank, feats.queries + 3 * rng.normal(size=feats.queries.shape), 1.0),
            128: (X128, q128, float(np.quantile(np.linalg.norm(X128[:200, None] - X128[None, :200], axis=2), 0.1)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{'d':>4} {'kappa':>7} {'r':>7} {'BRACE q/s':>11} {'Naive q/s':>11} {'Naive/BRACE':>12} "
          f"{'search share':>13} {'H_t share':>10} {'median Dbar':>12}")
    for d, (X, Q, r) in banks(rng).items():
        Q = np.resize(Q, (args.queries, d))
        for kappa in (128.0, 0.01):
            p = BraceParams(r=r, T=5, epsilon=64.0, delta=1e-5, d=d, kappa=kappa)
            normals = rng.standard_normal((args.queries, p.T, d))
            tb, tn = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run = brace_run(X, Q, p, NoiseSource(normals=normals))
                t1 = time.perf_counter()
                iterative_baseline(X, Q, p, normals, "count")
                t2 = time.perf_counter()
                tb.append(t1 - t0)
                tn.append(t2 - t1)
            qb = args.queries / statistics.median(tb)
            qn = args.queries / statistics.median(tn)
            print(f"{d:>4} {kappa:>7g} {r:>7.3g} {qb:>11.1f} {qn:>11.1f} {qn / qb:>12.2f} "
                  f"{run.uncertain.mean():>13.3f} {run.activated.mean():>10.3f} {np.median(run.delta_bar):>12.4g}")
    print(f"(n = 1000, T = 5, epsilon = 64, delta = 1e-5, {args.queries} queries per batch, "
          f"median of {args.repeats} runs)")


if __name__ == "__main__":
    main()
