"""An adaptive querying adversary: the next query depends on the responses seen so far.

papers/003 observed its leak "across 300 adaptively chosen queries". The adversary here
knows only public things: rough topic anchors (unit vectors near the data's clusters,
e.g. the topics it would ask about as a legitimate agent) and the public mechanism. It
learns the rest from the support channel:

1. **Probe.** Each anchor is a query *family*; the first pass asks every anchor once,
   with a small random perturbation (families are what the gateway tracks).
2. **Refine.** Afterwards each step either explores (probability ``explore``: the least
   asked family, perturbed by a random radius up to ``step``) or exploits: it picks the
   family whose observed support varies most (the edge of a cluster, where adding or
   removing one record changes who contributes, so membership shows most) and asks a
   point between that family's highest- and lowest-support queries, perturbed.
3. **Re-query.** When the gateway refuses a query, the adversary retries it once as a
   declared retry (``retry_of``) with a fresh perturbation and then deprioritises that
   family; a silent adversary (``declare_retries=False``) omits ``retry_of`` so the
   gateway must catch the repetition itself.

The support of a response is what the adversary can read: non-zero receipts, else the
released count (:func:`fedmem.attacks.support.reconstruct_cardinality`). All
randomness comes from the injected generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedmem import _validate as V
from fedmem.attacks.support import reconstruct_cardinality


@dataclass(frozen=True)
class Probe:
    """One query the adversary wants to ask."""

    index: int
    q: np.ndarray              # unit-norm query vector
    family: str                # query family id (one per anchor)
    retry_of: int | None = None


@dataclass
class _Family:
    anchor: np.ndarray
    asked: int = 0
    rejected: int = 0
    points: list = field(default_factory=list)     # (q, support estimate)


def _unit(x: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(x))
    if n == 0.0:
        raise ValueError("query direction must be non-zero. Found the zero vector.")
    return x / n


class AdaptiveAdversary:
    """Chooses each query from past responses (probe, refine toward support edges, re-query).

    Parameters: ``anchors`` (F, d) public topic directions (normalised here); ``rng`` the
    injected generator; ``shards`` and ``k_local`` (public deployment facts used to read
    the count channel); ``step`` the largest perturbation radius (relative to a unit
    query); ``explore`` the probability of an exploration step; ``declare_retries``
    whether refused queries are re-asked with ``retry_of`` set.
    """

    def __init__(self, anchors, rng: np.random.Generator, *, shards: int, k_local: int, step: float = 0.6,
                 explore: float = 0.3, declare_retries: bool = True):
        a = V.finite_array("anchors", anchors, ndim=2)
        V.rng_check("rng", rng)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator. Found {type(rng).__name__}.")
        self.shards = V.positive_int("shards", shards)
        self.k_local = V.positive_int("k_local", k_local)
        self.step = V.positive("step", step)
        self.explore = V.finite("explore", explore)
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"explore must be in [0, 1]. Found {explore!r}.")
        self.declare_retries = bool(declare_retries)
        self.rng = rng
        self.dim = a.shape[1]
        self.families = [_Family(_unit(row)) for row in a]
        self._issued: dict[int, Probe] = {}
        self._pending_retry: list[Probe] = []
        self._next = 0
        self.log: list[tuple[int, str, str, float]] = []   # (index, family, outcome, support)

    # -------------------------------------------------------------- query choice
    def _perturb(self, centre: np.ndarray, radius: float) -> np.ndarray:
        z = self.rng.standard_normal(self.dim)
        z -= (z @ centre) * centre                      # tangent direction
        z = _unit(z)
        return _unit(centre + radius * z)

    def _choose(self) -> tuple[int, np.ndarray]:
        fams = self.families
        unprobed = [i for i, f in enumerate(fams) if f.asked == 0]
        if unprobed:
            i = unprobed[0]
            return i, self._perturb(fams[i].anchor, self.step * self.rng.uniform(0.0, 0.3))
        # prefer families the gateway did not keep refusing
        weight = np.array([1.0 / (1.0 + 4.0 * f.rejected) for f in fams])
        if self.rng.random() < self.explore:
            score = weight / (1.0 + np.array([f.asked for f in fams]))
            i = int(np.argmax(score + 1e-9 * self.rng.random(len(fams))))
            return i, self._perturb(fams[i].anchor, self.step * self.rng.uniform(0.0, 1.0))
        spread = np.array([np.ptp([s for _, s in f.points]) if len(f.points) >= 2 else 0.0 for f in fams])
        score = weight * (spread + 0.5) / np.sqrt(1.0 + np.array([f.asked for f in fams]))
        i = int(np.argmax(score + 1e-9 * self.rng.random(len(fams))))
        f = fams[i]
        if len(f.points) >= 2:
            sup = np.array([s for _, s in f.points])
            hi, lo = f.points[int(np.argmax(sup))][0], f.points[int(np.argmin(sup))][0]
            t = self.rng.uniform(0.25, 0.75)
            centre = _unit((1 - t) * hi + t * lo) if np.linalg.norm((1 - t) * hi + t * lo) > 0 else f.anchor
            return i, self._perturb(centre, 0.25 * self.step * self.rng.uniform(0.0, 1.0))
        return i, self._perturb(f.anchor, self.step * self.rng.uniform(0.0, 1.0))

    def next_query(self) -> Probe:
        """The next probe: a pending retry first, else a new adaptively chosen query."""
        if self._pending_retry:
            p = self._pending_retry.pop(0)
        else:
            i, q = self._choose()
            p = Probe(self._next, q, f"family-{i}")
        p = Probe(self._next, p.q, p.family, p.retry_of)
        self._next += 1
        self._issued[p.index] = p
        self.families[int(p.family.split("-")[1])].asked += 1
        return p

    # ---------------------------------------------------------------- feedback
    def observe(self, probe: Probe, response) -> float:
        """Record the response to ``probe`` (``None`` = refused). Returns the support read."""
        if probe.index not in self._issued:
            raise ValueError(f"probe must come from next_query(). Found index {probe.index!r}.")
        fam = self.families[int(probe.family.split("-")[1])]
        if response is None:
            fam.rejected += 1
            if probe.retry_of is None and fam.rejected <= 1:
                retry = self._perturb(probe.q, 0.1 * self.step)
                self._pending_retry.append(
                    Probe(-1, retry, probe.family, probe.index if self.declare_retries else None))
            self.log.append((probe.index, probe.family, "rejected", float("nan")))
            return float("nan")
        est, _ = reconstruct_cardinality(response, shards=self.shards, k_local=self.k_local)
        support = float(est) if np.isfinite(est) else 0.0
        fam.points.append((probe.q, support))
        self.log.append((probe.index, probe.family, "answered", support))
        return support
