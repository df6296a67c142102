"""How the secure selection scales with the number of shards (top-k / threshold / broadcast).

For every shard count S in --shards (default 40, 1000, 10000, 100000) and every
selection mode, on pre-shared candidates as fedmem's shard hosts send them (S shards x
k'=5 candidates, d-dim values clipped to norm 1, rows sorted by score, 2 parties, TFP):

* per-query latency: one query, median over --repeats warm runs (wall seconds);
* batched throughput: B queries in one call (B = --batch, capped so that B*S <=
  --batch-cells), median over --batch-repeats;
* CrypTen rounds and bytes (bytes per query for the batch run);
* peak resident memory per process (``ru_maxrss``): the driver (which here plays all
  shard hosts: it makes the shares, puts each party's packet in the object store once and
  drops its copy) and each party (fresh parties for every S, so it is that S's peak); the
  packets' size in the object store (the parties fetch them from there, zero-copy).

Every secure result is checked bit for bit against the plaintext reference on the same
shares. At the smallest S the naive CrypTen loop (k sequential argmaxes) runs side by
side with fedmem's top-k (same process, interleaved repeats) and the ratio is printed.
A log-log fit of single-query latency against S gives each mode's scaling exponent.
Numbers depend on the machine and its load (printed); nothing is asserted.

    .venv/bin/python scripts/bench_scale.py --shards 40 1000 10000 --out /tmp/scale
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedmem.federation.mpc import CryptenParties, PlaintextParties, choose_impl  # noqa: E402
from fedmem.federation.sharing import SelectionSpec, SharePacket, share_candidates  # noqa: E402

MODES = ("topk", "threshold", "broadcast")


def make_packets(rng, B, S, m, d, n_parties, mode, chunk=8192):
    """Candidates as hosts send them: per-shard sorted scores, clipped values, broadcast dummies flagged valid.

    Made ``chunk`` shards at a time straight into the final share arrays, so the float
    temporaries never exceed one chunk (100,000 shards: 1 GB of shares, not 3 GB of work)."""
    sc = np.empty((n_parties, B, S, m), dtype=np.int64)
    va = np.empty((n_parties, B, S, m, d), dtype=np.int64)
    ok = np.empty((n_parties, B, S, m), dtype=np.int64)
    for lo in range(0, S, chunk):
        hi = min(S, lo + chunk)
        scores = -np.sort(-rng.uniform(-1, 1, (B, hi - lo, m)), axis=-1)
        values = rng.normal(size=(B, hi - lo, m, d)) / np.sqrt(d)
        values /= np.maximum(1.0, np.linalg.norm(values, axis=-1, keepdims=True))
        valid = np.ones((B, hi - lo, m), dtype=np.int64)
        for p, pk in enumerate(share_candidates(scores, values, valid, np.arange(lo, hi), n_parties, rng)):
            sc[p, :, lo:hi], va[p, :, lo:hi], ok[p, :, lo:hi] = pk.scores, pk.values, pk.valid
        del scores, values, valid
    return [[SharePacket(scores=sc[p], values=va[p], valid=ok[p], shard_ids=np.arange(S, dtype=np.int64))]
            for p in range(n_parties)]


def check(ref, got, what):
    for f in ("sum", "count", "tallies"):
        if not np.array_equal(getattr(ref, f), getattr(got, f)):
            raise SystemExit(f"MISMATCH: {what} differs from plaintext in {f!r}")


def rss_self() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def fit_exponent(xs, ys):
    """Slope of log(y) against log(x) (least squares); None with fewer than 2 points."""
    if len(xs) < 2:
        return None
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _put(packets):
    """Each party's packet into the object store once; the parties fetch it themselves (refs nested
    in a list, as the engine passes them), so repeated runs do not re-send the shares."""
    import ray

    return [[ray.put(p[0])] for p in packets]


def _nbytes(packets) -> int:
    return sum(x.scores.nbytes + x.values.nbytes + x.valid.nbytes for p in packets for x in p)


def run_size(a, S, rng, naive: bool):
    """One shard count: all modes (and the naive loop at the smallest S), fresh parties.

    Below --big-shards every mode's packets are made up front and the repeats are
    interleaved across methods (A B C A B C) so that load drift favours none of them. From
    --big-shards on, one mode at a time: its packets are made, put in the object store,
    dropped by the driver, run once, and released before the next mode (peak memory).
    """
    import gc

    import ray

    big = S >= a.big_shards
    if big:   # one timed run each: a single query already takes many seconds there
        a = argparse.Namespace(**{**vars(a), "repeats": 1, "batch_repeats": 1, "naive_repeats": 1})
    B = max(1, min(a.batch, a.batch_cells // S))
    specs = {"topk": SelectionSpec("topk", k=a.k), "threshold": SelectionSpec("threshold", threshold=a.threshold),
             "broadcast": SelectionSpec("broadcast")}
    methods = [(mo, "auto") for mo in MODES] + ([("topk", "argmax")] if naive else [])
    plain = PlaintextParties(2)
    t0 = time.perf_counter()
    cp = CryptenParties(2, timeout_s=3600, start_timeout_s=600, placement=a.placement, threads=a.threads,
                        shards_sorted=True)
    start_s = time.perf_counter() - t0
    single = {m: [] for m in methods}
    batch = {m: [] for m in methods}
    last, store_mb = {}, {}

    def prepare(mo):
        """(refs for B=1, refs for B, plaintext references); the driver keeps no share."""
        one = make_packets(rng, 1, S, a.m, a.dim, 2, mo)
        ref1 = plain.run(one, specs[mo])
        store_mb[mo] = _nbytes(one) / 2**20
        one_refs = _put(one)
        del one
        if B == 1:
            return one_refs, one_refs, ref1, ref1
        many = make_packets(rng, B, S, a.m, a.dim, 2, mo)
        refB = plain.run(many, specs[mo])
        store_mb[mo] += _nbytes(many) / 2**20
        many_refs = _put(many)
        del many
        gc.collect()
        return one_refs, many_refs, ref1, refB

    def timed(mo, impl, packets, ref, bucket, what):
        t = time.perf_counter()
        r = cp.run(packets, specs[mo], impl=impl)
        bucket[mo, impl].append(time.perf_counter() - t)
        check(ref, r, f"S={S} {mo} {impl} {what}")
        return r

    try:
        if not big:
            data = {mo: prepare(mo) for mo in MODES}
            for mo, impl in methods:   # warm-up and correctness
                check(data[mo][2], cp.run(data[mo][0], specs[mo], impl=impl), f"S={S} {mo} {impl}")
            for rep in range(a.repeats):   # interleaved: A B C A B C ...
                for mo, impl in methods:
                    if impl == "argmax" and rep >= a.naive_repeats:
                        continue
                    last[mo, impl, 1] = timed(mo, impl, data[mo][0], data[mo][2], single, "1 query")
            for rep in range(a.batch_repeats if B > 1 else 0):   # B == 1: the batch is the single query
                for mo, impl in methods:
                    if impl == "argmax" and rep >= a.naive_repeats:
                        continue
                    last[mo, impl, B] = timed(mo, impl, data[mo][1], data[mo][3], batch, "batch")
            del data
        else:
            for mo, impl in methods:
                one_refs, many_refs, ref1, refB = prepare(mo)
                last[mo, impl, 1] = timed(mo, impl, one_refs, ref1, single, "1 query")
                if B > 1:
                    last[mo, impl, B] = timed(mo, impl, many_refs, refB, batch, "batch")
                del one_refs, many_refs
                gc.collect()
        if B == 1:
            batch = single
            last.update({(mo, impl, 1): last[mo, impl, 1] for mo, impl in methods})
        party_rss = ray.get([x.peak_rss.remote() for x in cp.actors])
    finally:
        cp.close()
    rows = []
    for mo, impl in methods:
        r1, rB = last[mo, impl, 1], last[mo, impl, B]
        used1 = impl if impl != "auto" else choose_impl(1, S, a.m, a.k, True) if mo == "topk" else mo
        usedB = impl if impl != "auto" else choose_impl(B, S, a.m, a.k, True) if mo == "topk" else mo
        rows.append(dict(shards=S, mode=mo, impl=used1, batch_impl=usedB, batch=B,
                         single_s=statistics.median(single[mo, impl]), single_runs=len(single[mo, impl]),
                         batch_qps=B / statistics.median(batch[mo, impl]), batch_runs=len(batch[mo, impl]),
                         rounds=r1.stats["rounds"], bytes_per_query=r1.stats["bytes"],
                         batch_rounds=rB.stats["rounds"], batch_bytes_per_query=rB.stats["bytes"] / B,
                         party_peak_mb=[x / 2**20 for x in party_rss], driver_peak_mb=rss_self() / 2**20,
                         store_packets_mb=store_mb[mo], parties_start_s=start_s, load=os.getloadavg()[0],
                         single_times=single[mo, impl], batch_times=batch[mo, impl]))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[40, 1000, 10000, 100000])
    ap.add_argument("--m", type=int, default=5, help="candidates per shard (k')")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=100, help="queries per batched call (capped by --batch-cells)")
    ap.add_argument("--batch-cells", type=int, default=40_000, help="cap on batch * shards")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big-shards", type=int, default=50_000,
                    help="from this many shards on, one timed run per measurement (printed as runs)")
    ap.add_argument("--batch-repeats", type=int, default=3)
    ap.add_argument("--naive-repeats", type=int, default=3)
    ap.add_argument("--naive-max-shards", type=int, default=1000,
                    help="run the naive loop at the smallest S only if S <= this (its argmax breaks exact ties "
                         "at random, so with many candidates it no longer matches the reference)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per party")
    ap.add_argument("--placement", default="pack", choices=("auto", "spread", "pack"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="folder for scale.json and scale.png")
    a = ap.parse_args(argv)
    for name in ("m", "k", "dim", "batch", "batch_cells", "repeats", "batch_repeats", "naive_repeats", "threads"):
        if getattr(a, name) < 1:
            raise ValueError(f"{name} must be >= 1. Found {getattr(a, name)!r}.")
    if any(s < 1 for s in a.shards):
        raise ValueError(f"shards must be positive. Found {a.shards!r}.")

    from fedmem._ray import ensure_ray

    ensure_ray(num_cpus=os.cpu_count() or 1)
    rng = np.random.default_rng(a.seed)
    print(f"# shards {a.shards} x {a.m} candidates, d={a.dim}, k={a.k}, threshold={a.threshold}, 2 parties (TFP), "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    rows = []
    for i, S in enumerate(sorted(a.shards)):
        t0 = time.perf_counter()
        rows += run_size(a, S, rng, naive=(i == 0 and S <= a.naive_max_shards))
        print(f"  S={S} done in {time.perf_counter() - t0:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)

    print()
    print(f"{'shards':>7s} {'mode':10s} {'impl':8s} {'1q (s)':>9s} {'runs':>4s} {'B':>4s} {'B impl':8s} "
          f"{'q/s':>8s} {'rounds':>7s} {'KB/q':>9s} {'batch KB/q':>10s} {'parties MB':>11s} {'driver MB':>9s} "
          f"{'store MB':>8s}")
    for r in rows:
        print(f"{r['shards']:7d} {r['mode']:10s} {r['impl']:8s} {r['single_s']:9.4f} {r['single_runs']:4d} "
              f"{r['batch']:4d} {r['batch_impl']:8s} "
              f"{r['batch_qps']:8.1f} {r['rounds']:7d} {r['bytes_per_query'] / 1e3:9.1f} "
              f"{r['batch_bytes_per_query'] / 1e3:10.1f} {'+'.join(f'{x:.0f}' for x in r['party_peak_mb']):>11s} "
              f"{r['driver_peak_mb']:9.0f} {r['store_packets_mb']:8.0f}")
    smallest = min(a.shards)
    nv = next((r for r in rows if r["shards"] == smallest and r["impl"] == "argmax"), None)
    fm = next(r for r in rows if r["shards"] == smallest and r["mode"] == "topk" and r["impl"] != "argmax")
    if nv:
        rng_s = f"[{min(fm['single_times']):.3f}, {max(fm['single_times']):.3f}]"
        rng_b = f"[{B_ / max(fm['batch_times']):.1f}, {B_ / min(fm['batch_times']):.1f}]" \
            if (B_ := fm["batch"]) else ""
        print(f"S={smallest} top-k ranges (min-max over runs): 1 query {rng_s} s, batched {rng_b} q/s")
        print(f"\nS={smallest}: fedmem top-k ({fm['impl']}) {fm['single_s']:.3f} s vs naive loop "
              f"{nv['single_s']:.3f} s "
              f"per query: {nv['single_s'] / fm['single_s']:.1f}x; batched {fm['batch_qps']:.1f} vs "
              f"{nv['batch_qps']:.1f} q/s: {fm['batch_qps'] / nv['batch_qps']:.1f}x (same process, interleaved)")
    fits = {}
    for mo in MODES:
        pts = [(r["shards"], r["single_s"]) for r in rows if r["mode"] == mo and r["impl"] != "argmax"]
        fits[mo] = fit_exponent([p[0] for p in pts], [p[1] for p in pts])
        big = [(s, t) for s, t in pts if s >= 1000]
        fits[mo + "_S>=1000"] = fit_exponent([p[0] for p in big], [p[1] for p in big])
    print("log-log fitted exponent of single-query latency vs shards: " + ", ".join(
        f"{k} {v:.2f}" for k, v in fits.items() if v is not None))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "scale.json"), "w") as fh:
            json.dump({"args": vars(a), "load": os.getloadavg()[0], "cores": os.cpu_count(), "rows": rows,
                       "exponents": fits}, fh, indent=2)
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:  # pragma: no cover - matplotlib is a dependency
            return
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for mo in MODES:
            pts = sorted((r["shards"], r["single_s"]) for r in rows if r["mode"] == mo and r["impl"] != "argmax")
            e = fits[mo]
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o-",
                      label=f"{mo} (slope {e:.2f})" if e is not None else mo)
        if nv:
            ax.loglog([smallest], [nv["single_s"]], "kx", label="naive argmax loop (top-k)")
        ax.set_xlabel("shards (x5 candidates each)")
        ax.set_ylabel("single-query latency (s, median)")
        ax.set_title("fedmem secure selection, 2 CrypTen parties")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "scale.png"), dpi=120)
        print(f"wrote {a.out}/scale.json and scale.png")


if __name__ == "__main__":
    main()
