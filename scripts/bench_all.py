"""Every headline benchmark in one command, with its machine line, as markdown tables.

    .venv/bin/python scripts/bench_all.py                      # all, writes docs/benchmarks.md
    .venv/bin/python scripts/bench_all.py --quick --out /tmp/b.md
    .venv/bin/python scripts/bench_all.py --baseline HEAD~5     # old/new alternated per repeat

Repeats: 5 per benchmark by default (``--repeats``). The shared 2-core machines move a single
run by +-30% or more (docs/dpmind.md); 5 alternated repeats give a median and a range, and with
``--baseline`` each repeat runs old then new back to back, so both see the same load. ``--quick``
runs 1 repeat of tiny sizes (a smoke test, not a measurement).

Each benchmark is an existing ``scripts/bench_*.py`` run as a child process; its last output
lines are kept verbatim in the table (wall seconds per repeat; median and range). The machine
line records CPU model, flags (avx2 / avx512 / amx / bf16), load average, date and commit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FULL = {
    "engine": ["scripts/bench_engine.py", "--repeats", "1"],
    "retrieval": ["scripts/bench_retrieval.py"],
    "dpmind": ["scripts/bench_dpmind.py", "--interleaved", "--tokens", "16384", "--methods", "exact,cascade",
               "--repeats", "3", "--threads", "1"],
    "cascade_matmul": ["scripts/bench_cascade_matmul.py", "--tokens", "1024", "--repeats", "3"],
    "flower": ["scripts/bench_flower.py"],
    "agents": ["scripts/bench_agents.py"],
}
QUICK = {"cascade_matmul": ["scripts/bench_cascade_matmul.py", "--tokens", "64", "--repeats", "1"]}


def machine_line() -> str:
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    want = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Machine: {model}, {os.cpu_count()} CPUs, flags {' '.join(want) or 'none of avx2/avx512/amx/bf16'}; "
            f"load average {load}; {now}; commit {rev or 'unknown'}")


def run_one(tree: Path, cmd: list[str], timeout: float) -> tuple[float, str, int]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *cmd], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = (p.stdout + p.stderr).strip(), p.returncode
    except subprocess.TimeoutExpired:
        out, rc = "timed out", 124
    return time.perf_counter() - t, out, rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--baseline", default="", help="git revision to alternate with the working tree")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print(f"bench_all: --repeats must be >= 1. Found {args.repeats}.", file=sys.stderr)
        return 2
    table = QUICK if args.quick else FULL
    repeats = 1 if args.quick else args.repeats
    names = [n for n in args.only.split(",") if n] or list(table)
    bad = [n for n in names if n not in table]
    if bad:
        print(f"bench_all: --only must name benchmarks of {sorted(table)}. Found {bad[0]!r}.", file=sys.stderr)
        return 2
    trees = [("new", ROOT)]
    tmp = None
    if args.baseline:
        tmp = tempfile.TemporaryDirectory()
        arch = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, capture_output=True)
        if arch.returncode:
            print(f"bench_all: --baseline must be a git revision. Found {args.baseline!r}.", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", tmp.name], input=arch.stdout, check=True)
        trees = [("old", Path(tmp.name)), ("new", ROOT)]
    lines = ["# Benchmarks", "", machine_line(), "", f"`{' '.join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])}`",
             f"({repeats} repeat(s); old/new alternated within each repeat)" if args.baseline else f"({repeats} repeat(s))",
             "", "| benchmark | tree | wall s median | range | rc | last output line |", "|---|---|---|---|---|---|"]
    for name in names:
        res = {label: [] for label, _ in trees}
        for _ in range(repeats):
            for label, tree in trees:
                res[label].append(run_one(tree, table[name], args.timeout))
        for label, _ in trees:
            walls = [w for w, _, _ in res[label]]
            last = (res[label][-1][1].splitlines() or [""])[-1].replace("|", "/")[:160]
            rc = max(r for _, _, r in res[label])
            lines.append(f"| {name} | {label} | {statistics.median(walls):.2f} | {min(walls):.2f}..{max(walls):.2f} "
                         f"| {rc} | {last} |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
