"""Certified cascade: the bfloat16 candidate product against the float32 one.

Both paths multiply the same bfloat16-rounded operands and round the scores to bfloat16,
so the certified output is the same; only the speed differs. On a CPU without bfloat16
matrix units (AVX2 only) torch emulates the bfloat16 product, which is what
``CascadeProjector(matmul="auto")`` avoids. Prints, per path, the median (min..max)
seconds over ``--repeats`` runs on the same noisy points, tokens/s, the re-rank count, and
whether both paths equal the float64 exhaustive search on those points.

    .venv/bin/python scripts/bench_cascade_matmul.py --tokens 256 --repeats 3 --epsilon 100
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedmem.agent.dpmind.embeddings import load_minilm
from fedmem.agent.dpmind.perturb import CascadeProjector, native_bfloat16
from fedmem.dp import MetricLaplace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    table, _ = load_minilm()
    rng = np.random.default_rng(args.seed)
    ids = rng.choice(table.output_ids, args.tokens)
    pts = (table.matrix[ids].astype(np.float64) + MetricLaplace(args.epsilon, table.dim).sample(rng, args.tokens))
    pts = pts.astype(np.float32)
    print(f"CPU has bfloat16 matrix units: {native_bfloat16()}; tokens {args.tokens}, epsilon {args.epsilon}, "
          f"threads {args.threads}, repeats {args.repeats}")
    ref = None
    outs = {}
    for mode in ("float32", "bfloat16", "int8"):
        proj = CascadeProjector(table, threads=args.threads, matmul=mode)
        if ref is None:
            ref = proj.exhaustive(pts)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            outs[mode] = proj.project(pts)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        print(f"{mode:9s} median {med:8.3f} s ({min(times):.3f}..{max(times):.3f})  {args.tokens / med:9.0f} tok/s  "
              f"re-ranked {proj.fallbacks // args.repeats}  equals float64 exhaustive: "
              f"{bool(np.array_equal(outs[mode], ref))}")
    print(f"float32, bfloat16 and int8 outputs identical: {bool(np.array_equal(outs['float32'], outs['bfloat16']) and np.array_equal(outs['float32'], outs['int8']))}")


if __name__ == "__main__":
    main()
