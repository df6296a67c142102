"""Where a command's CPU goes, by process kind: samples /proc while the command runs.

Every ``--interval`` seconds it reads the CPU time (user + system) of every process on the
machine, and charges what each used since the last sample to a *kind*: a Ray actor or worker
by its title (``ray::_HostActor``, ``ray::IDLE``, ``ray::DashboardAgent``), Ray's own binaries
(``raylet``, ``gcs_server``), a Python script by its name (``log_monitor.py``, ``monitor.py``,
``dashboard.py``), a Ray worker that has not taken its title yet as ``ray-worker-starting``,
anything else by its command's basename. A pooled idle Ray worker (``ray::IDLE``) that then
becomes an actor or runs a task is charged to that title from then on (until session 11 it
stayed ``ray::IDLE``, so the IDLE line held most actors' CPU). Processes that exist before the command starts are
counted from then on (their earlier CPU is not charged); a process that ends between two
samples loses at most one interval. Linux only (/proc). This is how the suite's CPU was split
in issue 22 (session 10): e.g. that Ray's auxiliary processes used ~140 of ~830 CPU seconds of
``make test``, and that an orphaned dashboard agent kept running after a test.

    .venv/bin/python scripts/cpu_by_process.py -- .venv/bin/python -m pytest -q -n 2 --dist loadfile
    .venv/bin/python scripts/cpu_by_process.py --top 30 --json cpu.json -- make test

Prints the kinds by CPU seconds, then the ``--top`` processes with their command lines. Exits
with the command's exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
RELABEL = ("ray-worker-starting", "ray::IDLE")   # Ray workers not yet doing anything of their own


def read_proc(pid: str):
    """(CPU clock ticks, start time, parent pid, comm, command line) of process ``pid``; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12]), int(fields[19]), int(fields[1]), comm, cmd


def kind_of(comm: str, cmd: str) -> str:
    """The kind a process is charged to (see the module docstring)."""
    if comm.startswith("ray::"):
        return comm
    if comm in ("raylet", "gcs_server"):
        return comm
    parts = cmd.split()
    if not parts:
        return comm
    if len(parts) > 1 and parts[1].endswith(("default_worker.py", "setup_worker.py")):
        return "ray-worker-starting"
    if re.search(r"python[\d.]*$", parts[0]):
        rest = [p for p in parts[1:] if not p.startswith("-")]
        if "-m" in parts:
            return "python -m " + parts[parts.index("-m") + 1]
        if "-c" in parts:
            return "python -c"
        return os.path.basename(rest[0]) if rest else "python"
    return os.path.basename(parts[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    ap.add_argument("--top", type=int, default=20, help="how many single processes to list (default 20)")
    ap.add_argument("--json", help="also write kinds and top processes to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the command to measure after --, e.g. -- make test")
    if a.interval <= 0:
        ap.error(f"--interval must be > 0. Found {a.interval}.")
    if not Path("/proc/self/stat").exists():
        ap.error("needs Linux /proc")
    last: dict = {}
    kinds: Counter = Counter()
    per: Counter = Counter()
    label: dict = {}
    me = str(os.getpid())

    def sample(charge: bool) -> None:
        seen = set()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            got = read_proc(pid)
            if got is None:
                continue
            cpu, start, _ppid, comm, cmd = got
            key = (pid, start)
            seen.add(key)
            # A process keeps the kind of its first sight (an exiting one has no command line left),
            # except a Ray worker, re-labelled once it takes its title, and a pooled idle worker
            # (``ray::IDLE``, e.g. one Ray prestarted) re-labelled once it becomes an actor or runs a task:
            # its CPU from then on is that actor's (its start-up before that stays charged to IDLE).
            if key not in label or (label[key][0] in RELABEL and cmd and kind_of(comm, cmd) != label[key][0]):
                label[key] = (kind_of(comm, cmd), cmd[:300])
            kind = label[key][0]
            prev = last.get(key)
            if prev is None:
                used = cpu if charge else 0      # new since the last sample: all its CPU is the command's time
            else:
                used = cpu - prev
            last[key] = cpu
            if used:
                kinds[kind] += used
                per[key] += used
        for key in list(last):
            if key not in seen:
                del last[key]

    sample(charge=False)
    t0 = time.perf_counter()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(a.interval)
        sample(charge=True)
    wall = time.perf_counter() - t0
    total = sum(kinds.values()) / HZ
    print(f"\n{total:.1f} CPU-s in {wall:.1f} s wall ({total / wall:.2f} cores on average), by kind:")
    for k, v in kinds.most_common():
        if v / HZ >= 0.05:
            print(f"{v / HZ:9.1f}  {k}")
    print(f"\ntop {a.top} processes:")
    top = [(label[k][0], v / HZ, label[k][1]) for k, v in per.most_common(a.top)]
    for kind, v, cmd in top:
        print(f"{v:9.1f}  {kind[:24]:24s} {cmd[:110]}")
    if a.json:
        Path(a.json).write_text(json.dumps({"wall_s": wall, "cpu_s": total,
                                            "kinds": {k: v / HZ for k, v in kinds.most_common()},
                                            "top": top}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
