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

Event (de)serialisation lives in :mod:`fedmem.dp.events`; memoised Gaussian RDP/PLD,
pure/EM splitting and the composition tracks in :mod:`fedmem.dp.composition`. Their
names stay importable from here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal

from fedmem import _validate as V
from fedmem.dp.composition import (
    Track,
    bookable,
    copy_tracks,
    em_rho,
    memoise_pld_gaussian,
    memoise_rdp_gaussian,
    memoise_rdp_laplace,
    smallest_epsilon,
    split_pure,
)
from fedmem.dp.events import event_from_dict, event_from_text, event_to_dict
from fedmem.dp.store import DurableStore
from fedmem.errors import BudgetExceeded

AccountantKind = Literal["rdp", "pld"]
ACCOUNTANT_KINDS = ("rdp", "pld")

# Event (de)serialisation moved to fedmem.dp.events, composition to fedmem.dp.composition;
# the old names stay importable from here and are the very objects the code calls.
_memoise_rdp_gaussian = memoise_rdp_gaussian
_memoise_pld_gaussian = memoise_pld_gaussian
_split_pure = split_pure
_bookable = bookable
_Track = Track
_epsilon = smallest_epsilon
__all__ = ["ACCOUNTANT_KINDS", "Accountant", "AccountantKind", "Booking", "book_together", "em_rho",
           "PendingTrial", "book_groups", "composed_epsilon", "event_from_dict", "event_to_dict"]


@dataclass(frozen=True)
class Booking:
    id: int
    event: dict
    label: str
    ts: float


def new_tracks(kind: AccountantKind, pld_discretization: float = 1e-4) -> list[Track]:
    """The two composition tracks of an accountant of ``kind`` (:class:`~fedmem.dp.composition.Track`)."""
    # dp_accounting.rdp (scipy.special, absl) and .pld (scipy.signal, scipy.stats) are
    # imported here, on first use, not when fedmem is imported (start-up of every actor).
    from dp_accounting import rdp

    memoise_rdp_gaussian()
    memoise_rdp_laplace()
    if kind == "rdp":
        primary = rdp.RdpAccountant()
    else:
        from dp_accounting import pld

        memoise_pld_gaussian()
        primary = pld.PLDAccountant(value_discretization_interval=pld_discretization)
    return [Track(primary, em_as_zcdp=False), Track(rdp.RdpAccountant(), em_as_zcdp=True)]


def _normalised(event):
    """``event`` as it reads back from a stored row (what is stored is what is composed)."""
    return event_from_dict(event_to_dict(event))


def _compose_all(tracks, events):
    """Compose ``events`` (normalised) into every one of ``tracks``, in order, in place; returns ``tracks``."""
    for e in events:
        for t in tracks:
            t.compose(e)
    return tracks


def _epsilon_after(tracks, events, delta: float) -> float:
    """Compose ``events`` (normalised) into ``tracks`` in order; their smallest epsilon at ``delta``."""
    return smallest_epsilon(_compose_all(tracks, events), delta)


def _supported(tracks, event) -> bool:
    """Bookable: built only of the event types fedmem defines sensitivities for (a
    dp-accounting event such as ``PoissonSampledDpEvent`` assumes a neighbouring
    relation fedmem's records do not state), and composable by the primary backend."""
    rest, _, _ = split_pure(event)
    return all(bookable(e) and tracks[0].acc.supports(e) for e in rest)


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
        with self.store.snapshot() as db:
            self._sync(db)

    def _new_tracks(self) -> list[Track]:
        return new_tracks(self.kind, self._pld_discretization)

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
            _compose_all(self._tracks, [event_from_text(ev)])
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
        with self.store.snapshot() as db:
            self._sync(db)
        return Booking(rid, payload, str(label), ts)

    def _trial_epsilon(self, events, delta: float) -> float:
        """Epsilon at ``delta`` if ``events`` were composed on top of the current history."""
        return _epsilon_after(copy_tracks(self._tracks), [_normalised(e) for e in events], delta)

    def fits(self, events, budget: tuple[float, float] | None = None) -> bool:
        """Whether composing ``events`` (a list) would stay within this accountant's budget
        and within ``budget`` (an extra ``(epsilon, delta)`` cap; ``epsilon = inf`` is none).

        Writes nothing. The answer depends only on what was booked and on ``events``:
        callers use it to decide admission *before* computing anything private.
        """
        events = list(events)
        with self.store.snapshot() as db:
            self._sync(db)
        for cap in (self.budget, budget):
            if cap is None or cap[0] == float("inf"):
                continue
            if self._trial_epsilon(events, cap[1]) > cap[0]:
                return False
        return True

    def _supported(self, event) -> bool:
        return _supported(self._tracks, event)

    def spent(self, delta: float) -> float:
        """Total epsilon of everything booked so far, at ``delta``."""
        delta = V.open_unit("delta", delta)
        with self.store.snapshot() as db:
            self._sync(db)
        return smallest_epsilon(self._tracks, delta)

    def remaining(self) -> float:
        if self.budget is None:
            raise ValueError("remaining() needs a budget. Found budget=None.")
        return self.budget[0] - self.spent(self.budget[1])

    @property
    def count(self) -> int:
        with self.store.snapshot() as db:
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


class PendingTrial:
    """Events admitted against an accountant but not yet booked, composed once.

    A gateway decides a batch query by query and every admitted query's events stay
    pending until the batch is booked; asking ``accountant.fits(pending + events, cap)``
    recomposes the whole pending list for every query (quadratic in the batch: 385 ms of
    a 487 ms batch of 100 in the plaintext engine, profiled). This keeps the pending events
    composed on a copy of the accountant's tracks, so :meth:`fits` composes only the new
    events. The answer is what ``accountant.fits(self.events + events, cap)`` gives, bit
    for bit: the same normalised events composed in the same order onto the same synced
    history (tested). The copy is rebuilt whenever the accountant's synced history moved
    (another process or object booked since)."""

    def __init__(self, accountant: "Accountant"):
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        self.accountant = accountant
        self.events: list = []
        self._tracks = None
        self._base = None      # (last id, count) of the history the copy was built on
        self._trial = None     # (events object, base, pending length, tracks) of the last fits()

    def _state(self):
        acc = self.accountant
        with acc.store.snapshot() as db:
            acc._sync(db)
        if self._tracks is None or self._base != (acc._last_id, acc._count):
            self._tracks = _compose_all(copy_tracks(acc._tracks), self.events)
            self._base = (acc._last_id, acc._count)
        return self._tracks

    def fits(self, events, budget: tuple[float, float] | None = None) -> bool:
        """:meth:`Accountant.fits` of ``self.events + events`` (writes nothing)."""
        caps = [c for c in (self.accountant.budget, budget) if c is not None and c[0] != float("inf")]
        if not caps:            # nothing to check (as Accountant.fits): no composition at all
            return True
        trial = self._compose(events, self._state())
        return not any(smallest_epsilon(trial[1], c[1]) > c[0] for c in caps)

    def _compose(self, events, state):
        """``events`` (normalised) composed on a copy of ``state``; kept for an :meth:`add` of the
        same ``events`` object on the same state (a gateway checks, then holds, the same charges)."""
        kept = self._kept_trial(events)
        if kept is not None:
            return kept
        normalised = [_normalised(e) for e in events]
        trial = _compose_all(copy_tracks(state), normalised)
        self._trial = (events, self._base, len(self.events), (normalised, trial))
        return self._trial[3]

    def _kept_trial(self, events):
        """``(normalised events, tracks)`` of the last :meth:`fits` if it composed this same ``events``
        object on the current kept state (same base, same pending events), else ``None``."""
        t = self._trial
        if t is not None and t[0] is events and t[1] == self._base and t[2] == len(self.events):
            return t[3]
        return None

    def add(self, events) -> None:
        """Hold ``events`` as pending: the trial :meth:`fits` just composed for this same
        ``events`` object becomes the kept copy; otherwise they are composed into the kept copy
        (if one was ever needed: with no finite budget nothing is composed)."""
        kept = self._kept_trial(events)
        self._trial = None
        if self._tracks is not None and kept is not None:
            normalised, self._tracks = kept
            self.events += normalised
            return
        normalised = [_normalised(e) for e in events]
        self.events += normalised
        if self._tracks is not None:     # kept copy on self._base; rebuilt by _state() if the ledger moved
            _compose_all(self._tracks, normalised)


def composed_epsilon(kind: AccountantKind, events, delta: float) -> float:
    """What a fresh ``Accountant(kind)`` reports at ``delta`` after booking ``events`` in order,
    without writing them anywhere (one in-memory accountant, one trial composition instead of
    one SQLite transaction per event). Raises ``TypeError`` for an event the accountant could
    not book, as :meth:`Accountant.book` would."""
    delta = V.open_unit("delta", delta)
    if kind not in ACCOUNTANT_KINDS:
        raise ValueError(f"kind must be one of {ACCOUNTANT_KINDS}. Found {kind!r}.")
    tracks = new_tracks(kind)
    events = [_normalised(e) for e in events]   # as Accountant.book stores them
    for e in events:
        if not _supported(tracks, e):
            raise TypeError(f"event {event_to_dict(e)} cannot be composed by a {kind} accountant.")
    return _epsilon_after(tracks, events, delta)


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
    return book_groups([entries], [label])[0][0]


def book_groups(groups, labels, trace=None) -> tuple[list[list[Booking]], list[float]]:
    """:func:`book_together` for several groups of entries (e.g. the queries of one batch) in
    ONE transaction, all or nothing: every budget is checked against all groups' events
    together (epsilon only grows under composition, so if the whole fits, every prefix does;
    if it does not, nothing is written and :class:`BudgetExceeded` is raised, and a caller
    that wants the groups that still fit books them one by one). Rows are written in group
    order, each group's under its label.

    ``trace``: ``None`` or, per group, a list of ``(accountant, delta)`` (accountants of the
    same store); then the second result holds, per group, ``(count, epsilon)`` of each of
    them right after the group's rows: what :attr:`Accountant.count` and
    :meth:`Accountant.spent` return after booking the groups one by one, computed on the
    state read inside the transaction. Returns ``(bookings per group, traced values)``.
    """
    groups = [list(g) for g in groups]
    labels = [str(x) for x in labels]
    if len(labels) != len(groups) or (trace is not None and len(trace) != len(groups)):
        raise ValueError(f"labels and trace must have one entry per group ({len(groups)}). Found {len(labels)} and "
                         f"{None if trace is None else len(trace)}.")
    flat = [e for g in groups for e in g]
    if not flat:
        return [[] for _ in groups], []
    store = flat[0][0].store
    traced_accs = {id(acc): acc for t in (trace or ()) for acc, _ in t}
    # every accountant of the call, once: synced once inside the transaction
    accs = {**{id(acc): acc for acc, _, _ in flat}, **traced_accs}
    for acc in accs.values():
        if not isinstance(acc, Accountant):
            raise TypeError(f"entries must hold fedmem.dp.Accountant objects. Found {type(acc).__name__}.")
        if acc.store is not store:
            raise ValueError(f"accountants must share one store to be booked together. Found {acc.store!r} "
                             f"and {store!r}.")
    # payload and its normalised event (what is stored is what is composed), per entry
    pgroups = [[(acc, event_to_dict(ev), cap) for acc, ev, cap in g] for g in groups]
    events = [[event_from_dict(payload) for _, payload, _ in g] for g in pgroups]
    for g, evs in zip(pgroups, events):
        for (acc, payload, _), ev in zip(g, evs):
            if not acc._supported(ev):
                raise TypeError(f"event {payload} cannot be composed by a {acc.kind} accountant.")
    # the extra caps of every booked accountant (an accountant may appear in several entries)
    caps_of: dict[int, list] = {}
    for g in pgroups:
        for acc, _, cap in g:
            caps = caps_of.setdefault(id(acc), [])
            if cap is not None and cap not in caps:
                caps.append(cap)
    out: list[list[Booking]] = [[] for _ in groups]
    traced: list[list[tuple[int, float]]] = []
    with store.transaction() as db:
        for acc in accs.values():
            acc._sync(db)
        # ONE trial composition per accountant: its synced tracks with the groups' events composed
        # in group order (what booking the groups one by one would compose). The traced values
        # are read off it after each group, the budgets at the end (epsilon only grows under
        # composition, so the whole fitting means every prefix fits), and after the commit it
        # becomes the accountant's state: exactly what re-reading the rows just written would compose.
        trial = {i: [acc._count, copy_tracks(acc._tracks)] for i, acc in accs.items()}
        for g, evs, t in zip(pgroups, events, trace if trace is not None else [None] * len(groups)):
            for (acc, _, _), ev in zip(g, evs):
                st = trial[id(acc)]
                st[0] += 1
                _compose_all(st[1], [ev])
            if t is not None:
                traced.append([(trial[id(acc)][0], smallest_epsilon(trial[id(acc)][1], d)) for acc, d in t])
        for i, caps in caps_of.items():
            acc = accs[i]
            for cap in [acc.budget, *caps]:
                if cap is None or cap[0] == float("inf"):
                    continue
                eps = smallest_epsilon(trial[id(acc)][1], cap[1])
                if eps > cap[0]:
                    what = repr(labels[0]) if len(labels) == 1 else f"{labels[0]!r} and {len(labels) - 1} more"
                    raise BudgetExceeded(f"booking {what} would raise epsilon of accountant {acc.name!r} to "
                                         f"{eps:.6g} > budget {cap[0]!r} at delta={cap[1]!r}.")
        ts = time.time()
        last: dict[int, int] = {}
        for i, (g, label) in enumerate(zip(pgroups, labels)):
            for acc, payload, _ in g:
                cur = db.execute("INSERT INTO accountant_events (accountant, event, label, ts) VALUES (?, ?, ?, ?)",
                                 (acc.name, json.dumps(payload), label, ts))
                last[id(acc)] = cur.lastrowid
                out[i].append(Booking(cur.lastrowid, payload, label, ts))
    # Committed: every booked accountant takes its trial state (the rows were written under
    # the write lock right after its sync, so no other row of it lies between). Two objects
    # of one name would each miss the other's rows: those sync from the store instead.
    names = [acc.name for acc in accs.values()]
    unique = len(set(names)) == len(names)
    stale = []
    for i, acc in accs.items():
        if i not in last:
            continue
        if unique:
            acc._count, acc._tracks = trial[i]
            acc._last_id = last[i]
        else:
            stale.append(acc)
    if stale:
        with store.snapshot() as db:
            for acc in stale:
                acc._sync(db)
    return out, traced
