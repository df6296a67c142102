"""The two noise laws of DP-MIND's token perturbation, selectable by name.

``"l2"`` -- :class:`fedmem.dp.MetricLaplace` (the default, the paper's Sec. 3.1 as
written): density proportional to ``exp(-epsilon ||z||_2)`` in R^d, drawn as radius
~ Gamma(d, 1/epsilon) times a uniform direction. Guarantee (epsilon-d_chi, L2 metric):
for any two inputs a, b and any output set S,

    Pr[M(a) in S] <= exp(epsilon * ||phi(a) - phi(b)||_2) * Pr[M(b) in S].

The noise norm has mean d/epsilon, so at a fixed table scale a *larger* d needs a
*larger* epsilon for the same utility.

``"l1"`` -- :class:`CoordinateLaplace`: every coordinate gets independent
Laplace(0, 1/epsilon) noise, i.e. density proportional to ``exp(-epsilon ||z||_1)``.
Guarantee (epsilon-d_chi, L1 metric): for any two inputs a, b and any output set S,

    Pr[M(a) in S] <= exp(epsilon * ||phi(a) - phi(b)||_1) * Pr[M(b) in S],

because ``p_a(y) / p_b(y) = exp(epsilon (||y - b||_1 - ||y - a||_1))
<= exp(epsilon ||a - b||_1)`` by the triangle inequality, and the projection to a token
is post-processing. The per-coordinate noise scale does not grow with d (standard
deviation sqrt(2)/epsilon per coordinate against about sqrt(d)/epsilon for ``"l2"``),
which is the only reading under which the paper's epsilon = 6-8 leaves most tokens
unchanged. Note the metric: ||.||_1 >= ||.||_2, up to sqrt(d) times larger (about 16x
for MiniLM's 384-d rows), so an "l1" epsilon is not comparable with an "l2" epsilon.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedmem import _validate as V
from fedmem.dp import MetricLaplace

MECHANISMS = ("l2", "l1")


@dataclasses.dataclass(frozen=True)
class CoordinateLaplace:
    """Per-coordinate Laplace in R^d: density proportional to exp(-epsilon * ||z||_1).

    epsilon-d_chi private with the L1 metric: Pr[M(a) in S] <= exp(epsilon ||a - b||_1)
    Pr[M(b) in S] for every output set S (see the module docstring).
    """

    epsilon: float
    dim: int
    metric = "l1"

    def __post_init__(self):
        V.positive("epsilon", self.epsilon)
        V.positive_int("dim", self.dim)

    def sample(self, rng, n: int | None = None) -> np.ndarray:
        """``n`` draws of shape (n, dim), or one of shape (dim,) when ``n`` is None."""
        V.rng_check("rng", rng)
        count = 1 if n is None else V.positive_int("n", n)
        if isinstance(rng, np.random.Generator):
            out = rng.laplace(0.0, 1.0 / self.epsilon, size=(count, self.dim))
        else:
            import torch

            # Inverse CDF of uniforms from the injected generator: Laplace(0, b) =
            # -b sign(u) log(1 - 2|u|), u uniform on (-1/2, 1/2).
            u = torch.rand((count, self.dim), generator=rng, dtype=torch.float64).numpy() - 0.5
            out = -np.sign(u) * np.log1p(-2.0 * np.abs(u)) / self.epsilon
        return out[0] if n is None else out


def make_mechanism(kind: str, epsilon: float, dim: int):
    """``"l2"`` -> :class:`MetricLaplace`, ``"l1"`` -> :class:`CoordinateLaplace`."""
    if kind == "l2":
        return MetricLaplace(epsilon, dim)
    if kind == "l1":
        return CoordinateLaplace(epsilon, dim)
    raise ValueError(f"mechanism must be one of {list(MECHANISMS)}. Found {kind!r}.")


def guarantee_distance(mechanism, a: np.ndarray, b: np.ndarray) -> float:
    """The metric of ``mechanism``'s guarantee between embeddings a and b (float64)."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return float(np.abs(diff).sum()) if isinstance(mechanism, CoordinateLaplace) else float(np.linalg.norm(diff))
