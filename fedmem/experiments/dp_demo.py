"""``dp.demo``: a short tour of the DP core that a new user can read in one screen.

Releases the mean of a private synthetic dataset several times with the Gaussian
mechanism (calibrated by the analytic Gaussian), books every release in a durable
accountant before it is emitted until the budget refuses, runs a few exponential-
mechanism selections against a per-attribute ledger, and compares the empirical error
with the calibrated sigma. It also counts how many exponential-mechanism selections the
release budget would admit when they are booked as bounded-range (eps^2/8-zCDP) versus
by basic composition.

Finally it audits one release as an adversary would (:func:`float_bits_audit`): two
neighbouring datasets (record 0 replaced), ``audit.trials`` releases per world, each scored by
the float low-bit reachability attack (:mod:`fedmem.attacks.float_bits`) and judged by the
one verdict rule (:func:`fedmem.attacks.verdict.judge`) against the epsilon one release books,
for the configured sampler and, for comparison, the other one. With ``sampling = "fast"`` the
release is not DP (the report says so: "not DP (float sampler)").
"""

from __future__ import annotations

import numpy as np

from fedmem import _validate as V
from fedmem.dp import (
    Accountant,
    AttributeLedger,
    DurableStore,
    ExponentialMechanism,
    GaussianMechanism,
    PureDpEvent,
)
from fedmem.errors import BudgetExceeded
from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, open_unit, positive
from fedmem.attacks import float_bits as FB

SCHEMA = {
    "data": {
        "records": Param(int, 1000, "number of private records", check=positive),
        "dim": Param(int, 8, "dimension of each record's value vector", check=positive),
        "clip": Param(float, 1.0, "L2 clip norm of each record", check=positive),
    },
    "release": {
        "epsilon": Param(float, help="required: epsilon of one Gaussian mean release", check=positive),
        "delta": Param(float, help="required: delta of one release and of the budget", check=open_unit),
        "budget_epsilon": Param(float, help="required: accountant budget (epsilon at delta)", check=positive),
        "attempts": Param(int, 10, "releases attempted (the budget stops some)", check=positive),
        "sampling": Param(str, "secure", "noise sampler (fast: float samplers, not DP as released)",
                          choices=("fast", "secure")),
        "accountant": Param(str, "pld", "composition backend (pld: tight; rdp: faster, looser)",
                            choices=("rdp", "pld")),
    },
    "audit": {
        "trials": Param(int, 100, "releases per world of the float low-bit membership game (0: skip)",
                        check=lambda v: None if isinstance(v, int) and v >= 0 and v != 1 else
                        f"must be 0 or an integer >= 2, found {v!r}"),
    },
    "selection": {
        "cap": Param(float, help="required: per-attribute cap B_a of the ledger", check=positive),
        "epsilon": Param(float, help="required: epsilon of one exponential-mechanism selection", check=positive),
        "turns": Param(int, 6, "selections attempted", check=positive),
        "max_fit": Param(int, 1000, "stop counting selections that fit in the release budget here",
                         check=positive),
    },
}


def selections_that_fit(kind: str, budget: tuple[float, float], event, limit: int) -> int:
    """How many copies of ``event`` a fresh accountant with ``budget`` admits (at most ``limit``)."""
    acc = Accountant(kind, budget=budget)
    n = 0
    while n < limit and acc.fits([event]):
        acc.book(event)
        n += 1
    return n


def float_bits_audit(x: np.ndarray, mech, sampling: str, trials: int, rng, delta: float):
    """Membership game on one mean release ``fl(mean + Z)``: the world with ``x`` against the
    neighbour with record 0 replaced by its negation (replace-one, the relation the mechanism is
    calibrated for). Each release is scored by the float low-bit reachability attack; returns
    (AUC, Verdict) against the epsilon of one release at ``delta``."""
    from fedmem.attacks import audit  # lazy: loads sklearn, scipy, numpy (~2.6 s)
    from fedmem.attacks.verdict import judge  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    x_nb = x.copy()
    x_nb[0] = -x_nb[0]
    m_in, m_out = x.mean(axis=0), x_nb.mean(axis=0)      # the adversary computes both offline
    model = FB.model_for("gaussian", sampling, mech.sigma)
    v_in = np.array([mech.release(m_in, rng, sampling=sampling) for _ in range(trials)])
    v_out = np.array([mech.release(m_out, rng, sampling=sampling) for _ in range(trials)])
    pos = FB.release_scores(v_in, m_in, m_out, 1.0, model)
    neg = FB.release_scores(v_out, m_in, m_out, 1.0, model)
    return audit.roc_auc(pos, neg), judge(pos, neg, mech.epsilon(delta), delta)


def run(cfg, ctx) -> Result:
    rng = ctx.rng("data")
    d = cfg.data
    x = rng.normal(size=(d.records, d.dim))
    x *= np.minimum(1.0, d.clip / np.linalg.norm(x, axis=1, keepdims=True))
    exact = x.mean(axis=0)
    # Replacing one record moves the mean by at most 2*clip/n in L2.
    mech = GaussianMechanism.calibrate(cfg.release.epsilon, cfg.release.delta, 2 * d.clip / d.records)
    store = DurableStore(ctx.out_dir / "ledger.sqlite")
    acc = Accountant(cfg.release.accountant, store=store, name="demo",
                     budget=(cfg.release.budget_epsilon, cfg.release.delta))
    noise_rng = ctx.rng("noise")
    rows, errors, refused = [], [], 0
    attempts = cfg.release.attempts
    state: dict = {}   # phases: an interrupted run resumed with --resume restores completed phases
    if not ctx.resume_phase("releases", state, rows, errors):
        for i in ctx.progress(range(attempts), description="mean releases"):
            try:
                acc.book(mech.event(), label=f"mean release {i}")
            except BudgetExceeded:
                # every attempt books the same event and budgets only grow: once one is refused, all
                # later ones are too. Stop here instead of looping through the rest (they are refused).
                rest = attempts - i
                refused += rest
                rows.append([i if rest == 1 else f"{i}..{attempts - 1}",
                             "refused by budget" + ("" if rest == 1 else f" (all {rest}: the budget is spent)"), "-",
                             acc.spent(cfg.release.delta)])
                break
            released = mech.release(exact, noise_rng, sampling=cfg.release.sampling)
            err = float(np.sqrt(np.mean((released - exact) ** 2)))
            errors.append(err)
            rows.append([i, "released", err, acc.spent(cfg.release.delta)])
        state["refused"] = refused
        ctx.phase_done("releases", state, rows, errors)
    refused = state["refused"]

    ledger = AttributeLedger({"diabetes": cfg.selection.cap, "debt": cfg.selection.cap}, store=store, name="demo")
    em = ExponentialMechanism(cfg.selection.epsilon, sensitivity=0.6)
    sel_rng = ctx.rng("selection")
    sel_rows = []
    if not ctx.resume_phase("selections", state, sel_rows):
        for t in range(cfg.selection.turns):
            attrs = ["diabetes"] if t % 2 == 0 else ["diabetes", "debt"]
            if ledger.try_charge(attrs, em.epsilon, label=f"turn {t}"):
                choice = em.select(sel_rng.random(4), sel_rng)
                sel_rows.append([t, "+".join(attrs), f"view {choice}", ledger.spent("diabetes"),
                                 ledger.spent("debt")])
            else:
                sel_rows.append([t, "+".join(attrs), "generic (cap reached)", ledger.spent("diabetes"),
                                 ledger.spent("debt")])
        ctx.phase_done("selections", state, sel_rows)

    budget = (cfg.release.budget_epsilon, cfg.release.delta)
    fit_basic = selections_that_fit(cfg.release.accountant, budget, PureDpEvent(em.epsilon), cfg.selection.max_fit)
    fit_zcdp = selections_that_fit(cfg.release.accountant, budget, em.event(), cfg.selection.max_fit)

    from fedmem.attacks.verdict import sampler_label  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    audit_rows, audit_metrics = [], {}
    if cfg.audit.trials:
        configured = cfg.release.sampling
        for samp in (configured, "secure" if configured == "fast" else "fast"):
            auc, v = float_bits_audit(x, mech, samp, cfg.audit.trials, ctx.rng("audit", samp), cfg.release.delta)
            tag = "" if samp == configured else " (for comparison)"
            audit_rows.append([f"float low bits, sampling={samp}{tag}", f"{cfg.audit.trials}/{cfg.audit.trials}",
                               auc, v.eps_lower, v.eps_booked, v.power,
                               v.text + (f"; {sampler_label(samp)}" if sampler_label(samp) else "")])
            audit_metrics[samp] = dict(v.as_dict(), auc=auc, sampler=sampler_label(samp))
    rmse = float(np.mean(errors)) if errors else float("nan")
    metrics = {
        "sigma": mech.sigma, "released": len(errors), "refused": refused,
        "epsilon_spent": acc.spent(cfg.release.delta), "mean_rmse": rmse,
        "ledger_spent": ledger.spent(),
        "em_selections_fit_basic": fit_basic, "em_selections_fit_zcdp": fit_zcdp,
    }
    if audit_metrics:
        mine = audit_metrics[cfg.release.sampling]
        metrics["float_bits"] = audit_metrics
        metrics["verdict"] = mine["label"]
        metrics["verdict_text"] = mine["text"]
    if sampler_label(cfg.release.sampling):
        metrics["sampler"] = sampler_label(cfg.release.sampling)
    return Result(
        metrics=metrics,
        tables=[
            Table("Gaussian mean releases (booked before release)",
                  ["attempt", "outcome", "RMSE vs exact", "epsilon spent (ledger total)"], rows,
                  note=f"sigma={mech.sigma:.4g} per coordinate (expected RMSE = sigma); "
                       f"budget {cfg.release.budget_epsilon} at delta={cfg.release.delta}"),
            Table("Exponential-mechanism selections against per-attribute caps",
                  ["turn", "charged attributes", "released", "L_diabetes", "L_debt"], sel_rows,
                  note=f"cap B_a={cfg.selection.cap}, epsilon per selection {cfg.selection.epsilon}"),
            Table("Exponential-mechanism selections that fit in the release budget",
                  ["booking", "selections admitted"],
                  [["basic composition (epsilons summed)", fit_basic],
                   ["bounded range: eps^2/8-zCDP, or basic if smaller", fit_zcdp]],
                  note=f"budget {cfg.release.budget_epsilon} at delta={cfg.release.delta}, "
                       f"{cfg.release.accountant} accountant, counting stops at {cfg.selection.max_fit}"),
        ] + ([Table("Audit: one release attacked through its float low bits",
                    ["attack", "n pos/neg", "AUC", "empirical eps (CP lower)", "booked eps (one release)", "power",
                     "verdict"], audit_rows,
                    note="Neighbours: record 0 replaced by its negation. The adversary replays numpy's samplers "
                         "bit for bit and counts the coordinates each world cannot have produced "
                         "(fedmem.attacks.float_bits); one rule decides the verdict (fedmem.attacks.verdict.judge). "
                         "A fast float sampler is not DP as released, whatever epsilon is booked.")]
             if audit_rows else []),
    )


def cross_checks(cfg) -> list[tuple[str, str]]:
    """Problems found before anything runs: sizes that cannot fit, epsilons no solver can calibrate."""
    problems = []
    d, r = cfg.data, cfg.release
    mem = V.memory_problem(f"data.records={d.records} x data.dim={d.dim}", 3.0 * 8.0 * d.records * d.dim)
    if mem:
        problems.append(("data.records", mem))
    try:
        GaussianMechanism.calibrate(r.epsilon, r.delta, 1.0)
    except (ValueError, ArithmeticError, RuntimeError) as exc:
        problems.append(("release.epsilon", f"cannot calibrate a Gaussian mechanism for epsilon={r.epsilon!r}, "
                                            f"delta={r.delta!r} ({type(exc).__name__}); use a moderate epsilon "
                                            "(e.g. 0.01-50)"))
    return problems


EXPERIMENTS = {
    "dp.demo": Experiment("dp.demo", "Tour of the DP core: calibrated releases, budgeted accountant, ledger.",
                          SCHEMA, run, cross_checks),
}
