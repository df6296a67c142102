"""Experiment kind ``flower.support_leak``: papers/003's support attacks on a Flower deployment.

Shards are Flower ClientApps in Flower's simulation engine (``run_simulation``, Ray
backend); one query per round through Flower's message API; local threshold selection
per shard; the value channel (clipped local sums and counts) is summed with SecAgg+
(``SecAggPlusWorkflow`` + ``secaggplus_mod``). Two deployments run side by side:

* **stock Flower**: SecAgg+ and Flower's ``DifferentialPrivacyClientSideFixedClipping``;
  clients follow Flower's convention (``num_examples`` = examples used, a metric with the
  match count). The adversary is the server-side strategy (any ``Strategy`` subclass the
  app author writes sees ``aggregate_fit``'s arguments): reply set, ``num_examples``.
* **Flower + fedmem**: the same with :class:`~fedmem.flower.gateway.SupportGatewayStrategy`
  outside the DP wrapper (``federation.dp = "flower"``) or with fedmem's own noise
  (``"fedmem"``), and the fedmem client contract. Two adversaries: the querying agent
  (sees what the gateway returns) and the server strategy *inside* the gateway (reply
  set and ``num_examples``, now constant).

Attacks (``fedmem.attacks``): (a) cardinality reconstruction (contributing shards) from
the reply set / ``num_examples`` (stock, server view) or from the released noised count;
(b) differencing membership on a candidate record (both neighbouring worlds in one
simulation, selected per round), with the Clopper-Pearson epsilon lower bound against
what was booked for one round.
"""

from __future__ import annotations

import math

import numpy as np

from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, at_least, open_unit, positive

SCHEMA = {
    "federation": {
        "shards": Param(int, 20, "shards = Flower ClientApps (SuperNodes)", check=at_least(3)),
        "records_per_shard": Param(int, 20, "records per shard", check=at_least(1)),
        "key_dim": Param(int, 32, "key dimension", check=at_least(2)),
        "value_dim": Param(int, 16, "value dimension", check=at_least(1)),
        "clip": Param(float, 1.0, "values clipped to L2 norm <= clip", check=positive),
        "k_local": Param(int, 5, "k': local top-k' before the threshold (also the public num_examples)",
                         check=at_least(1)),
        "threshold": Param(float, 0.5, "cosine threshold of the local selection"),
        "dp": Param(str, "fedmem", "central DP of the defended deployment: Flower's wrapper or fedmem's noise",
                    choices=("fedmem", "flower")),
        "sigma": Param(float, 1.2, "fedmem noise multiplier (noise sigma * sensitivity on the sum)", check=positive),
        "flower_sigma": Param(float, 1.2, "Flower DP wrapper noise_multiplier", check=positive),
        "flower_clip": Param(float, 8.0, "Flower DP wrapper clipping_norm (fixedclipping_mod)", check=positive),
        "clipping_range": Param(float, 8.0, "SecAgg+ clipping_range (power of two >= k' * clip)", check=positive),
        "delta": Param(float, 1e-6, "delta of every epsilon", check=open_unit),
        "epsilon_budget": Param(float, math.inf, "gateway epsilon budget of the querying principal", check=positive,
                                allow_inf=True),
        "total_epsilon_budget": Param(float, math.inf, "gateway total epsilon budget", check=positive,
                                      allow_inf=True),
        "num_shares": Param(int, 5, "SecAgg+ num_shares", check=at_least(3)),
        "reconstruction_threshold": Param(int, 3, "SecAgg+ reconstruction_threshold", check=at_least(2)),
        "num_cpus": Param(int, 2, "CPUs of the simulation's private local Ray", check=at_least(1)),
        "client_cpus": Param(float, 0.5, "Ray CPUs per ClientApp actor", check=positive),
        "timeout_s": Param(float, 1800.0, "wall-clock limit of one simulation", check=positive),
    },
    "data": {
        "clusters": Param(int, 8, "topics", check=at_least(1)),
        "spread": Param(float, 0.35, "key spread around a topic centre", check=positive),
    },
    "attack": {
        "queries": Param(int, 30, "reconstruction queries (one round each)", check=at_least(1)),
        "tolerance": Param(int, 2, "a reconstruction is a hit within this many shards", check=at_least(0)),
        "targets": Param(int, 1, "membership candidates", check=at_least(1)),
        "repeats": Param(int, 40, "membership rounds per target and world", check=at_least(4)),
        "alpha": Param(float, 0.05, "confidence of CIs and epsilon lower bounds", check=open_unit),
    },
}


def _cross(cfg):
    f = cfg.federation
    out = []
    if f.k_local > f.records_per_shard:
        out.append(("federation.k_local", f"must be <= records_per_shard ({f.records_per_shard}), found {f.k_local}"))
    if f.k_local * f.clip > f.clipping_range or f.k_local > f.clipping_range:
        out.append(("federation.clipping_range", f"must be >= k_local * clip and >= k_local, found {f.clipping_range}"))
    m, e = math.frexp(f.clipping_range)
    if m != 0.5:
        out.append(("federation.clipping_range", f"must be a power of two, found {f.clipping_range}"))
    if f.reconstruction_threshold >= f.num_shares:
        out.append(("federation.reconstruction_threshold", f"must be < num_shares ({f.num_shares}), found "
                                                           f"{f.reconstruction_threshold}"))
    return out


def _spec(cfg, world, rounds, deployment, ledger, seed):
    f = cfg.federation
    sens = math.sqrt((2 * f.clip) ** 2 + 1.0)   # one record: local top-k' sum by <= 2C, count by <= 1
    return dict(deployment=deployment, dp=f.dp, world=world, shards=f.shards, value_dim=f.value_dim,
                k_local=f.k_local, threshold=f.threshold, clipping_range=f.clipping_range, rounds=rounds,
                flower_sigma=f.flower_sigma, flower_clip=f.flower_clip, sigma=f.sigma, sensitivity=sens,
                ledger=str(ledger), ledger_name=f"flower/{deployment}", epsilon_budget=f.epsilon_budget,
                total_epsilon_budget=f.total_epsilon_budget, delta=f.delta, noise_seed=seed,
                num_shares=f.num_shares, reconstruction_threshold=f.reconstruction_threshold,
                num_cpus=f.num_cpus, client_cpus=f.client_cpus)


def _truths(world, rounds, k_local, threshold, grid, shards):
    from fedmem.flower.apps import client_vector

    out = []
    for r in rounds:
        q = np.asarray(r["query"])
        out.append(sum(int(client_vector(world, i, q, r["world"], r["target"], k_local, threshold, grid)[-1] > 0)
                       for i in range(shards)))
    return out


def run(cfg, ctx) -> Result:
    from fedmem.attacks.observable import verdict
    from fedmem.attacks.support import cardinality_from_count, membership_report, reconstruction_report
    from fedmem.bench.shards import sample_queries
    from fedmem.flower.apps import build_world, world_spec
    from fedmem.flower.fixedpoint import SecAggGrid
    from fedmem.flower.sim import simulate

    f, a = cfg.federation, cfg.attack
    world = world_spec(seed=int(ctx.rng("data").integers(2 ** 31)), shards=f.shards,
                       records_per_shard=f.records_per_shard, key_dim=f.key_dim, value_dim=f.value_dim, clip=f.clip,
                       clusters=cfg.data.clusters, spread=cfg.data.spread, targets=a.targets)
    data, targets = build_world(world)
    grid = SecAggGrid(f.clipping_range)
    qs = sample_queries(data, a.queries, ctx.rng("queries"))
    rounds = [{"query": q.tolist(), "world": 0, "target": -1, "kind": "recon"} for q in qs]
    order = ctx.rng("worlds")
    for t, tg in enumerate(targets):
        worlds = np.r_[np.zeros(a.repeats, int), np.ones(a.repeats, int)]
        order.shuffle(worlds)
        rounds += [{"query": tg["key"].tolist(), "world": int(w), "target": t, "kind": "member"} for w in worlds]
    truths = _truths(world, rounds[: a.queries], f.k_local, f.threshold, grid, f.shards)

    runs = {}
    for dep in ("stock", "gateway"):
        ctx.log(f"flower: simulating {dep} ({len(rounds)} rounds, {f.shards} ClientApps)")
        runs[dep] = simulate(_spec(cfg, world, rounds, dep, ctx.out_dir / "ledger.sqlite",
                                   int(ctx.rng("noise", dep).integers(2 ** 31))), timeout_s=f.timeout_s)

    m = f.shards
    gw = runs["gateway"]["gateway"]
    eps_round = gw["epsilon_per_round"]
    # What stock Flower's DP wrapper would claim per round (client-level adjacency, sensitivity = clipping_norm).
    from fedmem.dp import Accountant
    import dp_accounting

    claim = Accountant("rdp")
    claim.book(dp_accounting.GaussianDpEvent(f.flower_sigma), "flower claim")
    eps_flower_claim = claim.spent(f.delta)

    def views(dep):
        recs = runs[dep]["records"]
        if dep == "stock":
            yield "stock Flower, server strategy (reply set, num_examples)", recs, "server", 0.0
        else:
            yield "Flower + fedmem gateway, querying agent (released aggregate)", recs, "agent", eps_round
            yield "Flower + fedmem gateway, server strategy (reply set, num_examples)", recs, "server", eps_round

    rows, metrics = [], {"epsilon_per_round_booked": eps_round, "flower_claimed_eps_per_round":
                              eps_flower_claim, "wall_s": {k: v["wall_s"] for k, v in runs.items()}}
    mrng = ctx.rng("audit")
    for dep in ("stock", "gateway"):
        for label, recs, who, booked in views(dep):
            est, pos, neg = [], [], []
            answered = 0
            for r, rec in zip(rounds, recs):
                if who == "server":
                    ne = np.asarray(rec.get("num_examples", []), dtype=float)
                    card = float(np.count_nonzero(ne > 0)) if rec.get("replied") else math.nan
                    score = float(ne.sum())
                else:
                    out = rec.get("output")
                    if out is None:
                        card, score = math.nan, -1e9
                    else:
                        answered += 1
                        n_hat = float(out[-1]) * m
                        card = cardinality_from_count(max(n_hat, 0.0), m, f.k_local)
                        score = n_hat
                if r["kind"] == "recon":
                    est.append(card)
                else:
                    (pos if r["world"] == 1 else neg).append(score)
            rec_rep = reconstruction_report(est, truths, a.tolerance, a.alpha)
            mem = membership_report(pos, neg, delta=f.delta, rng=mrng, epsilon_claim=booked if booked > 0
                                    else math.inf, alpha=a.alpha)
            v = verdict(mem.eps_lower, booked, mem.ceiling_violations)
            rows.append([label, f"{rec_rep.rate:.0%} ({rec_rep.chance_rate:.0%})", f"{mem.auc:.3f}",
                         f"[{mem.auc_ci[0]:.3f}, {mem.auc_ci[1]:.3f}]", f"{mem.tpr_at_1:.3f}", f"{mem.eps_lower:.2f}",
                         f"{booked:.2f}" if booked > 0 else "nothing booked", v])
            metrics[label] = {"reconstruction": rec_rep.as_dict(), "membership": mem.as_dict(), "verdict": v,
                              "booked_eps_per_round": booked, "answered": answered if who == "agent" else None}
    audit = gw["audit"]
    decisions = {d: sum(1 for x in audit if x["decision"] == d) for d in ("admitted", "refused", "fault")}
    metrics["gateway_decisions"] = decisions
    metrics["gateway_spent_eps"] = gw["spent"]
    overall = "LEAKS BEYOND BOOKED" if any(r[-1].startswith("LEAKS") for r in rows) else "within booked"
    metrics["verdict"] = overall
    tables = [Table("Stock Flower vs Flower + fedmem gateway (same shards, queries and candidate)",
                    ["deployment / observer", "shards within +-tol (chance)", "differencing AUC", "AUC 95% CI",
                     "TPR@1%FPR", "empirical eps (CP lower)", "booked eps / round", "verdict"], rows,
                    note=f"{len(rounds)} rounds per deployment ({a.queries} reconstruction queries, {a.targets} "
                         f"candidate(s) x {a.repeats} rounds per world), {m} ClientApps, SecAgg+ for the value. "
                         f"Gateway decisions: {decisions}. Stock Flower books nothing; its DP wrapper claims "
                         f"{eps_flower_claim:.2f} per round for client-level adjacency (sigma={f.flower_sigma}). "
                         f"Overall: {overall}.")]
    sections = [("What each observer sees", _explain(f))]
    return Result(metrics=metrics, tables=tables, sections=sections)


def _explain(f) -> str:
    return (
        "Stock Flower: every reply carries `num_examples` (the local match count) and a `matches` metric in "
        "plaintext, and SecAgg+ does not hide them; the server strategy reads the exact support. "
        "Flower + fedmem: clients reply with `num_examples = k'` (public), no metrics, and the count inside the "
        "SecAgg+ sum; the gateway books each admitted round's Gaussian event before the aggregate leaves and "
        "fails closed on any fault. The server process still sees the exact SecAgg+ sum before central noise "
        "is added (Flower 1.42 has no distributed noise for SecAgg+), so the server is trusted for the value; "
        f"the querying agent sees only the noised release (dp = {f.dp!r}).")


EXPERIMENTS = {
    "flower.support_leak": Experiment(
        "flower.support_leak",
        "papers/003 support attacks on Flower (SecAgg+, DP wrapper): stock vs fedmem's gateway strategy.",
        SCHEMA, run, _cross),
}
