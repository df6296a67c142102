"""What both BRACE experiments (:mod:`fedmem.experiments.brace`) share: the mechanism's
parameters from scenario keys, the Eq. (8) calibration check of their cross-field validation,
BRACE over row chunks (bounded memory) and the percentile-bootstrap CI."""

from __future__ import annotations

import numpy as np

from fedmem.agent.brace.mechanism import NoiseSource, brace_run
from fedmem.agent.brace.params import BraceParams, gamma_max


def _gamma(cfg_gamma: float) -> float | None:
    return None if cfg_gamma == 0 else cfg_gamma


def brace_params(r, T, eps, delta, d, kappa, gamma) -> BraceParams:
    return BraceParams(r=r, T=T, epsilon=eps, delta=delta, d=d, kappa=kappa, gamma=_gamma(gamma))


def gamma_problems(eps_list, delta, T_list, d, gamma, key, eps_key="mechanism.epsilon") -> list[tuple[str, str]]:
    out = []
    for e in eps_list:
        for T in T_list:
            try:
                g = gamma_max(e, delta, T, d)
                if not np.isfinite(g):
                    raise OverflowError("non-finite gamma")
            except (ArithmeticError, ValueError) as exc:
                out.append((eps_key, f"epsilon={e!r} cannot be calibrated with delta={delta!r}, T={T} "
                                     f"({type(exc).__name__}); use a moderate epsilon (e.g. 0.1-50)"))
                continue
            if gamma != 0 and gamma > g:
                out.append((key, f"gamma={gamma} violates Eq. (8) for epsilon={e}, T={T}, d={d} "
                                 f"(largest valid gamma {g:.4g}); use 0 for the largest valid value"))
    return out


def bank_chunks(X, starts, params, normals, certificate="brace", clean=None, chunk=4096, bound="all"):
    """brace_run over row chunks (bounded memory); returns (Y, delta_bar, activated, uncertain)."""
    parts = []
    for s in range(0, starts.shape[0], chunk):
        e = s + chunk
        parts.append(brace_run(X, starts[s:e], params, NoiseSource(normals=normals[s:e]), certificate=certificate,
                               clean=None if clean is None else clean[:, s:e], bound=bound))
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
    return cat("Y"), cat("delta_bar"), cat("activated"), cat("uncertain")



def scipy_boot(v: np.ndarray, boot: tuple[int, int]) -> tuple[float, float, float]:
    """Mean of ``v`` and its 95% percentile-bootstrap interval by ``scipy.stats.bootstrap``.

    ``boot = (resamples, seed)``: every call with the same seed and sample size draws the same
    resample indices, so methods evaluated on the same draws are resampled in pairs.
    """
    from scipy import stats   # here, not at the top: scipy.stats costs seconds of start-up (validation imports this)

    v = np.asarray(v, dtype=np.float64)
    if v.size < 2 or np.all(v == v[0]):
        return float(v.mean()), float(v.mean()), float(v.mean())
    res = stats.bootstrap((v,), np.mean, n_resamples=int(boot[0]), confidence_level=0.95, method="percentile",
                          rng=np.random.default_rng(int(boot[1])))
    return float(v.mean()), float(res.confidence_interval.low), float(res.confidence_interval.high)

