"""An accountant's budget check (``Accountant.fits``) with a long history: trial copies by
``copy_tracks`` (what ships) vs ``copy.deepcopy`` (the baseline, what it replaced), side by side.

A gateway asks ``fits`` for every principal of every query before computing anything; with a
budget, each call composes the trial events on a copy of the accountant's composition tracks.
One process, one durable (SQLite, WAL) accountant of kind ``--kind`` with ``--history`` booked
Gaussian events (three alternating noise multipliers, so dp-accounting's ledger builder cannot
merge them), then ``--calls`` calls of ``fits`` per repeat, the two copy functions interleaved
(A B A B ...). Prints the median milliseconds per call of each and their ratio; checks that
both answer the same. Nothing is asserted beyond that.

    .venv/bin/python scripts/bench_accountant.py [--history 200] [--calls 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dp_accounting  # noqa: E402

import fedmem.dp.accountant as A  # noqa: E402
from fedmem.dp import Accountant  # noqa: E402
from fedmem.dp.store import DurableStore  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=200, help="events booked before the checks")
    ap.add_argument("--calls", type=int, default=300, help="fits() calls per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kind", default="rdp", choices=("rdp", "pld"))
    args = ap.parse_args(argv)
    for name in ("history", "calls", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1. Found {getattr(args, name)!r}.")

    with tempfile.TemporaryDirectory() as tmp:
        acc = Accountant(args.kind, store=DurableStore(os.path.join(tmp, "ledger.sqlite")), name="bench",
                         budget=(1e9, 1e-6))
        for i in range(args.history):
            acc.book(dp_accounting.GaussianDpEvent(5.0 + i % 3))
        trial, cap = [dp_accounting.GaussianDpEvent(4.0)], (1e9, 1e-5)
        shipped = A.copy_tracks
        variants = {"copy_tracks (ships)": shipped, "copy.deepcopy (baseline)": copy.deepcopy}
        answers, times = {}, {k: [] for k in variants}
        try:
            for _ in range(args.repeats):
                for name, fn in variants.items():
                    A.copy_tracks = fn
                    answers[name] = acc._trial_epsilon(trial, cap[1])
                    t = time.perf_counter()
                    for _ in range(args.calls):
                        acc.fits(trial, cap)
                    times[name].append((time.perf_counter() - t) / args.calls * 1e3)
        finally:
            A.copy_tracks = shipped
    print(f"{args.kind} accountant, {args.history} booked events, {args.calls} fits() calls x {args.repeats} "
          f"repeats (load average {os.getloadavg()[0]:.2f})")
    for name, ts in times.items():
        print(f"  {name:26s} {statistics.median(ts):8.3f} ms per call (trial epsilon {answers[name]!r})")
    a, b = (statistics.median(times[k]) for k in variants)
    print(f"  baseline / shipped         {b / a:8.2f}x")
    if len(set(answers.values())) != 1:
        raise SystemExit("the two copies gave different trial epsilons")


if __name__ == "__main__":
    main()
