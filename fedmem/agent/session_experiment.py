"""``agents.session``: many agents, one federation, four booked boundaries (issue 11).

Each agent (one per user) runs ``agents.tasks`` tasks through
:meth:`fedmem.agent.client.AgentClient.step` (federation -> BRACE -> DP-MemView view for
the app -> DP-MIND to the external model -> local denoising). All ledgers (the
federation's per-principal accountants and every agent's ``agent/<user>/...`` entries)
live in one SQLite file, ``ledger.sqlite`` in the run folder. The report gives per-user
spend per boundary (table and plot), the composed (epsilon, delta) of the (epsilon,
delta)-type boundaries, which boundary dominates, and the booking check of
:func:`fedmem.agent.client.check_bookings` for every agent.

Adversaries at the boundaries and the undefended comparison are not part of this kind
yet (docs/agents.md).
"""

from __future__ import annotations

import time

import numpy as np

from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, open_unit, positive

SCHEMA = {
    "agents": {
        "n": Param(int, 8, "agents (users), one principal each; the issue's target is 100", check=positive),
        "tasks": Param(int, 5, "tasks per agent; the issue's target is 20", check=positive),
        "context_tokens": Param(int, 256, "private long-context length per task (MiniLM tokens, >= 64)",
                                check=lambda v: None if v >= 64 else f"must be >= 64, found {v!r}"),
        "bank_size": Param(int, 64, "BRACE team-bank records per agent", check=lambda v: None if v >= 2
                           else f"must be >= 2, found {v!r}"),
        "bank_dim": Param(int, 2, "BRACE bank dimension", check=positive),
    },
    "federation": {
        "shards": Param(int, 8, "shards", check=positive),
        "records_per_shard": Param(int, 20, "records per shard", check=positive),
        "key_dim": Param(int, 16, "key dimension", check=positive),
        "value_dim": Param(int, 8, "value dimension", check=positive),
        "k": Param(int, 3, "global top-k", check=positive),
        "k_local": Param(int, 2, "candidates per shard", check=positive),
        "mpc": Param(str, "plaintext", "compute parties", choices=("plaintext", "crypten")),
        "sigma": Param(float, 3.0, "noise multiplier of the value release", check=positive),
        "delta": Param(float, 1e-6, "delta of the federation's accounting", check=open_unit),
        "epsilon_budget": Param(float, 10.0, "epsilon per principal at delta", check=positive, allow_inf=True),
        "total_epsilon_budget": Param(float, 10000.0, "epsilon over all principals", check=positive,
                                      allow_inf=True),
        "hosts": Param(int, 1, "shard-host actors", check=positive),
    },
    "memview": {
        "cap": Param(float, 2.0, "B_a per protected attribute (pure epsilon)", check=positive),
        "K": Param(int, 3, "online mode: eps = B_a / K per charged selection", check=positive),
    },
    "brace": {
        "beta": Param(float, 0.5, "inverse temperature (r = sqrt(2/beta))", check=positive),
        "T": Param(int, 3, "horizon", check=positive),
        "epsilon": Param(float, 2.0, "epsilon of one recall", check=positive),
        "delta": Param(float, 1e-6, "delta of one recall", check=open_unit),
        "budget_epsilon": Param(float, 20.0, "user's BRACE budget epsilon", check=positive),
        "budget_delta": Param(float, 1e-5, "user's BRACE budget delta", check=open_unit),
    },
    "dpmind": {
        "epsilon": Param(float, 100.0, "metric-DP epsilon per token (L2, MiniLM rows)", check=positive),
        "chunk_tokens": Param(int, 128, "tokens per perturbed chunk", check=positive),
    },
    "report": {
        "delta": Param(float, 1e-5, "delta at which the composed epsilon is reported", check=open_unit),
    },
}


def _fed_config(cfg):
    from fedmem.federation.engine import FederationConfig

    f = cfg.federation
    return FederationConfig(shards=f.shards, records_per_shard=f.records_per_shard, key_dim=f.key_dim,
                            value_dim=f.value_dim, k=f.k, k_local=f.k_local, mpc=f.mpc, sigma=f.sigma,
                            delta=f.delta, epsilon_budget=f.epsilon_budget,
                            total_epsilon_budget=f.total_epsilon_budget, hosts=f.hosts)


def _agent_config(cfg):
    from fedmem.agent.client import AgentConfig

    b = cfg.brace
    return AgentConfig(memview_cap=cfg.memview.cap, memview_K=cfg.memview.K, brace_beta=b.beta, brace_T=b.T,
                       brace_epsilon=b.epsilon, brace_delta=b.delta, brace_budget_epsilon=b.budget_epsilon,
                       brace_budget_delta=b.budget_delta, dpmind_epsilon=cfg.dpmind.epsilon,
                       dpmind_chunk_tokens=cfg.dpmind.chunk_tokens)


def run(cfg, ctx) -> Result:
    from fedmem.agent.client import check_bookings, default_perturber
    from fedmem.agent.session import build_agents, make_world, run_session
    from fedmem.bench.shards import make_clustered_shards
    from fedmem.dp import Accountant, DurableStore
    from fedmem.federation.engine import Federation
    from fedmem._ray import ensure_ray

    fcfg, acfg = _fed_config(cfg), _agent_config(cfg)
    a = cfg.agents
    timings = {}
    t0 = time.perf_counter()
    perturber, codec = default_perturber(acfg.dpmind_epsilon)
    data = make_clustered_shards(fcfg.shards, fcfg.records_per_shard, fcfg.key_dim, fcfg.value_dim, fcfg.clip,
                                 ctx.rng("data"), clusters=4)
    worlds = make_world(a.n, a.tasks, data, ctx.rng("world"), codec=codec, context_tokens=a.context_tokens,
                        bank_size=a.bank_size, bank_dim=a.bank_dim)
    timings["setup_s"] = time.perf_counter() - t0
    store = DurableStore(ctx.out_dir / "ledger.sqlite")
    opts = cfg.get("ray", {})
    owns_ray = ensure_ray(ctx.ray_address, num_cpus=opts.get("num_cpus") or None,
                          object_store_mb=opts.get("object_store_mb") or None)
    try:
        t1 = time.perf_counter()
        with Federation(fcfg, data, accountant=Accountant("rdp", store=store, name="federation"),
                        rng=ctx.rng("federation"), ray_address=ctx.ray_address) as fed:
            agents = build_agents(worlds, fed, store, acfg, ctx.rng("agents"), perturber=perturber, codec=codec)
            results = run_session(agents, worlds)
            timings["session_s"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            spends = [ag.spend() for ag in agents]
            composed = [ag.ledger.composed(cfg.report.delta) for ag in agents]
            checks = [check_bookings(ag, w.tasks, rng=ctx.rng("check", i)) for i, (ag, w) in
                      enumerate(zip(agents, worlds))]
            timings["check_s"] = time.perf_counter() - t2
    finally:
        if owns_ray:
            import ray

            ray.shutdown()

    rows, dom_counts = [], {}
    for s, c, res in zip(spends, composed, results):
        parts = {"federation": s["federation"]["epsilon"], "brace": s["brace"]["epsilon"],
                 "memview": s["memview"]["max_epsilon"]}
        dom = max(parts, key=parts.get)
        dom_counts[dom] = dom_counts.get(dom, 0) + 1
        refused = sum(r.federation_refused for r in res)
        correct = [r.correct for r in res if r.correct is not None]
        rows.append([s["user"], s["principal"], s["federation"]["epsilon"], s["federation"]["releases"], refused,
                     s["memview"]["max_epsilon"], s["memview"]["charges"], s["brace"]["epsilon"],
                     s["brace"]["releases"], s["dpmind"]["epsilon_per_token"], s["dpmind"]["contexts"],
                     c["epsilon"], dom, f"{sum(correct)}/{len(correct)}"])
    problems = {s["user"]: {b: p for b, p in ch.items() if p} for s, ch in zip(spends, checks)}
    problems = {u: p for u, p in problems.items() if p}
    eps = np.array([[r[2], r[5], r[7]] for r in rows], dtype=float)
    _plot(ctx, [r[0] for r in rows], eps, [r[11] for r in rows])
    metrics = {
        "agents": a.n, "tasks": a.tasks, "timings": timings,
        "mean_epsilon": {"federation": float(eps[:, 0].mean()), "memview_max_attribute": float(eps[:, 1].mean()),
                         "brace": float(eps[:, 2].mean()), "composed": float(np.mean([c["epsilon"] for c in composed]))},
        "delta": {"federation": fcfg.delta, "brace": acfg.brace_budget_delta, "composed": cfg.report.delta},
        "dpmind_epsilon_per_token": acfg.dpmind_epsilon,
        "dominant_boundary": dom_counts,
        "federation_refusals": int(sum(r[4] for r in rows)),
        "booking_check_ok": not problems, "booking_problems": problems,
        "per_user": spends,
    }
    note = (f"federation epsilon at delta={fcfg.delta} (read from each principal's accountant); BRACE epsilon at "
            f"delta={acfg.brace_budget_delta}; DP-MemView: largest per-attribute pure epsilon (caps {acfg.memview_cap}); "
            f"DP-MIND: metric-DP epsilon per token per context (recorded, not composed); composed = federation + "
            f"BRACE + largest DP-MemView attribute by dp-accounting RDP at delta={cfg.report.delta}, an upper bound "
            f"for one individual whose data reached all three boundaries. dominant = largest of the three epsilons.")
    table = Table("Per-user spend per boundary (every release booked before it left)",
                  ["user", "principal", "fed eps", "fed releases", "fed refusals", "memview max eps",
                   "memview charges", "BRACE eps", "BRACE recalls", "DP-MIND eps/token", "DP-MIND contexts",
                   "composed eps", "dominant", "DP-MIND answers correct"], rows, note=note)
    chk = Table("Booking check (what left vs what was booked, per boundary)", ["boundary", "agents with problems"],
                [[b, sum(1 for p in problems.values() if b in p)] for b in ("federation", "memview", "brace",
                                                                               "dpmind")],
                note="fedmem.agent.client.check_bookings on every agent")
    return Result(metrics=metrics, tables=[table, chk])


def _plot(ctx, users, eps, composed):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(users))
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(users) + 2), 3.8))
    w = 0.22
    for j, (name, col) in enumerate((("federation", "C0"), ("DP-MemView (max attr.)", "C1"), ("BRACE", "C2"))):
        ax.bar(x + (j - 1) * w, eps[:, j], w, label=name, color=col)
    ax.plot(x, composed, "k_", markersize=12, label="composed (RDP)")
    ax.set_xticks(x)
    ax.set_xticklabels(users, rotation=90 if len(users) > 20 else 0, fontsize=7)
    ax.set_ylabel("epsilon spent")
    ax.set_title("Per-user spend per boundary")
    ax.legend(fontsize=7)
    fig.tight_layout()
    ctx.save_figure(fig, "agents_spend.png", "per-user epsilon per (eps, delta)-type boundary and composed")
    plt.close(fig)


def cross_checks(cfg) -> list[tuple[str, str]]:
    problems = []
    f = cfg.federation
    if f.k_local > f.records_per_shard:
        problems.append(("federation.k_local", f"must be <= federation.records_per_shard ({f.records_per_shard}), "
                                               f"found {f.k_local!r}"))
    if f.k > f.shards * f.k_local:
        problems.append(("federation.k", f"must be <= shards * k_local = {f.shards * f.k_local}, found {f.k!r}"))
    if f.hosts > f.shards:
        problems.append(("federation.hosts", f"must be <= federation.shards ({f.shards}), found {f.hosts!r}"))
    if cfg.brace.delta > cfg.brace.budget_delta:
        problems.append(("brace.delta", f"must be <= brace.budget_delta ({cfg.brace.budget_delta}), "
                                        f"found {cfg.brace.delta!r}"))
    return problems


EXPERIMENTS = {
    "agents.session": Experiment(
        kind="agents.session",
        description="Many AgentClients (federation + DP-MemView + BRACE + DP-MIND) against one federation: "
                    "per-user spend per boundary, composed (eps, delta), booking check",
        schema=SCHEMA, run=run, cross_checks=cross_checks),
}
