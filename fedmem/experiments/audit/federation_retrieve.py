"""``federation.retrieve``: one whole federated retrieval (Ray shard hosts, plaintext parties,
the gateway) with many canaries, and a half-noise federation.
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedmem.attacks import tight as T

from .book import Book
from fedmem.federation.config import FederationConfig


def canary_federation_data(m: int, clip: float, included: np.ndarray, key_dim: int = 4):
    """m shards, one per canary: a victim record (key -e_1, value -C e_i) always, and the
    canary (key e_1, value +C e_i) when ``included[i]``. With k' = 1 and broadcast
    selection the canary, when present, displaces its victim: coordinate i of the sum
    moves by 2C, the booked L2 sensitivity (the worst case of the add/remove adjacency)."""
    from fedmem.bench.shards import ShardData  # lazy: ~30 ms, no heavy package

    e1 = np.zeros(key_dim)
    e1[0] = 1.0
    keys, values = [], []
    for i in range(m):
        vic = np.zeros(m)
        vic[i] = -clip
        ks, vs = [-e1], [vic]
        if included[i]:
            ks.append(e1)
            vs.append(-vic)
        keys.append(np.array(ks))
        values.append(np.array(vs))
    return ShardData(keys=keys, values=values, centers=e1[None, :], clip=clip)


def _retrieve_scores(cfg, ctx, sigma: float, retrievals: int, tag: str, parties=None):
    from fedmem.dp import Accountant  # lazy: loads dp_accounting (~190 ms)
    from fedmem.federation.engine import Federation  # lazy: loads dp_accounting (~350 ms)

    F, a = cfg.federation, cfg.aggregator
    m = F.canaries
    rng = ctx.rng("federation", tag)
    included = rng.random(m) < 0.5
    data = canary_federation_data(m, a.clip, included)
    conf = FederationConfig(shards=m, records_per_shard=2, key_dim=4, value_dim=m, clip=a.clip, k_local=1,
                            selection="broadcast", receipts="broadcast", mpc="plaintext", noise="gaussian",
                            sigma=sigma, delta=cfg.audit.delta, sampling=a.sampling, hosts=1,
                            epsilon_budget=math.inf, total_epsilon_budget=math.inf)
    acc = Accountant("rdp")
    q = np.zeros(4)
    q[0] = 1.0
    scores = []
    with Federation(conf, data, accountant=acc, rng=ctx.rng("engine", tag), ray_address=ctx.ray_address,
                    parties=parties) as fed:
        left = retrievals
        while left > 0:
            b = min(left, conf.max_batch, 32)
            for r in fed.retrieve_many(np.tile(q, (b, 1))):
                if isinstance(r, Exception):
                    raise r
                scores.append(np.asarray(r.value) * m)     # the released mean times the public count
            left -= b
        booked_event = fed.policy.plan().event()
    return np.array(scores), included, booked_event


def audit_federation(cfg, ctx, book: Book):
    from fedmem.dp import GaussianMechanism  # lazy: loads dp_accounting (~190 ms)

    A, F = cfg.audit, cfg.federation
    sigma = GaussianMechanism.calibrate(F.epsilon, A.delta).noise_multiplier
    for broken, mult, n in ((None, sigma, F.retrievals), ("half_noise", sigma / 2, F.broken_retrievals)):
        t0 = time.perf_counter()
        scores, inc, _ = _retrieve_scores(cfg, ctx, mult, n, broken or "correct")
        booked = GaussianMechanism.from_noise_multiplier(sigma).epsilon(A.delta)   # the claim of the declared sigma
        one = T.one_run_audit(scores[0], inc, delta=A.delta, alpha=book.alpha,
                              guesses=tuple((k, k) for k in (10, 30, 100, 300) if 2 * k <= inc.size))
        pos = scores[:, inc].ravel()
        neg = scores[:, ~inc].ravel()
        name = "federation.retrieve" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=A.delta, family="gaussian",
                 eps_pair=GaussianMechanism.from_noise_multiplier(mult).epsilon(A.delta), broken=broken,
                 rng=ctx.rng("estimate", name), extra=[one], seconds=time.perf_counter() - t0,
                 note=f"{inc.size} canaries x {n} retrievals (one_run: the first retrieval alone), "
                      f"sigma={mult:.4g}, broadcast selection, plaintext parties")
