"""Query-round latency: the Flower engine (SecAgg+) vs the Ray engine (CrypTen top-k and threshold).

For every shard count S in --shards (default 40 200 1000), on the same clustered shards
(``fedmem.flower.apps.build_world``: S shards x --records records, --key-dim-d keys,
--value-dim-d values, clip 1):

* **Ray engine** (one private Ray and one pair of CrypTen parties for all sizes, idle
  while Flower runs): one :class:`fedmem.federation.Federation` per selection (2 shard
  hosts, gateway on, budgets lifted): ``topk`` (k = k' = 5, receipts
  suppressed) and ``threshold`` (0.5, noised receipts: the defended threshold setting).
  Wall time of one ``retrieve`` (gateway decision, hosts, MPC, aggregator, booking),
  median over --ray-repeats warm runs, the two selections interleaved; MPC bytes per query
  from ``Response.mpc_bytes``.
* **Flower engine**: one ``run_simulation`` (Ray backend, --client-cpus per ClientApp
  actor) with the fedmem gateway (``dp="fedmem"``), one query per round, SecAgg+ for the
  value. Per round: wall time from ``configure_fit`` to the end of ``aggregate_fit`` (all
  four SecAgg+ stages), and from one ``configure_fit`` to the next (what a stream of
  queries sees); medians over rounds 2..R (round 1 warms the actors up). Bytes per round:
  Flower's simulation reports none, so a client mod (``fedmem.flower.apps.message_bytes_mod``)
  sums the protobuf-serialized message contents crossing every ClientApp, both directions.
  Simulation start-up (Ray, actors) is reported apart.

Printed: a table per S, the Flower/Ray latency ratios at the smallest S, and the growth
exponents (log-log slope over the S measured). A Flower size that does not finish within
--flower-timeout seconds is reported as such and larger sizes are skipped. Numbers depend
on the machine and its load (printed before and after); nothing is asserted.

    .venv/bin/python scripts/bench_flower.py --shards 40 200 1000 --json /tmp/bench_flower.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def fit_exponent(xs, ys):
    pts = [(x, y) for x, y in zip(xs, ys) if y and math.isfinite(y)]
    if len(pts) < 2:
        return None
    return round(float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0]), 3)


def ray_engine(a, S, data, qs, parties):
    """Median single-query wall time of the Ray engine, top-k and threshold interleaved."""
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation, FederationConfig

    base = dict(shards=S, records_per_shard=a.records, key_dim=a.key_dim, value_dim=a.value_dim, clip=1.0,
                k_local=5, k=5, threshold=0.5, parties=2, mpc="crypten", sigma=1.2, delta=1e-6,
                calibration="realized", gateway=True, on_reject="raise", epsilon_budget=math.inf,
                total_epsilon_budget=math.inf, support_budget_bits=math.inf, total_support_budget_bits=math.inf,
                hosts=2, timeout_s=600.0)
    cfgs = {"topk": FederationConfig(**base, selection="topk", receipts="suppress"),
            "threshold": FederationConfig(**base, selection="threshold", receipts="noised", receipt_sigma=4.0)}
    feds = {k: Federation(c, data, accountant=Accountant("rdp"), rng=np.random.default_rng([a.seed, S, i]),
                          parties=parties) for i, (k, c) in enumerate(cfgs.items())}
    times = {k: [] for k in feds}
    mpc_bytes = {}
    try:
        clients = {k: f.connect() for k, f in feds.items()}
        for k in feds:                       # warm-up (hosts, CrypTen circuits)
            clients[k].retrieve(qs[0])
        for rep in range(a.ray_repeats):
            for k in feds:
                t0 = time.perf_counter()
                r = clients[k].retrieve(qs[(rep + 1) % len(qs)])
                times[k].append(time.perf_counter() - t0)
                mpc_bytes[k] = r.mpc_bytes
    finally:
        for f in feds.values():
            f.close()
    return {k: {"median_s": statistics.median(v), "min_s": min(v), "n": len(v), "mpc_bytes": mpc_bytes.get(k)}
            for k, v in times.items()}


def flower_engine(a, S, world, qs, workdir):
    """Per-round latency and bytes of a Flower simulation with the gateway (dp='fedmem')."""
    from fedmem.flower.sim import simulate

    R = a.rounds if S < a.big else a.big_rounds
    rounds = [{"query": qs[i % len(qs)].tolist(), "world": 0, "target": -1} for i in range(R)]
    blog = os.path.join(workdir, f"bytes_{S}.csv")
    spec = dict(deployment="gateway", dp="fedmem", world=world, shards=S, value_dim=a.value_dim, k_local=5,
                threshold=0.5, clipping_range=8.0, rounds=rounds, flower_sigma=1.2, flower_clip=8.0, sigma=1.2,
                sensitivity=math.sqrt(5.0), ledger=os.path.join(workdir, f"ledger_{S}.sqlite"),
                ledger_name="bench", epsilon_budget=math.inf, total_epsilon_budget=math.inf, delta=1e-6,
                noise_seed=a.seed, num_shares=a.num_shares, reconstruction_threshold=a.reconstruction_threshold,
                num_cpus=a.num_cpus, client_cpus=a.client_cpus, bytes_log=blog)
    t0 = time.perf_counter()
    out = simulate(spec, timeout_s=a.flower_timeout)
    wall = time.perf_counter() - t0
    recs = out["records"]
    admitted = sum(1 for x in out["gateway"]["audit"] if x["decision"] == "admitted")
    lat = [r["t_aggregated"] - r["t_configured"] for r in recs if "t_aggregated" in r]
    step = [b["t_configured"] - r["t_configured"] for r, b in zip(recs, recs[1:])]
    per_round: dict[str, list[int]] = {}
    if os.path.exists(blog):
        with open(blog) as fh:
            for line in fh:
                g, bi, bo = line.strip().split(",")
                per_round.setdefault(g, [0, 0])
                per_round[g][0] += int(bi)
                per_round[g][1] += int(bo)
    totals = [sum(v) for k, v in sorted(per_round.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)]
    measured = lat[1:] or lat
    return {"rounds": R, "admitted": admitted, "round_median_s": statistics.median(measured),
            "round_min_s": min(measured), "round1_s": lat[0] if lat else None,
            "step_median_s": statistics.median(step[1:] or step) if step else None, "n": len(measured),
            "sim_wall_s": wall, "startup_s": wall - sum(lat), "bytes_per_round_median": statistics.median(totals)
            if totals else None, "bytes_to_clients": statistics.median([v[0] for v in per_round.values()])
            if per_round else None, "bytes_from_clients": statistics.median([v[1] for v in per_round.values()])
            if per_round else None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[40, 200, 1000])
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--key-dim", type=int, default=32)
    ap.add_argument("--value-dim", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=8, help="Flower rounds (queries) per simulation")
    ap.add_argument("--big", type=int, default=500, help="from this S on, --big-rounds rounds")
    ap.add_argument("--big-rounds", type=int, default=3)
    ap.add_argument("--ray-repeats", type=int, default=9)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--client-cpus", type=float, default=0.5)
    ap.add_argument("--num-shares", type=int, default=5)
    ap.add_argument("--reconstruction-threshold", type=int, default=3)
    ap.add_argument("--flower-timeout", type=float, default=420.0, help="seconds allowed per Flower simulation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    import ray

    from fedmem._ray import ensure_ray
    from fedmem.bench.shards import sample_queries
    from fedmem.federation.mpc import CryptenParties
    from fedmem.flower.apps import build_world, world_spec

    print(f"# bench_flower: shards {a.shards}; {load()} (start)", flush=True)
    results = []
    workdir = tempfile.mkdtemp(prefix="bench_flower_")
    flower_ok = True
    # One private Ray and one pair of CrypTen parties for every size (they sit idle while Flower's own
    # simulation, in a child process with its own private Ray, runs).
    owns = ensure_ray(None, num_cpus=a.num_cpus)
    parties = CryptenParties(2, timeout_s=900.0, start_timeout_s=900.0, placement="pack")
    try:
        for S in a.shards:
            world = world_spec(seed=a.seed, shards=S, records_per_shard=a.records, key_dim=a.key_dim,
                               value_dim=a.value_dim, clip=1.0, clusters=8, spread=0.35, targets=1)
            data, _ = build_world(world)
            qs = sample_queries(data, max(a.rounds, a.ray_repeats + 1), np.random.default_rng([a.seed, S]))
            row = {"shards": S, "load_before": os.getloadavg()[0]}
            try:
                row["ray"] = ray_engine(a, S, data, qs, parties)
            except Exception as exc:  # noqa: BLE001 - report and go on (an overloaded machine can time out)
                row["ray"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            if flower_ok:
                try:
                    row["flower"] = flower_engine(a, S, world, qs, workdir)
                except RuntimeError as exc:
                    row["flower"] = {"error": str(exc).splitlines()[0][:300]}
                    flower_ok = False
            else:
                row["flower"] = {"error": "skipped: a smaller size did not finish in time"}
            _report_row(row, a)
            results.append(row)
            if a.json:
                with open(a.json, "w") as fh:
                    json.dump({"args": vars(a), "results": results}, fh, indent=2)
    finally:
        parties.close()
        if owns and ray.is_initialized():
            ray.shutdown()
    _summary(results)
    print(f"# {load()} (end)")


def _report_row(row, a):
        S = row["shards"]
        row["load_after"] = os.getloadavg()[0]
        fl = row["flower"]
        print(f"\nS = {S} shards (load {row['load_before']:.1f} -> {row['load_after']:.1f})", flush=True)
        for sel in ("topk", "threshold"):
            if "error" in row["ray"]:
                print(f"  Ray engine  {row['ray']['error']}", flush=True)
                break
            r = row["ray"][sel]
            print(f"  Ray engine  {sel:10s} median {r['median_s']:.3f} s (min {r['min_s']:.3f}, n={r['n']}), "
                  f"MPC {r['mpc_bytes'] / 1e3:.1f} KB/query", flush=True)
        if "error" in fl:
            print(f"  Flower      {fl['error']}", flush=True)
        else:
            print(f"  Flower      SecAgg+ round median {fl['round_median_s']:.3f} s (min {fl['round_min_s']:.3f}, "
                  f"n={fl['n']}; round 1 {fl['round1_s']:.2f} s), round-to-round {fl['step_median_s']:.3f} s, "
                  f"simulation start-up {fl['startup_s']:.1f} s, {fl['admitted']}/{fl['rounds']} admitted", flush=True)
            if fl["bytes_per_round_median"]:
                print(f"              bytes per round {fl['bytes_per_round_median'] / 1e3:.1f} KB "
                      f"({fl['bytes_to_clients'] / 1e3:.1f} KB to clients, {fl['bytes_from_clients'] / 1e3:.1f} KB "
                      f"from clients; {fl['bytes_per_round_median'] / S / 1e3:.2f} KB per client)", flush=True)


def _summary(results):
    if not results:
        return
    first = results[0]
    if "error" not in first["flower"] and "error" not in first["ray"]:
        f0 = first["flower"]["round_median_s"]
        print(f"\nratio at S = {first['shards']}: Flower SecAgg+ round / Ray top-k query = "
              f"{f0 / first['ray']['topk']['median_s']:.1f}x; / Ray threshold query = "
              f"{f0 / first['ray']['threshold']['median_s']:.1f}x")
    ok = [r for r in results if "error" not in r["flower"]]
    rok = [r for r in results if "error" not in r["ray"]]
    xs = [r["shards"] for r in rok]
    print("growth exponents (log-log slope of median latency vs shards): "
          f"Ray top-k {fit_exponent(xs, [r['ray']['topk']['median_s'] for r in rok])}, "
          f"Ray threshold {fit_exponent(xs, [r['ray']['threshold']['median_s'] for r in rok])}, "
          f"Flower round {fit_exponent([r['shards'] for r in ok], [r['flower']['round_median_s'] for r in ok])}")


if __name__ == "__main__":
    main()
