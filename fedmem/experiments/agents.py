"""``agents.session``: many agents, one federation, four booked boundaries.

Each agent (one per user) runs ``agents.tasks`` tasks through
:meth:`fedmem.agent.client.AgentClient.step` (federation -> BRACE -> DP-MemView view for
the app -> DP-MIND to the external model -> local denoising). The report gives per-user
spend per boundary (table and plot), the composed (epsilon, delta) of the (epsilon,
delta)-type boundaries, which boundary dominates, and the booking check of
:func:`fedmem.agent.client.check_bookings` for every agent.

Each agent is a Ray actor (:class:`fedmem.agent.actors.AgentHost`) with its own ledger
file (``ledgers/<user>.sqlite``); the federation runs in a service actor and books into
``federation.sqlite``. After the session, :mod:`fedmem.attacks.agent_boundaries` plays a
distinguishing game at every boundary (third-party app, external model provider,
curious peer agent, aggregator) against this agent and against an undefended agent (raw
memory, no gateway, clean context) on the same tasks and seeds.
"""

from __future__ import annotations

import time

import numpy as np

from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, open_unit, positive
from fedmem import figures as F
from fedmem._ray import ensure_ray
from fedmem.agent.federation_service import start_federation_service
from fedmem.attacks import agent_boundaries as adv
from fedmem.bench.shards import make_clustered_shards, without_record

SCHEMA = {
    "agents": {
        "n": Param(int, 100, "agents (users), one process and one principal each", check=positive),
        "mode": Param(str, "isolated", "isolated: each agent an OS process outside Ray (own uid and network "
                      "namespace when run as root), reaching the federation only through a narrow RPC; cluster: "
                      "agents as Ray actors (boundaries simulated: Ray confines nothing)",
                      choices=("isolated", "cluster")),
        "tasks": Param(int, 20, "tasks per agent", check=positive),
        "context_tokens": Param(int, 256, "private long-context length per task (MiniLM tokens, >= 64)",
                                check=lambda v: None if v >= 64 else f"must be >= 64, found {v!r}"),
        "bank_size": Param(int, 64, "BRACE team-bank records per agent", check=lambda v: None if v >= 2
                           else f"must be >= 2, found {v!r}"),
        "bank_dim": Param(int, 2, "BRACE bank dimension", check=positive),
        "actor_cpus": Param(float, 0.01, "Ray num_cpus per agent actor (small: 100 agents share 2 cores)",
                            check=positive),
        "projectors": Param(int, 2, "shared nearest-token services (noisy embeddings only); agents round-robin",
                            check=positive),
        "check_contexts": Param(int, 2, "DP-MIND contexts per agent in the booking check's statistical part "
                                "(0: all)", check=lambda v: None if v >= 0 else f"must be >= 0, found {v!r}"),
    },
    "attacks": {
        "peer_trials": Param(int, 100, "near-duplicate queries per world for the peer and aggregator games",
                             check=lambda v: None if v >= 8 else f"must be >= 8, found {v!r}"),
    },
    "federation": {
        "shards": Param(int, 8, "shards", check=positive),
        "records_per_shard": Param(int, 20, "records per shard", check=positive),
        "key_dim": Param(int, 16, "key dimension", check=positive),
        "value_dim": Param(int, 8, "value dimension", check=positive),
        "k": Param(int, 3, "global top-k", check=positive),
        "k_local": Param(int, 2, "candidates per shard", check=positive),
        "mpc": Param(str, "plaintext", "compute parties", choices=("plaintext", "crypten")),
        "sigma": Param(float, help="required: noise multiplier of the value release", check=positive),
        "delta": Param(float, help="required: delta of the federation's accounting", check=open_unit),
        "epsilon_budget": Param(float, help="required: epsilon per principal at delta", check=positive, allow_inf=True),
        "total_epsilon_budget": Param(float, help="required: epsilon over all principals", check=positive,
                                      allow_inf=True),
        "hosts": Param(int, 1, "shard-host actors", check=positive),
    },
    "memview": {
        "cap": Param(float, help="required: B_a per protected attribute (pure epsilon)", check=positive),
        "K": Param(int, help="required: online mode: eps = B_a / K per charged selection", check=positive),
    },
    "brace": {
        "beta": Param(float, 0.5, "inverse temperature (r = sqrt(2/beta))", check=positive),
        "T": Param(int, 3, "horizon", check=positive),
        "epsilon": Param(float, help="required: epsilon of one recall", check=positive),
        "delta": Param(float, help="required: delta of one recall", check=open_unit),
        "budget_epsilon": Param(float, help="required: user's BRACE budget epsilon", check=positive),
        "budget_delta": Param(float, help="required: user's BRACE budget delta", check=open_unit),
    },
    "dpmind": {
        "epsilon": Param(float, help="required: metric-DP epsilon per token (L2, MiniLM rows)", check=positive),
        "chunk_tokens": Param(int, 128, "tokens per perturbed chunk", check=positive),
    },
    "report": {
        "delta": Param(float, 1e-5, "delta at which the composed epsilon is reported", check=open_unit),
    },
}


def _fed_config(cfg):
    from fedmem.federation.engine import FederationConfig  # lazy: loads dp_accounting (~400 ms)

    f = cfg.federation
    return FederationConfig(shards=f.shards, records_per_shard=f.records_per_shard, key_dim=f.key_dim,
                            value_dim=f.value_dim, k=f.k, k_local=f.k_local, mpc=f.mpc, sigma=f.sigma,
                            delta=f.delta, epsilon_budget=f.epsilon_budget,
                            total_epsilon_budget=f.total_epsilon_budget, hosts=f.hosts)


def _agent_config(cfg):
    from fedmem.agent.client import AgentConfig  # lazy: loads dp_accounting (~250 ms)

    b = cfg.brace
    return AgentConfig(memview_cap=cfg.memview.cap, memview_K=cfg.memview.K, brace_beta=b.beta, brace_T=b.T,
                       brace_epsilon=b.epsilon, brace_delta=b.delta, brace_budget_epsilon=b.budget_epsilon,
                       brace_budget_delta=b.budget_delta, dpmind_epsilon=cfg.dpmind.epsilon,
                       dpmind_chunk_tokens=cfg.dpmind.chunk_tokens)


def run(cfg, ctx) -> Result:
    import resource

    import ray

    from fedmem.agent.dpmind import load_minilm  # lazy: loads dp_accounting (~420 ms)
    from fedmem.agent.session import open_session  # lazy: loads dp_accounting (~110 ms)
    from fedmem.experiments.agent_worlds import make_world  # lazy: loads dp_accounting (~220 ms)

    fcfg, acfg = _fed_config(cfg), _agent_config(cfg)
    a = cfg.agents
    timings = {}
    t0 = time.perf_counter()
    table, codec = load_minilm()
    data = make_clustered_shards(fcfg.shards, fcfg.records_per_shard, fcfg.key_dim, fcfg.value_dim, fcfg.clip,
                                 ctx.rng("data"), clusters=4)
    worlds = make_world(a.n, a.tasks, data, ctx.rng("world"), codec=codec, context_tokens=a.context_tokens,
                        bank_size=a.bank_size, bank_dim=a.bank_dim)
    timings["setup_s"] = time.perf_counter() - t0
    opts = cfg.get("ray", {})
    owns_ray = ensure_ray(ctx.ray_address, num_cpus=opts.get("num_cpus") or None,
                          object_store_mb=opts.get("object_store_mb") or None)
    seed = int(ctx.rng("session").integers(2**63))
    try:
        with open_session(a.mode, worlds, fcfg, data, acfg, ctx.out_dir, seed=seed, agent_cpus=a.actor_cpus,
                          projectors=a.projectors) as sess:
            timings.update(sess.timings)
            enforced = getattr(sess, "enforced", {"own_process_outside_ray": False, "own_uid": False,
                                                  "network_namespace": False})
            t1 = time.perf_counter()
            results = sess.run()
            timings["session_s"] = time.perf_counter() - t1
            agent_mem = _agent_memory(sess)
            step_s = np.asarray(sess.step_s)
            t2 = time.perf_counter()
            spends = sess.call("spend")
            composed = sess.call("composed", cfg.report.delta)
            checks = sess.call("check", int(ctx.rng("check").integers(2**31)), a.check_contexts or None)
            exposures = sess.call("exposures")
            ledger_seal = sess.verify_ledgers() if hasattr(sess, "verify_ledgers") else {}
            failed = dict(getattr(sess, "failed", {}))
            timings["check_s"] = time.perf_counter() - t2
            t3 = time.perf_counter()
            done = {u: {r.task for r in res} for u, res in results.items()}
            undefended = adv.undefended_dpmind(worlds, codec, table, acfg, done)
            timings["undefended_s"] = time.perf_counter() - t3
            t4 = time.perf_counter()
            proj = sess.service_stats()        # before the attacks add queries
            games = {}

            def attempt(name, fn):
                """An adversary that fails is reported as failed; the session's results stay."""
                try:
                    out = fn()
                except Exception as exc:  # noqa: BLE001
                    out = {"skipped": f"failed: {type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"}
                    if name == "peer+aggregator":
                        return {"peer": out, "aggregator": out}
                return out

            games["app"] = attempt("app", lambda: adv.app_game(worlds, exposures, spends, acfg,
                                                              ctx.rng("attack", "app")))
            games["external"] = attempt("external", lambda: adv.external_game(
                worlds, exposures, results, undefended, codec, table, acfg.dpmind_epsilon,
                ctx.rng("attack", "external")))
            target = adv.pick_target(data, ctx.rng("attack", "target"))
            neighbour = start_federation_service(fcfg, without_record(data, target[0], target[1]),
                                                 ctx.out_dir / "neighbour_federation.sqlite",
                                                 seed=int(ctx.rng("attack", "neighbour").integers(2**31)))
            try:
                games.update(attempt("peer+aggregator", lambda: adv.federation_games(
                    sess.fed, neighbour, target, cfg.attacks.peer_trials, ctx.rng("attack", "peer"),
                    delta=fcfg.delta)))
            finally:
                ray.kill(neighbour, no_restart=True)
            fed_util = attempt("utility", lambda: adv.federation_utility(sess.fed, results, worlds))
            timings["attacks_s"] = time.perf_counter() - t4
            dead = dict(sess.dead)
    finally:
        if owns_ray:
            ray.shutdown()
    timings["total_s"] = time.perf_counter() - t0
    n_done = sum(len(r) for r in results.values())
    timings["agent_tasks_per_s"] = n_done / timings["session_s"] if timings["session_s"] > 0 else None
    timings["step_s_mean"] = float(step_s.mean()) if step_s.size else None

    rows, dom_counts, comp_list = [], {}, []
    for w in worlds:
        u = w.user
        if u not in spends:
            rows.append([u, sess.principals.get(u), "dead", "", "", "", "", "", "", "", "", "", "", ""])
            continue
        s, c, res = spends[u], composed[u], results[u]
        parts = {"federation": s["federation"]["epsilon"], "brace": s["brace"]["epsilon"],
                 "memview": s["memview"]["max_epsilon"]}
        dom = max(parts, key=parts.get)
        dom_counts[dom] = dom_counts.get(dom, 0) + 1
        refused = sum(r.federation_refused for r in res)
        correct = [r.correct for r in res if r.correct is not None]
        comp_list.append(c["epsilon"])
        rows.append([u, s["principal"], s["federation"]["epsilon"], s["federation"]["releases"], refused,
                     s["memview"]["max_epsilon"], s["memview"]["charges"], s["brace"]["epsilon"],
                     s["brace"]["releases"], s["dpmind"]["epsilon_per_token"], s["dpmind"]["contexts"],
                     c["epsilon"], dom, f"{sum(correct)}/{len(correct)}"])
    problems = {u: {b: p for b, p in ch.items() if p} for u, ch in checks.items()}
    for u, p in ledger_seal.items():           # the driver's seal: rows no step of the agent wrote
        if p:
            problems.setdefault(u, {})["ledger"] = p
    problems = {u: p for u, p in problems.items() if p}
    live = [r for r in rows if r[2] != "dead"]
    eps = np.array([[r[2], r[5], r[7]] for r in live], dtype=float).reshape(-1, 3)
    _plot(ctx, [r[0] for r in live], eps, [r[11] for r in live])
    boundary_rows = _boundary_rows(games, fed_util)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    metrics = {
        "agents": a.n, "tasks": a.tasks, "agent_tasks_done": n_done, "timings": timings, "mode": a.mode,
        "isolation_enforced": enforced, "agent_memory": agent_mem,
        "driver_peak_rss_gb": peak_gb, "services": proj,
        "dead_agents": dead, "failed_agents": failed,
        "mean_epsilon": {"federation": float(eps[:, 0].mean()) if eps.size else None,
                         "memview_max_attribute": float(eps[:, 1].mean()) if eps.size else None,
                         "brace": float(eps[:, 2].mean()) if eps.size else None,
                         "composed": float(np.mean(comp_list)) if comp_list else None},
        "delta": {"federation": fcfg.delta, "brace": acfg.brace_budget_delta, "composed": cfg.report.delta},
        "dpmind_epsilon_per_token": acfg.dpmind_epsilon,
        "dominant_boundary": dom_counts,
        "federation_refusals": int(sum(r[4] for r in live)),
        "booking_check_ok": not problems, "booking_problems": problems,
        "boundaries": games, "federation_utility": fed_util,
        "per_user": spends,
    }
    note = (f"federation epsilon at delta={fcfg.delta} (read from each principal's accountant); BRACE epsilon at "
            f"delta={acfg.brace_budget_delta}; DP-MemView: largest per-attribute pure epsilon (caps {acfg.memview_cap}); "
            f"DP-MIND: metric-DP epsilon per token per context (recorded, not composed); composed = federation + "
            f"BRACE + largest DP-MemView attribute by dp-accounting RDP at delta={cfg.report.delta}, an upper bound "
            f"for one individual whose data reached all three boundaries. dominant = largest of the three epsilons. "
            f"Mode {a.mode} ({'one OS process per user outside Ray' if a.mode == 'isolated' else 'one Ray actor per user'}; "
            f"enforced by the OS: {', '.join(k for k, v in enforced.items() if v) or 'nothing'}); "
            f"dead agents: {sorted(dead) or 'none'}.")
    table_u = Table("Per-user spend per boundary (every release booked before it left)",
                    ["user", "principal", "fed eps", "fed releases", "fed refusals", "memview max eps",
                     "memview charges", "BRACE eps", "BRACE recalls", "DP-MIND eps/token", "DP-MIND contexts",
                     "composed eps", "dominant", "DP-MIND answers correct"], rows, note=note)
    chk = Table("Booking check (what left vs what was booked, per boundary)", ["boundary", "agents with problems"],
                [[b, sum(1 for p in problems.values() if b in p)] for b in ("federation", "memview", "brace",
                                                                               "dpmind")],
                note=f"fedmem.agent.client.check_bookings on every live agent (DP-MIND statistical part on "
                     f"{a.check_contexts or 'all'} contexts per agent)")
    bt = Table("Adversary at each boundary: defended agent vs undefended agent (same tasks and seeds)",
               ["boundary", "agent", "n (pos/neg)", "AUC [95% CI]", "TPR@1%FPR", "eps lower bound",
                "booked (median / max)", "ceiling violations", "utility", "verdict"], boundary_rows,
               note="membership_report: AUC with stratified bootstrap CI, held-out Clopper-Pearson epsilon lower "
                    "bound (alpha 0.05), ROC points provably above the booked epsilon's DP ceiling; verdict by the one "
                    "rule of fedmem.attacks.verdict.judge (undefended: judged against 0 booked). docs/agents.md "
                    "describes each game.")
    tt = Table("Where time goes", ["phase", "seconds"],
               [[k, round(v, 3) if isinstance(v, float) else v] for k, v in timings.items()]
               + [["federation service busy_s (session + checks)", round(proj["federation"]["busy_s"], 3)]]
               + [[f"projector {i} busy_s / cpu_s (session + checks)", f"{p['busy_s']:.1f} / {p['cpu_s']:.1f}"]
                  for i, p in enumerate(proj["projectors"])],
               note=f"{a.n} agents x {a.tasks} tasks; agent-tasks done {n_done}")
    return Result(metrics=metrics, tables=[bt, table_u, chk, tt])


def _agent_memory(sess) -> dict:
    """PSS (MiB) of the processes that run agent code, by mode (isolated: children + zygote;
    cluster: the Ray workers of the agent actors)."""
    if hasattr(sess, "memory"):
        return sess.memory()
    from fedmem.agent.isolated import pss_mib  # lazy: ~150 ms, no heavy package

    pids = sess.call("pid")
    return {"agents_pss_mib": sum(pss_mib(p) for p in pids.values()), "processes": len(pids)}


def _fmt_report(r):
    return (f"{r['n_pos']}/{r['n_neg']}", f"{r['auc']:.3f} [{r['auc_ci'][0]:.3f}, {r['auc_ci'][1]:.3f}]",
            f"{r['tpr_at_1fpr']:.3f}", f"{r['eps_lower']:.2f}", r["ceiling_violations"])


def _boundary_rows(games, fed_util) -> list:
    rows = []
    names = {"app": "third-party app (DP-MemView views)", "external": "external model (DP-MIND chunks)",
             "peer": "curious peer agent (federation)", "aggregator": "aggregator (opened sums)"}
    for key in ("app", "external", "peer", "aggregator"):
        g = games.get(key, {})
        if "skipped" in g or not g:
            rows.append([names[key], "-", g.get("skipped", "not run"), "", "", "", "", "", "", ""])
            continue
        b = g["booked"]
        util = g.get("utility")
        if key == "peer":
            util = {"defended": fed_util.get("defended"), "undefended": 0.0}
        for side in ("defended", "undefended"):
            if side not in g:
                rows.append([names[key], side, "n/a (no aggregator: raw memory)", "", "", "", "", "", "", ""])
                continue
            n, auc, tpr, lo, viol = _fmt_report(g[side])
            booked = f"{b['median']:.3g} / {b['max']:.3g}" if side == "defended" else "none"
            u = "" if not util else util.get(side)
            rows.append([names[key], side, n, auc, tpr, lo, booked, viol if side == "defended" else "",
                         "" if u is None else (f"{u:.3f}" if isinstance(u, float) else u),
                         g[side].get("verdict", "")])
    return rows


def _plot(ctx, users, eps, composed):
    plt = F.pyplot()
    x = np.arange(len(users))
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(users) + 2), 3.8))
    w = 0.22
    for j, (name, col) in enumerate((("federation", F.colour(0)), ("DP-MemView (max attr.)", F.colour(1)),
                                     ("BRACE", F.colour(2)))):
        ax.bar(x + (j - 1) * w, eps[:, j], w, label=name, color=col)
    ax.plot(x, composed, "k_", markersize=12, label="composed (RDP)")
    ax.set_xticks(x)
    ax.set_xticklabels(users, rotation=90 if len(users) > 20 else 0, fontsize=7)
    ax.set_ylabel("epsilon spent")
    ax.set_title("Per-user spend per boundary")
    ax.legend(fontsize=7)
    F.save(ctx, fig, "agents_spend", "per-user epsilon per (eps, delta)-type boundary and composed")
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
    import os

    ray_cpus = (cfg.get("ray", {}) or {}).get("num_cpus") or os.cpu_count() or 1
    services = 5 * 0.05 + cfg.agents.projectors * 0.05      # federation, observers, projectors (num_cpus each)
    need = (cfg.agents.n * cfg.agents.actor_cpus if cfg.agents.mode == "cluster" else 0.0) + services
    if need > ray_cpus:
        problems.append(("agents.actor_cpus", f"agents.n * actor_cpus + services = {need:.2f} CPUs exceeds the "
                                              f"{ray_cpus} Ray CPUs (actors would wait forever), found "
                                              f"{cfg.agents.actor_cpus!r}"))
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
