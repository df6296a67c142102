"""The ``"ray"`` engine column of ``flower.support_leak``: fedmem's own Ray + CrypTen federation.

Same shards (:func:`fedmem.flower.apps.build_world`), same reconstruction queries, same
membership candidate (the same record on the same shard, :func:`fedmem.bench.shards.with_record`)
as the Flower deployments, run through :class:`fedmem.federation.Federation` in this process
with ``selection = "threshold"`` (each shard's local top-k' kept if its cosine is >=
``threshold``: the same selection the Flower ClientApps make locally). Two configurations,
as in ``federation.support_leak``:

* ``undefended``: ``receipts = "expose"``, ``gateway = false`` (papers/003's setting with
  realized calibration): the querying agent reads the exact per-shard receipts;
* ``defended``: ``receipts = "noised"`` (Gaussian, ``receipt_sigma``), gateway on: the
  receipts and the value are DP releases booked before they are returned.

The adversary is the querying agent (``Federation.connect()``, the public client API):
(a) cardinality reconstruction from one principal's answers
(:func:`fedmem.attacks.support.reconstruct_cardinality`), (b) differencing membership
(:func:`fedmem.attacks.support.differencing_score` against a reference answer of the world
without the record, every trial from a fresh principal, the epsilon booked for it read from
the federation's accountant, as in ``federation.support_leak``'s games). Budgets are
lifted for the audit (public refusals only help the adversary).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from fedmem._ray import ensure_ray
from fedmem.bench.shards import with_record
from fedmem.errors import SupportPrivacyViolation

CONFIGS = ("undefended", "defended")


def repeat_with_fresh_principals(fed, q, trials: int):
    """``trials`` copies of query ``q``, each from its own fresh principal, in one batch.

    Returns (responses or refusals, ``(epsilon, mu)`` the federation booked for each principal;
    ``mu`` the exact GDP parameter when that booking is Gaussian only, else None)."""
    pids = [fed.connect().principal for _ in range(trials)]
    got = fed.retrieve_many(np.repeat(np.asarray(q, dtype=np.float64)[None], trials, axis=0), principal=pids)
    return got, [fed.gateway.principal_booked(p) for p in pids]


def column_config(f, r, variant: str):
    """``FederationConfig`` of one column (``f``: the scenario's ``[federation]``, ``r``: ``[ray_engine]``)."""
    from fedmem.federation.engine import FederationConfig  # lazy: loads dp_accounting (~240 ms)

    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {CONFIGS}. Found {variant!r}.")
    base = dict(shards=f.shards, records_per_shard=f.records_per_shard, key_dim=f.key_dim,
                value_dim=f.value_dim, clip=f.clip, k_local=f.k_local, selection="threshold", k=f.k_local,
                threshold=f.threshold, parties=2, mpc=r.mpc, noise="gaussian", sigma=f.sigma, delta=f.delta,
                calibration="realized", hosts=min(r.hosts, f.shards), epsilon_budget=math.inf,
                total_epsilon_budget=math.inf, support_budget_bits=math.inf, total_support_budget_bits=math.inf,
                timeout_s=120.0)
    if variant == "undefended":
        return FederationConfig(**base, receipts="expose", gateway=False, on_reject="raise")
    return FederationConfig(**base, receipts="noised", receipt_sigma=r.receipt_sigma, gateway=True,
                            on_reject="raise")


def run_ray_engine(f, r, data, targets, queries, repeats: int, *, rng_for, ray_address=None, log=print) -> dict:
    """Run both columns; returns per variant the reconstruction estimates and truths, the
    membership scores and the epsilon booked per trial, and timing.

    ``rng_for(*names)``: the run's named generators (``ctx.rng``).
    """
    from fedmem.attacks.support import differencing_score, reconstruct_cardinality, true_cardinality  # lazy: loads sklearn, scipy, numpy (~2.6 s)
    from fedmem.dp import Accountant  # lazy: loads dp_accounting (~140 ms)
    from fedmem.federation import mpc  # lazy: ~120 ms, no heavy package
    from fedmem.federation.engine import Federation  # lazy: loads dp_accounting (~240 ms)

    owns = ensure_ray(ray_address, num_cpus=f.num_cpus)
    parties = None
    out: dict = {}
    try:
        t0 = time.perf_counter()
        parties = (mpc.PlaintextParties(2) if r.mpc == "plaintext"
                   else mpc.CryptenParties(2, timeout_s=120.0, placement="pack" if owns else "auto"))
        out["startup_s"] = time.perf_counter() - t0
        qs = np.asarray(queries, dtype=np.float64)
        for variant in CONFIGS:
            t0 = time.perf_counter()
            config = column_config(f, r, variant)
            res = {"estimates": [], "truths": [], "channels": [], "pos": [], "neg": [], "booked": [], "mu": [],
                   "answered": 0, "refused": 0}
            fed = Federation(config, data, accountant=Accountant("rdp"), rng=rng_for("ray", variant, "recon"),
                             parties=parties)
            try:
                client = fed.connect()
                got = client.retrieve_many(qs)
                truths = fed.ground_truth_many(qs)
                for resp, tr in zip(got, truths):
                    res["truths"].append(true_cardinality(tr))
                    if isinstance(resp, (SupportPrivacyViolation, Exception)):
                        res["estimates"].append(math.nan)
                        res["channels"].append("refused")
                        res["refused"] += 1
                        continue
                    est, used = reconstruct_cardinality(resp, shards=f.shards, k_local=f.k_local)
                    res["estimates"].append(est)
                    res["channels"].append(used)
                    res["answered"] += 1
                res["recon_epsilon_spent"] = client.epsilon_spent
            finally:
                fed.close()
            for t, tg in enumerate(targets):
                worlds = {"with": with_record(data, tg["shard"], tg["key"], tg["value"]), "without": data}
                feds = {}
                try:
                    for w, wdata in worlds.items():
                        feds[w] = Federation(config, wdata, accountant=Accountant("rdp"),
                                             rng=rng_for("ray", variant, t, w), parties=parties)
                    key = np.asarray(tg["key"], dtype=np.float64)
                    refs, _ = repeat_with_fresh_principals(feds["without"], key, 1)
                    reference = None if isinstance(refs[0], Exception) else refs[0]
                    for w, fed in feds.items():
                        got, booked = repeat_with_fresh_principals(fed, key, repeats)
                        for resp, (e, mu) in zip(got, booked):
                            (res["pos"] if w == "with" else res["neg"]).append(
                                differencing_score(None if isinstance(resp, Exception) else resp, reference,
                                                   tg["shard"]))
                            res["booked"].append(e)
                            res["mu"].append(mu)
                finally:
                    for fed in feds.values():
                        fed.close()
            res["wall_s"] = time.perf_counter() - t0
            log(f"ray engine ({variant}): {res['answered']}/{len(qs)} reconstruction queries answered, "
                f"{len(res['pos']) + len(res['neg'])} membership trials, {res['wall_s']:.1f} s")
            out[variant] = res
    finally:
        if parties is not None:
            parties.close()
        if owns:
            import ray

            if ray.is_initialized():
                ray.shutdown()
    return out


def config_summary(config) -> str:
    d = dataclasses.asdict(config)
    keys = ("selection", "threshold", "receipts", "receipt_sigma", "calibration", "gateway", "mpc", "sigma")
    return ", ".join(f"{k}={d[k]}" for k in keys if not (k == "receipt_sigma" and d["receipts"] != "noised"))
