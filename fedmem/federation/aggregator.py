"""Aggregator: central-DP release of what the compute parties revealed.

DESIGN.md steps 4-5; papers/003, "Core Distinction" and "Condition of Validity".
The compute parties open to the aggregator the *exact* sum ``S`` of the selected value
vectors, the exact selected count ``n`` and (only for receipt policies that need them)
the exact per-shard tallies ``t``. The aggregator turns them into **channels**, each a
candidate release that the engine books before it is emitted.

**Plan first, data second.** :meth:`ReleasePolicy.plan` lists every channel a release
of this policy will carry, its kind and its DP event, from the *public* configuration
alone; :meth:`Aggregator.release` then fills the plan with data and fails closed if the
data does not fit it (e.g. a "public" count that is not the public value). So what is
booked and whether a release can be admitted never depend on the private data
(fedmem's threat model, ``docs/federation.md``).

Adjacency and sensitivities (add/remove one record anywhere in the federation):
adding or removing a record changes each shard's local top-k' list by at most one
insertion and one deletion, and then the global selection (top-k, threshold, or
broadcast) by at most one insertion and one deletion. Hence, with values clipped to
``||v||_2 <= C``:

* sum ``S``: L2 sensitivity ``Delta_2 = 2C`` (L1 ``Delta_1 = 2C sqrt(d)``);
* tallies ``t``: at most two entries move by 1, L2 sensitivity ``sqrt(2)``, L1 ``2``;
* count ``n``: sensitivity 1 (constant under broadcast, and under top-k whenever the
  federation holds at least k candidates).

**Value channel** (``"value"``), a noised mean with denominator ``D``: the public count
when the selection fixes it (top-k: ``k``; broadcast: ``S_total * k'``), else the noised
count (``receipts="noised"``), else the exact ``max(n, 1)``.

* ``calibration="realized"``: the noise is calibrated to the denominator actually
  applied: ``value = (S + Z) / D`` with ``Z ~ N(0, (sigma Delta_2)^2 I)`` (Laplace:
  ``Lap(sigma Delta_1)^d``). This is post-processing of a sum released with noise
  multiplier ``sigma`` (and, for a noised ``D``, of the booked noised tallies), so
  ``GaussianDpEvent(sigma)`` (``LaplaceDpEvent(sigma)``) is exact, whatever the data.
* ``calibration="global"`` (papers/003, "Noise-Scale Mismatch"): the noise is sized for a
  fixed ``n_bound``: ``value = S / D + N(0, (sigma Delta_2 / n_bound)^2 I)``. The mean's
  sensitivity is ``Delta_2 / D``, so the **delivered** noise multiplier is
  ``sigma * D / n_bound``. With a public ``D`` that is a public number and is what is
  booked (never the nominal ``sigma``). With a data-derived ``D`` (exact or noised count)
  the delivered multiplier depends on the data and is unbounded below (``D = 1``): no
  data-independent event covers it. The plan then books the operator's *claim*
  ``sigma`` (the flawed practice the undefended scenarios demonstrate) and adds the
  support channel ``"value:calibration"`` of kind ``"exact"``: the release leaks beyond
  its booking, and a gateway can never admit it (the engine refuses to build such a
  defended federation).

**Support channels** (``"count"``, ``"receipts"``), per receipt policy:

* ``expose``: exact tallies and count. A deterministic, data-dependent count separates
  some pair of neighbouring datasets with certainty (papers/003's cardinality
  differencing), so it has **no finite epsilon and cannot be booked as DP**; such a
  channel is kind ``"exact"``.
* ``suppress``: nothing. But if ``D`` is the exact data-dependent ``n`` (threshold
  selection), the value's denominator carries ``n``: with 128-d noise the norm of the
  released vector pins ``n`` almost exactly. That is the implicit channel
  ``"count:implicit"`` (kind ``"exact"``), not hidden.
* ``noised``: tallies ``t + N(0, (receipt_sigma * sqrt 2)^2 I)`` (Laplace: scale
  ``2 * receipt_sigma``), booked as ``GaussianDpEvent(receipt_sigma)``
  (``LaplaceDpEvent(receipt_sigma)``); the released count is the sum of the noised
  tallies (post-processing, free).
* ``broadcast``: the selection is forced to broadcast, so every tally is ``k'`` and the
  count is ``S_total * k'`` by construction: kind ``"public"``, zero leakage.

Every ``"dp"`` channel's event is booked before the release object is handed out;
``"exact"`` channels are listed so that callers can see they are unaccounted.

**Secure sampling.** ``sampling="secure"`` draws exact discrete noise on a grid derived
from the noise scale; every scale used here (``sigma Delta``, ``sigma Delta / n_bound``,
``receipt_sigma * sensitivity``) is public configuration, never a function of the data,
so the grid carries no information.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import dp_accounting
import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant, GaussianMechanism, LaplaceMechanism
from fedmem.dp.samplers import grid_granularity
from fedmem.federation.config import CALIBRATIONS, NOISES, RECEIPTS, SELECTIONS
from fedmem.federation.sharing import SelectionSpec

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


def _compose(events):
    events = list(events)
    if not events:
        return None
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


@dataclass(frozen=True)
class ReleasePlan:
    """What every release of one policy carries, decided from public configuration alone.

    ``denominator``: ``"public"`` (the selection fixes the count), ``"noised"`` (the sum
    of the booked noised tallies) or ``"exact"`` (the exact count ``max(n, 1)``).
    ``delivered_multiplier``: the value channel's noise multiplier for the mean actually
    released, when it does not depend on the data; ``None`` when it does (global
    calibration with a data-derived denominator).
    """

    channels: tuple
    selection: str
    denominator: str
    delivered_multiplier: float | None

    @property
    def dp_events(self) -> list:
        return [c.event for c in self.channels if c.kind == "dp"]

    @property
    def support_events(self) -> list:
        return [c.event for c in self.channels if c.kind == "dp" and c.support]

    @property
    def exact_channels(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.channels if c.kind == "exact")

    @property
    def bookable(self) -> bool:
        """True when every channel is booked DP, post-processing or public (no exact channel)."""
        return not self.exact_channels

    def event(self):
        """All DP events of one release as one composable event (None if there are none)."""
        return _compose(self.dp_events)

    def support_event(self):
        return _compose(self.support_events)


@dataclass(frozen=True)
class Release:
    """The aggregator's candidate release for one query. Nothing in it has left yet."""

    value: np.ndarray
    count: float | None
    receipts: np.ndarray | None
    plan: ReleasePlan
    realized_n: int            # exact selected count (inside the trust boundary)
    denominator: float         # D of the released mean
    effective_noise_multiplier: float   # noise multiplier actually delivered on the mean

    @property
    def channels(self) -> tuple:
        return self.plan.channels

    @property
    def selection(self) -> str:
        return self.plan.selection

    @property
    def dp_events(self) -> list:
        return self.plan.dp_events

    @property
    def exact_channels(self) -> tuple[str, ...]:
        return self.plan.exact_channels

    def event(self):
        """All DP events of this release as one composable event (None if there are none)."""
        return self.plan.event()


def book_release(accountant: Accountant, release: Release, label: str):
    """Book every DP channel of ``release`` in one transaction; returns the Booking or None.

    Raises :class:`~fedmem.errors.BudgetExceeded` (nothing booked) if over budget. Call
    **before** emitting anything from ``release``.
    """
    ev = release.event()
    if ev is None:
        return None
    return accountant.book(ev, label=label)


def delivered_epsilon(noise: str, multiplier: float, delta: float) -> float:
    """Epsilon of one release with noise ``multiplier`` (Gaussian: analytic at ``delta``;
    Laplace: ``1 / multiplier``, pure)."""
    multiplier = V.positive("multiplier", multiplier)
    if noise == "gaussian":
        return GaussianMechanism.from_noise_multiplier(multiplier).epsilon(delta)
    if noise == "laplace":
        return 1.0 / multiplier
    raise ValueError(f"noise must be one of {NOISES}. Found {noise!r}.")


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
    calibration: str = "realized"
    n_bound: int = 40
    receipts: str = "suppress"
    receipt_sigma: float = 1.0
    sampling: str = "secure"   # "fast": float samplers, not DP as released (fedmem.dp.samplers)
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
        if self.selection == "broadcast" and self.public_count is None:
            object.__setattr__(self, "public_count", self.shards * self.k_local)

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

    def _mechanism(self, multiplier: float, sens_scale: float = 1.0):
        """Noise multiplier ``multiplier`` for the sum's sensitivity divided by ``sens_scale``."""
        if self.noise == "gaussian":
            return GaussianMechanism.from_noise_multiplier(multiplier, self.sum_l2_sensitivity / sens_scale)
        return LaplaceMechanism(scale=multiplier * self.sum_l1_sensitivity / sens_scale,
                                l1_sensitivity=self.sum_l1_sensitivity / sens_scale)

    @property
    def denominator_kind(self) -> str:
        if self.public_count is not None:
            return "public"
        if self.receipts == "noised":
            return "noised"
        return "exact"

    def plan(self) -> ReleasePlan:
        """The channels, kinds and DP events of every release of this policy (public data only)."""
        dk = self.denominator_kind
        const = self.selection == "broadcast"
        support: list[Channel] = []
        if self.receipts == "broadcast":
            support += [Channel("count", "public", True), Channel("receipts", "public", True)]
        elif self.receipts == "noised":
            support += [Channel("receipts", "dp", True, self.receipt_mechanism().event()),
                        Channel("count", "derived", True)]
        elif self.receipts == "expose":
            support += [Channel("receipts", "public" if const else "exact", True),
                        Channel("count", "public" if (const or dk == "public") else "exact", True)]
        elif dk == "exact":   # suppress: the exact denominator carries n
            support.append(Channel("count:implicit", "exact", True))
        if self.calibration == "realized":
            delivered = self.sigma
            value_event = self._mechanism(self.sigma).event()
        elif dk == "public":
            delivered = self.sigma * self.public_count / self.n_bound
            value_event = self._mechanism(delivered).event()
        else:
            delivered = None
            value_event = self._mechanism(self.sigma).event()    # the (wrong) claim of papers/003
            support.append(Channel("value:calibration", "exact", True))
        return ReleasePlan((Channel("value", "dp", False, value_event), *support), self.selection, dk, delivered)


class Aggregator:
    """Turns one query's revealed ``(sum, count, tallies)`` into a :class:`Release`."""

    def __init__(self, policy: ReleasePolicy):
        if not isinstance(policy, ReleasePolicy):
            raise TypeError(f"policy must be a ReleasePolicy. Found {type(policy).__name__}.")
        self.policy = policy
        self.plan = policy.plan()
        # Mechanisms (frozen parameter records) and grids built from PUBLIC configuration only, made on
        # first use and reused by every release (a noised denominator's mechanism is never cached).
        self._public: dict = {}

    def _cached(self, key, make):
        got = self._public.get(key)
        if got is None:
            got = self._public[key] = make()
        return got

    def _grid(self, public_mech) -> dict:
        """Secure sampling's grid, always from a noise scale that is public configuration."""
        if self.policy.sampling != "secure":
            return {}
        scale = public_mech.sigma if hasattr(public_mech, "sigma") else public_mech.scale
        return {"grid": grid_granularity(scale)}

    def release(self, total, count, tallies, rng: np.random.Generator) -> Release:
        """Fill the policy's plan with one query's exact aggregate (module docstring).

        Raises ``ValueError`` if the data does not fit the plan (e.g. a count that the
        plan calls public differs from the public value): callers fail closed.
        """
        p, plan = self.policy, self.plan
        V.rng_check("rng", rng)
        total = V.finite_array("total", total, ndim=1, dim=p.value_dim)
        n = int(count)
        if n < 0:
            raise ValueError(f"count must be >= 0. Found {count!r}.")
        receipts = released_count = None
        if plan.denominator == "public" and n != p.public_count:
            raise ValueError(f"count must equal the public count {p.public_count} that the release plan relies "
                             f"on. Found {n}.")
        if p.receipts == "broadcast":
            receipts = np.full(p.shards, float(p.k_local))
            released_count = float(p.shards * p.k_local)
        elif p.receipts == "noised":
            if tallies is None:
                raise ValueError("tallies must be revealed for receipts='noised'. Found None.")
            rm = self._cached("receipts", p.receipt_mechanism)
            receipts = rm.release(np.asarray(tallies, dtype=np.float64), rng, sampling=p.sampling,
                                  **self._cached("receipts_grid", lambda: self._grid(rm)))
            released_count = float(receipts.sum())
        elif p.receipts == "expose":
            if tallies is None:
                raise ValueError("tallies must be revealed for receipts='expose'. Found None.")
            receipts = np.asarray(tallies, dtype=np.int64).copy()
            released_count = float(n)
        if plan.denominator == "public":
            denom = float(p.public_count)
        elif plan.denominator == "noised":
            denom = max(1.0, released_count)
        else:
            denom = float(max(1, n))
        if p.calibration == "realized":
            # noise on the sum, calibrated to the denominator actually applied
            mech = self._cached("sum", lambda: p._mechanism(p.sigma))
            value = mech.release(total, rng, sampling=p.sampling,
                                 **self._cached("sum_grid", lambda: self._grid(mech))) / denom
            eff = p.sigma
        else:
            # noise std sigma * Delta / n_bound on the mean S / D: multiplier sigma * D / n_bound delivered
            eff = p.sigma * denom / p.n_bound
            mech = p._mechanism(eff, denom)
            value = mech.release(total / denom, rng, sampling=p.sampling,
                                 **self._cached("global_grid", lambda: self._grid(p._mechanism(p.sigma, p.n_bound))))
        return Release(value=value, count=released_count, receipts=receipts, plan=plan, realized_n=n,
                       denominator=denom, effective_noise_multiplier=eff)
