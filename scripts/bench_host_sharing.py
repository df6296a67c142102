"""One shard host's step and its parties' opening, before and after seed-compressed shares, side by side.

The engine's configuration (``FederationConfig`` defaults: 40 shards x 50 records split over 2
hosts, so one host holds 20 shards; k' = 5, d = 128, 2 parties, packets sealed), one host, in
this process, both paths interleaved (A B A B ...), medians over ``--repeats``:

* **full shares** (the path before): ``local_candidates`` (clip and gather float values per
  query), ``share_candidates`` (every party's share drawn from the host's generator, full
  size), both packets sealed and pickled as Ray would store them (protocol 5, out-of-band
  buffers), then each party unpickles and opens its packet;
* **seeded** (what ships): ``encoded_candidates`` (values clipped and encoded once per record
  at load; a query gathers ring elements), ``share_encoded_seeded`` (party 0 gets a 32-byte
  seed, its share is the seed's AES-256-CTR keystream; party 1 the difference), both sealed
  and pickled, then opened (party 0 expands its seed).

Both paths start from the same scores (the hosts' BLAS product, ``_local_top``), so the
comparison does not include the scoring change that came with them. The output shows host
and party milliseconds, bytes that travel, and the ratio. Nothing is asserted::

    .venv/bin/python scripts/bench_host_sharing.py --repeats 9
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedmem.bench.shards import make_clustered_shards, sample_queries  # noqa: E402
from fedmem.federation.config import FederationConfig  # noqa: E402
from fedmem.federation.shard_host import (  # noqa: E402
    ShardHostCore, encoded_candidates, local_candidates, split_shards,
)
from fedmem.federation.sharing import (  # noqa: E402
    PartyKey, new_run_id, seal_packet, share_candidates, share_encoded_seeded,
)


def _ship(packets, keys, run_id):
    """Seal every packet to its party and serialise it as Ray's object store would: (blobs, bytes)."""
    blobs = []
    for r, (p, k) in enumerate(zip(packets, keys)):
        bufs = []
        head = pickle.dumps(seal_packet(p, k.public, run_id, r), protocol=5, buffer_callback=bufs.append)
        blobs.append((head, [b.raw() for b in bufs]))
    return blobs, sum(len(h) + sum(b.nbytes for b in bs) for h, bs in blobs)


def _open(blobs, keys, run_id):
    return [k.open(pickle.loads(h, buffers=bs), run_id, r) for r, ((h, bs), k) in enumerate(zip(blobs, keys))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    cfg = FederationConfig()
    data = make_clustered_shards(cfg.shards, cfg.records_per_shard, cfg.key_dim, cfg.value_dim, cfg.clip,
                                 np.random.default_rng(a.seed), clusters=8)
    ids = split_shards(cfg.shards, cfg.hosts)[0]
    host = ShardHostCore(ids, [data.keys[i] for i in ids], [data.values[i] for i in ids], clip=cfg.clip,
                         k_local=cfg.k_local, n_parties=2, seed=a.seed)
    # the float values the path before kept (the host now keeps only their encoding)
    values = [np.asarray(data.values[i], dtype=np.float64) for i in ids]
    from fedmem.federation.shard_host import stack_shards

    K, Vv, M = stack_shards([data.keys[i] for i in ids], values)
    keys = [PartyKey(), PartyKey()]
    rng = np.random.default_rng(a.seed + 1)

    def full(q, run_id):
        t0 = time.perf_counter()
        s, v, ok = local_candidates(q, K, Vv, M, cfg.k_local, cfg.clip, "topk")
        blobs, nbytes = _ship(share_candidates(s, v, ok, host.shard_ids, 2, rng), keys, run_id)
        t1 = time.perf_counter()
        got = _open(blobs, keys, run_id)
        return t1 - t0, time.perf_counter() - t1, nbytes, got

    def seeded(q, run_id):
        t0 = time.perf_counter()
        s, v, ok = encoded_candidates(q, host.K, host.Venc, host.M, cfg.k_local, "topk")
        blobs, nbytes = _ship(share_encoded_seeded(s, v, ok, host.shard_ids, 2, rng), keys, run_id)
        t1 = time.perf_counter()
        got = _open(blobs, keys, run_id)
        return t1 - t0, time.perf_counter() - t1, nbytes, got

    print(f"one shard host of the engine's configuration ({len(ids)} shards x {cfg.records_per_shard} records, "
          f"k'={cfg.k_local}, d={cfg.value_dim}), 2 parties, sealed; load average {os.getloadavg()[0]:.2f}; "
          f"medians of {a.repeats} interleaved repeats")
    print(f"{'B':>4s} {'path':14s} {'host ms':>9s} {'parties ms':>11s} {'total ms':>9s} {'MB shipped':>11s}")
    for B in sorted({1, a.batch}):
        q = sample_queries(data, B, np.random.default_rng(a.seed + 2))
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        runs = {"full shares": [], "seeded": []}
        for rep in range(a.repeats + 1):      # the first round is a warm-up, not counted
            for name, fn in (("full shares", full), ("seeded", seeded)):
                rid = new_run_id()
                h, p, nb, got = fn(q, rid)
                if rep:
                    runs[name].append((h, p, nb))
                if name == "seeded" and rep == 0:   # the two paths share the same secrets
                    from fedmem.federation.sharing import reconstruct

                    ref = full(q, rid)[3]
                    for f in ("scores", "values", "valid"):
                        if not np.array_equal(reconstruct([getattr(x, f) for x in got]),
                                              reconstruct([getattr(x, f) for x in ref])):
                            raise SystemExit(f"MISMATCH: the two paths share different {f}")
        med = {n: [statistics.median(r[i] for r in rs) for i in range(3)] for n, rs in runs.items()}
        for name, (h, p, nb) in med.items():
            print(f"{B:4d} {name:14s} {h * 1e3:9.2f} {p * 1e3:11.2f} {(h + p) * 1e3:9.2f} {nb / 1e6:11.2f}")
        f, s = med["full shares"], med["seeded"]
        print(f"{B:4d} ratio full / seeded: host {f[0] / s[0]:.2f}x, parties {f[1] / s[1]:.2f}x, "
              f"total {(f[0] + f[1]) / (s[0] + s[1]):.2f}x, bytes {f[2] / s[2]:.2f}x")


if __name__ == "__main__":
    main()
