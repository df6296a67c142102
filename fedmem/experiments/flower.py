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

import numpy as np

from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, at_least, nonnegative, open_unit, positive

DP_CHOICES = ("fedmem", "flower")


def _dp_list(v) -> str | None:
    if not v or any(x not in DP_CHOICES for x in v) or len(set(v)) != len(v):
        return f"must be a non-empty list of distinct items from {list(DP_CHOICES)}, found {v!r}"
    return None


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
        "dp": Param(list, help="required: central DP of the defended deployments, one Flower + gateway "
                    "deployment each: 'fedmem' (the wrapper's own noise) and/or 'flower' (Flower's "
                    "DifferentialPrivacyClientSideFixedClipping inside the wrapper)", item_type=str, check=_dp_list),
        "sigma": Param(float, help="required: fedmem noise multiplier (noise sigma * sensitivity on the sum)", check=positive),
        "flower_sigma": Param(float, help="required: Flower DP wrapper noise_multiplier", check=positive),
        "flower_clip": Param(float, help="required: Flower DP wrapper clipping_norm (fixedclipping_mod)", check=positive),
        "clipping_range": Param(float, 8.0, "SecAgg+ clipping_range (power of two >= k' * clip)", check=positive),
        "delta": Param(float, help="required: delta of every epsilon", check=open_unit),
        "epsilon_budget": Param(float, help="required: gateway epsilon budget of the querying principal (inf "
                                "disables; the audit needs every round answered)", check=positive, allow_inf=True),
        "total_epsilon_budget": Param(float, help="required: gateway total epsilon budget (inf disables)",
                                      check=positive, allow_inf=True),
        "num_shares": Param(int, 5, "SecAgg+ num_shares", check=at_least(3)),
        "reconstruction_threshold": Param(int, 3, "SecAgg+ reconstruction_threshold", check=at_least(2)),
        "num_cpus": Param(int, 2, "CPUs of the simulation's private local Ray", check=at_least(1)),
        "client_cpus": Param(float, 0.5, "Ray CPUs per ClientApp actor", check=positive),
        "timeout_s": Param(float, 1800.0, "wall-clock limit of one simulation", check=positive),
    },
    "ray_engine": {
        "enabled": Param(bool, True, "run the 'ray' engine column (fedmem's Ray + CrypTen federation, threshold "
                         "selection) on the same shards, queries and candidate"),
        "mpc": Param(str, "crypten", "its compute parties: crypten (real secret sharing) or plaintext (bit-identical "
                     "reference)", choices=("crypten", "plaintext")),
        "receipt_sigma": Param(float, 4.0, "noise multiplier of the defended column's noised receipts",
                               check=positive),
        "hosts": Param(int, 2, "shard-host Ray actors", check=at_least(1)),
    },
    "faults": {
        "fail_rounds": Param(int, 2, "rounds (after the attack rounds) in which one ClientApp raises in fit (the "
                             "masked-vector stage of SecAgg+)", check=nonnegative),
        "dropout_rounds": Param(int, 2, "rounds in which dropout_clients ClientApps reply after the round's "
                                "deadline (silent dropout)", check=nonnegative),
        "dropout_clients": Param(int, 2, "ClientApps that drop out silently in each dropout round",
                                 check=at_least(1)),
        "deadline_s": Param(float, 8.0, "SecAgg+ deadline (workflow timeout) of a dropout round", check=positive),
        "stall_s": Param(float, 4.0, "how much later than the deadline a dropped-out ClientApp replies",
                         check=positive),
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
    if cfg.faults.dropout_clients >= f.shards:
        out.append(("faults.dropout_clients", f"must be < shards ({f.shards}), found {cfg.faults.dropout_clients}"))
    if f.reconstruction_threshold >= f.num_shares:
        out.append(("federation.reconstruction_threshold", f"must be < num_shares ({f.num_shares}), found "
                                                           f"{f.reconstruction_threshold}"))
    return out


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
    from fedmem.flower.apps import client_vector

    out = []
    for r in rounds:
        q = np.asarray(r["query"])
        out.append(sum(int(client_vector(world, i, q, r["world"], r["target"], k_local, threshold, grid)[-1] > 0)
                       for i in range(shards)))
    return out


def _fault_plan(cfg, qs, first_round: int, rng):
    """Fault rounds after the attack rounds: ``fail_rounds`` with one ClientApp raising, ``dropout_rounds``
    with ``dropout_clients`` replying after the deadline, alternating (fail first). Returns the extra
    rounds and the spec entries (drops, stalls, stall_s, round_timeouts) plus {round: kind}."""
    fl, f = cfg.faults, cfg.federation
    kinds = []
    for i in range(max(fl.fail_rounds, fl.dropout_rounds)):
        if i < fl.fail_rounds:
            kinds.append("fail")
        if i < fl.dropout_rounds:
            kinds.append("dropout")
    rounds, drops, stalls, timeouts, kind_of = [], {}, {}, {}, {}
    for j, kind in enumerate(kinds):
        rnd = first_round + j
        rounds.append({"query": qs[j % len(qs)].tolist(), "world": 0, "target": -1, "kind": kind})
        kind_of[rnd] = kind
        if kind == "fail":
            drops.setdefault(int(rng.integers(f.shards)), []).append(rnd)
        else:
            for c in rng.choice(f.shards, size=fl.dropout_clients, replace=False):
                stalls.setdefault(int(c), []).append(rnd)
            timeouts[rnd] = fl.deadline_s
    spec = {"drops": drops, "stalls": stalls, "stall_s": fl.deadline_s + fl.stall_s, "round_timeouts": timeouts}
    return rounds, spec, kind_of


def _chi2_std_ci(noise, alpha):
    """Pooled std of zero-mean noise samples and its chi-square CI."""
    from scipy.stats import chi2

    x = np.asarray(noise, dtype=np.float64).ravel()
    n = x.size
    s2 = float(np.mean(x ** 2))
    return math.sqrt(s2), (math.sqrt(s2 * n / chi2.ppf(1 - alpha / 2, n)), math.sqrt(s2 * n / chi2.ppf(alpha / 2, n)))


def _eps_of(multiplier: float, delta: float) -> float:
    import dp_accounting

    from fedmem.dp import Accountant

    acc = Accountant("rdp")
    acc.book(dp_accounting.GaussianDpEvent(multiplier), "probe")
    return acc.spent(delta)


def _fault_rows(label, run_out, kind_of, f, alpha, flower_dp: bool):
    """One row per fault kind for a deployment: what Flower's server got and what left."""
    recs = {r["round"]: r for r in run_out["records"]}
    aggs = run_out.get("aggregates", {})
    gw = run_out.get("gateway")
    audit = {a["server_round"]: a for a in gw["audit"]} if gw else {}
    rows, out = [], {}
    m = f.shards
    for kind in ("fail", "dropout"):
        rnds = [r for r, k in kind_of.items() if k == kind]
        if not rnds:
            continue
        replies = [len(recs.get(r, {}).get("replied", [])) for r in rnds]
        failures = [int(recs.get(r, {}).get("failures", 0)) for r in rnds]
        released = [r for r in rnds if recs.get(r, {}).get("output") is not None]
        booked = sum(len(audit.get(r, {}).get("bookings", [])) for r in rnds) if gw else 0
        decisions = sorted({audit[r]["decision"] + (":" + "+".join(audit[r]["reasons"]) if audit[r]["reasons"]
                                                    else "") for r in rnds if r in audit}) if gw else []
        std_txt, eps_txt = "-", "-"
        d = {"rounds": rnds, "replies": replies, "failures": failures, "released": len(released),
             "bookings": booked, "gateway_decisions": decisions}
        noise = [np.asarray(recs[r]["output"]) - np.asarray(aggs[r]) for r in released if r in aggs]
        if noise and flower_dp and not gw:
            std, (lo, hi) = _chi2_std_ci(noise, alpha)
            n_rep = [len(recs[r]["replied"]) for r in released]
            n_min = min(n_rep)
            calibrated = f.flower_sigma * f.flower_clip / m
            needed = f.flower_sigma * f.flower_clip / n_min
            delivered = f.flower_sigma * n_min / m
            eps_claim, eps_real = _eps_of(f.flower_sigma, f.delta), _eps_of(delivered, f.delta)
            std_txt = (f"{std:.4f} [{lo:.4f}, {hi:.4f}] (Flower's calibration to m={m}: {calibrated:.4f}; "
                       f"needed for its claim at n={n_min}: {needed:.4f})")
            eps_txt = f"claimed {eps_claim:.2f}, delivered {eps_real:.2f} (multiplier {delivered:.3f})"
            d.update(noise_std_measured=std, noise_std_ci=[lo, hi], noise_std_calibrated=calibrated,
                     noise_std_needed=needed, replies_released=n_rep, eps_claimed=eps_claim,
                     eps_delivered=eps_real, samples=int(sum(x.size for x in noise)))
        elif gw:
            eps_txt = "nothing booked" if booked == 0 else f"{booked} bookings"
        warn = sum("differs from the number of sampled clients" in w for r in rnds
                   for w in recs.get(r, {}).get("warnings", []))
        d["flower_reply_count_warnings"] = warn
        rows.append([label, kind, len(rnds), ", ".join(f"{x}/{m}" for x in replies), ", ".join(map(str, failures)),
                     f"{len(released)}/{len(rnds)}", std_txt, eps_txt,
                     ", ".join(decisions) if gw else f"{warn} reply-count warning(s)"])
        out[kind] = d
    return rows, out


def _ledger_check(run_out, delta) -> dict:
    """Nothing lost: the ledger's principal and total spend equal the composition of the admitted rounds."""
    import dp_accounting

    from fedmem.dp import Accountant

    gw = run_out["gateway"]
    admitted = [a for a in gw["audit"] if a["decision"] == "admitted"]
    ref = Accountant("rdp")
    for _ in admitted:
        ref.book(dp_accounting.GaussianDpEvent(gw["multiplier"]), "ref")
    want = ref.spent(delta) if admitted else 0.0
    return {"admitted": len(admitted), "bookings": sum(len(a["bookings"]) for a in gw["audit"]),
            "principal_spent": gw["spent"], "total_spent": gw["total_spent"], "expected": want,
            "consistent": bool(math.isclose(gw["spent"], want, rel_tol=1e-9, abs_tol=1e-12)
                               and math.isclose(gw["total_spent"], want, rel_tol=1e-9, abs_tol=1e-12)
                               and sum(len(a["bookings"]) for a in gw["audit"]) == 2 * len(admitted))}


def run(cfg, ctx) -> Result:
    from fedmem.attacks.support import cardinality_from_count, membership_report, reconstruction_report
    from fedmem.attacks.verdict import judge, sampler_label, worst
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
    n_attack = len(rounds)
    fault_rounds, fault_spec, kind_of = _fault_plan(cfg, qs, n_attack + 1, ctx.rng("faults"))
    rounds += fault_rounds
    truths = _truths(world, rounds[: a.queries], f.k_local, f.threshold, grid, f.shards)
    metrics: dict = {"wall_s": {}}

    # ---- the "ray" engine column: same shards, queries and candidate, in this process (Ray + CrypTen)
    ray_out = None
    if cfg.ray_engine.enabled:
        from fedmem.experiments.flower_ray_engine import run_ray_engine

        ctx.log(f"ray engine: {cfg.ray_engine.mpc} parties, threshold selection, {f.shards} shards")
        ray_out = run_ray_engine(f, cfg.ray_engine, data, targets, qs, a.repeats, rng_for=ctx.rng,
                                 ray_address=ctx.ray_address, log=ctx.log)
        metrics["wall_s"]["ray"] = sum(ray_out[v]["wall_s"] for v in ("undefended", "defended")) + ray_out["startup_s"]

    # ---- Flower deployments (each its own run_simulation in a spawned process)
    deployments = [("stock", None)] + [("gateway", dp) for dp in f.dp]
    runs = {}
    for dep, dp in deployments:
        key = dep if dp is None else f"gateway-{dp}"
        ctx.log(f"flower: simulating {key} ({len(rounds)} rounds, {f.shards} ClientApps)")
        runs[key] = simulate(_spec(cfg, world, rounds, dep, ctx.out_dir / "ledger.sqlite",
                                   int(ctx.rng("noise", key).integers(2 ** 31)), dp=dp, faults=fault_spec),
                             timeout_s=f.timeout_s)
        metrics["wall_s"][key] = runs[key]["wall_s"]

    m = f.shards
    eps_flower_claim = _eps_of(f.flower_sigma, f.delta)
    rows = []
    mrng = ctx.rng("audit")
    attack_rounds = rounds[:n_attack]

    defended_rows: list[bool] = []

    verdicts: list = []

    def add_row(engine, observer, est, pos, neg, booked, defended, sampling=None, extra=None):
        # One verdict rule (fedmem.attacks.verdict.judge) against what this observer's release booked
        # (eps per round at delta; nothing booked = 0). A float-sampler release is labelled not DP.
        defended_rows.append(defended)
        rec_rep = reconstruction_report(est, truths, a.tolerance, a.alpha)
        mem = membership_report(pos, neg, delta=f.delta, rng=mrng, epsilon_claim=booked if booked > 0 else math.inf,
                                alpha=a.alpha)
        v = judge(pos, neg, booked, f.delta if booked > 0 else 0.0, alpha=a.alpha,
                  rng=np.random.default_rng(mrng.integers(2 ** 31)))
        verdicts.append(v)
        float_label = sampler_label(sampling) if sampling is not None else None
        text = v.text + (f"; {float_label}" if float_label else "")
        rows.append([engine, observer, f"{rec_rep.rate:.0%} [{rec_rep.ci[0]:.0%}, {rec_rep.ci[1]:.0%}]",
                     f"{rec_rep.chance_rate:.0%}", f"{mem.auc:.3f} [{mem.auc_ci[0]:.3f}, {mem.auc_ci[1]:.3f}]",
                     f"{mem.tpr_at_1:.3f}", f"{v.eps_lower:.2f} (power {v.power:.2f})",
                     f"{booked:.2f}" if booked > 0 else "nothing booked", text])
        metrics.setdefault("rows", {})[f"{engine} | {observer}"] = {
            "reconstruction": rec_rep.as_dict(), "membership": mem.as_dict(), "verdict": v.as_dict(),
            "verdict_text": text, "sampling": sampling, "booked_eps_per_round": booked, **(extra or {})}

    for key, recs in ((k, r["records"]) for k, r in runs.items()):
        gw = runs[key]["gateway"]
        booked = gw["epsilon_per_round"] if gw else 0.0
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
            add_row(engine, obs_label, est, pos, neg, booked,
                    defended if who != "server" else gw is not None,
                    sampling=sampling if who == "agent" else None,
                    extra={"answered": answered if who != "server" else None})

    if ray_out is not None:
        from fedmem.experiments.flower_ray_engine import column_config, config_summary

        for variant in ("undefended", "defended"):
            x = ray_out[variant]
            config = column_config(f, cfg.ray_engine, variant)
            booked = float(max(x["booked"])) if x["booked"] else 0.0
            metrics.setdefault("ray_engine_configs", {})[variant] = config_summary(config)
            label = ("Ray engine, undefended (exact receipts, gateway off)" if variant == "undefended" else
                     f"Ray engine, defended (noised receipts sigma {cfg.ray_engine.receipt_sigma:g}, gateway on)")
            add_row(label, "querying agent: Response (value, receipts)",
                    x["estimates"], x["pos"], x["neg"], booked, variant == "defended",
                    extra={"truth_mismatches_vs_flower": int(sum(t1 != t2 for t1, t2 in zip(x["truths"], truths))),
                           "refused": x["refused"], "wall_s": x["wall_s"]})

    # ---- faults
    fault_rows, faults = [], {}
    for key, out in runs.items():
        flower_dp = key in ("stock", "gateway-flower")
        label = "Flower, stock" if key == "stock" else f"Flower + fedmem gateway (dp={key.split('-', 1)[1]!r})"
        r_, d_ = _fault_rows(label, out, kind_of, f, a.alpha, flower_dp)
        fault_rows += r_
        faults[key] = d_
        if out["gateway"]:
            faults[key]["ledger"] = _ledger_check(out, f.delta)
    metrics["faults"] = faults
    metrics["epsilon_per_round_booked"] = {k: r["gateway"]["epsilon_per_round"] for k, r in runs.items()
                                           if r["gateway"]}
    metrics["flower_claimed_eps_per_round"] = eps_flower_claim
    metrics["gateway_decisions"] = {k: {d: sum(1 for x in r["gateway"]["audit"] if x["decision"] == d)
                                        for d in ("admitted", "refused", "fault")}
                                    for k, r in runs.items() if r["gateway"]}
    metrics["gateway_spent_eps"] = {k: r["gateway"]["spent"] for k, r in runs.items() if r["gateway"]}
    overall = worst([v for v, d in zip(verdicts, defended_rows) if not d])
    metrics["verdict_undefended"] = overall
    metrics["verdict_defended"] = worst([v for v, d in zip(verdicts, defended_rows) if d])
    ledgers = {k: v.get("ledger", {}).get("consistent") for k, v in faults.items() if "ledger" in v}
    tables = [
        Table("Stock Flower vs Flower + fedmem gateway vs the Ray engine (same shards, queries and candidate)",
              ["engine / deployment", "observer", "shards within +-tol [95% CI]", "chance (best constant)",
               "differencing AUC [95% CI]", "TPR@1%FPR", "empirical eps (CP lower)", "booked eps / round",
               "verdict"], rows,
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
              fault_rows,
              note=f"fail: one ClientApp raises in fit (SecAgg+'s masked-vector stage: an error reply). dropout: "
                   f"{cfg.faults.dropout_clients} ClientApps reply {cfg.faults.stall_s:g} s after the round's "
                   f"deadline ({cfg.faults.deadline_s:g} s, SecAggPlusWorkflow timeout): no error reaches the "
                   f"server, it just gets fewer replies. Noise std measured from the released aggregate minus the "
                   f"inner strategy's aggregate (both recorded), pooled over coordinates and rounds, chi-square CI. "
                   f"Gateway ledgers equal the composition of admitted rounds (nothing lost): {ledgers}."),
    ]
    sections = [("What each observer sees", _explain(f)), ("Faults, read", _explain_faults(faults, m))]
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


def _explain_faults(faults, m) -> str:
    lines = []
    st = faults.get("stock", {})
    if "fail" in st:
        x = st["fail"]
        lines.append(f"- Stock Flower, a ClientApp raises: the workflow reports {', '.join(map(str, x['failures']))} "
                     f"failure(s) per round for one "
                     f"client (SecAgg+ appends a masked-vector-stage error twice) and Flower's "
                     f"DifferentialPrivacyClientSideFixedClipping returns no aggregate when there are failures: "
                     f"{x['released']}/{len(x['rounds'])} released.")
    if "dropout" in st:
        x = st["dropout"]
        s = (f"- Stock Flower, silent dropout: {', '.join(map(str, x['replies']))} replies of {m}, no failure, and "
             f"Flower's DP wrapper "
             f"aggregates what came: {x['released']}/{len(x['rounds'])} released, with "
             f"{x['flower_reply_count_warnings']} reply-count warning(s) in the log.")
        if "noise_std_measured" in x:
            s += (f" The noise it added has std {x['noise_std_measured']:.4f} (95% CI {x['noise_std_ci'][0]:.4f}.."
                  f"{x['noise_std_ci'][1]:.4f}, {x['samples']} samples), i.e. calibrated to num_sampled_clients "
                  f"({x['noise_std_calibrated']:.4f}), while the mean over {min(x['replies_released'])} replies needs "
                  f"{x['noise_std_needed']:.4f} for the claimed epsilon: delivered {x['eps_delivered']:.2f} vs "
                  f"claimed {x['eps_claimed']:.2f} per round. Flower only warns; there is no strict mode.")
        lines.append(s)
    for k, v in faults.items():
        if k == "stock":
            continue
        led = v.get("ledger", {})
        rel = sum(v[x]["released"] for x in ("fail", "dropout") if x in v)
        bk = sum(v[x]["bookings"] for x in ("fail", "dropout") if x in v)
        dec = sorted({d for x in ("fail", "dropout") if x in v for d in v[x]["gateway_decisions"]})
        lines.append(f"- {k}: fault rounds released {rel}, booked {bk} ({', '.join(dec)}); ledger: "
                     f"{led.get('admitted')} admitted rounds, {led.get('bookings')} bookings, principal spent "
                     f"{led.get('principal_spent', float('nan')):.2f} = composition of the admitted rounds "
                     f"{led.get('expected', float('nan')):.2f}: {'consistent' if led.get('consistent') else 'MISMATCH'}.")
    return "\n".join(lines) if lines else "No fault rounds."


EXPERIMENTS = {
    "flower.support_leak": Experiment(
        "flower.support_leak",
        "papers/003 support attacks on Flower (SecAgg+, DP wrapper): stock vs fedmem's gateway strategy vs the "
        "Ray engine, plus faults.",
        SCHEMA, run, _cross),
}
