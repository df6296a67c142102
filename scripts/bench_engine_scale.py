"""The whole engine at a large shard count: federation start, warm single queries, one batch, memory.

One process, one private Ray. For each kind of parties (plaintext, then CrypTen; one fresh
federation each): ``--shards`` shards x ``--records`` records (float32 keys and values,
``make_clustered_shards(..., dtype=np.float32)``), ``--hosts`` shard-host actors, threshold
selection (cosine 0.5), k' = ``--k-local``, the gateway on with noised receipts and realized
calibration (a defended federation that answers threshold queries), budgets finite but 1e9
(every budget checked as with the defaults; every query computed, noised and booked as usual). Prints:

* federation start: constructing the ``Federation`` and waiting for its hosts to be ready;
* warm single queries: ``--queries`` calls of one query each (the first call is a warm-up and
  not counted), median and range;
* one batch: ``--batch`` queries in one ``retrieve_many`` call, wall seconds;
* memory: the driver's peak RSS (``ru_maxrss``) and the resident memory of every Ray worker of
  this run by actor class, read from ``/proc`` right after the batch (not a peak).

Nothing is asserted; the load average is printed (the machine may be shared).

    .venv/bin/python scripts/bench_engine_scale.py --shards 10000 --hosts 4 --queries 7 --batch 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedmem.bench.shards import make_clustered_shards, sample_queries  # noqa: E402
from fedmem.dp import Accountant  # noqa: E402
from fedmem.federation.config import FederationConfig  # noqa: E402
from fedmem.federation.engine import Federation  # noqa: E402

# finite budgets, so the gateway checks every budget as it does with the defaults, but so large
# that no query is refused (with infinite budgets the checks are skipped: not what ships)
BUDGETS = dict(epsilon_budget=1e9, total_epsilon_budget=1e9, support_budget_bits=1e9, total_support_budget_bits=1e9)


def ray_workers_rss() -> dict[str, float]:
    """GiB resident per Ray actor class (processes titled ``ray::<Class>...``), this machine."""
    out: dict[str, float] = defaultdict(float)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            title = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if not title.startswith("ray::"):
                continue
            rss_kb = next(int(line.split()[1]) for line in (d / "status").read_text().splitlines()
                          if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
        name = title[5:].split(".")[0].split(" ")[0] or "idle worker"
        out[name] += rss_kb / 2**20
    return dict(out)


def run(mpc: str, data, queries: np.ndarray, args) -> dict:
    cfg = FederationConfig(shards=args.shards, records_per_shard=args.records, key_dim=args.dim, value_dim=args.dim,
                           hosts=args.hosts, k_local=args.k_local, selection="threshold", threshold=0.5,
                           n_bound=args.shards, receipts="noised", calibration="realized", mpc=mpc, timeout_s=1800.0, max_batch=max(1, args.batch),
                           **BUDGETS)
    t0 = time.perf_counter()
    fed = Federation(cfg, data, accountant=Accountant(), rng=np.random.default_rng(args.seed))
    fed.engine._heal_hosts()          # wait for the hosts (the first query would)
    start = time.perf_counter() - t0
    try:
        singles = []
        for i in range(args.queries):
            t = time.perf_counter()
            fed.retrieve(queries[i])
            if i:                     # the first call is a warm-up
                singles.append(time.perf_counter() - t)
        t = time.perf_counter()
        fed.retrieve_many(queries[:args.batch])
        batch = time.perf_counter() - t
        mem = ray_workers_rss()
    finally:
        fed.close()
    return {"start": start, "singles": singles, "batch": batch, "mem": mem}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--records", type=int, default=50)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--k-local", type=int, default=1)
    ap.add_argument("--queries", type=int, default=7, help="single-query calls (the first is a warm-up)")
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--mpc", nargs="+", default=["plaintext", "crypten"], choices=("plaintext", "crypten"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("shards", "records", "dim", "hosts", "k_local", "queries", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1. Found {getattr(args, name)!r}.")
    if args.queries < 2:
        ap.error(f"--queries must be >= 2 (the first is a warm-up). Found {args.queries!r}.")

    import ray

    from fedmem._ray import ensure_ray

    ensure_ray("local")
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    t = time.perf_counter()
    data = make_clustered_shards(args.shards, args.records, args.dim, args.dim, 1.0, np.random.default_rng(args.seed),
                                 clusters=16, dtype=np.float32)
    queries = sample_queries(data, max(args.queries, args.batch), np.random.default_rng(args.seed + 1))
    print(f"data: {args.shards} shards x {args.records} records, {args.dim}-d float32, built in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    try:
        for mpc in args.mpc:
            r = run(mpc, data, queries, args)
            s = r["singles"]
            mem = ", ".join(f"{k} {v:.2f} GiB" for k, v in sorted(r["mem"].items()))
            print(f"{mpc:9s}: start {r['start']:.1f} s | warm single query median {statistics.median(s):.2f} s "
                  f"({min(s):.2f}-{max(s):.2f}, n={len(s)}) | batch of {args.batch}: {r['batch']:.2f} s | "
                  f"Ray workers: {mem}", flush=True)
    finally:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"driver peak RSS {peak:.2f} GiB; load average at end: {os.getloadavg()[0]:.2f}")
        ray.shutdown()


if __name__ == "__main__":
    main()
