"""Synthetic BRACE instances of papers/001 Sec. 6.1: the three-component Gaussian mixture and
the cues that make a trajectory sit on (or near) a basin boundary.

Library code used by the ``brace.synthetic`` experiment (:mod:`fedmem.experiments.brace`)
and the tests. Randomness comes from the injected ``rng`` only.
"""

from __future__ import annotations

import numpy as np

from fedmem.agent.brace.baselines import iterative_baseline
from fedmem.agent.brace.lsr import clean_trajectory, sq_dists
from fedmem.agent.brace.params import BraceParams
from fedmem.dp import samplers


def make_mixture(n: int, mode_std: float, bridge_std, bridge_weight: float, rng) -> np.ndarray:
    """Two dominant modes at (+-1, 0) plus a broader central component connecting them."""
    comp = rng.choice(3, size=n, p=[(1 - bridge_weight) / 2, (1 - bridge_weight) / 2, bridge_weight])
    centers = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    stds = np.array([[mode_std, mode_std], [mode_std, mode_std], list(bridge_std)])
    return centers[comp] + rng.standard_normal((n, 2)) * stds[comp]


def basin_boundary_start(X: np.ndarray, y: float, r: float, T: int, lo: float = -0.9, hi: float = 0.9,
                         halvings: int = 60) -> np.ndarray:
    """``(x, y)`` where the x-coordinate of the noiseless endpoint ``z_T`` changes sign along
    ``x in [lo, hi]`` (bisection; the returned point is on the ``lo`` side). Raises
    ``ValueError`` when both ends give the same sign (no boundary on that line)."""
    f = lambda x: clean_trajectory(X, np.array([[x, y]]), r, T)[-1, 0, 0]  # noqa: E731
    s_lo, s_hi = np.sign(f(lo)), np.sign(f(hi))
    if s_lo == s_hi:
        raise ValueError(f"query.q[1] must give a basin boundary on x in [{lo}, {hi}] (the noiseless endpoint "
                         f"has the same side at both ends). Found q[1]={y!r}.")
    for _ in range(halvings):
        mid = (lo + hi) / 2
        if np.sign(f(mid)) == s_lo:
            lo = mid
        else:
            hi = mid
    return np.array([lo, y])


def unstable_start(X: np.ndarray, params: BraceParams, box, points: int, min_gate: int, draws: int,
                   rng) -> tuple[np.ndarray, dict]:
    """The paper-setup cue of Sec. 6.1: among the cues of the grid ``box x box`` (``points``
    per axis) whose gate ``I(D, q)`` holds at least ``min_gate`` memories, the one where
    Naive DAM's mean final per-coordinate squared error vs noiseless DAM is largest over
    ``draws`` innovations from ``rng`` (a stream of its own: the reported draws never
    select the cue). Returns ``(cue, calibration stats)``; raises ``ValueError`` when no
    candidate has a large enough gate."""
    g = np.linspace(box[0], box[1], points)
    cand = np.array([[x, y] for x in g for y in g])
    cand = cand[(sq_dists(X, cand) <= params.r ** 2).sum(1) >= min_gate]
    if cand.shape[0] == 0:
        raise ValueError(f"query.min_gate must leave at least one candidate cue in the search box. Found min_gate="
                         f"{min_gate!r} with no cue of the {points}x{points} grid on {list(box)} holding that many.")
    S, T = cand.shape[0], params.T
    normals = samplers.gaussian(1.0, (draws, T, 2), rng)
    z = clean_trajectory(X, cand, params.r, T)                                  # (T+1, S, 2)
    Y = iterative_baseline(X, np.repeat(cand, draws, axis=0), params, np.tile(normals, (S, 1, 1)), "count")
    zt = np.transpose(np.repeat(z[1:], draws, axis=1), (1, 0, 2))
    final = (np.sum((Y[:, -1] - zt[:, -1]) ** 2, axis=1) / 2).reshape(S, draws).mean(axis=1)
    best = int(np.argmax(final))
    return cand[best], {"candidates": S, "calibration_draws": draws,
                        "calibration_final_error_naive": float(final[best])}
