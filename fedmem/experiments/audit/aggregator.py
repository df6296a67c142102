"""Aggregator value releases (``aggregator.gaussian``, ``aggregator.laplace``) and noised
receipts (``aggregator.receipts``) through ``Aggregator.release``: the worst-case
neighbour search of a top-k sum, the deployed + batched sampling, and their broken
variants (half the noise, a sensitivity off by 2, the fast float sampler, a missing charge).
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedmem.attacks import tight as T

from .book import Book
from .releases import batched_release, lr_scores


def _secure_scale_note(sampling: str) -> str:
    return "secure samplers" if sampling == "secure" else "fast float samplers"


def release_policy(cfg, noise: str, sigma: float, *, clip=None, sampling=None, receipts="suppress",
                   receipt_sigma=1.0, value_dim=None):
    """The ``ReleasePolicy`` of the audited top-k value release (``[aggregator]`` keys; the
    keyword arguments override them for a broken variant or the receipts release)."""
    from fedmem.federation.aggregator import ReleasePolicy  # lazy: loads dp_accounting (~350 ms)

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


def sample_aggregator(policy, total: np.ndarray, n: int, rng, deployed: int, *, receipts: bool = False):
    """``deployed`` releases through ``Aggregator.release`` (as deployed) and ``n`` more by
    :func:`batched_release` of the same mechanism; returns all of them and the two-sample
    Kolmogorov-Smirnov p-value of the first coordinate (deployed vs batched)."""
    from scipy.stats import ks_2samp

    from fedmem.federation.aggregator import Aggregator  # lazy: loads dp_accounting (~350 ms)

    agg = Aggregator(policy)
    zero = np.zeros(policy.value_dim)
    if receipts:
        live = np.stack([agg.release(zero, policy.k, total, rng).receipts for _ in range(deployed)])
        rm = policy.receipt_mechanism()
        bulk = batched_release(rm, total, n, rng, policy.sampling, agg._grid(rm).get("grid"))
    else:
        live = np.stack([agg.release(total, policy.k, None, rng).value for _ in range(deployed)])
        mech = policy._mechanism(policy.sigma)
        bulk = batched_release(mech, total, n, rng, policy.sampling, agg._grid(mech).get("grid")) / policy.public_count
    p = float(ks_2samp(live[:, 0], bulk[:, 0]).pvalue) if deployed >= 20 else math.nan
    return np.concatenate([live, bulk]), p


def audit_value(cfg, ctx, book: Book, noise: str, search_rows: list):
    from fedmem.federation.aggregator import delivered_epsilon  # lazy: loads dp_accounting (~350 ms)
    from fedmem.dp import GaussianMechanism  # lazy: loads dp_accounting (~270 ms)

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
        pol = release_policy(cfg, noise, mult, clip=clip, sampling=sampling, value_dim=dim)
        booked = delivered_epsilon(noise, sigma, delta)   # every variant books the claim of the declared sigma
        t0 = time.perf_counter()
        rng = ctx.rng("release", noise, broken or "correct")
        # the float-bit attack reads every coordinate that differs: the diagonal placement moves them all
        x_in, x_out = (np.full(dim, a.clip / math.sqrt(dim)), np.full(dim, -a.clip / math.sqrt(dim))) if fast \
            else (s_in, s_out)
        live = min(deployed, n)
        v_in, ks_in = sample_aggregator(pol, x_in, n - live, rng, live)
        v_out, ks_out = sample_aggregator(pol, x_out, n - live, rng, live)
        ks = min(ks_in, ks_out)
        true_frac = frac * (a.clip / (clip or a.clip))      # sensitivity the noise was sized for vs real change
        eps_pair = pair_eps(mult, true_frac)
        name = f"aggregator.{noise}" + (f"/{broken}" if broken else "")
        ks_note = f"; deployed vs batched KS p={ks:.2g} ({live} deployed releases per world)"
        if fast:
            from fedmem.attacks import float_bits as FB  # lazy: ~35 ms, no heavy package

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
        pos = lr_scores(v_in, s_in / pol.public_count, s_out / pol.public_count, noise)
        neg = lr_scores(v_out, s_in / pol.public_count, s_out / pol.public_count, noise)
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=booked_delta, family=noise,
                 eps_pair=eps_pair, broken=broken, rng=ctx.rng("estimate", name),
                 gdp_ok=noise == "gaussian", seconds=time.perf_counter() - t0, ks=ks,
                 note=f"LR test, {_secure_scale_note(sampling)}, noise multiplier {mult:.4g}"
                      + (f", aggregator clip {clip} vs records {a.clip}" if clip else "") + ks_note)


def audit_receipts(cfg, ctx, book: Book, search_rows: list):
    from fedmem.dp import GaussianMechanism  # lazy: loads dp_accounting (~270 ms)
    from fedmem.federation.aggregator import TALLY_L2  # lazy: loads dp_accounting (~350 ms)

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
        pol = release_policy(cfg, "gaussian", 1.0, receipts="noised", receipt_sigma=rs)
        ev = pol.receipt_mechanism()
        booked = ev.epsilon(A.delta) if broken is None else 0.0   # missing charge: the receipt event is not booked
        t0 = time.perf_counter()
        rng = ctx.rng("receipts", broken or "correct")
        live = min(cfg.aggregator.deployed, n)
        r_in, ks_in = sample_aggregator(pol, t_in, n - live, rng, live, receipts=True)
        r_out, ks_out = sample_aggregator(pol, t_out, n - live, rng, live, receipts=True)
        pos, neg = lr_scores(r_in, t_in, t_out, "gaussian"), lr_scores(r_out, t_in, t_out, "gaussian")
        eps_pair = T.gdp_epsilon(frac / rs, A.delta)
        name = "aggregator.receipts" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=A.delta, family="gaussian",
                 eps_pair=eps_pair, broken=broken, rng=ctx.rng("estimate", name), seconds=time.perf_counter() - t0,
                 ks=min(ks_in, ks_out),
                 note=f"noised tallies, receipt_sigma={rs:.4g}" + (", receipt event not booked" if broken else "")
                      + f"; deployed vs batched KS p={min(ks_in, ks_out):.2g}")
