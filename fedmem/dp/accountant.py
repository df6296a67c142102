"""(epsilon, delta) accountant for Gaussian and Laplace releases, on Google's dp-accounting.

Interface after ``dp_accounting.PrivacyAccountant``: :meth:`Accountant.book` composes one
event (book **before** releasing), :meth:`Accountant.spent` returns epsilon at a delta,
:attr:`Accountant.history` is the inspectable ledger, :meth:`Accountant.to_json`
serialises it. Composition is done by ``dp_accounting.rdp.RdpAccountant`` (``kind="rdp"``)
or ``dp_accounting.pld.PLDAccountant`` (``kind="pld"``), never by hand.

Pure-DP events (:class:`~fedmem.dp.mechanisms.PureDpEvent`, e.g. exponential-mechanism
selections; dp-accounting has no event for them) and directly certified (epsilon, delta)
events (:class:`~fedmem.dp.mechanisms.ApproxDpEvent`, e.g. BRACE) are summed exactly and
added by basic composition: if the rest is (e1, delta - d2)-DP and these parts are
(e2, d2)-DP, the whole is (e1 + e2, delta)-DP.

Every booking is one SQLite transaction in a :class:`~fedmem.dp.store.DurableStore`;
with a ``budget`` the prospective total is checked inside the same transaction, so a
booking that would exceed it raises :class:`~fedmem.errors.BudgetExceeded` and writes
nothing. Several ``Accountant`` objects (in one or many processes) opened on the same
file and name share one history.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import dp_accounting
from dp_accounting import pld, rdp

from fedmem import _validate as V
from fedmem.dp.mechanisms import ApproxDpEvent, PureDpEvent
from fedmem.dp.store import DurableStore
from fedmem.errors import BudgetExceeded

AccountantKind = Literal["rdp", "pld"]
ACCOUNTANT_KINDS = ("rdp", "pld")


# ------------------------------------------------------------------ event (de)serialisation
def event_to_dict(event) -> dict:
    """Serialise the event types fedmem books. Unknown types raise ``TypeError``."""
    if isinstance(event, PureDpEvent):
        return {"type": "pure", "epsilon": event.epsilon, "mechanism": event.mechanism}
    if isinstance(event, ApproxDpEvent):
        return {"type": "approx", "epsilon": event.epsilon, "delta": event.delta, "mechanism": event.mechanism}
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return {"type": "gaussian", "noise_multiplier": float(event.noise_multiplier)}
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return {"type": "laplace", "noise_multiplier": float(event.noise_multiplier)}
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return {"type": "self_composed", "count": int(event.count), "event": event_to_dict(event.event)}
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return {"type": "composed", "events": [event_to_dict(e) for e in event.events]}
    raise TypeError(
        "event must be a GaussianDpEvent, LaplaceDpEvent, PureDpEvent, SelfComposedDpEvent or "
        f"ComposedDpEvent. Found {type(event).__name__}."
    )


def event_from_dict(d: dict):
    t = d.get("type")
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
    raise ValueError(f"event type must be one of pure/approx/gaussian/laplace/self_composed/composed. Found {t!r}.")


@dataclass(frozen=True)
class _Basic:
    """Exact sums of the parts composed by basic composition."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    def __add__(self, other: "_Basic") -> "_Basic":
        return _Basic(self.epsilon + other.epsilon, self.delta + other.delta)

    def times(self, n: int) -> "_Basic":
        return _Basic(self.epsilon * n, self.delta * n)


def _split_pure(event) -> tuple[list, _Basic]:
    """Separate pure / approximate-DP parts (summed exactly) from dp-accounting parts."""
    if isinstance(event, PureDpEvent):
        return [], _Basic(Fraction(event.epsilon))
    if isinstance(event, ApproxDpEvent):
        return [], _Basic(Fraction(event.epsilon), Fraction(event.delta))
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner, basic = _split_pure(event.event)
        rest = [dp_accounting.SelfComposedDpEvent(e, event.count) for e in inner]
        return rest, basic.times(event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        rest, basic = [], _Basic()
        for e in event.events:
            r, b = _split_pure(e)
            rest += r
            basic = basic + b
        return rest, basic
    return [event], _Basic()


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
        self._acc = self._new_backend()
        self._pure = _Basic()
        self._last_id = 0
        self._count = 0
        with self.store.transaction() as db:
            self._sync(db)

    def _new_backend(self):
        if self.kind == "rdp":
            return rdp.RdpAccountant()
        return pld.PLDAccountant(value_discretization_interval=self._pld_discretization)

    def _compose(self, acc, event) -> _Basic:
        rest, pure = _split_pure(event)
        for e in rest:
            acc.compose(e)
        return pure

    def _sync(self, db) -> None:
        """Fold in rows booked (by any process) since the last sync."""
        for rid, ev in db.execute(
            "SELECT id, event FROM accountant_events WHERE accountant=? AND id>? ORDER BY id",
            (self.name, self._last_id),
        ):
            self._pure += self._compose(self._acc, event_from_dict(json.loads(ev)))
            self._last_id = rid
            self._count += 1

    def _epsilon(self, acc, basic: _Basic, delta: float) -> float:
        """dp-accounting epsilon at (delta - booked approx deltas), plus the basic parts.

        Infinite when the approximate-DP deltas already use up ``delta``.
        """
        rest_delta = Fraction(delta) - basic.delta
        if rest_delta <= 0:
            return float("inf")
        base = acc.get_epsilon(float(rest_delta)) if self._has_events(acc) else 0.0
        return float(base) + float(basic.epsilon)

    @staticmethod
    def _has_events(acc) -> bool:
        ledger = getattr(acc, "ledger", None)
        return not (isinstance(ledger, dp_accounting.ComposedDpEvent) and not ledger.events)

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
                trial = copy.deepcopy(self._acc)
                pure = self._pure + self._compose(trial, event)
                eps = self._epsilon(trial, pure, self.budget[1])
                if eps > self.budget[0]:
                    raise BudgetExceeded(
                        f"booking {label or payload['type']!r} would raise epsilon of accountant "
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
        trial = copy.deepcopy(self._acc)
        pure = self._pure
        for ev in events:
            pure = pure + self._compose(trial, event_from_dict(event_to_dict(ev)))
        return self._epsilon(trial, pure, delta)

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
        rest, _ = _split_pure(event)
        return all(self._acc.supports(e) for e in rest)

    def spent(self, delta: float) -> float:
        """Total epsilon of everything booked so far, at ``delta``."""
        delta = V.open_unit("delta", delta)
        with self.store.transaction() as db:
            self._sync(db)
        return self._epsilon(self._acc, self._pure, delta)

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
