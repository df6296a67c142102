"""BRACE retrieval, Algorithm 1 of papers/001 (Steps 1-6), batched over starts.

One call runs ``B`` independent BRACE trajectories on the same private bank (one per
row of ``starts``), which is how the experiments vectorise over queries and paired
noise repetitions. The clean trajectory ``z_t`` is computed and used internally; the
caller receives it in :class:`BraceRun` only for evaluation (fidelity MSE). The agent
integration (:mod:`fedmem.agent.brace.memory`) returns only the released ``Y``.

Per step t (with ``Y_0 = z_0 = q``)::

    I_t = I(D, z_{t-1}), J_t = I(D, Y_{t-1}), z_t = Phi_D(z_{t-1}), a_t = Phi_D(Y_{t-1})  (Step 1)
    R_t = z_t - a_t                                                (Step 2, Eq. (1), App. B.2)
    H_t = 1{||R_t||^2 > kappa T r^2}                               (Step 3, Eq. (2))
    Q_t = Pi_{B(Y_{t-1}, r)}(a_t + H_t R_t)                        (Step 4)
    Delta_bar_t = certificate (see certificate.py)                 (Step 5, Eq. (7))
    Y_t = Pi_{B(q, (t+1) r)}(Q_t + xi_t),  xi_t ~ N(0, T Delta_bar_t^2 / (2 rho) I_d)   (Step 6)

With ``sampling="secure"`` the noise is an exact discrete Gaussian on a grid fixed from
public parameters (``params.secure_grid(n)``), never from ``sigma_t``: ``sigma_t`` depends
on the bank, and the grid is visible in the outputs' low bits (see :mod:`fedmem.dp.samplers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.agent.brace.certificate import Certifier
from fedmem.agent.brace.lsr import phi, project_ball
from fedmem.agent.brace.params import BraceParams
from fedmem.dp import GaussianMechanism
from fedmem.dp import samplers


@dataclass(frozen=True)
class BraceRun:
    """Result of a batch of BRACE runs. ``Y`` is what is released; the rest is internal
    diagnostics (never released by :class:`~fedmem.agent.brace.memory.BraceMemory`)."""

    Y: np.ndarray              # (B, T, d) released trajectory
    z: np.ndarray              # (B, T, d) clean trajectory (internal)
    delta_bar: np.ndarray      # (B, T) certificates
    sigma: np.ndarray          # (B, T) per-coordinate noise std
    activated: np.ndarray      # (B, T) H_t
    uncertain: np.ndarray      # (B, T) activation not excluded for all neighbours
    gate_counts: np.ndarray    # (B, T) |J_t| = |I(D, Y_{t-1})|


class NoiseSource:
    """Standard-normal innovations for a batch: pre-drawn (paired designs) or drawn per
    step from an injected RNG through :mod:`fedmem.dp` (``fast`` or ``secure``).

    ``grid`` (secure only, optional): a public power-of-two grid for the secure sampler.
    When omitted, :func:`brace_run` supplies ``params.secure_grid(n)``. The grid is never
    derived from ``sigma_t``, which depends on the private bank.
    """

    def __init__(self, *, normals: np.ndarray | None = None, rng=None, sampling: str = "secure",
                 grid: float | None = None):
        if (normals is None) == (rng is None):
            raise ValueError("exactly one of normals or rng must be given. Found "
                             f"normals={'set' if normals is not None else None}, rng={rng!r}.")
        if rng is not None:
            V.rng_check("rng", rng)
        if sampling not in ("fast", "secure"):
            raise ValueError(f"sampling must be 'fast' or 'secure'. Found {sampling!r}.")
        if grid is not None:
            if sampling != "secure" or normals is not None:
                raise ValueError("grid applies only to rng-driven sampling='secure'. Found "
                                 f"sampling={sampling!r}, normals={'set' if normals is not None else None}, "
                                 f"grid={grid!r}.")
            grid = samplers.check_grid(grid)
        self.normals, self.rng, self.sampling, self.grid = normals, rng, sampling, grid

    def perturb(self, t: int, Q: np.ndarray, sigma: np.ndarray, delta_bar: np.ndarray, *,
                grid: float | None = None) -> np.ndarray:
        """``Q + xi_t`` for step ``t`` (1-based), per-row std ``sigma``.

        In ``secure`` mode each row goes through ``GaussianMechanism.release(..., "secure",
        grid=g)`` (value snapped to the public grid ``g``, exact discrete Gaussian noise on
        it, noise scale inflated to cover the rounding; see :mod:`fedmem.dp.samplers`).
        ``g`` is this source's ``grid`` if set, else the ``grid`` argument (``brace_run``
        passes ``params.secure_grid(n)``); secure mode without either raises ``ValueError``.
        ``sigma`` and ``delta_bar`` depend on the bank, so deriving the grid from them (the
        ``grid=None`` default of ``release``) would leak through the outputs' low bits.
        """
        if self.normals is not None:
            return Q + self.normals[:, t - 1, :] * sigma[:, None]
        if self.sampling == "fast":
            return Q + samplers.gaussian(1.0, Q.shape, self.rng) * sigma[:, None]
        g = self.grid if self.grid is not None else grid
        if g is None:
            raise ValueError("secure BRACE sampling needs a public grid (sigma_t depends on the bank). "
                             "Found grid=None.")
        rows = [GaussianMechanism(sigma=float(s), l2_sensitivity=float(db)).release(row, self.rng, "secure", grid=g)
                for row, s, db in zip(Q, sigma, delta_bar)]
        return np.stack(rows)


def _check_inputs(X, starts, params: BraceParams):
    X = V.finite_array("bank", X, ndim=2)
    starts = V.finite_array("starts", np.atleast_2d(starts), ndim=2)
    if starts.shape[1] != X.shape[1]:
        raise ValueError(f"starts must have dimension {X.shape[1]} like the bank. Found {starts.shape[1]}.")
    if params.d != X.shape[1]:
        raise ValueError(f"params.d must equal the bank dimension {X.shape[1]}. Found {params.d!r}.")
    return X, starts


def brace_run(X, starts, params: BraceParams, noise: NoiseSource, *, certificate: str = "brace",
              clean: np.ndarray | None = None, bound: str = "all") -> BraceRun:
    """Run Algorithm 1 for every row of ``starts``.

    ``clean`` optionally passes the precomputed clean trajectory ``(T + 1, B, d)``
    (it does not depend on the noise, so paired experiments compute it once).
    ``certificate="raw_count"`` is the broken variant for the privacy tests. ``bound`` selects
    the activated-branch bound of the certificate (``certificate.BOUNDS``; default ``"all"``).
    """
    X, q = _check_inputs(X, starts, params)
    B, d = q.shape
    T, r = params.T, params.r
    cert = Certifier(X, q, params, mode=certificate, bound=bound)
    grid = params.secure_grid(X.shape[0])   # public: params and n only, never sigma_t
    Y_prev = q.copy()
    z_prev = q.copy()
    out = {k: [] for k in ("Y", "z", "delta_bar", "sigma", "activated", "uncertain", "gate_counts")}
    for t in range(1, T + 1):
        a, m, sq = phi(X, Y_prev, r)                                    # a_t, |J_t|
        z = clean[t] if clean is not None else phi(X, z_prev, r)[0]     # z_t
        R = z - a
        H = np.sum(R * R, axis=1) > params.threshold ** 2
        Q = project_ball(a + H[:, None] * R, Y_prev, r)
        delta_bar, uncertain = cert.step(t, Y_prev, sq, m, a)
        sigma = delta_bar * params.noise_multiplier
        Y = project_ball(noise.perturb(t, Q, sigma, delta_bar, grid=grid), q, (t + 1) * r)
        for k, v in (("Y", Y), ("z", z), ("delta_bar", delta_bar), ("sigma", sigma), ("activated", H),
                     ("uncertain", uncertain), ("gate_counts", m)):
            out[k].append(v)
        Y_prev, z_prev = Y, z
    return BraceRun(**{k: np.stack(v, axis=1) for k, v in out.items()})
