"""Experiment kind ``federation.support_leak``: papers/003's 40-shard attack scenario, undefended or defended.

One run builds clustered shards (:mod:`fedmem.bench.shards`), a :class:`Federation`
configured from ``[federation]`` (a mirror of :class:`FederationConfig`; the security
keys are required), and runs the adversary library of :mod:`fedmem.attacks` through the
public client API only (``Federation.connect()``):

(a) **reconstruction**: an :class:`~fedmem.attacks.adaptive.AdaptiveAdversary` (one
    principal) asks ``attack.queries`` adaptive queries; each answer's support channel is
    read back into a contributing-set size and compared with the truth. Every forwarded
    response is classified as support-leaky or not from the ground truth, and its
    bookings are compared with the channels it carried.
Membership games (:func:`run_games`): for each of ``attack.targets`` worst-case candidate
    records, a world with it and one without, alive at once; every trial from a fresh
    principal, the epsilon booked for it read from the federation's accountant. Attacks:
    (b) differencing, (c) noise scale, refusal content, admission oracle (offline boundary
    search), timing (interleaved), silent-retry and near-duplicate averaging, float low bits
    (:mod:`fedmem.attacks.float_bits`, on the same trials as the value attacks). Each gives
    AUC (+CI), TPR@1%FPR, a Clopper-Pearson epsilon lower bound and a verdict against the
    booked epsilon (one rule: :func:`fedmem.attacks.verdict.judge`). The games lift the budgets
    (budget refusals are public, lifting them only helps the adversary).
**principal spreading** (:func:`run_spreading`): a Sybil over many principals with fresh
    labels, under the scenario's real budgets.
(d) **retries**: one query re-asked ``r`` times (declared and silent); the averaged
    release's error and the booked epsilon after ``r`` releases.

The report has tables (attack metrics with one verdict each and an overall verdict,
reconstruction, gateway and accounting, refusals by reason, utility, spreading,
retries) and plots (reconstructed vs true cardinality, membership ROC with the DP
ceiling of the booked epsilon, booked vs empirical epsilon).

The code: this module (scenario keys, checks, the run and its phases),
:mod:`fedmem.experiments.support_leak_games` (the attack games against a running federation),
:mod:`fedmem.experiments.support_leak_report` (verdicts, tables, ``queries.csv``, the reading)
and :mod:`fedmem.experiments.support_leak_plots` (the plots).
"""


from __future__ import annotations

import time

import numpy as np

from fedmem.attacks.federation_games import ATTACKS, GAME_ATTACKS, is_broadcast
from fedmem.bench.shards import clustered_data
from fedmem.experiments.support_leak_games import (AttackParams, NewFederation, QueryRecord, run_games,
                                                 run_reconstruction, run_retries, run_spreading)
from fedmem.experiments.support_leak_plots import _plot_eps, _plot_roc
from fedmem.experiments.support_leak_report import (GAME_LABELS, explain, game_row, overall_verdict,
                                                    reconstruction_tables, variant_label, write_queries)
from fedmem.federation import services
from fedmem.federation.config import FederationConfig
from fedmem.attacks.verdict import sampler_label
from fedmem.params import schema_of
from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, at_least, nonnegative, open_unit, positive

# ---------------------------------------------------------------------------- schema
# The [federation] section is FederationConfig's own knobs (one source of truth); a scenario
# must state every key that decides what leaves the federation and what is booked.
SECURITY_KEYS = ("selection", "calibration", "receipts", "gateway", "on_reject", "support_budget_bits",
                 "total_support_budget_bits", "epsilon_budget", "total_epsilon_budget")
FEDERATION_SCHEMA = schema_of(FederationConfig, required=SECURITY_KEYS)

SCHEMA = {
    "federation": FEDERATION_SCHEMA,
    "data": {
        "clusters": Param(int, 12, "topic clusters (rare topics on few shards, common on all)", check=positive),
        "spread": Param(float, 0.35, "spread of keys around their topic centre", check=positive),
        "generate_at_hosts": Param(bool, False, "every shard host generates its own shards from a seeded recipe "
                                   "(fedmem.bench.shards.ShardRecipe): no record crosses from the driver to the hosts; "
                                   "a different random stream than false (docs/cluster.md)"),
    },
    "attack": {
        "attacks": Param(list, list(ATTACKS), "attacks to run", item_type=str,
                         check=lambda v: None if set(v) <= set(ATTACKS) and v else
                         f"must be a non-empty subset of {list(ATTACKS)}, found {v!r}"),
        "queries": Param(int, 300, "adaptive queries of the reconstruction attack", check=positive),
        "tolerance": Param(int, 2, "reconstruction counts as a hit within this many shards", check=nonnegative),
        "anchor_noise": Param(float, 0.3, "how far the adversary's public topic hints are from the true centres",
                              check=nonnegative),
        "step": Param(float, 0.6, "adversary's largest perturbation radius", check=positive),
        "explore": Param(float, 0.3, "adversary's exploration probability", check=lambda v: None if 0 <= v <= 1
                         else f"must be in [0, 1], found {v!r}"),
        "targets": Param(int, 8, "candidate records of the membership games", check=positive),
        "repeats": Param(int, 100, "queries per target and world in the membership games (a Clopper-Pearson "
                         "bound from T trials per world cannot exceed about ln(T/7))", check=at_least(4)),
        "r": Param(int, 4, "queries per trial of retry_averaging and near_duplicate (values averaged)",
                   check=positive),
        "near_duplicate_radius": Param(float, 0.05, "angle (radians) of near-duplicate queries from the target "
                                       "query", check=nonnegative),
        "timing_trials": Param(int, 40, "timed single queries per target and world (interleaved between worlds)",
                               check=at_least(4)),
        "references": Param(int, 5, "reference queries on the known neighbour (refusal_content's categories)",
                             check=positive),
        "boundary_tolerance": Param(int, 2, "admission_oracle: the |n - n_bound| <= tolerance rule whose boundary "
                                    "the adversary searches for offline", check=nonnegative),
        "sybils": Param(int, 8, "principal_spreading: principals the adversary connects", check=positive),
        "sybil_queries": Param(int, 64, "principal_spreading: queries spread over the sybils", check=positive),
        "retry_counts": Param(list, [1, 2, 4, 8, 16], "retry counts r of the silent-retry attack", item_type=int,
                              check=lambda v: None if v and all(x >= 1 for x in v) else
                              f"must be a non-empty list of integers >= 1, found {v!r}"),
        "neighbours": Param(str, "replace-one", "neighbouring relation of the membership games: replace-one (shard "
                            "sizes are public: the world without the target holds a filler record in its slot) or "
                            "add-remove (shard sizes differ between the worlds)",
                            choices=("replace-one", "add-remove")),
        "alpha": Param(float, 0.05, "confidence level of CIs and epsilon lower bounds (1 - alpha)",
                       check=open_unit),
        "accountant": Param(str, "rdp", "composition backend", choices=("rdp", "pld")),
    },
}


def cross_checks(cfg) -> list[tuple[str, str]]:
    """Cross-field problems, all reported at once (ScenarioError lists them): FederationConfig's own
    rules, plus one a scenario file must make explicit (broadcast receipts need broadcast selection)."""
    f = cfg.federation
    problems = [(f"federation.{key}", msg) for key, msg in FederationConfig.problems(f)]
    if f.receipts == "broadcast" and f.selection != "broadcast":
        problems.append(("federation.receipts", "receipts='broadcast' needs selection='broadcast' "
                                                f"(found selection={f.selection!r})"))
    return problems


def memory(cfg) -> list[tuple[str, str, float]]:
    """Up-front memory estimate (fedmem.scenario refuses what cannot fit, naming the key): a lower
    bound, the shards' keys and values at 4 bytes a number, and one record per adaptive query."""
    f, a = cfg.federation, cfg.attack
    per_record = 4.0 * (f.key_dim + f.value_dim)
    factors = {"federation.shards": (f.shards, 40), "federation.records_per_shard": (f.records_per_shard, 50),
               "federation.key_dim": (f.key_dim, 128), "federation.value_dim": (f.value_dim, 128)}
    key = max(factors, key=lambda k: factors[k][0] / factors[k][1])   # the size furthest above its default
    sizes = ", ".join(f"{k}={v}" for k, (v, _) in sorted(factors.items(), key=lambda kv: -kv[1][0]))
    return [(key, f"the shards' records ({sizes})", per_record * f.shards * f.records_per_shard),
            ("attack.queries", f"the per-query log of attack.queries={a.queries} adaptive queries (about 4 KiB each)",
             4096.0 * a.queries)]


# ------------------------------------------------------------------------------ run
def attack_params(cfg) -> AttackParams:
    """The ``[attack]`` knobs the game runners use, as plain values."""
    a = cfg.attack
    return AttackParams(attacks=tuple(a.attacks), queries=a.queries, anchor_noise=a.anchor_noise, step=a.step,
                        explore=a.explore, targets=a.targets, repeats=a.repeats, r=a.r,
                        near_duplicate_radius=a.near_duplicate_radius, timing_trials=a.timing_trials,
                        references=a.references, boundary_tolerance=a.boundary_tolerance, sybils=a.sybils,
                        sybil_queries=a.sybil_queries, retry_counts=tuple(a.retry_counts), neighbours=a.neighbours,
                        accountant=a.accountant)


def federation_factory(ray_address, parties) -> NewFederation:
    """``new_federation(config, data, accountant, rng)`` on this run's Ray and compute parties.
    It looks up :func:`fedmem.federation.services.make_federation` at each call (tests substitute it)."""
    def new_federation(config, data, accountant, rng):
        return services.make_federation(config, data, accountant=accountant, rng=rng, ray_address=ray_address,
                                        parties=parties)
    return new_federation


def make_data(cfg, rng):
    """The clustered shard data (benchmark content, injected into the federation; moved here
    from ``fedmem.federation.services`` so the federation layer never imports ``fedmem.bench``)."""
    f = cfg.federation
    return clustered_data(f.shards, f.records_per_shard, f.key_dim, f.value_dim, f.clip, rng,
                          clusters=cfg.data.clusters, spread=cfg.data.spread, at_hosts=cfg.data.generate_at_hosts)


def run(cfg, ctx) -> Result:
    from fedmem.dp import Accountant, DurableStore   # here: fedmem.dp costs ~1 s of start-up (-X importtime)

    f, a = cfg.federation, cfg.attack
    store = DurableStore(ctx.out_dir / "ledger.sqlite")

    def world_accountant(name: str):
        return Accountant(a.accountant, store=store, name=name)

    data = make_data(cfg, ctx.rng("data"))
    metrics: dict = {"variant": variant_label(f), "budgets": {k: f[k] for k in (
        "epsilon_budget", "total_epsilon_budget", "support_budget_bits", "total_support_budget_bits")}}
    tables: list[Table] = []
    sections: list[tuple[str, str]] = []
    attack_rows, eps_rows = [], []
    mrng = ctx.rng("audit")

    svc = services.Services(cfg, ctx.ray_address)
    try:
        _run_attacks(cfg, ctx, data, federation_factory(ctx.ray_address, svc.parties), world_accountant, metrics,
                     tables, attack_rows, eps_rows, mrng)
    finally:
        svc.close()
    overall = overall_verdict([r[-1] for r in attack_rows])
    metrics["verdict"] = overall
    sampler = sampler_label(f.sampling)
    if sampler:
        metrics["sampler"] = sampler
    tables.insert(0, Table("Attack metrics (what the adversary got vs what was booked for it)",
                           ["attack", "success rate", "n pos/neg", "AUC", "AUC 95% CI", "TPR@1%FPR",
                            "empirical eps (CP lower)", "booked eps (what it saw)", "power", "verdict"], attack_rows,
                           note=f"Overall verdict: {overall}." + (f" Noise sampler: {sampler}." if sampler else "")
                                + " One rule (fedmem.attacks.verdict.judge): LEAK when the Clopper-Pearson bound "
                                "exceeds what was booked or the ROC lies provably above the DP ceiling of the booking "
                                "(an exact channel is LEAK whatever the trial count); within booked only when the "
                                "power (the bound a perfect attack reaches with these trials) is at least the "
                                "booking, else no leak seen. When every answer a row saw booked Gaussian "
                                "events only (exactly mu-GDP), the whole-ROC Gaussian-DP test runs too: LEAK "
                                "when its lower bound on mu exceeds the booked mu, and its power counts for "
                                "within booked (metrics: mu_booked, mu_lower, mu_power). Success rate: "
                                "reconstruction within tolerance, or "
                                "balanced accuracy of the held-out threshold test. Empirical eps: Clopper-Pearson "
                                f"lower bound ({1 - a.alpha:.0%}), threshold chosen on a held-out half. Booked eps: "
                                "composed epsilon of the answers one trial of the attack saw, the smaller of the two "
                                "worlds' (0 if it saw only refusals)."))
    if eps_rows:
        _plot_eps(ctx, eps_rows)
    sections.append(("How to read this", explain(cfg, metrics)))
    return Result(metrics=metrics, tables=tables, sections=sections)



def _run_attacks(cfg, ctx, data, new_federation, world_accountant, metrics, tables, attack_rows, eps_rows, mrng):
    f, a = cfg.federation, cfg.attack
    config, params = services.federation_config(cfg), attack_params(cfg)   # the library objects of the runners
    phases = metrics.setdefault("phase_seconds", {})
    records: list[QueryRecord] = []
    t0 = time.perf_counter()
    keep = (metrics, tables, attack_rows, eps_rows)   # what a phase adds; restored on --resume (RunContext)
    if "reconstruction" in a.attacks and not ctx.resume_phase("reconstruction", *keep):
        acc = world_accountant("main")
        fed = new_federation(config, data, acc, ctx.rng("engine", "main"))
        try:
            records = run_reconstruction(config, params, data, fed, acc, ctx.rng, ctx.progress)
        finally:
            fed.close()
        metrics.update(reconstruction_tables(records, cfg, tables, attack_rows, ctx))
        costs = [(r.mpc_rounds, r.mpc_bytes, r.mpc_batch) for r in fed.audit if r.mpc_rounds is not None]
        if costs:   # public MPC cost (shapes only), into results.json
            metrics["mpc"] = {"queries": len(costs), "rounds_per_query": sorted({c[0] for c in costs}),
                              "bytes_per_query_median": float(np.median([c[1] / c[2] for c in costs])),
                              "bytes_per_query_max": float(max(c[1] / c[2] for c in costs))}
        write_queries(ctx, records)
        phases["reconstruction"] = round(time.perf_counter() - t0, 2)
        ctx.phase_done("reconstruction", *keep)

    t0 = time.perf_counter()
    if set(GAME_ATTACKS) & set(a.attacks) and not ctx.resume_phase("membership", *keep):
        game = run_games(config, params, data, new_federation, world_accountant, ctx.rng, ctx.progress)
        eps_one = float(np.median(game["eps_one"])) if game["eps_one"] else 0.0
        metrics["membership_queries"] = game["queries"]
        metrics["membership_refused"] = game["refused"]
        metrics["booked_epsilon_per_query"] = eps_one
        metrics["boundary_queries_found"] = game["boundary_found"]
        roc = {}
        for name in GAME_ATTACKS:
            if name in game:      # the attacks asked for, plus float_bits wherever values are read
                game_row(name, GAME_LABELS[name], game, f, a, mrng, metrics, attack_rows, eps_rows, roc)
        if game["n_target"]:
            n_small = int(np.min(game["n_target"]))
            if f.calibration == "global" and not is_broadcast(f) and f.selection == "threshold":
                from fedmem.federation.aggregator import delivered_epsilon  # lazy: loads dp_accounting (~410 ms)

                eff = delivered_epsilon(f.noise, f.sigma * max(1, n_small) / f.n_bound, f.delta)
            else:
                eff = eps_one
            metrics["effective_epsilon_smallest_n"] = eff
            metrics["target_selected_counts"] = game["n_target"]
        _plot_roc(ctx, roc, eps_one, f.delta)
        phases["membership"] = round(time.perf_counter() - t0, 2)
        ctx.phase_done("membership", *keep)

    t0 = time.perf_counter()
    if "principal_spreading" in a.attacks and not ctx.resume_phase("principal_spreading", *keep):
        rep = run_spreading(config, params, data, new_federation, world_accountant, ctx.rng)
        metrics["principal_spreading"] = rep.as_dict()
        metrics.setdefault("attacks", {})["principal_spreading"] = rep.as_dict()
        tables.append(Table("Principal spreading: one adversary, many principals and fresh labels",
                            ["principals", "queries", "answered", "support bits seen (composed)",
                             "total support budget (bits)", "eps seen (composed)", "total eps budget", "verdict"],
                            [[rep.principals, rep.queries, rep.answered, rep.support_bits_seen,
                              rep.total_support_budget_bits, rep.epsilon_seen, rep.total_epsilon_budget,
                              rep.verdict]],
                            note="Budgets are charged per principal and in total, never per caller-chosen label; "
                                 "exact (unbooked) support channels count as infinitely many bits."))
        attack_rows.append(["principal spreading (budget)", "-", f"{rep.answered}/{rep.queries} answered", "-", "-",
                            "-", "-", rep.epsilon_seen, "-", rep.verdict])
        phases["principal_spreading"] = round(time.perf_counter() - t0, 2)
        ctx.phase_done("principal_spreading", *keep)

    t0 = time.perf_counter()
    if "retries" in a.attacks and not ctx.resume_phase("retries", *keep):
        rows = run_retries(config, params, data, new_federation, world_accountant, ctx.rng)
        tables.append(Table("(d) Retry composition: averaging r releases of one query",
                            ["mode", "r asked", "released", "refused", "MSE of averaged mean",
                             "booked eps after 1", "booked eps after r"], rows,
                            note="Averaging r releases divides the noise variance by r; the booked epsilon "
                                 "must grow with r (declared: retry_of set; silent: re-asked as new queries)."))
        metrics["retries"] = [dict(zip(["mode", "r", "released", "refused", "mse", "eps_1", "eps_r"], r))
                              for r in rows]
        grew = all(r[6] >= r[5] - 1e-12 for r in rows) and any(r[6] > r[5] for r in rows if r[2] > 1)
        metrics["retries_booked"] = bool(grew) or all(r[2] <= 1 for r in rows)
        phases["retries"] = round(time.perf_counter() - t0, 2)
        ctx.phase_done("retries", *keep)
    ctx.log("phase wall seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))



EXPERIMENTS = {
    "federation.support_leak": Experiment(
        "federation.support_leak",
        "papers/003 support-leak scenario: the whole adversary library (reconstruction, differencing, noise "
        "scale, refusal content, admission oracle, timing, retry/near-duplicate averaging, principal "
        "spreading) against an undefended or defended federation, one verdict per attack.",
        SCHEMA, run, cross_checks, memory=memory),
}
