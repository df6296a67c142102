"""The WHOLE engine, as it ships: gateway, shard hosts, MPC, aggregator, booking, Ray calls.

One process, one private Ray, the engine's own configuration (``FederationConfig``
defaults: 40 shards x 50 records, k' = 5, top-5, 128-dim keys and values, 2 hosts, 2
parties built by the engine itself, i.e. ``shards_sorted=False``, packets sealed to
their party), budgets finite (every budget is checked, as with the defaults) but set to 1e9
so that no query is refused (every query is computed, noised and booked in the ledger as
usual). Measured side by side, repeats
interleaved (A B C A B C, so load drift favours none):

* plaintext engine (``mpc="plaintext"``) and CrypTen engine (``mpc="crypten"``), one
  query per call and B queries per ``retrieve_many`` call;
* the CrypTen engine with sealing switched off (same process: the cost of sealing);
* the CrypTen engine with the previous triple generator (``torch.randint`` on demand
  instead of AES-CTR generated ahead between queries): before/after of the AES-CTR change;
* the naive CrypTen loop (k sequential CrypTen argmaxes on ``MPCTensor``) on the same
  engine's hosts' packets, B queries per call (the baseline).

Per configuration the text output gives a per-stage breakdown of a call: gateway and
booking (the rest of ``retrieve_many``), shard hosts (scoring, sharing, sealing, one Ray
round), MPC protocol time inside the parties, Ray/transport around the parties (MPC call
wall time minus the protocol time) and the aggregator. Medians over repeats; the load
average is printed (the machine may be shared). ``--json FILE`` writes the headline
numbers. Nothing is asserted.

    .venv/bin/python scripts/bench_engine.py --json /tmp/engine.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedmem.bench.shards import make_clustered_shards, sample_queries  # noqa: E402
from fedmem.dp import Accountant  # noqa: E402
from fedmem.federation.config import FederationConfig  # noqa: E402
from fedmem.federation.engine import Federation  # noqa: E402

STAGES = ("gateway+booking", "hosts", "mpc protocol", "ray/transport", "aggregator")
# finite budgets, so the gateway checks every budget as it does with the defaults, but so large
# that no query is refused (with infinite budgets the checks are skipped: not what ships)
BUDGETS = dict(epsilon_budget=1e9, total_epsilon_budget=1e9, support_budget_bits=1e9, total_support_budget_bits=1e9)


def federation(mpc: str, data, seed: int) -> Federation:
    cfg = FederationConfig(mpc=mpc, timeout_s=600.0, **BUDGETS)
    return Federation(cfg, data, accountant=Accountant(), rng=np.random.default_rng(seed))


def timed_call(fed: Federation, q: np.ndarray) -> dict:
    """One ``retrieve_many`` call: wall seconds and its stages (from the engine's own timings)."""
    before = dict(fed.timings)
    t0 = time.perf_counter()
    rs = fed.retrieve_many(q)
    wall = time.perf_counter() - t0
    if any(isinstance(r, Exception) for r in rs):
        raise SystemExit("a query was refused: the benchmark must compute every query")
    d = {k: fed.timings[k] - before[k] for k in ("hosts", "mpc", "mpc_party", "aggregator")}
    return {"wall": wall, "hosts": d["hosts"], "mpc protocol": d["mpc_party"],
            "ray/transport": max(0.0, d["mpc"] - d["mpc_party"]), "aggregator": d["aggregator"],
            "gateway+booking": max(0.0, wall - d["hosts"] - d["mpc"] - d["aggregator"])}


def naive_call(fed: Federation, q: np.ndarray) -> dict:
    """The naive CrypTen loop on the engine's own hosts' packets (selection only, no release)."""
    from fedmem.federation.sharing import SelectionSpec

    qq = fed.engine.queries(q)
    t0 = time.perf_counter()
    packets = fed.engine.packets(qq, "topk")
    t1 = time.perf_counter()
    r = fed.parties.run(packets, SelectionSpec("topk", k=fed.config.k), impl="argmax")
    wall = time.perf_counter() - t0
    return {"wall": wall, "hosts": t1 - t0, "mpc protocol": r.stats["party_seconds"],
            "ray/transport": max(0.0, wall - (t1 - t0) - r.stats["party_seconds"]), "aggregator": 0.0,
            "gateway+booking": 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats of every configuration")
    ap.add_argument("--naive-repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None, help="write the headline numbers here")
    ap.add_argument("--seal-micro", action="store_true",
                    help="only time seal_packet / PartyKey.open on one host's packet (B = 1 and --batch), both AEADs")
    ap.add_argument("--fit-impl", action="store_true",
                    help="only measure rank/grouped/merge protocol time at several B in the engine's configuration "
                         "and fit the cost model of mpc.networks.choose_impl")
    ap.add_argument("--ray-micro", action="store_true",
                    help="only time the Ray calls of one query's host round on the engine's own hosts: a trivial "
                         "actor call, the host step returned by value, the same with ray.put refs, two tiny ray.puts, "
                         "and candidates_refs as the engine calls it (sealed)")
    ap.add_argument("--profile", default=None,
                    help="cProfile the driver over the CrypTen-engine batch calls; write pstats here")
    a = ap.parse_args(argv)

    if a.seal_micro:
        return seal_micro(a)
    from fedmem._ray import ensure_ray

    import ray

    load0 = os.getloadavg()
    owns = ensure_ray()   # one private Ray for both engines (neither engine owns it)
    cfg = FederationConfig()
    data = make_clustered_shards(cfg.shards, cfg.records_per_shard, cfg.key_dim, cfg.value_dim, cfg.clip,
                                 np.random.default_rng(a.seed), clusters=8)
    qs = sample_queries(data, a.batch, np.random.default_rng(a.seed + 1))
    if a.fit_impl:
        return fit_impl(a, data, qs, owns)
    if a.ray_micro:
        return ray_micro(a, data, qs, owns)
    plain = federation("plaintext", data, a.seed + 2)
    t0 = time.perf_counter()
    secure = federation("crypten", data, a.seed + 3)
    start_s = time.perf_counter() - t0
    B = a.batch
    configs = {
        "plaintext engine, 1 query": (lambda: timed_call(plain, qs[:1]), 1),
        f"plaintext engine, B={B}": (lambda: timed_call(plain, qs), B),
        "crypten engine, 1 query": (lambda: timed_call(secure, qs[:1]), 1),
        f"crypten engine, B={B}": (lambda: timed_call(secure, qs), B),
        "crypten engine unsealed, 1 query": (lambda: _unsealed(secure, qs[:1]), 1),
        f"crypten engine unsealed, B={B}": (lambda: _unsealed(secure, qs), B),
        "crypten engine torch-PRG, 1 query": (lambda: _torch_prg(secure, qs[:1]), 1),
        f"crypten engine torch-PRG, B={B}": (lambda: _torch_prg(secure, qs), B),
        f"naive crypten loop, B={B}": (lambda: naive_call(secure, qs), B),
    }
    runs = {name: [] for name in configs}
    prof = None
    try:
        # warm-up (and correctness of the secure engine against the plaintext ground truth)
        for name, (fn, _) in configs.items():
            fn()
        truth = secure.ground_truth_many(qs[:8])
        from fedmem.federation.sharing import SelectionSpec

        got = secure.parties.run(secure.engine.packets(secure.engine.queries(qs[:8]), "topk"), SelectionSpec("topk", k=cfg.k))
        if not (np.array_equal(got.tallies, np.stack([t.tallies for t in truth]))
                and np.array_equal(got.sum, np.stack([t.sum for t in truth]))):
            raise SystemExit("MISMATCH: secure selection differs from the plaintext ground truth")
        for rep in range(a.repeats):
            for name, (fn, _) in configs.items():
                if name.startswith("naive") and rep >= a.naive_repeats:
                    continue
                if prof is None and a.profile and name == f"crypten engine, B={B}":
                    import cProfile

                    prof = cProfile.Profile()
                if prof is not None and name == f"crypten engine, B={B}":
                    prof.enable()
                    runs[name].append(fn())
                    prof.disable()
                else:
                    runs[name].append(fn())
    finally:
        secure.close()
        plain.close()
        if owns:
            ray.shutdown()
    load1 = os.getloadavg()
    if prof is not None:
        prof.dump_stats(a.profile)

    print(f"fedmem engine benchmark: {cfg.shards} shards x {cfg.k_local} candidates, top-{cfg.k}, d={cfg.value_dim}, "
          f"{cfg.hosts} hosts, 2 parties (TFP, shards_sorted=False), sealed packets; "
          f"CrypTen parties started in {start_s:.1f} s")
    print(f"load average before {load0[0]:.2f} / after {load1[0]:.2f} (1 min); {os.cpu_count()} CPUs; "
          f"medians over repeats (naive: {a.naive_repeats})")
    print(f"{'configuration':34s} {'n':>3s} {'s/call':>9s} {'q/s':>9s}  " + "  ".join(f"{s:>15s}" for s in STAGES))
    out = {"load_before": load0[0], "load_after": load1[0], "batch": B, "cpus": os.cpu_count(),
           "repeats": a.repeats, "naive_repeats": a.naive_repeats, "configurations": {}}
    for name, (_, n) in configs.items():
        rs = runs[name]
        wall = statistics.median(r["wall"] for r in rs)
        stages = {s: statistics.median(r[s] for r in rs) for s in STAGES}
        print(f"{name:34s} {len(rs):3d} {wall:9.4f} {n / wall:9.1f}  " +
              "  ".join(f"{stages[s] * 1e3:12.1f} ms" for s in STAGES))
        out["configurations"][name] = {"n": len(rs), "seconds_per_call": wall, "qps": n / wall,
                                       "walls": [r["wall"] for r in rs],
                                       "stages_s": stages}
    c = out["configurations"]
    out.update({
        "plaintext_engine_qps": c[f"plaintext engine, B={B}"]["qps"],
        "plaintext_engine_latency_s": c["plaintext engine, 1 query"]["seconds_per_call"],
        "crypten_engine_qps": c[f"crypten engine, B={B}"]["qps"],
        "crypten_engine_latency_s": c["crypten engine, 1 query"]["seconds_per_call"],
        "crypten_engine_unsealed_qps": c[f"crypten engine unsealed, B={B}"]["qps"],
        "crypten_engine_unsealed_latency_s": c["crypten engine unsealed, 1 query"]["seconds_per_call"],
        "naive_loop_qps": c[f"naive crypten loop, B={B}"]["qps"],
        "crypten_engine_torch_prg_qps": c[f"crypten engine torch-PRG, B={B}"]["qps"],
        "crypten_engine_torch_prg_latency_s": c["crypten engine torch-PRG, 1 query"]["seconds_per_call"],
    })
    out["crypten_vs_naive"] = out["crypten_engine_qps"] / out["naive_loop_qps"]
    out["sealing_cost_latency_s"] = out["crypten_engine_latency_s"] - out["crypten_engine_unsealed_latency_s"]
    out["sealing_cost_per_query_batch_s"] = 1 / out["crypten_engine_qps"] - 1 / out["crypten_engine_unsealed_qps"]
    print(f"crypten engine / naive loop at B={B}: {out['crypten_vs_naive']:.1f}x; sealing costs "
          f"{out['sealing_cost_latency_s'] * 1e3:+.1f} ms per single query and "
          f"{out['sealing_cost_per_query_batch_s'] * 1e3:+.2f} ms per query at B={B}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


def _rm_nothing(self, q):
    return 1


def _rm_by_value(self, q):
    return self.candidates(q, "topk")


def _rm_put(self, q):
    import ray

    return [ray.put(p) for p in self.candidates(q, "topk")]


def _rm_put_tiny(self, q):
    import ray

    return [ray.put(b"x" * 100) for _ in range(2)]


def ray_micro(a, data, qs, owns):
    """Where one query's host round goes: Ray calls on the engine's own hosts, medians, 1 and all hosts."""
    import ray

    from fedmem.federation.sharing import new_run_id

    fed = federation("plaintext", data, a.seed + 2)
    load0 = os.getloadavg()
    try:
        hosts, q1 = fed.engine.hosts, fed.engine.queries(qs[:1])
        keys = fed.parties.public_keys or None
        n = max(a.repeats, 5)
        calls = {
            "trivial actor call (returns 1)": lambda hs: [h.__ray_call__.remote(_rm_nothing, q1) for h in hs],
            "host step, packets returned by value": lambda hs: [h.__ray_call__.remote(_rm_by_value, q1) for h in hs],
            "host step, packets ray.put, refs returned": lambda hs: [h.__ray_call__.remote(_rm_put, q1) for h in hs],
            "two 100-byte ray.puts, refs returned": lambda hs: [h.__ray_call__.remote(_rm_put_tiny, q1) for h in hs],
            "candidates_refs, sealed (the engine's call)": lambda hs: [
                h.candidates_refs.remote(q1, "topk", keys, new_run_id()) for h in hs],
        }
        times = {(name, k): [] for name in calls for k in (1, len(hosts))}
        # blocks of 7 calls of one kind, blocks interleaved; the first call of a block is not
        # counted (it also pays for freeing the previous block's objects)
        for rep in range(n + 1):
            for name, fn in calls.items():
                for k in (1, len(hosts)):
                    for j in range(7):
                        t0 = time.perf_counter()
                        ray.get(fn(hosts[:k]))
                        if rep >= 1 and j >= 1:
                            times[(name, k)].append(time.perf_counter() - t0)
    finally:
        fed.close()
        if owns:
            ray.shutdown()
    print(f"one query's host round, Ray calls on the engine's {len(hosts)} hosts, median of {n * 6} (blocks of 6 "
          f"back-to-back calls, interleaved); "
          f"load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    for name in calls:
        print(f"  {name:45s} " + "  ".join(f"{k} host{'s' if k > 1 else ''} "
                                              f"{statistics.median(times[(name, k)]) * 1e3:6.2f} ms"
                                              for k in (1, len(hosts))))
    return times


def seal_micro(a):
    """Seal and open one host's packet for one party (20 shards x 5, d = 128), interleaved, medians."""
    from fedmem.federation.sharing import AEADS, PartyKey, new_run_id, seal_packet, share_candidates

    rng = np.random.default_rng(a.seed)
    load0 = os.getloadavg()
    times = {}
    packets = {}
    for B in (1, a.batch):
        packets[B] = share_candidates(rng.uniform(-1, 1, (B, 20, 5)), rng.normal(size=(B, 20, 5, 128)) * 0.01,
                                      np.ones((B, 20, 5)), np.arange(20), 2, rng)[0]
    key = PartyKey()
    for _ in range(a.repeats):
        for B, pk in packets.items():
            for aead in AEADS:
                rid = new_run_id()
                t0 = time.perf_counter()
                sealed = seal_packet(pk, key.public, rid, 0, aead=aead)
                t1 = time.perf_counter()
                opened = key.open(sealed, rid, 0)
                times.setdefault((B, aead), []).append((t1 - t0, time.perf_counter() - t1))
                del sealed, opened   # freed outside the timed region
    print(f"seal/open one packet (20 shards x 5, d=128), median of {a.repeats}; load {load0[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    for (B, aead), v in times.items():
        mb = packets[B].values.nbytes * (1 + 2 / 128) / 1e6
        print(f"  B={B:4d} {aead:18s} {mb:6.2f} MB  seal {statistics.median(x[0] for x in v) * 1e3:7.2f} ms  "
              f"open {statistics.median(x[1] for x in v) * 1e3:7.2f} ms")
    return times


def fit_impl(a, data, qs, owns):
    """Protocol seconds (inside the parties) of every top-k method at several B, interleaved;
    least-squares fit of seconds per round and per comparison (mpc.networks.fit_cost_model)."""
    import ray

    from fedmem.federation.mpc.networks import (
        COMPARISON_S,
        CONSTANT_ROUNDS_MAX,
        ROUND_S,
        fit_cost_model,
        impl_costs,
        switch_batch,
    )
    from fedmem.federation.sharing import SelectionSpec

    fed = federation("crypten", data, a.seed + 3)
    load0 = os.getloadavg()
    grid = [("rank", 1), ("grouped", 1), ("grouped", 10), ("grouped", 50), ("grouped", 100), ("merge", 1),
            ("merge", 50), ("merge", 100)]
    spec = SelectionSpec("topk", k=fed.config.k)
    times = {g: [] for g in grid}
    try:
        packs = {B: fed.engine.packets(fed.engine.queries(qs[:B]), "topk") for B in sorted({B for _, B in grid})}
        for impl, B in grid:   # warm-up
            fed.parties.run(packs[B], spec, impl=impl)
        for _ in range(a.repeats):
            for impl, B in grid:
                times[impl, B].append(fed.parties.run(packs[B], spec, impl=impl).stats["party_seconds"])
    finally:
        fed.close()
        if owns:
            ray.shutdown()
    load1 = os.getloadavg()
    points = [(impl, B, statistics.median(times[impl, B])) for impl, B in grid]
    r, c = fit_cost_model(points)
    costs = impl_costs(40, 5, 5)
    print(f"protocol seconds (median of {a.repeats}, inside the parties), engine configuration; load "
          f"{load0[0]:.2f} -> {load1[0]:.2f}")
    for impl, B, t in points:
        pred = r * costs[impl][0] + c * B * costs[impl][1]
        print(f"  {impl:8s} B={B:4d}  {t:8.4f} s   model {pred:8.4f} s")
    # where choose_impl's rule would switch to merge with THIS machine's fitted constants
    def picks(B):
        ok = {n: r * rc + c * B * cc for n, (rc, cc) in costs.items() if n == "merge" or B * cc <= CONSTANT_ROUNDS_MAX}
        return min(ok, key=lambda n: (ok[n], n != "grouped"))

    fitted_switch = next((B for B in range(1, 4097) if picks(B) == "merge"), None)
    print(f"fit: ROUND_S = {r:.3g} s, COMPARISON_S = {c:.3g} s  (in the code: {ROUND_S:.3g}, {COMPARISON_S:.3g}; "
          f"switch to merge from B = {switch_batch(40, 5, 5)} with the code's constants, from B = {fitted_switch} "
          f"with these)")
    print("FIT_POINTS = " + repr([(i, B, round(t, 4)) for i, B, t in points]))
    return {"points": points, "round_s": r, "comparison_s": c, "fitted_switch": fitted_switch}


def _torch_prg(fed: Federation, q):
    """The previous triple generator (torch.randint, drawn on demand): the before."""
    import ray

    ray.get([a.configure.remote(prg="torch") for a in fed.parties.actors])
    try:
        return timed_call(fed, q)
    finally:
        ray.get([a.configure.remote(prg="aes") for a in fed.parties.actors])


def _unsealed(fed: Federation, q):
    fed.engine.seal = False
    try:
        return timed_call(fed, q)
    finally:
        fed.engine.seal = True


if __name__ == "__main__":
    main()
