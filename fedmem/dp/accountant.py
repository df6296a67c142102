"""(epsilon, delta) accountant for Gaussian and Laplace releases, on Google's dp-accounting.

Interface after ``dp_accounting.PrivacyAccountant``: :meth:`Accountant.book` composes one
event (book **before** releasing), :meth:`Accountant.spent` returns epsilon at a delta,
:attr:`Accountant.history` is the inspectable ledger, :meth:`Accountant.to_json`
serialises it. Composition is done by ``dp_accounting.rdp.RdpAccountant`` (``kind="rdp"``)
or ``dp_accounting.pld.PLDAccountant`` (``kind="pld"``), never by hand.

Pure-DP events (:class:`~fedmem.dp.mechanisms.PureDpEvent`) and directly certified
(epsilon, delta) events (:class:`~fedmem.dp.mechanisms.ApproxDpEvent`, e.g. BRACE) are
summed exactly and added by basic composition: if the rest is (e1, delta - d2)-DP and
these parts are (e2, d2)-DP, the whole is (e1 + e2, delta)-DP.

Exponential-mechanism selections (``PureDpEvent(mechanism="exponential")``, what
:meth:`~fedmem.dp.mechanisms.ExponentialMechanism.event` returns) are eps-bounded-range
and therefore ``eps^2/8``-zCDP (:func:`em_rho`). The accountant keeps a second, equally
valid composition in which they are ``dp_accounting.ZCDpEvent`` s composed by an
``RdpAccountant`` together with every other dp-accounting event (``PLDAccountant`` has no
``ZCDpEvent`` support in dp-accounting 0.6.0), and reports the smaller of the two
epsilons: never looser than basic composition, and growing like sqrt(k) instead of k
for many selections. The per-attribute ledgers (:mod:`fedmem.dp.ledger`) stay pure DP.

Every booking is one SQLite transaction in a :class:`~fedmem.dp.store.DurableStore`;
with a ``budget`` the prospective total is checked inside the same transaction, so a
booking that would exceed it raises :class:`~fedmem.errors.BudgetExceeded` and writes
nothing. Several ``Accountant`` objects (in one or many processes) opened on the same
file and name share one history.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import dp_accounting
import numpy as np

from fedmem import _validate as V
from fedmem.dp.mechanisms import ApproxDpEvent, PureDpEvent
from fedmem.dp.store import DurableStore
from fedmem.errors import BudgetExceeded

AccountantKind = Literal["rdp", "pld"]
ACCOUNTANT_KINDS = ("rdp", "pld")


# ------------------------------------------------------------------ event (de)serialisation
# dp-accounting 0.6.0 serialises events only to / from NamedTuples
# (``DpEvent.to_named_tuple`` / ``DpEvent.from_named_tuple``), not to dicts or JSON. A row
# is that named tuple as a JSON object: ``{"module_name", "class_name", <fields>}``, nested
# events likewise. fedmem's own records (``PureDpEvent``, ``ApproxDpEvent``; plain
# dataclasses, not attrs classes) use the same shape. ``from_named_tuple`` imports whatever
# module a row names, so rows are checked against an allow-list first.
_FEDMEM_MODULE = "fedmem.dp.mechanisms"
_FEDMEM_EVENTS = {"PureDpEvent": PureDpEvent, "ApproxDpEvent": ApproxDpEvent}
_DPA_MODULE = "dp_accounting.dp_event"
_LEGACY_TYPES = ("pure", "approx", "gaussian", "laplace", "self_composed", "composed")


_TO_DICT_MEMO: dict = {}


def _memoise_rdp_gaussian() -> None:
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


def _memoise_pld_gaussian() -> None:
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


@functools.lru_cache(maxsize=256)
def _named_tuple_class(name: str, fields: tuple):
    """The named-tuple class dp-accounting's deserialiser takes (made once per shape, not per row)."""
    return collections.namedtuple(f"_{name}NamedTuple", ["module_name", "class_name", *fields])


def _tuple_to_json(value):
    if isinstance(value, (PureDpEvent, ApproxDpEvent)):
        return event_to_dict(value)
    if isinstance(value, dp_accounting.dp_event.DpEventNamedTuple):
        return {k: _tuple_to_json(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_tuple_to_json(v) for v in value]
    return value


def event_to_dict(event) -> dict:
    """JSON-ready dict of ``event`` (any dp-accounting event, or a fedmem pure/approx record).

    dp-accounting events go through ``DpEvent.to_named_tuple``; the result names the
    event's module and class. Anything else raises ``TypeError``.
    """
    if isinstance(event, (PureDpEvent, ApproxDpEvent)):
        return {"module_name": _FEDMEM_MODULE, "class_name": type(event).__name__, **dataclasses.asdict(event)}
    if isinstance(event, dp_accounting.DpEvent):
        # to_named_tuple builds a namedtuple class per call (exec/eval, ~1 ms): memoised per
        # (frozen, hashable) event; every caller gets its own deep copy
        try:
            got = _TO_DICT_MEMO.get(event)
        except TypeError:   # an unhashable event: no memo
            return _tuple_to_json(event.to_named_tuple())
        if got is None:
            got = _tuple_to_json(event.to_named_tuple())
            if len(_TO_DICT_MEMO) < 4096:
                _TO_DICT_MEMO[event] = got
        return copy.deepcopy(got)
    raise TypeError(f"event must be a dp_accounting.DpEvent, PureDpEvent or ApproxDpEvent. "
                    f"Found {type(event).__name__}.")


def _legacy_from_dict(d: dict):
    """Rows written before events were stored as dp-accounting named tuples."""
    t = d["type"]
    if t == "pure":
        return PureDpEvent(epsilon=d["epsilon"], mechanism=d.get("mechanism", "pure"))
    if t == "approx":
        return ApproxDpEvent(epsilon=d["epsilon"], delta=d["delta"], mechanism=d.get("mechanism", "approx"))
    if t == "gaussian":
        return dp_accounting.GaussianDpEvent(d["noise_multiplier"])
    if t == "laplace":
        return dp_accounting.LaplaceDpEvent(d["noise_multiplier"])
    if t == "self_composed":
        return dp_accounting.SelfComposedDpEvent(event_from_dict(d["event"]), d["count"])
    if t == "composed":
        return dp_accounting.ComposedDpEvent([event_from_dict(e) for e in d["events"]])
    raise ValueError(f"event type must be one of {'/'.join(_LEGACY_TYPES)}. Found {t!r}.")


def _json_to_value(value):
    if isinstance(value, dict):
        return event_from_dict(value)
    if isinstance(value, list):
        return [_json_to_value(v) for v in value]
    return value


def event_from_dict(d: dict):
    """Inverse of :func:`event_to_dict`; also reads rows in the older ``{"type": ...}`` form."""
    if not isinstance(d, dict):
        raise ValueError(f"event must be a dict. Found {d!r}.")
    if "type" in d and "class_name" not in d:
        return _legacy_from_dict(d)
    module, name = d.get("module_name"), d.get("class_name")
    fields = {k: _json_to_value(v) for k, v in d.items() if k not in ("module_name", "class_name")}
    if module == _FEDMEM_MODULE and name in _FEDMEM_EVENTS:
        try:
            return _FEDMEM_EVENTS[name](**fields)
        except TypeError as exc:
            raise ValueError(f"event fields of {name} must be {_FEDMEM_EVENTS[name].__dataclass_fields__.keys()}. "
                             f"Found {sorted(fields)}.") from exc
    cls = getattr(dp_accounting.dp_event, name, None) if module == _DPA_MODULE and isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)):
        raise ValueError(f"event module_name/class_name must name a dp_accounting.dp_event event or a fedmem "
                         f"PureDpEvent/ApproxDpEvent. Found {module!r}/{name!r}.")
    # The named tuple dp-accounting's own deserialiser takes (nested events already built).
    nt = _named_tuple_class(name, tuple(fields))
    try:
        return dp_accounting.DpEvent.from_named_tuple(nt(module, name, **fields))
    except TypeError as exc:
        raise ValueError(f"event fields of {name} must be its attrs fields. Found {sorted(fields)}.") from exc


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


def _bookable(event) -> bool:
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _bookable(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return all(_bookable(e) for e in event.events)
    return isinstance(event, _BOOKABLE)


def _is_em(event) -> bool:
    return isinstance(event, PureDpEvent) and event.mechanism == "exponential"


@dataclass(frozen=True)
class _Basic:
    """Exact sums of the parts composed by basic composition."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    def __add__(self, other: "_Basic") -> "_Basic":
        return _Basic(self.epsilon + other.epsilon, self.delta + other.delta)

    def times(self, n: int) -> "_Basic":
        return _Basic(self.epsilon * n, self.delta * n)


def _split_pure(event, em_as_zcdp: bool = False) -> tuple[list, _Basic, int]:
    """Separate the parts summed exactly (pure / approximate DP) from dp-accounting parts.

    With ``em_as_zcdp``, exponential-mechanism selections become ``ZCDpEvent(eps^2/8)``
    dp-accounting parts instead. Also returns how many EM selections ``event`` holds.
    """
    if isinstance(event, PureDpEvent):
        if em_as_zcdp and _is_em(event):
            return [dp_accounting.ZCDpEvent(rho=em_rho(event.epsilon))], _Basic(), 1
        return [], _Basic(Fraction(event.epsilon)), int(_is_em(event))
    if isinstance(event, ApproxDpEvent):
        return [], _Basic(Fraction(event.epsilon), Fraction(event.delta)), 0
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner, basic, n_em = _split_pure(event.event, em_as_zcdp)
        rest = [dp_accounting.SelfComposedDpEvent(e, event.count) for e in inner]
        return rest, basic.times(event.count), n_em * event.count
    if isinstance(event, dp_accounting.ComposedDpEvent):
        rest, basic, n_em = [], _Basic(), 0
        for e in event.events:
            r, b, n = _split_pure(e, em_as_zcdp)
            rest += r
            basic = basic + b
            n_em += n
        return rest, basic, n_em
    return [event], _Basic(), 0


class _Track:
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
        self.basic = _Basic()
        self.alive = True
        self.n_em = 0

    def compose(self, event) -> None:
        rest, basic, n_em = _split_pure(event, self.em_as_zcdp)
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
        rest_delta = Fraction(delta) - self.basic.delta
        if rest_delta <= 0:
            return float("inf")
        ledger = getattr(self.acc, "ledger", None)
        empty = isinstance(ledger, dp_accounting.ComposedDpEvent) and not ledger.events
        base = 0.0 if empty else self.acc.get_epsilon(float(rest_delta))
        return float(base) + float(self.basic.epsilon)


def _epsilon(tracks, delta: float) -> float:
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


@dataclass(frozen=True)
class Booking:
    id: int
    event: dict
    label: str
    ts: float


class Accountant:
    """Composes booked releases; optional hard budget ``(epsilon, delta)``."""

    def __init__(self, kind: AccountantKind = "rdp", *, store: DurableStore | None = None,
                 name: str = "accountant", budget: tuple[float, float] | None = None,
                 pld_discretization: float = 1e-4):
        if kind not in ACCOUNTANT_KINDS:
            raise ValueError(f"kind must be one of {ACCOUNTANT_KINDS}. Found {kind!r}.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string. Found {name!r}.")
        if budget is not None:
            if not isinstance(budget, (tuple, list)) or len(budget) != 2:
                raise ValueError(f"budget must be a pair (epsilon, delta). Found {budget!r}.")
            budget = (V.positive("budget epsilon", budget[0]), V.open_unit("budget delta", budget[1]))
        self.kind = kind
        self.name = name
        self.budget = budget
        self._pld_discretization = V.positive("pld_discretization", pld_discretization)
        self.store = store if store is not None else DurableStore(None)
        with self.store.transaction() as db:
            row = db.execute("SELECT kind, budget_epsilon, budget_delta FROM accountant_meta WHERE accountant=?",
                             (name,)).fetchone()
            stored_budget = None if row is None or row[1] is None else (row[1], row[2])
            if row is not None and (row[0] != kind or stored_budget != (None if budget is None else tuple(budget))):
                raise ValueError(
                    f"accountant {name!r} in {self.store!r} was created with kind={row[0]!r}, "
                    f"budget={stored_budget!r}. Found kind={kind!r}, budget={budget!r}."
                )
            if row is None:
                db.execute("INSERT INTO accountant_meta VALUES (?, ?, ?, ?)",
                           (name, kind, None if budget is None else budget[0],
                            None if budget is None else budget[1]))
        self._tracks = self._new_tracks()
        self._last_id = 0
        self._count = 0
        with self.store.transaction() as db:
            self._sync(db)

    def _new_backend(self):
        # dp_accounting.rdp (scipy.special, absl) and .pld (scipy.signal, scipy.stats) are
        # imported here, on first use, not when fedmem is imported (start-up of every actor).
        from dp_accounting import rdp

        _memoise_rdp_gaussian()

        if self.kind == "rdp":
            return rdp.RdpAccountant()
        from dp_accounting import pld

        _memoise_pld_gaussian()
        return pld.PLDAccountant(value_discretization_interval=self._pld_discretization)

    def _new_tracks(self) -> list[_Track]:
        from dp_accounting import rdp

        return [_Track(self._new_backend(), em_as_zcdp=False), _Track(rdp.RdpAccountant(), em_as_zcdp=True)]

    @property
    def _acc(self):
        """The primary dp-accounting backend (kind ``rdp`` or ``pld``)."""
        return self._tracks[0].acc

    def _sync(self, db) -> None:
        """Fold in rows booked (by any process) since the last sync."""
        for rid, ev in db.execute(
            "SELECT id, event FROM accountant_events WHERE accountant=? AND id>? ORDER BY id",
            (self.name, self._last_id),
        ):
            event = event_from_dict(json.loads(ev))
            for t in self._tracks:
                t.compose(event)
            self._last_id = rid
            self._count += 1

    # ------------------------------------------------------------------ public API
    def book(self, event, label: str = "") -> Booking:
        """Compose ``event`` durably. Call this **before** releasing what it describes.

        With a budget, raises :class:`BudgetExceeded` (nothing written) if the total
        epsilon at the budget's delta would exceed the budget's epsilon.
        """
        payload = event_to_dict(event)
        event = event_from_dict(payload)  # normalised copy: what is stored is what is composed
        if not self._supported(event):
            raise TypeError(f"event {payload} cannot be composed by a {self.kind} accountant.")
        with self.store.transaction() as db:
            self._sync(db)
            if self.budget is not None:
                eps = self._trial_epsilon([event], self.budget[1])
                if eps > self.budget[0]:
                    raise BudgetExceeded(
                        f"booking {label or payload['class_name']!r} would raise epsilon of accountant "
                        f"{self.name!r} to {eps:.6g} > budget {self.budget[0]!r} at delta={self.budget[1]!r}."
                    )
            ts = time.time()
            cur = db.execute(
                "INSERT INTO accountant_events (accountant, event, label, ts) VALUES (?, ?, ?, ?)",
                (self.name, json.dumps(payload), str(label), ts),
            )
            rid = cur.lastrowid
        # Fold the new row in only after COMMIT succeeded: if the commit fails, in-memory
        # state must not hold (or skip past the id of) a row that was never written.
        with self.store.transaction() as db:
            self._sync(db)
        return Booking(rid, payload, str(label), ts)

    def _trial_epsilon(self, events, delta: float) -> float:
        """Epsilon at ``delta`` if ``events`` were composed on top of the current history."""
        trial = copy.deepcopy(self._tracks)
        for ev in events:
            ev = event_from_dict(event_to_dict(ev))
            for t in trial:
                t.compose(ev)
        return _epsilon(trial, delta)

    def fits(self, events, budget: tuple[float, float] | None = None) -> bool:
        """Whether composing ``events`` (a list) would stay within this accountant's budget
        and within ``budget`` (an extra ``(epsilon, delta)`` cap; ``epsilon = inf`` is none).

        Writes nothing. The answer depends only on what was booked and on ``events``:
        callers use it to decide admission *before* computing anything private.
        """
        events = list(events)
        with self.store.transaction() as db:
            self._sync(db)
        for cap in (self.budget, budget):
            if cap is None or cap[0] == float("inf"):
                continue
            if self._trial_epsilon(events, cap[1]) > cap[0]:
                return False
        return True

    def _supported(self, event) -> bool:
        """Bookable: built only of the event types fedmem defines sensitivities for (a
        dp-accounting event such as ``PoissonSampledDpEvent`` assumes a neighbouring
        relation fedmem's records do not state), and composable by the primary backend."""
        rest, _, _ = _split_pure(event)
        return all(_bookable(e) and self._acc.supports(e) for e in rest)

    def spent(self, delta: float) -> float:
        """Total epsilon of everything booked so far, at ``delta``."""
        delta = V.open_unit("delta", delta)
        with self.store.transaction() as db:
            self._sync(db)
        return _epsilon(self._tracks, delta)

    def remaining(self) -> float:
        if self.budget is None:
            raise ValueError("remaining() needs a budget. Found budget=None.")
        return self.budget[0] - self.spent(self.budget[1])

    @property
    def count(self) -> int:
        with self.store.transaction() as db:
            self._sync(db)
        return self._count

    @property
    def history(self) -> list[Booking]:
        rows = self.store.read(
            "SELECT id, event, label, ts FROM accountant_events WHERE accountant=? ORDER BY id", (self.name,)
        )
        return [Booking(i, json.loads(e), l, t) for i, e, l, t in rows]

    def to_json(self) -> str:
        return json.dumps({
            "name": self.name, "kind": self.kind,
            "budget": None if self.budget is None else list(self.budget),
            "history": [b.__dict__ for b in self.history],
        }, indent=2)

    def __repr__(self) -> str:
        return f"Accountant(kind={self.kind!r}, name={self.name!r}, bookings={self.count}, store={self.store!r})"


def book_together(entries, label: str = "") -> list[Booking]:
    """Book several events on several accountants of **one** store, all or nothing.

    ``entries`` is a list of ``(accountant, event, extra_budget)``; ``extra_budget`` is an
    ``(epsilon, delta)`` cap checked besides the accountant's own budget (``None`` or
    ``epsilon = inf``: none). Every budget is checked inside one ``BEGIN IMMEDIATE``
    transaction; if any would be exceeded, :class:`BudgetExceeded` is raised and nothing
    is written (so a per-principal and a total accountant can never disagree).
    """
    entries = list(entries)
    if not entries:
        return []
    store = entries[0][0].store
    for acc, _, _ in entries:
        if not isinstance(acc, Accountant):
            raise TypeError(f"entries must hold fedmem.dp.Accountant objects. Found {type(acc).__name__}.")
        if acc.store is not store:
            raise ValueError(f"accountants must share one store to be booked together. Found {acc.store!r} "
                             f"and {store!r}.")
    payloads = [(acc, event_to_dict(ev), cap) for acc, ev, cap in entries]
    for acc, payload, _ in payloads:
        if not acc._supported(event_from_dict(payload)):
            raise TypeError(f"event {payload} cannot be composed by a {acc.kind} accountant.")
    # group by accountant object (an accountant may appear in several entries)
    per_acc: dict[int, tuple] = {}
    for acc, payload, cap in payloads:
        a, evs, caps = per_acc.get(id(acc), (acc, [], []))
        evs.append(event_from_dict(payload))
        if cap is not None:
            caps.append(cap)
        per_acc[id(acc)] = (a, evs, caps)
    rows = []
    with store.transaction() as db:
        for acc, evs, caps in per_acc.values():
            acc._sync(db)
            for cap in [acc.budget, *caps]:
                if cap is None or cap[0] == float("inf"):
                    continue
                eps = acc._trial_epsilon(evs, cap[1])
                if eps > cap[0]:
                    raise BudgetExceeded(f"booking {label!r} would raise epsilon of accountant {acc.name!r} to "
                                         f"{eps:.6g} > budget {cap[0]!r} at delta={cap[1]!r}.")
        ts = time.time()
        for acc, payload, _ in payloads:
            cur = db.execute("INSERT INTO accountant_events (accountant, event, label, ts) VALUES (?, ?, ?, ?)",
                             (acc.name, json.dumps(payload), str(label), ts))
            rows.append(Booking(cur.lastrowid, payload, str(label), ts))
    with store.transaction() as db:
        for acc, _, _ in per_acc.values():
            acc._sync(db)
    return rows
