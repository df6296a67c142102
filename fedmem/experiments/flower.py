"""Experiment kind ``flower.support_leak``: papers/003's support attacks on Flower and on the Ray engine.

Shards are Flower ClientApps in Flower's simulation engine (``run_simulation``, Ray
backend); one query per round through Flower's message API; local threshold selection
per shard; the value channel (clipped local sums and counts) is summed with SecAgg+
(``SecAggPlusWorkflow`` + ``secaggplus_mod``). Deployments, side by side on the same
shards, queries and membership candidate:

* **stock Flower**: SecAgg+ and Flower's ``DifferentialPrivacyClientSideFixedClipping``;
  clients follow Flower's convention (``num_examples`` = examples used, a metric with the
  match count). The adversary is the server-side strategy (any ``Strategy`` subclass the
  app author writes sees ``aggregate_fit``'s arguments): reply set, ``num_examples``.
* **Flower + fedmem**, one deployment per entry of ``federation.dp``: the same with
  :class:`~fedmem.flower.gateway.SupportGatewayStrategy` outside Flower's DP wrapper
  (``"flower"``) or with fedmem's own release (``"fedmem"``: the gateway noises the sum
  with the secure sampler and hands the wrapped strategy only the noised mean), and the
  fedmem client contract. Three observers: the querying agent (what the gateway returns),
  the wrapped strategy (what its ``aggregate_fit`` receives) and the server strategy
  *inside* the gateway (reply set and ``num_examples``, now constant). ``"flower"`` is a
  comparison, not a defended deployment: Flower's noise is numpy's float sampler (labelled
  "not DP (float sampler)") and its inner strategy sees the exact aggregate.

Every row is judged by the one verdict rule, :func:`fedmem.attacks.verdict.judge`.
* **the Ray engine** (``[ray_engine]``, :mod:`fedmem.experiments.flower_ray_engine`): fedmem's own
  Ray + CrypTen :class:`~fedmem.federation.Federation`, threshold selection, undefended
  (exact receipts, gateway off) and defended (noised receipts, gateway on), in this process.

Attacks (``fedmem.attacks``): (a) cardinality reconstruction (contributing shards) from
the reply set / ``num_examples`` (stock, server view), from the released noised count
(gateway, agent view) or from the receipts (Ray engine,
:func:`~fedmem.attacks.support.reconstruct_cardinality`); (b) differencing membership on a
candidate record (Flower: both neighbouring worlds in one simulation, selected per round;
Ray: two federations, :func:`~fedmem.attacks.support.differencing_score`), with the
Clopper-Pearson epsilon lower bound against what was booked for one round/trial.

**Faults** (``[faults]``): after the attack rounds, rounds in which one ClientApp raises
in ``fit`` and rounds in which some reply after the round's deadline (silent dropout);
the report shows what Flower's server got and released (and the noise its DP wrapper
added against what the realized reply count needs) and what the gateway did and booked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedmem.experiments.flower_faults import (chi2_std_ci, eps_of, explain_faults, fault_plan, fault_rows,
                                              ledger_check)
from fedmem.experiments.flower_schema import DP_CHOICES, SCHEMA, cross_checks
from fedmem.report import Result, Table
from fedmem.scenario import Experiment
from fedmem.bench.shards import sample_queries
from fedmem.experiments.flower_ray_engine import column_config, config_summary, run_ray_engine

__all__ = ["DP_CHOICES", "EXPERIMENTS", "SCHEMA", "cross_checks", "run"]

# Their old private names (the tests import them from here).
_chi2_std_ci, _eps_of = chi2_std_ci, eps_of

# The library imports of the run steps (fedmem.attacks, fedmem.bench, fedmem.flower) stay inside
# the functions that use them: the registry imports this module to validate a scenario (`fedmem
# validate`, `fedmem list`), and they pull in Flower and scipy.stats (`python -X importtime` on the
# shared 2-core machine: fedmem.flower.apps 2.4 s, fedmem.attacks.verdict 11 s, against 1.2 s for
# this module with fedmem.report and fedmem.scenario).


def _spec(cfg, world, rounds, deployment, ledger, seed, dp=None, faults=None):
    f = cfg.federation
    sens = math.sqrt((2 * f.clip) ** 2 + 1.0)   # one record: local top-k' sum by <= 2C, count by <= 1
    name = deployment if dp is None else f"{deployment}-{dp}"
    spec = dict(deployment=deployment, dp=dp or "fedmem", world=world, shards=f.shards, value_dim=f.value_dim,
                k_local=f.k_local, threshold=f.threshold, clipping_range=f.clipping_range, rounds=rounds,
                flower_sigma=f.flower_sigma, flower_clip=f.flower_clip, sigma=f.sigma, sensitivity=sens,
                ledger=str(ledger), ledger_name=f"flower/{name}", epsilon_budget=f.epsilon_budget,
                total_epsilon_budget=f.total_epsilon_budget, delta=f.delta, noise_seed=seed,
                num_shares=f.num_shares, reconstruction_threshold=f.reconstruction_threshold,
                num_cpus=f.num_cpus, client_cpus=f.client_cpus)
    spec.update(faults or {})
    return spec


def _truths(world, rounds, k_local, threshold, grid, shards):
    from fedmem.flower.apps import client_vector  # lazy: loads flwr, dp_accounting, grpc (~800 ms)

    out = []
    for r in rounds:
        q = np.asarray(r["query"])
        out.append(sum(int(client_vector(world, i, q, r["world"], r["target"], k_local, threshold, grid)[-1] > 0)
                       for i in range(shards)))
    return out


@dataclass
class _Plan:
    """One run's world and rounds: the attack rounds (reconstruction, then membership) and the
    fault rounds after them, shared by every deployment and the Ray engine column."""
    world: dict
    data: object
    targets: list
    qs: np.ndarray
    rounds: list
    n_attack: int
    fault_spec: dict
    kind_of: dict
    truths: list


def _plan(cfg, ctx) -> _Plan:
    """Step 1: the shards, the reconstruction queries, the membership rounds (both worlds,
    shuffled), the fault rounds and the true contributing-shard counts."""
    from fedmem.flower.apps import build_world, world_spec  # lazy: loads flwr, dp_accounting, grpc (~800 ms)
    from fedmem.flower.fixedpoint import SecAggGrid  # lazy: loads flwr, dp_accounting, grpc (~800 ms)

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
    n_attack = len(rounds)
    fault_rounds, fault_spec, kind_of = fault_plan(cfg, qs, n_attack + 1, ctx.rng("faults"))
    rounds += fault_rounds
    truths = _truths(world, rounds[: a.queries], f.k_local, f.threshold, grid, f.shards)
    return _Plan(world, data, targets, qs, rounds, n_attack, fault_spec, kind_of, truths)


def _run_ray_column(cfg, ctx, plan: _Plan, metrics: dict):
    """Step 2: the "ray" engine column: same shards, queries and candidate, in this process (Ray + CrypTen)."""

    f, a = cfg.federation, cfg.attack
    ctx.log(f"ray engine: {cfg.ray_engine.mpc} parties, threshold selection, {f.shards} shards")
    ray_out = run_ray_engine(f, cfg.ray_engine, plan.data, plan.targets, plan.qs, a.repeats, rng_for=ctx.rng,
                             ray_address=ctx.ray_address, log=ctx.log)
    metrics["wall_s"]["ray"] = sum(ray_out[v]["wall_s"] for v in ("undefended", "defended")) + ray_out["startup_s"]
    return ray_out


def _simulate_deployments(cfg, ctx, plan: _Plan, metrics: dict) -> dict:
    """Step 3: the Flower deployments, stock then one gateway deployment per ``federation.dp``
    (each its own run_simulation in a spawned process)."""
    from fedmem.flower.sim import simulate  # lazy: loads flwr, dp_accounting, grpc (~800 ms)

    f = cfg.federation
    deployments = [("stock", None)] + [("gateway", dp) for dp in f.dp]
    runs = {}
    for dep, dp in deployments:
        key = dep if dp is None else f"gateway-{dp}"
        ctx.log(f"flower: simulating {key} ({len(plan.rounds)} rounds, {f.shards} ClientApps)")
        runs[key] = simulate(_spec(cfg, plan.world, plan.rounds, dep, ctx.out_dir / "ledger.sqlite",
                                   int(ctx.rng("noise", key).integers(2 ** 31)), dp=dp, faults=plan.fault_spec),
                             timeout_s=f.timeout_s)
        metrics["wall_s"][key] = runs[key]["wall_s"]
    return runs


class _VerdictRows:
    """The attack table's rows, one per (engine, observer), each judged by the one verdict rule
    (fedmem.attacks.verdict.judge) against what this observer's release booked (eps per round at
    delta; nothing booked = 0). A float-sampler release is labelled not DP."""

    def __init__(self, f, a, truths, mrng, metrics):
        self.f, self.a, self.truths, self.mrng, self.metrics = f, a, truths, mrng, metrics
        self.rows: list = []
        self.defended: list[bool] = []
        self.verdicts: list = []

    def add(self, engine, observer, est, pos, neg, booked, defended, sampling=None, extra=None, mu_booked=None):
        from fedmem.attacks.support import membership_report, reconstruction_report  # lazy: loads sklearn, scipy, numpy (~2.6 s)
        from fedmem.attacks.verdict import judge, sampler_label  # lazy: loads sklearn, scipy, numpy (~2.6 s)

        f, a, mrng = self.f, self.a, self.mrng
        self.defended.append(defended)
        rec_rep = reconstruction_report(est, self.truths, a.tolerance, a.alpha)
        mem = membership_report(pos, neg, delta=f.delta, rng=mrng, epsilon_claim=booked if booked > 0 else math.inf,
                                alpha=a.alpha)
        v = judge(pos, neg, booked, f.delta if booked > 0 else 0.0, alpha=a.alpha,
                  rng=np.random.default_rng(mrng.integers(2 ** 31)), mu_booked=mu_booked if booked > 0 else None)
        self.verdicts.append(v)
        float_label = sampler_label(sampling) if sampling is not None else None
        text = v.text + (f"; {float_label}" if float_label else "")
        self.rows.append([engine, observer, f"{rec_rep.rate:.0%} [{rec_rep.ci[0]:.0%}, {rec_rep.ci[1]:.0%}]",
                          f"{rec_rep.chance_rate:.0%}", f"{mem.auc:.3f} [{mem.auc_ci[0]:.3f}, {mem.auc_ci[1]:.3f}]",
                          f"{mem.tpr_at_1:.3f}", f"{v.eps_lower:.2f} (power {v.power:.2f})",
                          f"{booked:.2f}" if booked > 0 else "nothing booked", text])
        self.metrics.setdefault("rows", {})[f"{engine} | {observer}"] = {
            "reconstruction": rec_rep.as_dict(), "membership": mem.as_dict(), "verdict": v.as_dict(),
            "verdict_text": text, "sampling": sampling, "booked_eps_per_round": booked, **(extra or {})}

    def worst(self, defended: bool) -> str:
        from fedmem.attacks.verdict import worst  # lazy: loads sklearn, scipy, numpy (~2.6 s)

        return worst([v for v, d in zip(self.verdicts, self.defended) if (d if defended else not d)])


def _flower_observer_rows(runs: dict, plan: _Plan, f, table: _VerdictRows) -> None:
    """Step 4: per Flower deployment and observer (querying agent, wrapped strategy, server
    strategy), the cardinality estimates and membership scores of the attack rounds."""
    from fedmem.attacks.support import cardinality_from_count  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    m, n_attack = f.shards, plan.n_attack
    attack_rounds = plan.rounds[:n_attack]
    for key, recs in ((k, r["records"]) for k, r in runs.items()):
        gw = runs[key]["gateway"]
        booked = gw["epsilon_per_round"] if gw else 0.0
        mu_booked = gw.get("mu_per_round") if gw else None    # Gaussian-only booking: the GDP test too
        inner_views = runs[key].get("aggregates", {})
        observers = [("server", "server strategy: reply set, num_examples")]
        if gw:
            observers.insert(0, ("agent", "querying agent: released aggregate"))
            observers.insert(1, ("inner", "wrapped strategy: what its aggregate_fit receives"))
        # dp="flower": Flower's DP wrapper noises with numpy's float sampler, after its inner strategy
        # aggregated the exact replies: not a defended deployment (shown for comparison).
        defended = gw is not None and key != "gateway-flower"
        sampling = gw.get("sampling") if gw else None
        engine = ("Flower (SecAgg+, Flower DP wrapper), stock" if key == "stock" else
                  f"Flower + fedmem gateway (dp={key.split('-', 1)[1]!r})")
        for who, obs_label in observers:
            est, pos, neg, answered = [], [], [], 0
            for r, rec in zip(attack_rounds, recs[:n_attack]):
                if who == "server":
                    ne = np.asarray(rec.get("num_examples", []), dtype=float)
                    card = float(np.count_nonzero(ne > 0)) if rec.get("replied") else math.nan
                    score = float(ne.sum())
                else:
                    out = rec.get("output") if who == "agent" else inner_views.get(rec["round"])
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
            table.add(engine, obs_label, est, pos, neg, booked,
                      defended if who != "server" else gw is not None,
                      sampling=sampling if who == "agent" else None,
                      extra={"answered": answered if who != "server" else None},
                      mu_booked=mu_booked if who != "server" else None)


def _ray_engine_rows(ray_out: dict, cfg, truths, metrics: dict, table: _VerdictRows) -> None:
    """Step 5: the Ray engine column's rows (undefended, defended): the querying agent's view."""

    f = cfg.federation
    for variant in ("undefended", "defended"):
        x = ray_out[variant]
        config = column_config(f, cfg.ray_engine, variant)
        booked = float(max(x["booked"])) if x["booked"] else 0.0
        mus = x.get("mu") or []
        mu_booked = float(max(mus)) if mus and all(m is not None for m in mus) else None   # Gaussian-only
        metrics.setdefault("ray_engine_configs", {})[variant] = config_summary(config)
        label = ("Ray engine, undefended (exact receipts, gateway off)" if variant == "undefended" else
                 f"Ray engine, defended (noised receipts sigma {cfg.ray_engine.receipt_sigma:g}, gateway on)")
        table.add(label, "querying agent: Response (value, receipts)",
                  x["estimates"], x["pos"], x["neg"], booked, variant == "defended", mu_booked=mu_booked,
                  extra={"truth_mismatches_vs_flower": int(sum(t1 != t2 for t1, t2 in zip(x["truths"], truths))),
                         "refused": x["refused"], "wall_s": x["wall_s"]})


def _fault_report(runs: dict, kind_of: dict, f, alpha) -> tuple[list, dict]:
    """Step 6: the fault rows per deployment, with the gateway ledgers checked."""
    rows, faults = [], {}
    for key, out in runs.items():
        flower_dp = key in ("stock", "gateway-flower")
        label = "Flower, stock" if key == "stock" else f"Flower + fedmem gateway (dp={key.split('-', 1)[1]!r})"
        r_, d_ = fault_rows(label, out, kind_of, f, alpha, flower_dp)
        rows += r_
        faults[key] = d_
        if out["gateway"]:
            faults[key]["ledger"] = ledger_check(out, f.delta)
    return rows, faults


def _malicious_rows(cfg, ctx, metrics: dict) -> Table | None:
    """Step 7: the hostile-ClientApp games (fedmem.attacks.malicious_client) against both wrappers, each
    with its companion broken variant (the pre-issue-37 wrapper, one defect on), judged by the one rule."""
    mc = cfg.malicious
    if not mc.enabled:
        return None
    from fedmem.attacks.malicious_client import run_attack  # lazy: loads flwr, scipy (~2.6 s)

    rows, out = [], []
    seed = int(ctx.rng("malicious").integers(2 ** 31))
    for attack in mc.attacks:
        timing = attack == "release_timing"
        kw = dict(trials=mc.trials, num_sampled_clients=mc.clients, sensitivity=mc.sensitivity, seed=seed,
                  alpha=cfg.attack.alpha, delta=cfg.federation.delta,
                  noise_multiplier=mc.timing_noise_multiplier if timing else mc.noise_multiplier)
        if timing:
            kw.update(dim=mc.timing_dim, repeats=mc.timing_repeats)
        for api, broken in (("legacy", False), ("message", False), ("legacy", True)):
            ctx.log(f"malicious client: {attack} ({api}{', broken variant' if broken else ''})")
            r = run_attack(attack, api=api, broken=broken, **kw)
            out.append(r.as_dict())
            rows.append([attack, r.api, r.variant, f"{r.released[0]}/{r.trials} | {r.released[1]}/{r.trials}",
                         str(r.escaped), str(r.values_in_text), f"{r.eps_booked:.2f}", r.verdict.text,
                         "holds" if r.holds() else "FAILS"])
    metrics["malicious_client"] = out
    metrics["malicious_client_holds"] = all(r["holds"] for r in out if r["variant"] == "fedmem")
    metrics["malicious_client_broken_caught"] = all(not r["holds"] for r in out if r["variant"] != "fedmem")
    return Table("Hostile ClientApps against the Flower wrappers (fedmem.attacks.malicious_client), with the broken "
                 "variants", ["attack", "API", "wrapper", "released (world 0 | world 1)", "exceptions out",
                              "honest sum in a text", "booked eps / round", "verdict", "row"], rows,
                 note=f"{mc.trials} rounds per world, m = {mc.clients} (node 0 malicious, node 1 the target: 0 or "
                      f"a contribution of norm C = {mc.sensitivity:g}), noise multiplier {mc.noise_multiplier:g} "
                      f"(timing: {mc.timing_noise_multiplier:g}, d = {mc.timing_dim}, smallest CPU time of "
                      f"{mc.timing_repeats} aggregations per trial, worlds interleaved at random in this process). "
                      f"A row holds when the verdict is not LEAK, no exception left the wrapper, nothing was booked "
                      f"without a release and no text carried the honest sum. Broken variant: the pre-issue-37 "
                      f"legacy wrapper with one defect on (no server clipping / exceptions out with their text / "
                      f"math.fsum sum). Wrapper rows hold: {metrics['malicious_client_holds']}; broken variants "
                      f"caught: {metrics['malicious_client_broken_caught']}.")


def run(cfg, ctx) -> Result:
    f, a = cfg.federation, cfg.attack
    plan = _plan(cfg, ctx)
    n_attack = plan.n_attack
    metrics: dict = {"wall_s": {}}
    ray_out = _run_ray_column(cfg, ctx, plan, metrics) if cfg.ray_engine.enabled else None
    runs = _simulate_deployments(cfg, ctx, plan, metrics)

    m = f.shards
    eps_flower_claim = eps_of(f.flower_sigma, f.delta)
    table = _VerdictRows(f, a, plan.truths, ctx.rng("audit"), metrics)
    _flower_observer_rows(runs, plan, f, table)
    if ray_out is not None:
        _ray_engine_rows(ray_out, cfg, plan.truths, metrics, table)

    fault_rows_, faults = _fault_report(runs, plan.kind_of, f, a.alpha)
    metrics["faults"] = faults
    metrics["epsilon_per_round_booked"] = {k: r["gateway"]["epsilon_per_round"] for k, r in runs.items()
                                           if r["gateway"]}
    metrics["flower_claimed_eps_per_round"] = eps_flower_claim
    metrics["gateway_decisions"] = {k: {d: sum(1 for x in r["gateway"]["audit"] if x["decision"] == d)
                                        for d in ("admitted", "refused", "fault")}
                                    for k, r in runs.items() if r["gateway"]}
    metrics["gateway_spent_eps"] = {k: r["gateway"]["spent"] for k, r in runs.items() if r["gateway"]}
    overall = table.worst(defended=False)
    metrics["verdict_undefended"] = overall
    metrics["verdict_defended"] = table.worst(defended=True)
    ledgers = {k: v.get("ledger", {}).get("consistent") for k, v in faults.items() if "ledger" in v}
    tables = [
        Table("Stock Flower vs Flower + fedmem gateway vs the Ray engine (same shards, queries and candidate)",
              ["engine / deployment", "observer", "shards within +-tol [95% CI]", "chance (best constant)",
               "differencing AUC [95% CI]", "TPR@1%FPR", "empirical eps (CP lower)", "booked eps / round",
               "verdict"], table.rows,
              note=f"{n_attack} attack rounds per deployment ({a.queries} reconstruction queries, {a.targets} "
                   f"candidate(s) x {a.repeats} rounds per world), {m} shards. Flower: one query per round, "
                   f"SecAgg+ for the value, run_simulation (Ray backend). Ray engine: Federation with threshold "
                   f"selection, {cfg.ray_engine.mpc} parties, one batch per world (fresh principal per trial); "
                   f"undefended: {metrics.get('ray_engine_configs', {}).get('undefended', '-')}; defended: "
                   f"{metrics.get('ray_engine_configs', {}).get('defended', '-')}. "
                   f"Stock Flower books nothing; its DP wrapper claims {eps_flower_claim:.2f} per round for "
                   f"client-level adjacency (sigma={f.flower_sigma}). Gateway decisions: "
                   f"{metrics['gateway_decisions']}. Undefended deployments: {overall}; defended: "
                   f"{metrics['verdict_defended']}."),
        Table("Faults: a ClientApp fails or drops out mid-round (after the attack rounds)",
              ["deployment", "fault", "rounds", "replies / sampled", "failures reported", "aggregates released",
               "noise std on the mean: added [95% CI] vs calibration", "epsilon", "Flower / gateway"],
              fault_rows_,
              note=f"fail: one ClientApp raises in fit (SecAgg+'s masked-vector stage: an error reply). dropout: "
                   f"{cfg.faults.dropout_clients} ClientApps reply {cfg.faults.stall_s:g} s after the round's "
                   f"deadline ({cfg.faults.deadline_s:g} s, SecAggPlusWorkflow timeout): no error reaches the "
                   f"server, it just gets fewer replies. Noise std measured from the released aggregate minus the "
                   f"inner strategy's aggregate (both recorded), pooled over coordinates and rounds, chi-square CI. "
                   f"Gateway ledgers equal the composition of admitted rounds (nothing lost): {ledgers}."),
    ]
    hostile = _malicious_rows(cfg, ctx, metrics)
    if hostile is not None:
        tables.append(hostile)
    sections = [("What each observer sees", _explain(f)), ("Faults, read", explain_faults(faults, m))]
    metrics["verdict"] = metrics["verdict_defended"]
    return Result(metrics=metrics, tables=tables, sections=sections)


def _explain(f) -> str:
    return (
        "Stock Flower: every reply carries `num_examples` (the local match count) and a `matches` metric in "
        "plaintext, and SecAgg+ does not hide them; the server strategy reads the exact support. "
        "Flower + fedmem: clients reply with `num_examples = k'` (public), no metrics, and the count inside the "
        "SecAgg+ sum; the gateway books each admitted round's Gaussian event before the aggregate leaves and "
        "fails closed on any fault. The server process still sees the exact SecAgg+ sum before central noise "
        "is added (Flower 1.42 has no distributed noise for SecAgg+), so the server is trusted for the value; "
        f"the querying agent sees only the noised release (dp = {list(f.dp)!r}). "
        "The wrapped strategy inside the gateway sees, with dp = 'fedmem', only the gateway's one noised mean "
        "(the gateway noises the sum itself with the secure sampler: the wrapped strategy is post-processing); "
        "with dp = 'flower', Flower's DP wrapper adds its float noise after its inner strategy aggregated the "
        "exact replies, so that strategy sees the exact aggregate (a comparison, not a defended deployment). "
        "Ray engine: the querying agent reads `Response` (noised value, receipts as the policy releases them); "
        "undefended = exact receipts with the gateway off (the value is booked, the receipts are not), "
        "defended = Gaussian-noised receipts booked with the value, gateway on. Its compute parties see only "
        "secret shares; nobody sees the exact sum.")



EXPERIMENTS = {
    "flower.support_leak": Experiment(
        "flower.support_leak",
        "papers/003 support attacks on Flower (SecAgg+, DP wrapper): stock vs fedmem's gateway strategy vs the "
        "Ray engine, plus faults.",
        SCHEMA, run, cross_checks),
}
