"""Composition of a booked history: memoised dp-accounting Gaussian RDP/PLD, the exact sums
of pure / approximate DP parts (basic composition), exponential-mechanism selections as
zCDP (:func:`em_rho`), and the two composition tracks whose smaller epsilon the
:class:`~fedmem.dp.accountant.Accountant` reports.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from fractions import Fraction

import dp_accounting
import numpy as np

from fedmem.dp.mechanisms import ApproxDpEvent, PureDpEvent


def memoise_rdp_gaussian() -> None:
    """Memoise dp-accounting's RDP curve of a (subsampled) Gaussian per (q, noise multiplier, orders).

    ``RdpAccountant`` recomputes the curve (156 orders in Python) every time it composes a
    ``GaussianDpEvent``: the largest single cost of the engine's booking (profiled:
    4 compositions per query). The function is pure, so a memo returns exactly what it
    would; callers get a copy (dp-accounting only reads it: ``rdp += count * curve``)."""
    from dp_accounting.rdp import rdp_privacy_accountant as R

    f = R._compute_rdp_poisson_subsampled_gaussian
    if getattr(f, "_fedmem_memo", False):
        return
    memo: dict = {}

    def curve(q, noise_multiplier, orders):
        if np.ndim(orders) != 1:
            return f(q, noise_multiplier, orders)
        key = (float(q), float(noise_multiplier), np.asarray(orders, dtype=np.float64).tobytes())
        got = memo.get(key)
        if got is None:
            got = np.asarray(f(q, noise_multiplier, orders), dtype=np.float64)
            if len(memo) < 4096:
                memo[key] = got
        return got.copy()

    curve._fedmem_memo = True
    R._compute_rdp_poisson_subsampled_gaussian = curve


def memoise_rdp_laplace() -> None:
    """Memoise dp-accounting's RDP curve of a Laplace event per (epsilon, orders).

    ``RdpAccountant._maybe_compose`` computes ``[_laplace_rdp(1 / b, a) for a in orders]``
    (156 orders in Python, ~0.5 ms) every time it composes a ``LaplaceDpEvent``: the largest
    single cost of the support-leak games' booking (cProfile of
    ``tests/experiments/test_support_leak.py``: 2.9 million ``_laplace_rdp`` calls, 13 of its
    89 s). The curve is a pure function of ``float(1 / b)`` (``_laplace_rdp`` starts with
    ``float(eps)``) and the orders, so the wrapper composes ``count * curve`` from a memo of
    that same array: the same floats, added in the same way. Every other event, and
    ``supports()`` (``do_compose=False``), goes to dp-accounting's own method; so does a
    Laplace event whose parameter is not a finite positive number (its own error)."""
    from dp_accounting.rdp import rdp_privacy_accountant as R

    f = R.RdpAccountant._maybe_compose
    if getattr(f, "_fedmem_memo", False):
        return
    memo: dict = {}
    laplace = dp_accounting.LaplaceDpEvent

    def _maybe_compose(self, event, count, do_compose):
        if not do_compose or type(event) is not laplace:
            return f(self, event, count, do_compose)
        b = event.noise_multiplier
        if not (isinstance(b, (int, float)) and math.isfinite(b) and b > 0):
            return f(self, event, count, do_compose)
        eps = 1 / b
        key = (float(eps), self._orders.tobytes())
        curve = memo.get(key)
        if curve is None:
            curve = np.array([R._laplace_rdp(eps, order) for order in self._orders])
            if len(memo) < 4096:
                memo[key] = curve
        self._rdp += count * curve
        return None

    _maybe_compose._fedmem_memo = True
    _maybe_compose.__wrapped__ = f
    R.RdpAccountant._maybe_compose = _maybe_compose


_RDP_CONSTANTS: dict = {}


def rdp_epsilon(orders, rdp, delta: float) -> float:
    """``dp_accounting.rdp.compute_epsilon(orders, rdp, delta)[0]``, vectorised, bit for bit.

    dp-accounting loops over its 156 orders in Python (about 0.9 ms per call: the largest
    cost of a response, whose ``epsilon_spent`` is one such call). Per order it takes
    ``0`` if ``r < 0`` or ``delta**2 + expm1(-r) > 0``, else ``r + log1p(-1/a) -
    log(delta*a)/(a-1)`` for ``a > 1.01``, else ``inf``, then the first minimum, floored at
    0. The terms that depend on ``(a, delta)`` only are computed once per ``(orders,
    delta)`` with the same ``math`` calls, and the rest are the same IEEE operations in
    the same order, so the result is the same float (tested against dp-accounting on
    random curves, including negative, zero and infinite entries)."""
    if delta <= 0 or len(orders) != len(rdp):   # dp-accounting's own edge cases and errors
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        return compute_epsilon(orders, rdp, delta)[0]
    a = np.asarray(orders, dtype=np.float64)
    key = (a.tobytes(), float(delta))
    got = _RDP_CONSTANTS.get(key)
    if got is None:
        if np.any(a < 1):
            from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

            return compute_epsilon(orders, rdp, delta)[0]
        big = a > 1.01
        l1 = np.array([math.log1p(-1 / x) if b else 0.0 for x, b in zip(a.tolist(), big)])
        l2 = np.array([math.log(delta * x) / (x - 1) if b else 0.0 for x, b in zip(a.tolist(), big)])
        got = (big, l1, l2, float(delta) ** 2)
        if len(_RDP_CONSTANTS) < 256:
            _RDP_CONSTANTS[key] = got
    big, l1, l2, d2 = got
    r = np.asarray(rdp, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        eps = np.where(big, (r + l1) - l2, np.inf)
        eps = np.where((r < 0) | (d2 + np.expm1(-r) > 0), 0.0, eps)
    return max(0, eps[int(np.argmin(eps))])


def memoise_pld_gaussian() -> None:
    """Memoise dp-accounting's PLD of a Gaussian mechanism per (noise, discretization, relation).

    ``PLDAccountant`` builds ``from_gaussian_mechanism`` afresh for every ``GaussianDpEvent``
    it composes (about 0.5 s each on 2 cores; profiled as about half of a dp.demo run), and a
    trial composition (``fits``) or a resumed accountant builds them again. The function is
    pure, so the memo returns what it would; every caller gets its own deep copy, so nothing
    that composes or edits a PLD can reach the cached one. Only calls in the accountant's
    shape (keyword arguments ``standard_deviation``, ``value_discretization_interval``,
    ``neighboring_relation``) are memoised; any other call goes straight through."""
    from dp_accounting.pld import privacy_loss_distribution as P

    f = P.from_gaussian_mechanism
    if getattr(f, "_fedmem_memo", False):
        return
    memo: dict = {}
    shape = {"standard_deviation", "value_discretization_interval", "neighboring_relation"}

    def gaussian_pld(*args, **kwargs):
        if args or set(kwargs) != shape:
            return f(*args, **kwargs)
        key = (float(kwargs["standard_deviation"]), float(kwargs["value_discretization_interval"]),
               kwargs["neighboring_relation"])
        got = memo.get(key)
        if got is None:
            got = f(**kwargs)
            if len(memo) < 256:
                memo[key] = got
        return copy.deepcopy(got)

    gaussian_pld._fedmem_memo = True
    gaussian_pld.__wrapped__ = f
    P.from_gaussian_mechanism = gaussian_pld


# ------------------------------------------------------------------ exponential mechanism as zCDP
def em_rho(epsilon: float) -> float:
    """zCDP parameter of one epsilon-DP exponential-mechanism selection: ``epsilon**2 / 8``.

    An exponential mechanism ``Pr[v] ∝ exp(eps u(v) / (2 Δ))`` with ``|u(x, v) - u(x', v)| <= Δ``
    is eps-*bounded range* (Durfee & Rogers 2019), and an eps-bounded-range mechanism is
    ``eps^2/8``-zCDP (Cesar & Rogers 2021, Lemma 3.2), four times less than the
    ``eps^2/2`` of a generic eps-DP mechanism. Rounded up, never below the exact value.
    """
    exact = Fraction(epsilon) ** 2 / 8
    rho = float(exact)
    while Fraction(rho) < exact:
        rho = math.nextafter(rho, math.inf)
    return rho


_BOOKABLE = (dp_accounting.GaussianDpEvent, dp_accounting.LaplaceDpEvent)


def bookable(event) -> bool:
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return bookable(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return all(bookable(e) for e in event.events)
    return isinstance(event, _BOOKABLE)


def _is_em(event) -> bool:
    return isinstance(event, PureDpEvent) and event.mechanism == "exponential"


@dataclass(frozen=True)
class _Basic:
    """Exact sums of the parts composed by basic composition."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    def __add__(self, other: "_Basic") -> "_Basic":
        if other is _ZERO:   # most parts are dp-accounting events: no Fraction arithmetic for them
            return self
        if self is _ZERO:
            return other
        return _Basic(self.epsilon + other.epsilon, self.delta + other.delta)

    def times(self, n: int) -> "_Basic":
        if self is _ZERO:
            return self
        return _Basic(self.epsilon * n, self.delta * n)


_ZERO = _Basic()
"""The empty sum (shared: adding it is the identity, checked by ``is``)."""


def split_pure(event, em_as_zcdp: bool = False) -> tuple[list, _Basic, int]:
    """Separate the parts summed exactly (pure / approximate DP) from dp-accounting parts.

    With ``em_as_zcdp``, exponential-mechanism selections become ``ZCDpEvent(eps^2/8)``
    dp-accounting parts instead. Also returns how many EM selections ``event`` holds.
    """
    if isinstance(event, PureDpEvent):
        if em_as_zcdp and _is_em(event):
            return [dp_accounting.ZCDpEvent(rho=em_rho(event.epsilon))], _ZERO, 1
        return [], _Basic(Fraction(event.epsilon)), int(_is_em(event))
    if isinstance(event, ApproxDpEvent):
        return [], _Basic(Fraction(event.epsilon), Fraction(event.delta)), 0
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner, basic, n_em = split_pure(event.event, em_as_zcdp)
        rest = [dp_accounting.SelfComposedDpEvent(e, event.count) for e in inner]
        return rest, basic.times(event.count), n_em * event.count
    if isinstance(event, dp_accounting.ComposedDpEvent):
        rest, basic, n_em = [], _ZERO, 0
        for e in event.events:
            r, b, n = split_pure(e, em_as_zcdp)
            rest += r
            basic = basic + b
            n_em += n
        return rest, basic, n_em
    return [event], _ZERO, 0


class Track:
    """One valid way of composing the history: a dp-accounting backend plus exact sums.

    ``em_as_zcdp=False``: basic composition of every pure / approximate part (the
    original accounting). ``em_as_zcdp=True``: EM selections composed as zCDP inside an
    ``RdpAccountant`` (dp-accounting 0.6.0's ``PLDAccountant`` does not support
    ``ZCDpEvent``). Both are upper bounds, so the accountant reports the smaller.
    A track that meets an event its backend cannot compose is dropped (``alive=False``).
    """

    def __init__(self, backend, em_as_zcdp: bool):
        self.acc = backend
        self.em_as_zcdp = em_as_zcdp
        self.basic = _ZERO
        self.alive = True
        self.n_em = 0

    def compose(self, event) -> None:
        rest, basic, n_em = split_pure(event, self.em_as_zcdp)
        self.n_em += n_em
        if not self.alive:
            return
        if not all(self.acc.supports(e) for e in rest):
            self.alive = False
            return
        for e in rest:
            self.acc.compose(e)
        self.basic = self.basic + basic

    def epsilon(self, delta: float) -> float:
        """dp-accounting epsilon at (delta - booked approx deltas), plus the basic parts.

        Infinite when the approximate-DP deltas already use up ``delta`` (or the track is dead).
        """
        if not self.alive:
            return float("inf")
        if self.basic is _ZERO:     # no approximate-DP part: the whole delta, no exact-fraction arithmetic
            if not delta > 0:
                return float("inf")
            rest = float(delta)
        else:
            rest_delta = Fraction(delta) - self.basic.delta
            if rest_delta <= 0:
                return float("inf")
            rest = float(rest_delta)
        builder = getattr(self.acc, "_ledger", None)
        if type(builder) is dp_accounting.DpEventBuilder:   # what .ledger would build from, without building it
            empty = not builder._event_counts
        else:
            ledger = getattr(self.acc, "ledger", None)
            empty = isinstance(ledger, dp_accounting.ComposedDpEvent) and not ledger.events
        if empty:
            base = 0.0
        elif isinstance(getattr(self.acc, "_rdp", None), np.ndarray) and hasattr(self.acc, "_orders"):
            base = rdp_epsilon(self.acc._orders, self.acc._rdp, rest)   # RdpAccountant, vectorised
        else:
            base = self.acc.get_epsilon(rest)
        return float(base) + float(self.basic.epsilon)


def copy_tracks(tracks) -> list:
    """Independent copies of ``tracks`` for a trial composition (what ``copy.deepcopy`` gives,
    at a fraction of its cost). An ``RdpAccountant``'s state is its ``_rdp`` curve (copied), its
    fixed orders (shared, never written) and its ledger builder (copied list of (event,
    count) pairs; events are immutable); ``_Basic`` sums are immutable. Any other backend (the
    PLD accountant) is deep-copied as before. Tested: composing on a copy gives the deep copy's
    epsilon bit for bit and leaves the original unchanged."""
    from dp_accounting.rdp import RdpAccountant   # loaded already: the tracks exist

    out = []
    for t in tracks:
        c = copy.copy(t)
        acc = t.acc
        if type(acc) is RdpAccountant and type(acc._ledger) is dp_accounting.DpEventBuilder:
            a = copy.copy(acc)
            a._rdp = acc._rdp.copy()
            a._ledger = copy.copy(acc._ledger)
            a._ledger._event_counts = list(acc._ledger._event_counts)
            c.acc = a
        else:
            c.acc = copy.deepcopy(acc)
        out.append(c)
    return out


def smallest_epsilon(tracks, delta: float) -> float:
    """Smallest valid epsilon at ``delta`` over the tracks.

    The zCDP track only counts once an EM selection is in the history: without one it
    could only differ from the primary track by the choice of backend.
    """
    primary, *others = tracks
    eps = primary.epsilon(delta)
    if primary.n_em:
        for t in others:
            eps = min(eps, t.epsilon(delta))
    return eps
