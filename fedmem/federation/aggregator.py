"""Aggregator: central-DP release of what the compute parties revealed.

DESIGN.md steps 4-5; papers/003, "Core Distinction" and "Condition of Validity".
The compute parties open to the aggregator the *exact* sum ``S`` of the selected value
vectors, the exact selected count ``n`` and (only for receipt policies that need them)
the exact per-shard tallies ``t``. The aggregator turns them into **channels**, each a
candidate release that the engine (or gateway) books before it is emitted.

Adjacency and sensitivities (add/remove one record anywhere in the federation):
adding or removing a record changes each shard's local top-k' list by at most one
insertion and one deletion, and then the global selection (top-k, threshold, or
broadcast) by at most one insertion and one deletion. Hence, with values clipped to
``||v||_2 <= C``:

* sum ``S``: L2 sensitivity ``Delta_2 = 2C`` (L1 ``Delta_1 = 2C sqrt(d)``);
* tallies ``t``: at most two entries move by 1, L2 sensitivity ``sqrt(2)``, L1 ``2``;
* count ``n``: sensitivity 1 (constant under broadcast, and under top-k whenever the
  federation holds at least k candidates).

**Value channel** (``"value"``): the released vector is a noised mean

    value = S / D + Z,    Z ~ N(0, (sigma * Delta_2 / n_cal)^2 I)      (Gaussian)
                          Z ~ Lap(sigma * Delta_1 / n_cal)^d           (Laplace)

with denominator ``D`` = the public count when the selection fixes it (top-k: ``k``,
broadcast: ``S_total * k'``), else the noised count (``receipts="noised"``), else the
exact ``max(n, 1)``. The booked record is the mechanism the operator *claims*: a
Gaussian (Laplace) with noise multiplier ``sigma`` for sensitivity ``Delta / n_cal`` of
the mean, i.e. one ``GaussianDpEvent(sigma)`` (``LaplaceDpEvent(sigma)``).

* ``calibration="realized"``: ``n_cal = D``, so ``value = (S + N(0, (sigma Delta_2)^2 I)) / D``
  is post-processing of a sum released with noise multiplier ``sigma``: the booking is
  exact.
* ``calibration="global"`` (the flawed practice of papers/003, "Noise-Scale Mismatch"):
  ``n_cal = n_bound``. The mean over ``n`` contributors has sensitivity ``Delta / n``,
  so the noise multiplier actually delivered is ``sigma * n / n_bound``: far below the
  booked ``sigma`` when ``n`` is small (a leak beyond the booked epsilon), far above it
  when ``n`` is large (utility collapse). The gateway's calibration check catches it.

**Support channels** (``"count"``, ``"receipts"``), per receipt policy:

* ``expose``: exact tallies and count. A deterministic, data-dependent count separates
  some pair of neighbouring datasets with certainty (papers/003's cardinality
  differencing), so it has **no finite epsilon and cannot be booked as DP**; such a
  channel is kind ``"exact"``. Only the gateway can stop it.
* ``suppress``: nothing. But if ``D`` is the exact data-dependent ``n`` (threshold
  selection), the value's denominator carries ``n``: with 128-d Gaussian noise the
  norm of the released vector pins ``n`` almost exactly. That is emitted as the
  implicit channel ``"count:implicit"`` (kind ``"exact"``), not hidden.
* ``noised``: tallies ``t + N(0, (receipt_sigma * sqrt 2)^2 I)`` (Laplace: scale
  ``2 * receipt_sigma``), booked as ``GaussianDpEvent(receipt_sigma)``
  (``LaplaceDpEvent(receipt_sigma)``); the released count is the sum of the noised
  tallies (post-processing, free).
* ``broadcast``: the selection is forced to broadcast, so every tally is ``k'`` and the
  count is ``S_total * k'`` by construction: kind ``"public"``, zero leakage.

Every ``"dp"`` channel's event is booked (one ``ComposedDpEvent`` per query, one SQLite
transaction) **before** the release object is handed out; ``"exact"`` channels are
listed so that callers can see they are unaccounted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import dp_accounting
import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant, GaussianMechanism, LaplaceMechanism
from fedmem.federation.sharing import SelectionSpec

SELECTIONS = ("topk", "threshold", "broadcast")
NOISES = ("gaussian", "laplace")
CALIBRATIONS = ("global", "realized")
RECEIPTS = ("expose", "suppress", "noised", "broadcast")
CHANNEL_KINDS = ("dp", "derived", "public", "exact")

TALLY_L2 = math.sqrt(2.0)
TALLY_L1 = 2.0


@dataclass(frozen=True)
class Channel:
    """One emitted (or about-to-be-emitted) release channel.

    ``kind``: ``"dp"`` (noised, ``event`` is its DP event), ``"derived"``
    (post-processing of the query's other DP channels, e.g. the sum of noised tallies:
    no cost of its own), ``"public"`` (constant by construction, carries no information
    about the data) or ``"exact"`` (a
    deterministic data-dependent value: no finite epsilon, ``event`` is None).
    ``support``: True for support channels (count, receipts, implicit count).
    """

    name: str
    kind: str
    support: bool
    event: object = None

    def __post_init__(self):
        if self.kind not in CHANNEL_KINDS:
            raise ValueError(f"kind must be one of {CHANNEL_KINDS}. Found {self.kind!r}.")
        if (self.kind == "dp") != (self.event is not None):
            raise ValueError(f"event must be given exactly for 'dp' channels. Found kind={self.kind!r}, "
                             f"event={self.event!r}.")


@dataclass(frozen=True)
class Release:
    """The aggregator's candidate release for one query. Nothing in it has left yet."""

    value: np.ndarray
    count: float | None
    receipts: np.ndarray | None
    channels: tuple
    realized_n: int            # exact selected count (inside the trust boundary)
    calibrated_n: float        # n the value noise was calibrated for (n_bound, or realized n)
    denominator: float         # D of the released mean
    effective_noise_multiplier: float   # noise multiplier actually delivered on the value
    selection: str

    @property
    def dp_events(self) -> list:
        return [c.event for c in self.channels if c.kind == "dp"]

    @property
    def exact_channels(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.channels if c.kind == "exact")

    def event(self):
        """All DP events of this release as one composable event (None if there are none)."""
        ev = self.dp_events
        if not ev:
            return None
        return ev[0] if len(ev) == 1 else dp_accounting.ComposedDpEvent(list(ev))


def book_release(accountant: Accountant, release: Release, label: str):
    """Book every DP channel of ``release`` in one transaction; returns the Booking or None.

    Raises :class:`~fedmem.errors.BudgetExceeded` (nothing booked) if over budget. Call
    **before** emitting anything from ``release``.
    """
    ev = release.event()
    if ev is None:
        return None
    return accountant.book(ev, label=label)


@dataclass(frozen=True)
class ReleasePolicy:
    """Frozen parameters of the aggregator (validated at construction)."""

    selection: str
    shards: int
    k_local: int
    clip: float
    value_dim: int
    k: int = 5
    threshold: float = 0.5
    noise: str = "gaussian"
    sigma: float = 1.2
    calibration: str = "global"
    n_bound: int = 40
    receipts: str = "expose"
    receipt_sigma: float = 1.0
    sampling: str = "fast"
    public_count: int | None = field(default=None)

    def __post_init__(self):
        for name, allowed in (("selection", SELECTIONS), ("noise", NOISES), ("calibration", CALIBRATIONS),
                              ("receipts", RECEIPTS), ("sampling", ("fast", "secure"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}. Found {getattr(self, name)!r}.")
        V.positive_int("shards", self.shards)
        V.positive_int("k_local", self.k_local)
        V.positive("clip", self.clip)
        V.positive_int("value_dim", self.value_dim)
        V.positive_int("k", self.k)
        V.finite("threshold", self.threshold)
        V.positive("sigma", self.sigma)
        V.positive_int("n_bound", self.n_bound)
        V.positive("receipt_sigma", self.receipt_sigma)
        if self.receipts == "broadcast" and self.selection != "broadcast":
            raise ValueError(f"selection must be 'broadcast' when receipts='broadcast' (the engine forces it). "
                             f"Found {self.selection!r}.")
        if self.public_count is not None:
            V.positive_int("public_count", self.public_count)

    @property
    def sum_l2_sensitivity(self) -> float:
        return 2.0 * self.clip

    @property
    def sum_l1_sensitivity(self) -> float:
        return 2.0 * self.clip * math.sqrt(self.value_dim)

    def selection_spec(self) -> SelectionSpec:
        """What the compute parties select and open: tallies only if a receipt policy needs them."""
        reveal = {"sum", "count"}
        if self.receipts in ("expose", "noised"):
            reveal.add("tallies")
        return SelectionSpec(mode=self.selection, k=self.k, threshold=self.threshold, reveal=frozenset(reveal))

    def receipt_mechanism(self):
        if self.noise == "gaussian":
            return GaussianMechanism.from_noise_multiplier(self.receipt_sigma, TALLY_L2)
        return LaplaceMechanism(scale=self.receipt_sigma * TALLY_L1, l1_sensitivity=TALLY_L1)

    def value_mechanism(self, n_cal: float):
        """The claimed mean mechanism: noise multiplier ``sigma`` for sensitivity Delta / n_cal."""
        if self.noise == "gaussian":
            return GaussianMechanism.from_noise_multiplier(self.sigma, self.sum_l2_sensitivity / n_cal)
        return LaplaceMechanism(scale=self.sigma * self.sum_l1_sensitivity / n_cal,
                                l1_sensitivity=self.sum_l1_sensitivity / n_cal)


class Aggregator:
    """Turns one query's revealed ``(sum, count, tallies)`` into a :class:`Release`."""

    def __init__(self, policy: ReleasePolicy):
        if not isinstance(policy, ReleasePolicy):
            raise TypeError(f"policy must be a ReleasePolicy. Found {type(policy).__name__}.")
        self.policy = policy

    def release(self, total, count, tallies, rng: np.random.Generator) -> Release:
        """Noise and package one query's exact aggregate (see the module docstring)."""
        p = self.policy
        V.rng_check("rng", rng)
        total = V.finite_array("total", total, ndim=1, dim=p.value_dim)
        n = int(count)
        if n < 0:
            raise ValueError(f"count must be >= 0. Found {count!r}.")
        channels = []
        receipts = released_count = None
        denom = None
        # The count is public only if it is the value the selection fixes; anything else
        # (e.g. top-k over fewer than k candidates) is treated as data-dependent.
        public = p.public_count if p.public_count is not None and n == p.public_count else None
        if p.receipts == "broadcast":
            receipts = np.full(p.shards, float(p.k_local))
            released_count = float(p.shards * p.k_local)
            channels += [Channel("count", "public", True), Channel("receipts", "public", True)]
        elif p.receipts == "noised":
            if tallies is None:
                raise ValueError("tallies must be revealed for receipts='noised'. Found None.")
            mech = p.receipt_mechanism()
            receipts = mech.release(np.asarray(tallies, dtype=np.float64), rng, sampling=p.sampling)
            released_count = float(receipts.sum())
            channels.append(Channel("receipts", "dp", True, mech.event()))
            channels.append(Channel("count", "derived", True))
            if public is None:
                denom = max(1.0, released_count)
        elif p.receipts == "expose":
            if tallies is None:
                raise ValueError("tallies must be revealed for receipts='expose'. Found None.")
            receipts = np.asarray(tallies, dtype=np.int64).copy()
            released_count = float(n)
            const = p.selection == "broadcast"
            channels.append(Channel("receipts", "public" if const else "exact", True))
            channels.append(Channel("count", "public" if (const or public is not None) else "exact", True))
        if denom is None:
            if public is not None:
                denom = float(public)
            else:
                denom = float(max(1, n))
                if p.receipts == "suppress":
                    channels.append(Channel("count:implicit", "exact", True))
        n_cal = float(p.n_bound) if p.calibration == "global" else denom
        mech = p.value_mechanism(n_cal)
        value = mech.release(total / denom, rng, sampling=p.sampling)
        channels.insert(0, Channel("value", "dp", False, mech.event()))
        if p.calibration == "realized":
            eff, cal_n = p.sigma, float(n)
        else:
            n_eff = denom if public is not None else max(1, n)
            eff, cal_n = p.sigma * n_eff / p.n_bound, float(p.n_bound)
        return Release(value=value, count=released_count, receipts=receipts, channels=tuple(channels),
                       realized_n=n, calibrated_n=cal_n, denominator=denom, effective_noise_multiplier=eff,
                       selection=p.selection)

