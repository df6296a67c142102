"""Benchmark an ``agents.session`` run: agent-tasks per second and where the time goes.

Runs ``fedmem run scenarios/agents_session.toml --set agents.n=N --set agents.tasks=T``
in a subprocess (its own session, so every Ray process it starts can be accounted and,
if memory runs out, stopped by its process group), samples the machine's load average,
available memory and the summed RSS of the run's processes every ``--every`` seconds, then
prints the run's phase timings (from ``results.json``) next to those samples.

    .venv/bin/python scripts/bench_agents.py --agents 100 --tasks 20 --out /tmp/bench_agents

The issue's target: 100 agents x 20 tasks in at most 10 minutes on 2 cores. Timings on a
shared machine are noisy: the load average is part of the output.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mem_available_gb() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _cpu_seconds(text: str) -> int:
    """``ps`` TIME ``[[dd-]hh:]mm:ss`` -> seconds."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _session_usage(sid: int) -> tuple[float, int, int]:
    """Summed RSS (GB; shared pages counted per process), process count and CPU seconds of a session."""
    out = subprocess.run(["ps", "-eo", "sid=,rss=,time="], capture_output=True, text=True).stdout
    tot, n, cpu = 0, 0, 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == str(sid):
            tot += int(parts[1])
            cpu += _cpu_seconds(parts[2])
            n += 1
    return tot / 2**20, n, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--peer-trials", type=int, default=None)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "agents_session.toml"))
    ap.add_argument("--out", required=True, help="run folder (must not exist or be empty)")
    ap.add_argument("--every", type=float, default=2.0, help="sampling period (s)")
    ap.add_argument("--min-free-gb", type=float, default=2.0,
                    help="stop the run (its process group) if available memory drops below this")
    ap.add_argument("--timeout", type=float, default=1800.0)
    a = ap.parse_args(argv)
    for name in ("agents", "tasks"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name} must be >= 1. Found {getattr(a, name)!r}.")
    cmd = [sys.executable, "-m", "fedmem.cli", "run", a.scenario, "--set", f"agents.n={a.agents}",
           "--set", f"agents.tasks={a.tasks}", "--out", a.out]
    if a.peer_trials is not None:
        cmd += ["--set", f"attacks.peer_trials={a.peer_trials}"]
    samples = []
    t0 = time.perf_counter()
    log_path = Path(str(Path(a.out)) + ".log")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    stopped = None
    try:
        while proc.poll() is None:
            time.sleep(a.every)
            rss, nproc, cpu = _session_usage(proc.pid)
            s = {"t": time.perf_counter() - t0, "load1": os.getloadavg()[0], "mem_available_gb": _mem_available_gb(),
                 "run_rss_gb": rss, "run_processes": nproc, "run_cpu_s": cpu}
            samples.append(s)
            if s["mem_available_gb"] < a.min_free_gb:
                stopped = f"available memory {s['mem_available_gb']:.1f} GB < {a.min_free_gb} GB"
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if s["t"] > a.timeout:
                stopped = f"timeout {a.timeout} s"
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    tail = log_path.read_text(errors="replace")[-4000:]
    wall = time.perf_counter() - t0
    out = {"agents": a.agents, "tasks": a.tasks, "wall_s": wall, "returncode": proc.returncode, "stopped": stopped,
           "cpus": os.cpu_count()}
    if samples:
        loads = [s["load1"] for s in samples]
        out["load1"] = {"min": min(loads), "mean": sum(loads) / len(loads), "max": max(loads)}
        out["peak_run_rss_gb"] = max(s["run_rss_gb"] for s in samples)   # summed RSS: shared pages counted per process
        out["min_mem_available_gb"] = min(s["mem_available_gb"] for s in samples)
        out["peak_run_processes"] = max(s["run_processes"] for s in samples)
        # CPU seconds of the run's live processes at the last sample (processes that ended earlier are missed):
        # with 2 idle cores the run needs at least run_cpu_s / 2 seconds
        out["run_cpu_s_last_sample"] = max(s["run_cpu_s"] for s in samples)
    res = Path(a.out) / "results.json"
    if res.exists():
        m = json.loads(res.read_text())["metrics"]
        out["timings"] = m["timings"]
        out["agent_tasks_done"] = m["agent_tasks_done"]
        out["dead_agents"] = m["dead_agents"]
        out["booking_check_ok"] = m["booking_check_ok"]
    else:
        out["output_tail"] = tail
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bench.json").write_text(json.dumps({"summary": out, "samples": samples}, indent=1))
    print(json.dumps(out, indent=1))
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
