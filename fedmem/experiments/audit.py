"""``audit.tightness``: tight audits of the release mechanisms fedmem ships.

For each mechanism, the experiment

1. **searches for worst-case neighbours**: candidate canary placements (a canary record
   that enters the selection and displaces a victim record of opposite value, in several
   directions; a tally pair that moves in opposite directions; utility vectors of the
   exponential mechanism over candidate-set sizes) are compared on the *exact*,
   noise-free statistic and the pair with the largest change relative to the booked
   sensitivity (or the largest exact privacy loss, for the exponential mechanism) is kept;
2. **samples the mechanism as deployed** on both neighbours (``Aggregator.release`` with
   the secure samplers, ``ExponentialMechanism.select``, a full ``Federation.retrieve``
   with plaintext parties) and scores every release with the likelihood-ratio statistic of
   the pair (Neyman-Pearson optimal for Gaussian and Laplace noise);
3. runs the three estimators of :mod:`fedmem.attacks.tight` side by side (held-out
   Clopper-Pearson, Gaussian-DP ROC fit, one-run with many canaries where one run is
   audited) and reports, for the estimator pre-registered for the mechanism, **eps lower
   bound, eps booked, tightness = lower / booked**, trials and confidence. It also
   reports the exact epsilon of the neighbour pair found (``eps_pair``): a tightness
   below 1 splits into "the pair is not the worst case" (``eps_pair < booked``) and "the
   estimator's statistical slack" (``eps_lower < eps_pair``), both measured;
4. audits **broken variants** in the same run (half the noise, a sensitivity off by 2, a
   missing charge, the fast float sampler through the float-bit attack of
   :mod:`fedmem.attacks.float_bits`): each must come out with a lower bound above what it
   books.

Mechanisms: ``aggregator.gaussian``, ``aggregator.laplace``, ``aggregator.receipts``
(noised receipts), ``memview.em`` (DP-MemView's exponential-mechanism selection) and
``dpmind.token`` (DP-MIND's metric-DP token perturbation) and ``federation.retrieve`` (a
whole retrieval through the gateway, Ray + plaintext parties; ``[federation] enabled =
false`` skips it), ``flower.fedmem`` / ``flower.flower`` (Flower rounds through fedmem's
wrappers, ``fedmem.flower.harness``: the gateway's own release, and Flower's DP wrapper inside
the gateway) and ``brace.step`` (one BRACE step, ``brace_run`` with T = 1). Not audited: the
float low bits of ``dp="flower"`` (numpy's legacy polar Gaussian is not modelled by
:mod:`fedmem.attacks.float_bits`; the report lists it as not covered).
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedmem.attacks import tight as T
from fedmem.attacks.audit import roc_curve
from fedmem.report import Result, Table
from fedmem.scenario import Param, open_unit, positive

SCHEMA = {
    "audit": {
        "delta": Param(float, 1e-6, "delta of every booked (eps, delta) and of the GDP conversion", check=open_unit),
        "alpha": Param(float, 0.05, "1 - confidence of every lower bound", check=open_unit),
        "epsilon": Param(float, 4.0, "booked epsilon (at delta) of the audited value releases", check=positive),
        "trials": Param(int, 100_000, "releases per neighbour for the correct mechanisms", check=positive),
        "broken_trials": Param(int, 10_000, "releases per neighbour for each broken variant", check=positive),
        "plots": Param(bool, True, "draw the log-log ROC of every mechanism"),
        "familywise": Param(bool, True, "run every row at alpha / rows (Bonferroni) so that all bounds of the run "
                                        "hold at once with probability >= 1 - alpha"),
    },
    "aggregator": {
        "value_dim": Param(int, 2, "dimension of the released value vector", check=positive),
        "clip": Param(float, 1.0, "L2 clip norm C of every value vector", check=positive),
        "k": Param(int, 5, "global top-k (the public count)", check=positive),
        "shards": Param(int, 4, "shards (tallies) of the receipts release", check=positive),
        "sampling": Param(str, "secure", "noise sampler of the correct mechanisms (as deployed: secure)",
                          choices=("secure", "fast")),
        "directions": Param(int, 4, "random canary directions tried by the search, besides the axes and the "
                                    "diagonal", check=positive),
        "fast_dim": Param(int, 16, "value dimension of the fast-float-sampler variant (the float-bit attack "
                                   "reads every coordinate)", check=positive),
        "fast_trials": Param(int, 1000, "releases per neighbour of the fast-float-sampler variant", check=positive),
        "deployed": Param(int, 500, "releases per world through Aggregator.release itself (the rest are drawn "
                                    "batched from the same sampler; a KS test compares the two)", check=positive),
    },
    "memview": {
        "epsilon": Param(float, 4.0, "epsilon of one exponential-mechanism selection", check=positive),
        "max_candidates": Param(int, 256, "largest candidate set the neighbour search tries", check=positive),
    },
    "dpmind": {
        "epsilon": Param(float, 4.0, "metric-DP epsilon per unit of embedding distance", check=positive),
        "dim": Param(int, 8, "embedding dimension of the token table", check=positive),
        "distance": Param(float, 1.0, "distance between the two neighbouring token embeddings", check=positive),
        "trials": Param(int, 20_000, "releases per neighbour (dim-dimensional each)", check=positive),
    },
    "flower": {
        "enabled": Param(bool, True, "audit Flower rounds (flower.fedmem, flower.flower)"),
        "clients": Param(int, 4, "sampled clients per round (public m)", check=positive),
        "dim": Param(int, 2, "dimension of every reply", check=positive),
        "clip": Param(float, 1.0, "client-side clip C of every reply (replace-one: the sum moves by 2C)",
                      check=positive),
        "epsilon": Param(float, 4.0, "booked epsilon (at delta) of one round, both wrappers", check=positive),
        "deployed": Param(int, 150, "rounds per world through the wrapper itself (the rest batched from the same "
                                    "sampler; a KS test compares the two)", check=positive),
    },
    "brace": {
        "enabled": Param(bool, True, "audit one BRACE step (brace.step)"),
        "epsilon": Param(float, 4.0, "booked epsilon (at delta) of one BRACE step (T = 1)", check=positive),
        "r": Param(float, 1.0, "LSR radius r (the output ball is B(q, 2r))", check=positive),
        "far": Param(int, 20, "records outside every gate (distance 10 r) in the one-record-gate candidate",
                     check=positive),
        "gate": Param(int, 4000, "largest gate the neighbour search tries (records at q; the certificate "
                                 "reaches its floor 2r/n near 4000 at epsilon 4)", check=positive),
        "trials": Param(int, 100_000, "releases per neighbour bank", check=positive),
    },
    "federation": {
        "enabled": Param(bool, True, "audit one full federated retrieval (starts Ray; plaintext parties)"),
        "canaries": Param(int, 512, "canaries per retrieval (one shard and one value coordinate each)",
                          check=positive),
        "retrievals": Param(int, 200, "retrievals of the correct federation (GDP fit over all canaries)",
                            check=positive),
        "broken_retrievals": Param(int, 20, "retrievals of the half-noise federation", check=positive),
        "epsilon": Param(float, 4.0, "booked epsilon (at delta) of one retrieval's value channel", check=positive),
    },
}

ROWS_PER_SECTION = 12   # aggregator gaussian 4 + laplace 2 + receipts 2, memview.em 2, dpmind.token 2
ROWS_FLOWER, ROWS_BRACE, ROWS_FEDERATION = 6, 2, 2    # flower.fedmem 3 + flower.flower 3; brace.step 2

# The estimator registered (before any data) as the headline of each kind of mechanism.
HEADLINE = {"gaussian": "gdp_fit", "laplace": "clopper_pearson_heldout", "pure": "clopper_pearson_heldout"}


# ------------------------------------------------------------------ bookkeeping
class _Book:
    """Collects one row per audited mechanism (correct or broken) and its ROC data."""

    def __init__(self, alpha: float, delta: float):
        self.alpha, self.delta = alpha, delta
        self.mechanisms: dict = {}
        self.rows: list = []
        self.side: list = []
        self.rocs: dict = {}
        self.search: list = []

    def add(self, name: str, *, pos, neg, eps_booked: float, booked_delta: float, family: str, eps_pair: float,
            broken: str | None, rng, extra: list | None = None, seconds: float = 0.0, gdp_ok: bool = True,
            headline: str | None = None, note: str = "", ks: float | None = None):
        ests = [T.preregistered_threshold_bound(pos, neg, delta=booked_delta, alpha=self.alpha, rng=rng)]
        if gdp_ok:
            ests.append(T.gdp_audit(pos, neg, delta=booked_delta if booked_delta > 0 else self.delta,
                                    alpha=self.alpha, rng=rng))
        ests += list(extra or [])
        by = {e.method: e for e in ests}
        head = by[headline or HEADLINE[family]]
        caught = head.eps_lower > eps_booked + 1e-12
        tight = T.tightness(head.eps_lower, eps_booked)
        entry = {"eps_lower": head.eps_lower, "eps_booked": eps_booked, "delta_booked": booked_delta,
                 "tightness": tight, "method": head.method, "trials": head.trials,
                 "confidence": head.confidence, "broken": broken is not None, "eps_pair": eps_pair,
                 "caught": caught, "seconds": seconds, "deployed_vs_batched_ks_p": ks,
                 "estimators": {e.method: e.to_dict() for e in ests}}
        if broken:
            entry["variant"] = broken
        self.mechanisms[name] = entry
        verdict = ("LEAK (caught)" if caught else "within booked") if broken is None or caught else \
            "MISSED (not caught)"
        self.rows.append([name, broken or "-", head.method, head.eps_lower, eps_booked, booked_delta, eps_pair,
                          tight, head.trials, f"{head.confidence:.2%}", verdict])
        self.side.append([name] + [by[m].eps_lower if m in by else "-"
                                   for m in ("clopper_pearson_heldout", "gdp_fit", "one_run")]
                         + [f"{by['gdp_fit'].details['mu_lower']:.4g}" if "gdp_fit" in by else "-", note])
        self.rocs[name] = (pos, neg, eps_booked, booked_delta, family)


def _secure_scale_note(sampling: str) -> str:
    return "secure samplers" if sampling == "secure" else "fast float samplers"


# ------------------------------------------------------------------ aggregator value releases
def _policy(cfg, noise: str, sigma: float, *, clip=None, sampling=None, receipts="suppress", receipt_sigma=1.0,
            value_dim=None):
    from fedmem.federation.aggregator import ReleasePolicy

    a = cfg.aggregator
    return ReleasePolicy(selection="topk", shards=a.shards, k_local=a.k, clip=a.clip if clip is None else clip,
                         value_dim=a.value_dim if value_dim is None else value_dim, k=a.k, noise=noise, sigma=sigma, receipts=receipts,
                         receipt_sigma=receipt_sigma, sampling=a.sampling if sampling is None else sampling,
                         public_count=a.k)


def search_value_neighbours(clip: float, dim: int, noise: str, rng, directions: int):
    """Worst-case neighbours of a top-k sum: a canary of value ``C u`` enters the selection and
    pushes out a victim of value ``-C u`` (the other k-1 selected records are the same).

    The change of the sum is ``2 C u``; its norm in the noise's geometry (L2 for Gaussian,
    L1 for Laplace) relative to the booked sensitivity (``2C``, ``2C sqrt(d)``) is what a
    placement achieves. Tried: every axis, the diagonal, ``directions`` random unit vectors.
    Returns ``(S_D, S_D', rows)`` for the best placement (ties: the first)."""
    cands = [("axis e_%d" % i, np.eye(dim)[i]) for i in range(dim)]
    cands.append(("diagonal", np.ones(dim) / math.sqrt(dim)))
    for j in range(directions):
        u = rng.normal(size=dim)
        cands.append((f"random #{j}", u / np.linalg.norm(u)))
    sens = 2 * clip if noise == "gaussian" else 2 * clip * math.sqrt(dim)
    rows, best = [], None
    others = np.zeros(dim)            # the k-1 records selected in both worlds (their values cancel)
    for label, u in cands:
        s_in, s_out = others + clip * u, others - clip * u
        change = float(np.linalg.norm(s_in - s_out, 2 if noise == "gaussian" else 1))
        rows.append([noise, label, change, change / sens])
        if best is None or change > best[0] + 1e-12:
            best = (change, s_in, s_out, label)
    return best[1], best[2], rows, best[3], best[0] / sens


def _lr_scores(values: np.ndarray, a: np.ndarray, b: np.ndarray, noise: str) -> np.ndarray:
    """Log-likelihood-ratio statistic (up to a positive factor) of "centre a" vs "centre b"."""
    if noise == "gaussian":
        v = a - b
        return (values - (a + b) / 2) @ v
    return np.sum(np.abs(values - b) - np.abs(values - a), axis=1)


def _batched_release(mech, x: np.ndarray, n: int, rng, sampling: str, grid) -> np.ndarray:
    """``n`` releases of ``mech.release(x, rng, sampling, grid=grid)`` at once, row by row the same
    computation: the value rounded to the public grid, noise from the same exact sampler on the
    same grid at the same inflated scale (fedmem.dp.samplers, module docstring), or the fast
    float sampler added to ``x``."""
    x = np.asarray(x, dtype=np.float64)
    d = x.size
    if sampling != "secure":
        return x[None, :] + mech.noise((n, d), rng, "fast")
    from fedmem.dp import samplers

    gauss = hasattr(mech, "sigma")
    scale = mech.sigma if gauss else mech.scale
    sens = mech.l2_sensitivity if gauss else mech.l1_sensitivity
    g = samplers.grid_granularity(scale) if grid is None else grid
    infl = scale * (sens + g * (math.sqrt(d) if gauss else d)) / sens
    snapped = np.round(x / g) * g
    draw = samplers.secure_gaussian if gauss else samplers.secure_laplace
    return snapped[None, :] + draw(infl, (n, d), rng, grid=g)


def _sample_aggregator(policy, total: np.ndarray, n: int, rng, deployed: int, *, receipts: bool = False):
    """``deployed`` releases through ``Aggregator.release`` (as deployed) and ``n`` more by
    :func:`_batched_release` of the same mechanism; returns all of them and the two-sample
    Kolmogorov-Smirnov p-value of the first coordinate (deployed vs batched)."""
    from scipy.stats import ks_2samp

    from fedmem.federation.aggregator import Aggregator

    agg = Aggregator(policy)
    zero = np.zeros(policy.value_dim)
    if receipts:
        live = np.stack([agg.release(zero, policy.k, total, rng).receipts for _ in range(deployed)])
        rm = policy.receipt_mechanism()
        bulk = _batched_release(rm, total, n, rng, policy.sampling, agg._grid(rm).get("grid"))
    else:
        live = np.stack([agg.release(total, policy.k, None, rng).value for _ in range(deployed)])
        mech = policy._mechanism(policy.sigma)
        bulk = _batched_release(mech, total, n, rng, policy.sampling, agg._grid(mech).get("grid")) / policy.public_count
    p = float(ks_2samp(live[:, 0], bulk[:, 0]).pvalue) if deployed >= 20 else math.nan
    return np.concatenate([live, bulk]), p


def _audit_value(cfg, ctx, book: _Book, noise: str, search_rows: list):
    from fedmem.federation.aggregator import delivered_epsilon
    from fedmem.dp import GaussianMechanism

    A, a = cfg.audit, cfg.aggregator
    delta = A.delta
    if noise == "gaussian":
        sigma = GaussianMechanism.calibrate(A.epsilon, delta).noise_multiplier
        booked_delta = delta
    else:
        sigma = 1.0 / A.epsilon
        booked_delta = 0.0
    s_in, s_out, rows, label, frac = search_value_neighbours(a.clip, a.value_dim, noise, ctx.rng("search", noise),
                                                             a.directions)
    search_rows += [r + ["<- chosen" if r[1] == label else ""] for r in rows]

    def pair_eps(mult: float, frac_: float) -> float:
        # exact epsilon of the chosen pair: the change is frac_ of the sensitivity the noise was sized for
        return delivered_epsilon(noise, mult / frac_, delta) if noise == "gaussian" else frac_ / mult

    variants = [(None, sigma, None, a.sampling, A.trials),
                ("half_noise", sigma / 2, None, a.sampling, A.broken_trials)]
    if noise == "gaussian":
        variants.append(("sensitivity_off_by_2", sigma, a.clip / 2, a.sampling, A.broken_trials))
        variants.append(("fast_float_sampler", sigma, None, "fast", a.fast_trials))
    deployed = cfg.aggregator.deployed
    for broken, mult, clip, sampling, n in variants:
        fast = broken == "fast_float_sampler"
        dim = a.fast_dim if fast else a.value_dim
        pol = _policy(cfg, noise, mult, clip=clip, sampling=sampling, value_dim=dim)
        booked = delivered_epsilon(noise, sigma, delta)   # every variant books the claim of the declared sigma
        t0 = time.perf_counter()
        rng = ctx.rng("release", noise, broken or "correct")
        # the float-bit attack reads every coordinate that differs: the diagonal placement moves them all
        x_in, x_out = (np.full(dim, a.clip / math.sqrt(dim)), np.full(dim, -a.clip / math.sqrt(dim))) if fast \
            else (s_in, s_out)
        live = min(deployed, n)
        v_in, ks_in = _sample_aggregator(pol, x_in, n - live, rng, live)
        v_out, ks_out = _sample_aggregator(pol, x_out, n - live, rng, live)
        ks = min(ks_in, ks_out)
        true_frac = frac * (a.clip / (clip or a.clip))      # sensitivity the noise was sized for vs real change
        eps_pair = pair_eps(mult, true_frac)
        name = f"aggregator.{noise}" + (f"/{broken}" if broken else "")
        ks_note = f"; deployed vs batched KS p={ks:.2g} ({live} deployed releases per world)"
        if fast:
            from fedmem.attacks import float_bits as FB

            den = float(pol.public_count)
            mech = pol._mechanism(mult)
            model = FB.model_for(noise, "fast", mech.sigma if noise == "gaussian" else mech.scale)
            # one-sided reachability score: #coordinates NOT reachable from the neighbour's sum S_out (the
            # same statistic in both worlds; the two-sided score of FB.release_scores also subtracts the
            # count unreachable from S_in, which costs a second enumeration and is 0 in world D anyway)
            def unreachable_from_out(v):
                return (~FB.consistent(v.ravel(), np.broadcast_to(x_out, v.shape).ravel(), den, model)
                        ).reshape(v.shape).sum(axis=1).astype(np.float64)

            pos, neg = unreachable_from_out(v_in), unreachable_from_out(v_out)
            book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=booked_delta, family="pure",
                     eps_pair=math.inf, broken=broken, rng=ctx.rng("estimate", name), gdp_ok=False,
                     seconds=time.perf_counter() - t0, ks=ks,
                     note=f"one-sided float-bit reachability score (Mironov 2012; fedmem.attacks.float_bits), diagonal "
                          f"placement, value_dim {dim}" + ks_note)
            continue
        pos = _lr_scores(v_in, s_in / pol.public_count, s_out / pol.public_count, noise)
        neg = _lr_scores(v_out, s_in / pol.public_count, s_out / pol.public_count, noise)
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=booked_delta, family=noise,
                 eps_pair=eps_pair, broken=broken, rng=ctx.rng("estimate", name),
                 gdp_ok=noise == "gaussian", seconds=time.perf_counter() - t0, ks=ks,
                 note=f"LR test, {_secure_scale_note(sampling)}, noise multiplier {mult:.4g}"
                      + (f", aggregator clip {clip} vs records {a.clip}" if clip else "") + ks_note)


def _audit_receipts(cfg, ctx, book: _Book, search_rows: list):
    from fedmem.dp import GaussianMechanism
    from fedmem.federation.aggregator import TALLY_L2

    A, a = cfg.audit, cfg.aggregator
    if a.shards < 2:
        return
    rs = GaussianMechanism.calibrate(A.epsilon, A.delta).noise_multiplier
    base = np.full(a.shards, 1.0)
    # search: one record added to shard 0 (one tally moves) vs added to shard 0 displacing one of shard 1
    cands = [("+1 on one shard", base + np.eye(a.shards)[0], base),
             ("+1 / -1 on two shards", base + np.eye(a.shards)[0], base + np.eye(a.shards)[1])]
    best = max(cands, key=lambda c: np.linalg.norm(c[1] - c[2]))
    for lab, t_in, t_out in cands:
        ch = float(np.linalg.norm(t_in - t_out))
        search_rows.append(["receipts", lab, ch, ch / TALLY_L2, "<- chosen" if lab == best[0] else ""])
    _, t_in, t_out = best
    frac = float(np.linalg.norm(t_in - t_out)) / TALLY_L2
    for broken, n in ((None, A.trials), ("missing_charge", A.broken_trials)):
        pol = _policy(cfg, "gaussian", 1.0, receipts="noised", receipt_sigma=rs)
        ev = pol.receipt_mechanism()
        booked = ev.epsilon(A.delta) if broken is None else 0.0   # missing charge: the receipt event is not booked
        t0 = time.perf_counter()
        rng = ctx.rng("receipts", broken or "correct")
        live = min(cfg.aggregator.deployed, n)
        r_in, ks_in = _sample_aggregator(pol, t_in, n - live, rng, live, receipts=True)
        r_out, ks_out = _sample_aggregator(pol, t_out, n - live, rng, live, receipts=True)
        pos, neg = _lr_scores(r_in, t_in, t_out, "gaussian"), _lr_scores(r_out, t_in, t_out, "gaussian")
        eps_pair = T.gdp_epsilon(frac / rs, A.delta)
        name = "aggregator.receipts" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=A.delta, family="gaussian",
                 eps_pair=eps_pair, broken=broken, rng=ctx.rng("estimate", name), seconds=time.perf_counter() - t0,
                 ks=min(ks_in, ks_out),
                 note=f"noised tallies, receipt_sigma={rs:.4g}" + (", receipt event not booked" if broken else "")
                      + f"; deployed vs batched KS p={min(ks_in, ks_out):.2g}")


# ------------------------------------------------------------------ exponential mechanism
def search_em_neighbours(epsilon: float, sensitivity: float, max_candidates: int, trials: int, alpha: float):
    """Worst-case utility neighbours of the exponential mechanism, by exact probabilities.

    For K candidates, D has utilities ``(s, 0, ..., 0)`` and D' has ``(0, s, ..., s)`` (every
    coordinate moves by the sensitivity s, the largest change allowed); the event "candidate
    0 is chosen" has exact privacy loss ``ln(P_D(0) / P_D'(0))``, which grows to epsilon
    with K while ``P_D'(0)`` shrinks. The K kept maximises the Clopper-Pearson bound the
    test would reach with ``trials`` releases at the expected counts (public numbers only).
    Returns ``(u_D, u_D', rows)``."""
    from fedmem.attacks.audit import epsilon_lower_bound
    from fedmem.dp import ExponentialMechanism

    em = ExponentialMechanism(epsilon, sensitivity)
    rows, best = [], None
    K = 2
    while K <= max_candidates:
        u_in = np.zeros(K)
        u_in[0] = sensitivity
        u_out = np.full(K, sensitivity)
        u_out[0] = 0.0
        p, q = float(em.probabilities(u_in)[0]), float(em.probabilities(u_out)[0])
        loss = math.log(p / q)
        expect = epsilon_lower_bound(int(p * trials / 2), trials // 2, int(math.ceil(q * trials / 2)), trials // 2,
                                     alpha=alpha)
        rows.append(["em", f"K={K}", loss, loss / epsilon, expect])
        if best is None or expect > best[0]:
            best = (expect, u_in, u_out, K, loss)
        K *= 2
    return best[1], best[2], rows, best[3], best[4]


def _em_draws(em, u, n: int, deployed: int, rng):
    """``deployed`` draws of ``em.select(u, rng)`` and ``n`` more by the same inverse CDF on a batch
    of uniforms (``ExponentialMechanism.select``: one uniform, ``searchsorted`` on the cumulative
    probabilities); scores are 1 for candidate 0. Returns the scores and the two-sided p-value of
    a two-proportion test (deployed vs batched frequency of candidate 0)."""
    from scipy.stats import fisher_exact

    live = np.array([em.select(u, rng) == 0 for _ in range(deployed)], dtype=float)
    cdf = np.cumsum(em.probabilities(u))
    idx = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), cdf.size - 1)
    bulk = (idx == 0).astype(float)
    a, b = int(live.sum()), int(bulk.sum())
    p = float(fisher_exact([[a, live.size - a], [b, bulk.size - b]]).pvalue)
    return np.concatenate([live, bulk]), p


def _audit_em(cfg, ctx, book: _Book, search_rows: list):
    from fedmem.dp import ExponentialMechanism

    A, M = cfg.audit, cfg.memview
    sens = 1.0
    u_in, u_out, rows, K, loss = search_em_neighbours(M.epsilon, sens, M.max_candidates, A.trials, A.alpha)
    search_rows += [r[:4] + [f"expected CP bound {r[4]:.3g}" + (" <- chosen" if r[1] == f"K={K}" else "")]
                    for r in rows]
    for broken, s_decl, n in ((None, sens, A.trials), ("sensitivity_off_by_2", sens / 2, A.broken_trials)):
        em = ExponentialMechanism(M.epsilon, s_decl)
        t0 = time.perf_counter()
        rng = ctx.rng("em", broken or "correct")
        deployed = min(cfg.aggregator.deployed, n)
        pos, f_in = _em_draws(em, u_in, n, deployed, rng)
        neg, f_out = _em_draws(em, u_out, n, deployed, rng)
        p_in, p_out = float(em.probabilities(u_in)[0]), float(em.probabilities(u_out)[0])
        name = "memview.em" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=M.epsilon, booked_delta=0.0, family="pure",
                 eps_pair=math.log(p_in / p_out), broken=broken, rng=ctx.rng("estimate", name), gdp_ok=False,
                 seconds=time.perf_counter() - t0,
                 note=f"K={K} candidates, event 'candidate 0 chosen'; deployed vs batched two-proportion p="
                      f"{min(f_in, f_out):.2g}" + (
                     f", declared sensitivity {s_decl} vs utilities moving by {sens}" if broken else ""))


# ------------------------------------------------------------------ DP-MIND token perturbation
def _audit_dpmind(cfg, ctx, book: _Book, search_rows: list):
    """DP-MIND's metric-DP token perturbation (``fedmem.dp.MetricLaplace``: density
    proportional to ``exp(-eps ||z||)``), booked ``eps * ||x - x'||`` for two token
    embeddings. The noisy embedding is audited (the nearest-token projection after it is
    post-processing). The LR statistic is ``||y - x'|| - ||y - x||``. The search places ``x'``
    along an axis or the diagonal and keeps the placement with the largest exact worst-case
    loss under the audited sampler (metric Laplace: rotation invariant, all alike;
    coordinate-wise Laplace, the broken variant: the diagonal, loss ``eps ||x - x'||_1``).
    The loss ``eps (||y-x'|| - ||y-x||)`` reaches ``eps * dist`` only on the ray through
    ``x'`` and ``x``: in ``dim`` dimensions that event has tiny probability, which the
    row measures (a low tightness here is the looseness of the booked worst case)."""
    from fedmem.dp import MetricLaplace

    A, D = cfg.audit, cfg.dpmind
    booked = D.epsilon * D.distance
    x = np.zeros(D.dim)
    dirs = [("axis e_0", np.eye(D.dim)[0]), ("diagonal", np.ones(D.dim) / math.sqrt(D.dim))]
    for broken, n in ((None, D.trials), ("per_coordinate_laplace", min(D.trials, A.broken_trials))):
        # the exact worst-case loss of each placement under the audited mechanism: metric Laplace
        # eps * ||x - x'||_2 (every direction alike), coordinate-wise Laplace eps * ||x - x'||_1
        order = 2 if broken is None else 1
        losses = [D.epsilon * float(np.linalg.norm(D.distance * u, order)) for _, u in dirs]
        i = int(np.argmax(losses))
        for (lab, _), loss in zip(dirs, losses):
            search_rows.append(["dpmind" + (f"/{broken}" if broken else ""), f"{lab}, distance {D.distance}",
                                loss, loss / booked, "<- chosen" if lab == dirs[i][0] else ""])
        xp = D.distance * dirs[i][1]
        t0 = time.perf_counter()
        rng = ctx.rng("dpmind", broken or "correct")
        if broken:
            # the classic calibration bug: Laplace(1/eps) on every coordinate (the 1-D calibration) instead of
            # the L2 metric Laplace, whose radius is Gamma(dim, 1/eps)
            z_in = rng.laplace(0.0, 1.0 / D.epsilon, (n, D.dim))
            z_out = rng.laplace(0.0, 1.0 / D.epsilon, (n, D.dim))
        else:
            mech = MetricLaplace(D.epsilon, D.dim)
            z_in, z_out = mech.sample(rng, n), mech.sample(rng, n)
        y_in, y_out = x + z_in, xp + z_out
        pos = np.linalg.norm(y_in - xp, order, axis=1) - np.linalg.norm(y_in - x, order, axis=1)
        neg = np.linalg.norm(y_out - xp, order, axis=1) - np.linalg.norm(y_out - x, order, axis=1)
        name = "dpmind.token" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=0.0, family="pure",
                 eps_pair=losses[i], broken=broken, rng=ctx.rng("estimate", name), gdp_ok=False,
                 seconds=time.perf_counter() - t0,
                 note=f"dim {D.dim}, noisy embedding (before projection), LR test, {dirs[i][0]} placement"
                      + (", coordinate-wise Laplace(1/eps) booked as metric DP" if broken else ""))


# ------------------------------------------------------------------ one federated retrieval
def canary_federation_data(m: int, clip: float, included: np.ndarray, key_dim: int = 4):
    """m shards, one per canary: a victim record (key -e_1, value -C e_i) always, and the
    canary (key e_1, value +C e_i) when ``included[i]``. With k' = 1 and broadcast
    selection the canary, when present, displaces its victim: coordinate i of the sum
    moves by 2C, the booked L2 sensitivity (the worst case of the add/remove adjacency)."""
    from fedmem.bench.shards import ShardData

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
    from fedmem.dp import Accountant
    from fedmem.federation.config import FederationConfig
    from fedmem.federation.engine import Federation

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


def _audit_federation(cfg, ctx, book: _Book):
    from fedmem.dp import GaussianMechanism

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


# ------------------------------------------------------------------ Flower rounds
def flower_round_replies(m: int, dim: int, half_change: float, u: np.ndarray, included: bool) -> list:
    """One round's replies (one list of arrays per client): client 0 sends ``+half_change u``
    (``included``) or ``-half_change u``, the other ``m - 1`` clients send zeros. Both
    replies have norm ``half_change`` (the client-side clip), so the sum moves by
    ``2 half_change`` between the worlds: the worst case of replace-one client adjacency."""
    rep = [[np.zeros(dim)] for _ in range(m)]
    rep[0] = [(1.0 if included else -1.0) * half_change * u]
    return rep


def _flower_sample(gw, dp: str, replies: list, n: int, deployed: int, rng, dim: int):
    """``deployed`` rounds through the wrapper (``fedmem.flower.harness.run_wrapped_rounds``:
    the wrapper's own ``configure_fit`` / ``aggregate_fit``, booking included) and ``n`` more
    drawn batched from the same sampler at the same scale: ``dp="fedmem"``, the secure
    discrete Gaussian of ``GatewayCore.noised_sum`` on the replies' sum divided by the
    public count; ``dp="flower"``, Flower's ``np.random.normal(0, sigma_f C_f / m)`` (the
    legacy global ``RandomState``: seeded from ``rng`` for the deployed rounds, the global
    state restored afterwards; a private ``RandomState`` for the batch) added to FedAvg's
    mean. Returns the releases and the KS p-value of the first coordinate (deployed vs
    batched)."""
    import logging

    from scipy.stats import ks_2samp

    from fedmem.flower.harness import run_wrapped_rounds

    log = logging.getLogger("flwr")
    level = log.level
    log.setLevel(logging.ERROR)        # Flower logs every round at INFO
    saved = np.random.get_state()
    try:
        np.random.seed(int(rng.integers(2 ** 32)))
        outs = run_wrapped_rounds(gw, [replies] * deployed)
    finally:
        np.random.set_state(saved)
        log.setLevel(level)
    if any(o is None for o in outs):
        raise RuntimeError(f"flower.{dp}: a wrapped round released nothing (refused or faulted).")
    live = np.stack([np.asarray(o[0], dtype=np.float64) for o in outs])
    m = gw.num_sampled_clients
    if dp == "fedmem":
        from fedmem.dp import GaussianMechanism

        total = np.array([math.fsum(c) for c in np.stack([r[0] for r in replies]).T])
        mech = GaussianMechanism(sigma=gw.core.noise_std_on_sum, l2_sensitivity=gw.core.sensitivity)
        bulk = _batched_release(mech, total, n, rng, "secure", None) / float(m)
    else:
        from flwr.server.strategy.aggregate import aggregate

        from fedmem.flower.gateway import find_flower_dp

        fdp = find_flower_dp(gw.strategy)
        mean = aggregate([([np.asarray(r[0], dtype=np.float64)], gw.public_num_examples) for r in replies])[0]
        std = float(fdp.noise_multiplier) * float(fdp.clipping_norm) / fdp.num_sampled_clients
        bulk = mean[None, :] + np.random.RandomState(int(rng.integers(2 ** 32))).normal(0, std, (n, dim))
    p = float(ks_2samp(live[:, 0], bulk[:, 0]).pvalue) if deployed >= 20 else math.nan
    return np.concatenate([live, bulk]), p


def _audit_flower(cfg, ctx, book: _Book, search_rows: list):
    """Flower rounds through fedmem's wrappers (``fedmem.flower.harness.make_wrapped``, legacy
    API): ``dp="fedmem"`` (the gateway's own secure release of the replies' sum) and
    ``dp="flower"`` (Flower's ``DifferentialPrivacyClientSideFixedClipping`` around FedAvg
    inside the gateway, which books ``GaussianDpEvent(sigma_f C_f / sensitivity)``). Both
    are calibrated to book ``[flower] epsilon`` at delta for replace-one client adjacency
    (sensitivity ``2 C`` on the sum). What dp="flower" claims is audited: the value channel.
    Its float sampler (numpy's legacy polar Gaussian on the global RNG) is not modelled by
    :mod:`fedmem.attacks.float_bits` (which replays ``Generator``'s ziggurat), so its low
    bits are NOT audited here."""
    from fedmem.dp import GaussianMechanism
    from fedmem.flower.harness import make_wrapped

    A, Fl = cfg.audit, cfg.flower
    m, dim, C = Fl.clients, Fl.dim, Fl.clip
    sens = 2.0 * C                          # replace-one: a reply of norm C becomes another of norm C
    sigma = GaussianMechanism.calibrate(Fl.epsilon, A.delta).noise_multiplier
    # search: the change of the sum for every placement of the target client's reply (L2: all alike; the
    # axis is kept, ties going to the first)
    dirs = [("axis e_%d" % i, np.eye(dim)[i]) for i in range(dim)] + [("diagonal", np.ones(dim) / math.sqrt(dim))]
    changes = [float(np.linalg.norm(2 * C * u)) for _, u in dirs]
    i = int(np.argmax(changes))
    for (lab, _), ch in zip(dirs, changes):
        search_rows.append(["flower", f"client 0: +C u vs -C u, u = {lab}", ch, ch / sens,
                            "<- chosen" if lab == dirs[i][0] else ""])
    u = dirs[i][1]
    frac = changes[i] / sens
    rep_in = flower_round_replies(m, dim, C, u, True)
    rep_out = flower_round_replies(m, dim, C, u, False)
    a_in = np.sum([r[0] for r in rep_in], axis=0) / m
    a_out = np.sum([r[0] for r in rep_out], axis=0) / m
    booked_claim = {}      # dp -> what the correct wrapper books (a half-noise variant books the same claim)
    variants = [
        # (dp, variant, noise multiplier on the sum in units of the true sensitivity, gateway kwargs, booked)
        ("fedmem", None, sigma, dict(noise_multiplier=sigma, sensitivity=sens), None),
        ("fedmem", "half_noise", sigma / 2, dict(noise_multiplier=sigma / 2, sensitivity=sens), "claim"),
        # the gateway told the add/remove sensitivity C while replace-one neighbours move the sum by 2C
        ("fedmem", "sensitivity_off_by_2", sigma / 2, dict(noise_multiplier=sigma, sensitivity=C), None),
        # Flower's wrapper: std sigma_f C_f / m on the mean = sigma_f C_f on the sum; sigma_f C_f = sigma * 2C
        ("flower", None, sigma, dict(noise_multiplier=2 * sigma, flower_clipping_norm=C, sensitivity=sens), None),
        ("flower", "half_noise", sigma / 2, dict(noise_multiplier=sigma, flower_clipping_norm=C, sensitivity=sens),
         "claim"),
        # dp='flower' without sensitivity books sensitivity = clipping_norm (add/remove adjacency)
        # (its gap is 2x in mu, the smallest of the variants: it gets the correct rows' trials)
        ("flower", "default_sensitivity_clipping_norm", sigma,
         dict(noise_multiplier=2 * sigma, flower_clipping_norm=C, sensitivity=None), None),
    ]
    for dp, broken, true_mult, kw, booked in variants:
        t0 = time.perf_counter()
        n = A.trials if broken in (None, "default_sensitivity_clipping_norm") else A.broken_trials
        live = min(Fl.deployed, n)
        rng = ctx.rng("flower", dp, broken or "correct")
        samples, ks = [], []
        for reps in (rep_in, rep_out):
            gw = make_wrapped(dp, num_sampled_clients=m, public_num_examples=5, delta=A.delta,
                              seed=int(rng.integers(2 ** 31)), **kw)
            v, p = _flower_sample(gw, dp, reps, n - live, live, rng, dim)
            samples.append(v)
            ks.append(p)
        eps_booked = gw.epsilon_per_round if booked is None else booked_claim[dp]
        if broken is None:
            booked_claim[dp] = eps_booked
        pos = _lr_scores(samples[0], a_in, a_out, "gaussian")
        neg = _lr_scores(samples[1], a_in, a_out, "gaussian")
        name = f"flower.{dp}" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=eps_booked, booked_delta=A.delta, family="gaussian",
                 eps_pair=GaussianMechanism.from_noise_multiplier(true_mult / frac).epsilon(A.delta), broken=broken,
                 rng=ctx.rng("estimate", name), seconds=time.perf_counter() - t0, ks=min(ks),
                 note=f"{m} clients, client 0 +C u vs -C u (C={C}), LR test; "
                      + ("gateway's secure release" if dp == "fedmem" else
                         "Flower's ClientSideFixedClipping noise (numpy float sampler, low bits NOT audited)")
                      + (f", {broken}" if broken else "")
                      + f"; {live} rounds per world through the wrapper, KS p={min(ks):.2g}")


# ------------------------------------------------------------------ one BRACE step
def brace_step_candidates(r: float, far: int, gate: int, margin: float = 1e-3):
    """Candidate neighbouring banks for one BRACE step from ``q = 0`` (d = 1). In every pair
    ONE record sits at ``+(1 - margin) r`` in D and at ``-(1 - margin) r`` in D' (both inside
    the gate), which moves the step's mean by ``2 (1 - margin) r / m`` for a gate of ``m``
    records; the certificate ``Delta_bar`` (floor ``2r/n``) sets the noise. Small gates move
    the mean most but get a certificate near ``2r``, whose noise is then cut by the
    projection on ``B(q, 2r)``; large gates (``m`` records at ``q``) drive the certificate to
    its floor ``2r/n`` and the release is a plain Gaussian. Returns ``(label, D, D')``
    pairs; the search keeps the one with the largest exact epsilon."""
    x = (1 - margin) * r
    rest = np.full((far, 1), 10.0 * r)
    out = [("1 in gate (+x vs -x), %d far" % far, np.vstack([[[x]], rest]), np.vstack([[[-x]], rest]))]
    sizes = sorted({max(1, gate // 40), max(1, gate // 4), gate})
    for m in sizes:
        core = np.zeros((m, 1))
        out.append((f"{m} at q + 1 (+x vs -x)", np.vstack([core, [[x]]]), np.vstack([core, [[-x]]])))
    return out


class _ScaledNoise:
    """A NoiseSource whose noise std is ``factor`` times the calibrated one (the half-noise variant)."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, factor

    def perturb(self, t, Q, sigma, delta_bar, *, grid=None):
        return self.inner.perturb(t, Q, sigma * self.factor, delta_bar * self.factor, grid=grid)


def projected_gaussian_epsilon(a: float, b: float, s: float, R: float, delta: float, points: int = 40_001) -> float:
    """Exact (numerical) epsilon at ``delta`` of ``clip(a + s Z, -R, R)`` vs ``clip(b + s Z, -R, R)``
    (1-D Gaussian then projection onto the ball, the BRACE output): ``delta(eps)`` is the
    integral of ``(p_a - e^eps p_b)_+`` over the interior plus the two atoms, maximised over
    both orders; eps by bisection."""
    from scipy.stats import norm as N

    lo_y, hi_y = max(-R, min(a, b) - 40 * s), min(R, max(a, b) + 40 * s)    # the interior mass outside: < 1e-300
    y = np.linspace(lo_y, hi_y, points)
    h = y[1] - y[0]

    # densities and atoms do not depend on eps: computed once
    dens = {c: (N.pdf(y, c, s), float(N.sf(R, c, s)), float(N.cdf(-R, c, s))) for c in (a, b)}

    def dlt(eps, a_, b_):
        (pa, ha, la), (pb, hb, lb) = dens[a_], dens[b_]
        w = math.exp(eps)
        return np.sum(np.maximum(pa - w * pb, 0.0)) * h + max(ha - w * hb, 0.0) + max(la - w * lb, 0.0)

    def d(eps):
        return max(dlt(eps, a, b), dlt(eps, b, a))

    if d(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while d(hi) > delta:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return math.inf
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


def _audit_brace(cfg, ctx, book: _Book, search_rows: list):
    """One BRACE step (``brace_run`` with T = 1, d = 1, secure sampler, as ``BraceMemory.recall``
    runs it): the release is ``Y_1 = Proj_{B(q, 2r)}(Q_1 + xi)`` with ``xi`` of std
    ``Delta_bar_1 sqrt(T / (2 rho))``; booked ``params.event()`` = (epsilon, delta) from the
    zCDP parameter rho (App. C.2). The LR statistic of the equal-variance pair is monotone
    in ``y`` (the projection's atoms sit at its ends), so the score is ``y (a - b)``."""
    from fedmem.agent.brace.mechanism import NoiseSource, brace_run
    from fedmem.agent.brace.params import BraceParams
    from fedmem.dp import GaussianMechanism

    A, Br = cfg.audit, cfg.brace
    r = Br.r
    p = BraceParams(r=r, T=1, epsilon=Br.epsilon, delta=A.delta, d=1)
    q = np.zeros((1, 1))

    def step(X, noise, B):
        return brace_run(X, np.repeat(q, B, axis=0), p, noise)

    zero = NoiseSource(normals=np.zeros((1, 1, 1)))
    best = None
    for lab, X, Xp in brace_step_candidates(r, Br.far, Br.gate):
        ra, rb = step(X, zero, 1), step(Xp, zero, 1)
        a, b = float(ra.Y[0, 0, 0]), float(rb.Y[0, 0, 0])
        dbar = max(float(ra.delta_bar[0, 0]), float(rb.delta_bar[0, 0]))
        same = float(ra.delta_bar[0, 0]) == float(rb.delta_bar[0, 0])
        g = p.secure_grid(X.shape[0])
        sig = dbar * p.noise_multiplier
        loss = projected_gaussian_epsilon(a, b, sig * (dbar + g) / dbar, 2 * r, A.delta) if same else math.nan
        search_rows.append(["brace", lab, loss, loss / p.epsilon,
                            f"mean moves {abs(a - b):.4g}, certificate {dbar:.4g} ({abs(a - b) / dbar:.3g} of it)"
                            + ("" if same else " (differs between worlds: skipped)")])
        if same and (best is None or loss > best[0] + 1e-12):
            best = (loss, lab, X, Xp, a, b, dbar)
    for row in search_rows:
        if row[0] == "brace" and row[1] == best[1]:
            row[4] += " <- chosen"
    _, _, X, Xp, a, b, dbar = best
    grid = p.secure_grid(X.shape[0])
    for broken, factor, n in ((None, 1.0, Br.trials), ("half_noise", 0.5, min(Br.trials, A.broken_trials))):
        t0 = time.perf_counter()
        rng = ctx.rng("brace", broken or "correct")
        live = min(cfg.aggregator.deployed, n)
        sig = dbar * p.noise_multiplier * factor
        mech = GaussianMechanism(sigma=sig, l2_sensitivity=dbar * factor)
        out, ks = [], []
        for bank, centre in ((X, a), (Xp, b)):
            src = NoiseSource(rng=rng, sampling="secure")
            dep = step(bank, src if factor == 1.0 else _ScaledNoise(src, factor), live).Y[:, 0, 0]
            bulk = np.clip(_batched_release(mech, np.array([centre]), n - live, rng, "secure", grid)[:, 0],
                           -2 * r, 2 * r)
            from scipy.stats import ks_2samp

            ks.append(float(ks_2samp(dep, bulk).pvalue))
            out.append(np.concatenate([dep, bulk]))
        infl = sig * (dbar * factor + grid) / (dbar * factor)
        eps_pair = projected_gaussian_epsilon(a, b, infl, 2 * r, A.delta)
        pos, neg = out[0] * (a - b), out[1] * (a - b)
        name = "brace.step" + (f"/{broken}" if broken else "")
        # the GDP fit is exact only when the projection never binds (a plain Gaussian pair); otherwise the
        # projection's atoms bound the loss below the GDP curve's and only Clopper-Pearson is valid
        gauss = max(abs(a), abs(b)) + 10 * infl < 2 * r
        book.add(name, pos=pos, neg=neg, eps_booked=p.event().epsilon, booked_delta=A.delta, family="gaussian",
                 headline="gdp_fit" if gauss else "clopper_pearson_heldout",
                 eps_pair=eps_pair, broken=broken, rng=ctx.rng("estimate", name), seconds=time.perf_counter() - t0,
                 ks=min(ks),
                 note=f"T=1, d=1, r={r}, {X.shape[0]} records, certificate {dbar:.4g}, noise std {sig:.4g}, output "
                      f"projected on B(q, {2 * r:g}); without the projection the pair's eps would be "
                      f"{T.gdp_epsilon(abs(a - b) / infl, A.delta):.3g}; zCDP rho={p.rho:.4g}; deployed vs batched "
                      f"KS p={min(ks):.2g} ({live} brace_run releases per world)")


# ------------------------------------------------------------------ plots
def _plot_rocs(ctx, book: _Book, max_points: int = 4000):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedmem.attacks.audit import dp_roc_ceiling

    names = [n for n in book.rocs]
    cols = 3
    rows = int(math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        pos, neg, eps, delta, family = book.rocs[name]
        fpr, tpr = roc_curve(pos, neg)
        keep = np.unique(np.linspace(0, fpr.size - 1, min(fpr.size, max_points)).astype(int))
        ok = (fpr[keep] > 0) & (tpr[keep] > 0)
        ax.loglog(fpr[keep][ok], tpr[keep][ok], "b-", lw=1.2, label="observed ROC")
        grid = np.geomspace(1e-7, 1.0, 300)
        if math.isfinite(eps):
            ax.loglog(grid, np.maximum(dp_roc_ceiling(grid, eps, delta), 1e-12), "r--", lw=1,
                      label=f"booked ({eps:.3g}, {delta:.0e}) ceiling")
            if family == "gaussian" and delta > 0 and eps > 0:
                mu = T.gdp_mu(eps, delta)
                ax.loglog(grid, np.maximum(1 - T.gdp_tradeoff(grid, mu), 1e-12), "g:", lw=1,
                          label=f"booked GDP mu={mu:.3g}")
        e = book.mechanisms[name]
        ax.set_title(f"{name}\nlower {e['eps_lower']:.3g} / booked {e['eps_booked']:.3g}", fontsize=8)
        ax.set_xlim(1e-6, 1)
        ax.set_ylim(1e-4, 1.05)
        ax.set_xlabel("FPR", fontsize=8)
        ax.set_ylabel("TPR", fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    ctx.save_figure(fig, "roc_loglog", "log-log ROC of every audited mechanism with the booked DP ceiling")


# ------------------------------------------------------------------ run
def run(cfg, ctx) -> Result:
    A = cfg.audit
    # every row's headline bound at alpha / rows (Bonferroni), so that all of them hold at once with probability
    # >= 1 - alpha: with 14 rows at alpha each, one correct mechanism would be flagged in about a third of runs
    rows = (ROWS_PER_SECTION + (ROWS_FLOWER if cfg.flower.enabled else 0) + (ROWS_BRACE if cfg.brace.enabled else 0)
            + (ROWS_FEDERATION if cfg.federation.enabled else 0))
    book = _Book(A.alpha / rows if A.familywise else A.alpha, A.delta)
    search_rows: list = []
    phases = {}
    for label, fn in (("aggregator.gaussian", lambda: _audit_value(cfg, ctx, book, "gaussian", search_rows)),
                      ("aggregator.laplace", lambda: _audit_value(cfg, ctx, book, "laplace", search_rows)),
                      ("aggregator.receipts", lambda: _audit_receipts(cfg, ctx, book, search_rows)),
                      ("memview.em", lambda: _audit_em(cfg, ctx, book, search_rows)),
                      ("dpmind.token", lambda: _audit_dpmind(cfg, ctx, book, search_rows)),
                      ("flower", lambda: _audit_flower(cfg, ctx, book, search_rows)),
                      ("brace.step", lambda: _audit_brace(cfg, ctx, book, search_rows))):
        if (label == "flower" and not cfg.flower.enabled) or (label == "brace.step" and not cfg.brace.enabled):
            continue
        t0 = time.perf_counter()
        fn()
        phases[label] = time.perf_counter() - t0
        ctx.log(f"{label}: {phases[label]:.1f} s")
    fed_error = None
    if cfg.federation.enabled:
        t0 = time.perf_counter()
        try:
            _audit_federation(cfg, ctx, book)
        except Exception as exc:      # e.g. Ray cannot start on an overloaded machine: keep the other rows
            fed_error = f"{type(exc).__name__}: {exc}"
            ctx.log(f"federation.retrieve: not audited ({fed_error})")
        phases["federation.retrieve"] = time.perf_counter() - t0
        ctx.log(f"federation.retrieve: {phases['federation.retrieve']:.1f} s")
    if A.plots:
        _plot_rocs(ctx, book)
    broken = {k: v for k, v in book.mechanisms.items() if v["broken"]}
    all_caught = all(v["caught"] for v in broken.values())
    correct_ok = all(not v["caught"] for v in book.mechanisms.values() if not v["broken"])
    metrics = {"mechanisms": book.mechanisms, "all_broken_caught": all_caught, "no_false_leak": correct_ok,
               "phase_seconds": phases, "federation_error": fed_error,
               "not_covered": ["flower.flower float low bits (numpy's legacy polar sampler is not modelled by "
                               "fedmem.attacks.float_bits)"]}
    tables = [
        Table("Tightness: eps lower bound vs eps booked",
              ["mechanism", "broken variant", "method", "eps lower", "eps booked", "delta", "eps of pair found",
               "tightness", "trials", "confidence", "verdict"], book.rows,
              note="tightness = eps lower / eps booked, with the estimator registered for the mechanism before the "
                   "run (Gaussian noise: GDP fit; pure DP: held-out Clopper-Pearson). 'eps of pair found' is the "
                   "exact epsilon of the neighbour pair the search kept: tightness below 1 is the gap between it "
                   "and the booking (pair not worst case) plus the estimator's statistical slack (eps lower < eps "
                   "of pair). A broken variant books what the correct one books (half_noise, "
                   "sensitivity_off_by_2, fast_float_sampler) or nothing (missing_charge)."),
        Table("Estimators side by side (eps lower bound)",
              ["mechanism", "Clopper-Pearson held-out", "GDP fit", "one-run", "mu lower", "test"], book.side,
              note=f"every bound at confidence {1 - book.alpha:.4g}"
                   + (f" (Bonferroni over {rows} rows: all hold at once with probability >= {1 - A.alpha:.0%})"
                      if A.familywise else "") + "; GDP eps assumes a Gaussian trade-off curve "
                   "(exact for Gaussian noise; see docs/audit.md)"),
        Table("Worst-case neighbour search",
              ["mechanism", "placement", "change (noise norm) / exact loss", "fraction of booked sensitivity / "
               "of eps", "note"], search_rows),
    ]
    sections = []
    if fed_error:
        sections.append(("federation.retrieve not audited", f"The federated retrieval could not run: `{fed_error}`."))
    return Result(metrics=metrics, tables=tables, sections=sections, ok=all_caught and correct_ok and not fed_error)


def cross_checks(cfg) -> list[tuple[str, str]]:
    problems = []
    if cfg.aggregator.shards < 2:
        problems.append(("aggregator.shards", "must be >= 2 for the receipts audit (a +1/-1 tally pair)"))
    if cfg.audit.trials < 100 or cfg.audit.broken_trials < 100:
        problems.append(("audit.trials", "trials and broken_trials must be >= 100 (the held-out split)"))
    if cfg.federation.canaries < 20:
        problems.append(("federation.canaries", "must be >= 20 (one-run guesses 10 + 10)"))
    return problems


from fedmem.scenario import Experiment  # noqa: E402

EXPERIMENTS = {
    "audit.tightness": Experiment("audit.tightness", "Tight audits: eps lower bound vs booked for every release "
                                  "mechanism, broken variants caught", SCHEMA, run, cross_checks),
}
