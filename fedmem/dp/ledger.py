"""Pure-DP per-attribute ledgers with caps B_a (DP-MemView Algorithm 1, contract C5).

A charge names a *set* of attributes and one epsilon. The vocabulary is the accountants':
``fits`` (prospective check) and ``book`` (durable charge, raises when refused; ``try_charge``
returns False instead). It is admitted only if, for every
attribute a in the set, ``L_a + epsilon <= B_a`` (prospective check); then every L_a
grows by epsilon in one transaction, or none does (all-or-nothing). Epsilons are summed
exactly as rationals (``fractions.Fraction`` of the binary floats), so a sequence of
charges that exactly meets a cap is admitted and float round-off can never let a path
exceed one. State lives in a :class:`~fedmem.dp.store.DurableStore`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Mapping

from fedmem import _validate as V
from fedmem.dp.store import DurableStore
from fedmem.errors import BudgetExceeded


@dataclass(frozen=True)
class Charge:
    id: int
    attrs: tuple[str, ...]
    epsilon: float
    label: str


class AttributeLedger:
    """Caps ``B_a`` for named attributes; all-or-nothing charges of attribute sets.

    Opening a ledger whose name already exists in ``store`` resumes it; its caps must
    match (a ledger's caps are part of its privacy claim and cannot change silently).
    """

    def __init__(self, caps: Mapping[str, float], *, store: DurableStore | None = None,
                 name: str = "ledger"):
        if not isinstance(caps, Mapping) or not caps:
            raise ValueError(f"caps must be a non-empty mapping attribute -> cap. Found {caps!r}.")
        clean = {}
        for attr, cap in caps.items():
            if not isinstance(attr, str) or not attr:
                raise ValueError(f"caps keys must be non-empty strings. Found {attr!r}.")
            clean[attr] = V.positive(f"caps[{attr!r}]", cap)
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string. Found {name!r}.")
        self.name = name
        self.store = store if store is not None else DurableStore(None)
        with self.store.transaction() as db:
            rows = dict(db.execute("SELECT attr, cap FROM ledger_caps WHERE ledger=?", (name,)).fetchall())
            if rows and rows != clean:
                raise ValueError(
                    f"caps for ledger {name!r} differ from the ones stored in {self.store!r}. "
                    f"Found {clean!r}, stored {rows!r}."
                )
            if not rows:
                db.executemany("INSERT INTO ledger_caps (ledger, attr, cap) VALUES (?, ?, ?)",
                               [(name, a, c) for a, c in clean.items()])
        self._caps = dict(clean)
        self._seen = (0, 0, {a: Fraction(0) for a in self._caps})   # (last id read, rows read, exact sums)

    # ------------------------------------------------------------------ reading
    @property
    def caps(self) -> dict[str, float]:
        return dict(self._caps)

    def _spent_exact(self, db) -> dict[str, Fraction]:
        """Exact L_a from the store, inside the caller's transaction.

        Incremental: the exact sums up to the last charge id this object has read are kept,
        and only rows with a larger id are read (ids only grow: ``AUTOINCREMENT``), so a
        charge costs O(new rows), not O(history). Another process may append to the same
        ledger; its rows have larger ids and are read here. If the number of rows is not the
        number read (a row removed or rewritten behind the ledger's back), the sums are
        recomputed from the whole history, so the answer is always what a full read gives.
        """
        last, count, spent = self._seen
        new = db.execute("SELECT id, attrs, epsilon FROM ledger_charges WHERE ledger=? AND id>? ORDER BY id",
                         (self.name, last)).fetchall()
        total = db.execute("SELECT COUNT(*) FROM ledger_charges WHERE ledger=?", (self.name,)).fetchone()[0]
        if total != count + len(new):
            last, count, spent = 0, 0, {a: Fraction(0) for a in self._caps}
            new = db.execute("SELECT id, attrs, epsilon FROM ledger_charges WHERE ledger=? ORDER BY id",
                             (self.name,)).fetchall()
        spent = dict(spent)
        for row_id, attrs_json, eps in new:
            for a in json.loads(attrs_json):
                spent[a] += Fraction(eps)
            last = row_id
        self._seen = (last, count + len(new), spent)
        return dict(spent)

    def spent(self, attr: str | None = None):
        """L_a for one attribute, or a dict of all of them (floats)."""
        with self.store.transaction() as db:
            spent = self._spent_exact(db)
        if attr is None:
            return {a: float(v) for a, v in spent.items()}
        self._check_attrs([attr])
        return float(spent[attr])

    def remaining(self, attr: str) -> float:
        """B_a - L_a, computed exactly and rounded once (not from the rounded L_a)."""
        self._check_attrs([attr])
        with self.store.transaction() as db:
            spent = self._spent_exact(db)[attr]
        return float(Fraction(self._caps[attr]) - spent)

    def history(self) -> list[Charge]:
        rows = self.store.read(
            "SELECT id, attrs, epsilon, label FROM ledger_charges WHERE ledger=? ORDER BY id", (self.name,)
        )
        return [Charge(i, tuple(json.loads(a)), e, l) for i, a, e, l in rows]

    # ------------------------------------------------------------------ charging
    def _check_attrs(self, attrs: Iterable[str]) -> tuple[str, ...]:
        attrs = tuple(sorted(set(attrs)))
        unknown = [a for a in attrs if a not in self._caps]
        if unknown:
            raise ValueError(f"attrs must be ledger attributes {sorted(self._caps)}. Found unknown {unknown!r}.")
        return attrs

    def _admits(self, spent, attrs, eps: Fraction) -> bool:
        return all(spent[a] + eps <= Fraction(self._caps[a]) for a in attrs)

    def fits(self, attrs: Iterable[str], epsilon: float) -> bool:
        """Whether a charge of ``epsilon`` to every attribute in ``attrs`` would stay within
        every cap (the accountants' ``fits``). Prospective check only; changes nothing."""
        attrs = self._check_attrs(attrs)
        eps = Fraction(V.positive("epsilon", epsilon))
        with self.store.transaction() as db:
            return self._admits(self._spent_exact(db), attrs, eps)

    def try_charge(self, attrs: Iterable[str], epsilon: float, label: str = "") -> bool:
        """Charge every attribute in ``attrs`` by ``epsilon`` if all stay within cap.

        Returns False and changes nothing otherwise. Check and write happen in one
        ``BEGIN IMMEDIATE`` transaction, so concurrent writers cannot overshoot.
        """
        attrs = self._check_attrs(attrs)
        epsilon = V.positive("epsilon", epsilon)
        if not attrs:
            raise ValueError("attrs must name at least one attribute. Found an empty set.")
        with self.store.transaction() as db:
            if not self._admits(self._spent_exact(db), attrs, Fraction(epsilon)):
                return False
            db.execute(
                "INSERT INTO ledger_charges (ledger, attrs, epsilon, label, ts) VALUES (?, ?, ?, ?, ?)",
                (self.name, json.dumps(list(attrs)), epsilon, str(label), time.time()),
            )
        return True

    def book(self, attrs: Iterable[str], epsilon: float, label: str = "") -> None:
        """Charge durably, or raise :class:`BudgetExceeded` and write nothing (the accountants'
        ``book``): like :meth:`try_charge`, but a refusal raises."""
        if not self.try_charge(attrs, epsilon, label):
            raise BudgetExceeded(
                f"charge of {epsilon!r} to {sorted(set(attrs))} refused by ledger {self.name!r}: "
                f"spent {self.spent()}, caps {self._caps}."
            )

    def __repr__(self) -> str:
        return f"AttributeLedger(name={self.name!r}, caps={self._caps!r}, store={self.store!r})"
