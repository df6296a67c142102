"""Benchmark: what a private Ray instance costs in CPU, fedmem's lean head vs Ray's default.

fedmem starts its private instance through ``fedmem._ray.ensure_ray`` (``lean_private_head``:
no autoscaler monitor, no log monitor, no dashboard head, the dashboard agent's node reports
every 10 minutes instead of every 5 s). The baseline is the same ``ray.init`` (``include_dashboard=False``,
``log_to_driver=False``, the same CPUs) without the wrapper. Trials alternate (lean, plain,
lean, ...), each in a fresh child process, which starts the instance, creates ``--actors`` idle
actors, and reads every process of that Ray session from /proc:

* ``start_wall_s``: wall time of ``ray.init``;
* ``start_cpu_s``: CPU seconds of the instance's own processes (GCS, raylet, agents, monitors,
  dashboard head; not the actors and workers) from its start to ``--settle`` seconds after the actors answered;
* ``idle_cpu_per_min``: CPU seconds per minute of those processes over the next ``--steady``
  seconds with nothing running (what a long-lived instance, a test session's, pays).

Prints the median of each over ``--repeats`` trials per variant and the ratio plain / lean.

    .venv/bin/python scripts/bench_ray_start.py                 # 3 + 3 trials, 30 s steady each
    .venv/bin/python scripts/bench_ray_start.py --repeats 5 --steady 60 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from cpu_by_process import HZ, kind_of, read_proc  # noqa: E402 - scripts/ is on sys.path (this file's folder)

AGENTS = ("ray::DashboardA", "ray::RuntimeEnv")   # the raylet's agents, by their (15-character) titles


def _session_cpu(session: str) -> dict[str, float]:
    """CPU seconds per process kind of the Ray session ``session``: the processes whose command line
    names it and their children (the raylet's agents rename themselves to ``ray::DashboardAgent``,
    which names no session), actors and workers excluded (the same in both variants). Kinds and
    the /proc reader are ``scripts/cpu_by_process.py``'s."""
    procs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (got := read_proc(pid)) is not None:
            procs[int(pid)] = got
    own = {pid for pid, (_, _, _, _, cmd) in procs.items() if session in cmd}
    out: dict[str, float] = {}
    for pid, (cpu, _start, ppid, comm, cmd) in procs.items():
        if pid not in own and ppid not in own:
            continue
        kind = kind_of(comm, cmd)
        if kind == "ray-worker-starting" or (kind.startswith("ray::") and kind not in AGENTS):
            continue
        out[kind] = out.get(kind, 0.0) + cpu / HZ
    return out


def trial(variant: str, actors: int, settle: float, steady: float) -> dict:
    import ray

    from fedmem._ray import ensure_ray, local_options

    t0 = time.perf_counter()
    if variant == "lean":
        ensure_ray("local", num_cpus=2)
    else:
        ray.init(**local_options(2))
    start_wall = time.perf_counter() - t0
    session = Path(ray._private.worker._global_node.get_session_dir_path()).name

    @ray.remote(num_cpus=0.01)
    class Idle:
        def pid(self):
            return os.getpid()

    handles = [Idle.remote() for _ in range(actors)]
    ray.get([h.pid.remote() for h in handles])
    time.sleep(settle)
    a = _session_cpu(session)
    time.sleep(steady)
    b = _session_cpu(session)
    ray.shutdown()
    return {"variant": variant, "start_wall_s": start_wall, "start_cpu_s": sum(a.values()),
            "idle_cpu_per_min": sum(b.get(k, 0.0) - a.get(k, 0.0) for k in b) * 60.0 / steady,
            "start_by_process": {k: round(v, 2) for k, v in sorted(a.items())},
            "idle_by_process": {k: round(b.get(k, 0.0) - a.get(k, 0.0), 2) for k in sorted(b)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="trials per variant, alternated (default 3)")
    ap.add_argument("--actors", type=int, default=8, help="idle actors alive during the measurement (default 8)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the actors answer (default 3)")
    ap.add_argument("--steady", type=float, default=30.0, help="idle measurement window, seconds (default 30)")
    ap.add_argument("--json", help="write the trials and medians to this file")
    ap.add_argument("--trial", choices=("lean", "plain"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for name in ("repeats", "actors"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1. Found {getattr(a, name)}.")
    if a.trial:
        print("TRIAL " + json.dumps(trial(a.trial, a.actors, a.settle, a.steady)), flush=True)
        return 0
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    trials = []
    for i in range(a.repeats):
        for variant in ("lean", "plain"):
            p = subprocess.run([sys.executable, __file__, "--trial", variant, "--actors", str(a.actors),
                                "--settle", str(a.settle), "--steady", str(a.steady)],
                               capture_output=True, text=True, env=env, timeout=600)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("TRIAL ")), None)
            if p.returncode or line is None:
                print(p.stderr[-3000:], file=sys.stderr)
                return 1
            t = json.loads(line[6:])
            trials.append(t)
            print(f"[{i + 1}/{a.repeats}] {variant:5s} start {t['start_wall_s']:.2f} s wall, "
                  f"{t['start_cpu_s']:.2f} CPU-s; idle {t['idle_cpu_per_min']:.2f} CPU-s/min  "
                  f"{t['idle_by_process']}", flush=True)
    med = {v: {k: statistics.median(t[k] for t in trials if t["variant"] == v)
               for k in ("start_wall_s", "start_cpu_s", "idle_cpu_per_min")} for v in ("lean", "plain")}
    print(f"\nmedians over {a.repeats} trials each ({a.actors} idle actors, {a.steady:.0f} s idle window; "
          f"load {os.getloadavg()[0]:.1f}):")
    print(f"{'':22s}{'lean':>10s}{'plain':>10s}{'plain/lean':>12s}")
    for k in ("start_wall_s", "start_cpu_s", "idle_cpu_per_min"):
        lean, plain = med["lean"][k], med["plain"][k]
        print(f"{k:22s}{lean:10.2f}{plain:10.2f}{plain / lean if lean else float('inf'):11.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"trials": trials, "medians": med}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
