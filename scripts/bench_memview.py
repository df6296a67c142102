"""Full DP-MemView benchmark timing: 320 PairedMem pairs x 32 turns, every interface, auditor.

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_memview.py [--pairs 320] [--turns 32]
        [--seeds 0 1 2] [--repeats 3] [--skip-full]

Prints

1. stage timings of one full run (pair generation, interfaces + responder, encoder load,
   embedding of unique responses, auditor fit/eval) for all ten methods of Tables 2 and 4
   at prefixes T=16 and T=32, and the headline AUCs;
2. the embedding cache against its baseline, side by side in one process: embedding every
   response of a sample of transcripts as is (baseline) vs embedding each unique string
   once (cache), median of ``--repeats`` runs each, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fedmem.agent.memview.baselines import ALL_METHODS  # noqa: E402
from fedmem.experiments.memview import Bench  # noqa: E402
from fedmem.embeddings import SentenceEmbedder  # noqa: E402
from fedmem.report import RunContext  # noqa: E402
from fedmem.registry import load_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=320)
    ap.add_argument("--turns", type=int, default=32)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-full", action="store_true", help="only the cache-vs-baseline comparison")
    args = ap.parse_args()

    prefixes = sorted({min(16, args.turns), args.turns})
    overrides = [f"data.pairs={args.pairs}", f"data.turns={args.turns}", f"audit.prefixes={prefixes}",
                 f"run.seeds={args.seeds}"]
    sc = load_scenario(Path(__file__).resolve().parents[1] / "scenarios/memview_table2.toml", overrides)
    ctx = RunContext(Path("/tmp/fedmem_bench_memview"), sc.config.seed, show_progress=False, quiet=True)

    if not args.skip_full:
        t_all = time.perf_counter()
        bench = Bench(sc.config, ctx)
        print(f"full run: {args.pairs} pairs x {args.turns} turns, methods={len(ALL_METHODS)}, "
              f"EM seeds={args.seeds}, prefixes={prefixes}", flush=True)
        for m in ALL_METHODS:
            t0 = time.perf_counter()
            r = bench.evaluate(m, sc.config.budget.cap, sc.config.budget.K)
            aucs = "  ".join(f"T={p}: AUC={r['by_prefix'][p]['auc']:.3f} TPR@5={r['by_prefix'][p]['tpr5']:.3f}"
                             for p in prefixes)
            print(f"  {m:18s} {aucs}  tRec={r['tRec']:.3f} U={r['U']:.3f} Unsup={r['Unsup']:.3f}  "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        total = time.perf_counter() - t_all
        print("stage timings:")
        for k, v in bench.timings.items():
            print(f"  {k:24s} {v:8.1f} s")
        print(f"  {'unique responses':24s} {bench.embedder.encoded:8d}")
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(f"  {'TOTAL wall':24s} {total:8.1f} s  (budget 600 s on 2 cores)")
        print(f"  {'process CPU (user+sys)':24s} {ru.ru_utime + ru.ru_stime:8.1f} s  (os.getloadavg: "
              f"{os.getloadavg()[0]:.1f}; wall >> CPU/2 means other processes held the cores)")

    # ---- cache vs baseline on a sample, side by side in one process
    sc_small = load_scenario(Path(__file__).resolve().parents[1] / "scenarios/memview_table2.toml",
                             ["data.pairs=16", "data.turns=16", "audit.prefixes=[16]", "run.seeds=[0]"])
    b = Bench(sc_small.config, RunContext(Path("/tmp/fedmem_bench_memview_small"), 1, show_progress=False,
                                          quiet=True))
    texts = []
    for m in ("RawReadSet", "DP-MemView (on)", "GenericOnly"):
        runs = b.transcripts(m, 0, 2.0, 3)
        texts += [t for r in runs for side in ("M", "M'") for t in r[side].responses]
    model = SentenceEmbedder(threads=2).model
    base, cached = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        model.encode(texts, batch_size=128, normalize_embeddings=True, show_progress_bar=False)
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        uniq = list(dict.fromkeys(texts))
        vecs = dict(zip(uniq, model.encode(uniq, batch_size=128, normalize_embeddings=True,
                                           show_progress_bar=False)))
        np.stack([vecs[t] for t in texts])
        cached.append(time.perf_counter() - t0)
    mb, mc = statistics.median(base), statistics.median(cached)
    print(f"embedding {len(texts)} responses ({len(set(texts))} unique), median of {args.repeats}:")
    print(f"  baseline (every response) {mb:7.2f} s")
    print(f"  cache (unique strings)    {mc:7.2f} s")
    print(f"  ratio baseline / cache    {mb / mc:7.2f}x")


if __name__ == "__main__":
    main()
