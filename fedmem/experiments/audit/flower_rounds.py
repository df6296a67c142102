"""``flower.fedmem`` / ``flower.flower``: Flower rounds through fedmem's wrappers
(``fedmem.flower.harness``) and their broken variants.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .book import Book
from .releases import batched_release, lr_scores


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

    from fedmem.flower.harness import run_wrapped_rounds  # lazy: loads flwr, dp_accounting, grpc (~800 ms)

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
        from fedmem.dp import GaussianMechanism  # lazy: loads dp_accounting (~95 ms)

        total = np.array([math.fsum(c) for c in np.stack([r[0] for r in replies]).T])
        mech = GaussianMechanism(sigma=gw.core.noise_std_on_sum, l2_sensitivity=gw.core.sensitivity)
        bulk = batched_release(mech, total, n, rng, "secure", None) / float(m)
    else:
        from flwr.server.strategy.aggregate import aggregate

        from fedmem.flower.gateway import find_flower_dp  # lazy: loads flwr, dp_accounting, grpc (~800 ms)

        fdp = find_flower_dp(gw.strategy)
        mean = aggregate([([np.asarray(r[0], dtype=np.float64)], gw.public_num_examples) for r in replies])[0]
        std = float(fdp.noise_multiplier) * float(fdp.clipping_norm) / fdp.num_sampled_clients
        bulk = mean[None, :] + np.random.RandomState(int(rng.integers(2 ** 32))).normal(0, std, (n, dim))
    p = float(ks_2samp(live[:, 0], bulk[:, 0]).pvalue) if deployed >= 20 else math.nan
    return np.concatenate([live, bulk]), p


def audit_flower(cfg, ctx, book: Book, search_rows: list):
    """Flower rounds through fedmem's wrappers (``fedmem.flower.harness.make_wrapped``, legacy
    API): ``dp="fedmem"`` (the gateway's own secure release of the replies' sum) and
    ``dp="flower"`` (Flower's ``DifferentialPrivacyClientSideFixedClipping`` around FedAvg
    inside the gateway, which books ``GaussianDpEvent(sigma_f C_f / sensitivity)``). Both
    are calibrated to book ``[flower] epsilon`` at delta for replace-one client adjacency
    (sensitivity ``2 C`` on the sum). What dp="flower" claims is audited: the value channel.
    Its float sampler (numpy's legacy polar Gaussian on the global RNG) is not modelled by
    :mod:`fedmem.attacks.float_bits` (which replays ``Generator``'s ziggurat), so its low
    bits are NOT audited here."""
    from fedmem.dp import GaussianMechanism  # lazy: loads dp_accounting (~95 ms)
    from fedmem.flower.harness import make_wrapped  # lazy: loads flwr, dp_accounting, grpc (~800 ms)

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
        pos = lr_scores(samples[0], a_in, a_out, "gaussian")
        neg = lr_scores(samples[1], a_in, a_out, "gaussian")
        name = f"flower.{dp}" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=eps_booked, booked_delta=A.delta, family="gaussian",
                 eps_pair=GaussianMechanism.from_noise_multiplier(true_mult / frac).epsilon(A.delta), broken=broken,
                 rng=ctx.rng("estimate", name), seconds=time.perf_counter() - t0, ks=min(ks),
                 note=f"{m} clients, client 0 +C u vs -C u (C={C}), LR test; "
                      + ("gateway's secure release" if dp == "fedmem" else
                         "Flower's ClientSideFixedClipping noise (numpy float sampler, low bits NOT audited)")
                      + (f", {broken}" if broken else "")
                      + f"; {live} rounds per world through the wrapper, KS p={min(ks):.2g}")
