"""Gateway: admission control at the aggregation boundary (papers/003, Decision Boundary).

"Acceptance is not the default; it is the outcome of a positive check on the support
channel." fedmem's gateway adds one rule papers/003 leaves implicit: **the decision
itself is a channel**. A querying agent sees whether it got an answer, which kind of
answer, and when; so every admission decision here is a function of public
configuration, of the query's public metadata (principal, retry link) and of what has
already been *booked* — never of the private records. Concretely, :meth:`Gateway.decide`
runs **before anything private is computed**, on the release *plan*
(:meth:`~fedmem.federation.aggregator.ReleasePolicy.plan`: the channels, kinds and DP
events of every release of a policy, derived from the configuration alone):

1. ``retry_unbooked``: a declared retry (``retry_of=j``) must name a query this
   federation issued (query ids are durable, public and sequential).
2. ``unbookable``: a plan with an ``"exact"`` support channel (exposed receipts or
   count, the exact denominator of a mean, a global calibration whose delivered noise
   depends on the realized count) has no finite privacy loss: papers/003's cardinality
   differencing separates some neighbouring pair with certainty. With the gateway on
   such a plan is never admitted, for any query (so the refusal says nothing about the
   data).
3. ``support_budget``: the plan's DP support events (noised receipts) composed with
   everything this principal's support channels already released, and with every
   principal's, must stay within ``support_budget_bits`` per principal and
   ``total_support_budget_bits`` in total. Bits are ``epsilon(delta) / ln 2`` of the RDP
   (or PLD) composition: an epsilon-DP channel's privacy loss is at most epsilon nats.
4. ``epsilon_budget``: the plan's DP events (value and support) composed per principal
   and in total must stay within ``epsilon_budget`` / ``total_epsilon_budget`` at
   ``delta``.

Budgets are charged per **principal** — the identity the federation gives a client
when it connects (:meth:`~fedmem.federation.engine.Federation.connect`), never a label
the caller chooses — and in total, so a Sybil that connects many times is still bounded
by the totals. A principal is a **capability**: :meth:`Gateway.new_principal`
returns a :class:`Principal`, whose string value is a random public label (``p-`` and 16
hex digits: not sequential, not guessable from other labels) used in ledgers and the
audit log, and which carries a secret 128-bit token (:mod:`secrets`). The store keeps
only the token's SHA-256 digest; :meth:`Gateway.resolve` maps a presented token (or
``Principal``) back to its label, and anything the gateway did not issue resolves to
``None`` and is refused with the uniform refusal (reason ``unissued_principal`` in the
operator's audit). Knowing a label (from a ledger or a report) gives no right to query. A query family is kept only as a label in the operator's audit log.
All spend lives in durable accountants in the same SQLite store as the federation's
accountant (names ``<accountant>/principal/<id>``, ``<accountant>/support/<id>``,
``<accountant>/support/total``), together with the issued query ids and principals,
so a restart neither resets a budget nor forgets a query.

With ``on_reject="rerun_broadcast"`` the gateway has a second route: when the primary
plan cannot be admitted, the query is answered by the support-safe broadcast plan
instead (it is checked the same way). Which route answers is again decided before any
computation, from public state only.

Refusals: the agent receives :class:`~fedmem.errors.SupportPrivacyViolation` with the
constant text ``"no memory available for this query"`` and no other content; the reasons
go to the operator's audit record (:class:`~fedmem.federation.engine.AuditRecord`).

Booking (:meth:`Gateway.book`) charges the per-principal, total, per-principal-support
and total-support accountants in **one** SQLite transaction (all or nothing) after the
release is computed and before it is returned.

papers/003's plug-in entropy of released counts is not computed: it is 0 on a family's first
query, so it can decide nothing, and an unread diagnostic of released counts is one more place
that holds them.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

from fedmem import _validate as V
from fedmem.dp import Accountant, book_together
from fedmem.dp.accountant import PendingTrial, book_groups
from fedmem.dp.events import gaussian_mu
from fedmem.errors import BudgetExceeded, SupportPrivacyViolation
from fedmem.federation.aggregator import ReleasePlan

ANONYMOUS = "anonymous"
ROUTES = ("primary", "fallback")
REASONS = ("unissued_principal", "retry_unbooked", "unbookable", "support_budget", "epsilon_budget")
UNISSUED = "unissued"          # the label booked for a query under a capability nobody issued
REFUSAL_TEXT = "no memory available for this query"

_TABLES = """
CREATE TABLE IF NOT EXISTS federation_principals (
    federation TEXT NOT NULL, principal TEXT NOT NULL, ts REAL NOT NULL, PRIMARY KEY (federation, principal));
CREATE TABLE IF NOT EXISTS federation_queries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, federation TEXT NOT NULL, qid INTEGER NOT NULL, principal TEXT NOT NULL,
    family TEXT, retry_of INTEGER);
CREATE INDEX IF NOT EXISTS ix_federation_queries ON federation_queries (federation, qid);
CREATE TABLE IF NOT EXISTS federation_capabilities (
    federation TEXT NOT NULL, digest TEXT NOT NULL, principal TEXT NOT NULL, PRIMARY KEY (federation, digest));
"""


class Principal(str):
    """An issued principal: the string value is its public label, ``capability`` its secret token.

    Crossing a process boundary (pickling) carries the token: hand a ``Principal`` only to
    the party it was issued to. ``repr`` and ``str`` show the label only.
    """

    def __new__(cls, label: str, token: str):
        obj = super().__new__(cls, label)
        obj._token = token
        return obj

    @property
    def label(self) -> str:
        return str.__str__(self)

    @property
    def capability(self) -> str:
        """The secret token (what an RPC client presents)."""
        return self._token

    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Principal({str.__str__(self)!r})"

    def __reduce__(self):
        return (Principal, (str.__str__(self), self._token))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def refusal(query_id: int | None = None) -> SupportPrivacyViolation:
    """The one refusal an agent ever receives: constant text, no data-dependent attribute."""
    return SupportPrivacyViolation(REFUSAL_TEXT, query_id=query_id)


@dataclass(frozen=True)
class Decision:
    """The gateway's verdict on one query, taken before anything private was computed."""

    query_id: int
    principal: str
    family: str
    retry_of: int | None
    route: str | None           # "primary" | "fallback" | None (refused)
    reasons: tuple[str, ...]    # why the primary (and fallback) route was refused: operator's audit only

    @property
    def admitted(self) -> bool:
        return self.route is not None


class Gateway:
    """Data-independent admission, per-principal and total budgets, atomic durable booking."""

    def __init__(self, accountant: Accountant, *, enabled: bool = True, support_budget_bits: float = 1.0,
                 total_support_budget_bits: float = 4.0, epsilon_budget: float = 10.0,
                 total_epsilon_budget: float = 100.0, delta: float = 1e-6, federation: str | None = None):
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool. Found {enabled!r}.")
        self.accountant = accountant
        self.enabled = enabled
        self.support_budget_bits = V.positive_or_inf("support_budget_bits", support_budget_bits)
        self.total_support_budget_bits = V.positive_or_inf("total_support_budget_bits", total_support_budget_bits)
        self.epsilon_budget = V.positive_or_inf("epsilon_budget", epsilon_budget)
        self.total_epsilon_budget = V.positive_or_inf("total_epsilon_budget", total_epsilon_budget)
        self.delta = V.open_unit("delta", delta)
        self.name = federation or accountant.name
        self.store = accountant.store
        for stmt in _TABLES.strip().split(";"):
            if stmt.strip():
                with self.store.transaction() as db:
                    db.execute(stmt)
        self._accs: dict[str, Accountant] = {}
        self._resolved: dict[str, str] = {}    # token digest -> label (cache of federation_capabilities)
        self._pending: dict[str, PendingTrial] = {}   # accountant name -> charges admitted, not yet booked

    # ------------------------------------------------------------------ principals and queries
    def new_principal(self) -> Principal:
        """A fresh principal: random public label + secret 128-bit token, durable (only the
        token's digest is stored) and never reused (also across restarts)."""
        import time

        token = secrets.token_hex(16)
        with self.store.transaction() as db:
            while True:
                label = f"p-{secrets.token_hex(8)}"
                if not db.execute("SELECT 1 FROM federation_principals WHERE federation=? AND principal=?",
                                  (self.name, label)).fetchone():
                    break
            db.execute("INSERT INTO federation_principals VALUES (?, ?, ?)", (self.name, label, time.time()))
            db.execute("INSERT INTO federation_capabilities VALUES (?, ?, ?)", (self.name, _digest(token), label))
        self._resolved[_digest(token)] = label
        return Principal(label, token)

    def resolve(self, capability) -> str | None:
        """The label of an issued capability (a :class:`Principal` or its token), else ``None``.

        A bare label is not a capability: it resolves to ``None`` (unless it happens to be
        someone's token, which has probability 2^-128)."""
        if isinstance(capability, Principal):
            token, want = capability.capability, capability.label
        elif isinstance(capability, str):
            token, want = capability, None
        else:
            return None
        if not isinstance(token, str) or not token:
            return None
        d = _digest(token)
        label = self._resolved.get(d)
        if label is None:
            rows = self.store.read("SELECT principal FROM federation_capabilities WHERE federation=? AND digest=?",
                                   (self.name, d))
            if not rows:
                return None
            label = self._resolved[d] = rows[0][0]
        if want is not None and want != label:
            return None
        return label

    def known_principal(self, principal) -> bool:
        """Whether ``principal`` is an issued capability (a bare label is not)."""
        return self.resolve(principal) is not None

    def register(self, principal, families, retries) -> list[int]:
        """Issue durable, sequential query ids for one batch (one transaction). ``principal``:
        one id for the whole batch, or a list with one per query."""
        families, retries = list(families), list(retries)
        pids = [str(p) for p in principal] if isinstance(principal, (list, tuple)) else [str(principal)] * len(families)
        ids = []
        with self.store.transaction() as db:
            row = db.execute("SELECT MAX(qid) FROM federation_queries WHERE federation=?", (self.name,)).fetchone()
            nxt = 0 if row[0] is None else int(row[0]) + 1
            for pid, fam, ret in zip(pids, families, retries):
                db.execute("INSERT INTO federation_queries (federation, qid, principal, family, retry_of) "
                           "VALUES (?, ?, ?, ?, ?)", (self.name, nxt, pid, fam, ret))
                ids.append(nxt)
                nxt += 1
        return ids

    def issued(self, query_id: int) -> bool:
        return bool(self.store.read("SELECT 1 FROM federation_queries WHERE federation=? AND qid=?",
                                    (self.name, int(query_id))))

    # ------------------------------------------------------------------ accountants
    def _acc(self, name: str) -> Accountant:
        acc = self._accs.get(name)
        if acc is None:
            acc = Accountant(self.accountant.kind, store=self.store, name=name)
            self._accs[name] = acc
        return acc

    def principal_accountant(self, principal: str) -> Accountant:
        return self._acc(f"{self.accountant.name}/principal/{principal}")

    def support_accountant(self, principal: str | None) -> Accountant:
        """Support spend of one principal, or of all (``None``)."""
        return self._acc(f"{self.accountant.name}/support/{'total' if principal is None else principal}")

    def _caps(self, principal: str, plan: ReleasePlan):
        """(accountant, events, cap, reason) of every budget a release of ``plan`` charges."""
        ln2 = math.log(2.0)
        ev, sup = plan.dp_events, plan.support_events
        out = [(self.principal_accountant(principal), ev, (self.epsilon_budget, self.delta), "epsilon_budget"),
               (self.accountant, ev, (self.total_epsilon_budget, self.delta), "epsilon_budget")]
        if sup:
            out += [(self.support_accountant(principal), sup, (self.support_budget_bits * ln2, self.delta),
                     "support_budget"),
                    (self.support_accountant(None), sup, (self.total_support_budget_bits * ln2, self.delta),
                     "support_budget")]
        return out

    def support_bits(self, principal: str | None) -> float:
        """Bits released so far through support channels by ``principal`` (``None``: everyone)."""
        acc = self.support_accountant(principal)
        return acc.spent(self.delta) / math.log(2.0) if acc.count else 0.0

    def principal_spent(self, principal: str) -> float:
        acc = self.principal_accountant(principal)
        return acc.spent(self.delta) if acc.count else 0.0

    def principal_gdp_mu(self, principal: str) -> float | None:
        """``mu`` of everything booked to ``principal`` when it is Gaussian only (exactly ``mu``-GDP,
        :func:`fedmem.dp.events.gaussian_mu`); 0 if nothing was booked; ``None`` if any booked
        event is not Gaussian (operator / evaluation side: the attack reports judge with it)."""
        mus = [gaussian_mu(b.event) for b in self.principal_accountant(principal).history]
        if any(m is None for m in mus):
            return None
        return math.sqrt(sum(m * m for m in mus))

    def principal_booked(self, principal: str) -> tuple[float, float | None]:
        """``(principal_spent, principal_gdp_mu)``: what the attack reports judge a trial against."""
        return self.principal_spent(principal), self.principal_gdp_mu(principal)

    # ------------------------------------------------------------------ decision
    def decide(self, query_id: int, principal: str, family: str, retry_of: int | None,
               plans: dict[str, ReleasePlan]) -> Decision:
        """Admission of one query from public state only (module docstring). Reserves the
        charges of an admitted query until :meth:`book` or :meth:`clear_pending`."""
        refused = self._refused_uncharged(query_id, principal, family, retry_of)
        if refused is not None:
            return refused
        reasons: list[str] = []
        for route in ROUTES:
            plan = plans.get(route)
            if plan is None:
                continue
            if self.enabled and not plan.bookable:
                reasons.append("unbookable" if route == "primary" else "fallback:unbookable")
                continue
            caps = self._caps(principal, plan)
            why = next((why for acc, events, cap, why in caps
                        if not self._pending_of(acc).fits(events, cap)), None)
            if why is not None:
                reasons.append(why if route == "primary" else f"fallback:{why}")
                continue
            for acc, events, _, _ in caps:
                self._pending_of(acc).add(events)
            return Decision(query_id, principal, family, retry_of, route, tuple(reasons))
        return Decision(query_id, principal, family, retry_of, None, tuple(reasons))

    def _refused_uncharged(self, query_id, principal, family, retry_of) -> Decision | None:
        """The refusals decided before any route or budget (nothing charged): an unissued principal,
        a retry of a query this federation never issued; ``None`` otherwise."""
        if principal == UNISSUED:
            return Decision(query_id, principal, family, retry_of, None, ("unissued_principal",))
        if retry_of is not None and not self.issued(retry_of):
            return Decision(query_id, principal, family, retry_of, None, ("retry_unbooked",))
        return None

    def decide_many(self, query_ids, principals, families, retries, plans: dict[str, ReleasePlan]) -> list[Decision]:
        """:meth:`decide` for every query of a batch, in order: the same decisions, the same pending
        charges afterwards.

        Fast path, for RDP ledgers: when every charge of the batch's chargeable queries (issued
        principal, booked retry) by the primary route fits all together (one trial composition
        per ledger: its pending charges, then each query's charges in batch order, as
        :meth:`decide` would hold them), every such query is admitted by the primary route and
        the trial becomes the pending state. The decisions are :meth:`decide`'s because an RDP
        accountant's epsilon never decreases when an event is composed (every order's curve only
        grows in floating point too, and the conversion to epsilon, the exact sums and the
        leftover delta are monotone), so each query's prefix fits when the whole batch does.
        Otherwise (a budget binds within the batch, a PLD ledger whose discretised epsilon is not
        provably monotone, an unbookable primary plan) query by query with :meth:`decide`.
        Saves a trial copy, a ledger read and an epsilon per ledger per query (8 of 75 ms of a
        plaintext batch of 100, ``scripts/bench_engine.py``)."""
        query_ids, principals, families, retries = (list(x) for x in (query_ids, principals, families, retries))
        if not len(query_ids) == len(principals) == len(families) == len(retries):
            raise ValueError(f"query_ids, principals, families and retries must have one entry per query. Found "
                             f"{len(query_ids)}, {len(principals)}, {len(families)} and {len(retries)}.")
        rows = list(zip(query_ids, principals, families, retries))
        fast = self._decide_all_primary(rows, plans)
        if fast is not None:
            return fast
        return [self.decide(q, p, f, r, plans) for q, p, f, r in rows]

    def _decide_all_primary(self, rows, plans) -> list[Decision] | None:
        """The fast path of :meth:`decide_many`; ``None`` (nothing held) when it does not apply."""
        plan = plans.get("primary")
        if self.accountant.kind != "rdp" or plan is None or (self.enabled and not plan.bookable):
            return None
        out, charged = [], {}     # ledger name -> (pending trial, cap, [events of each charge, in order])
        for q, p, f, r in rows:
            refused = self._refused_uncharged(q, p, f, r)
            if refused is not None:
                out.append(refused)
                continue
            # every ledger is of the gateway's kind (_acc) and has one cap (the gateway's setting for it)
            for acc, events, cap, _ in self._caps(p, plan):
                charged.setdefault(acc.name, (self._pending_of(acc), cap, []))[2].extend(events)
            out.append(Decision(q, p, f, r, "primary", ()))
        if any(not trial.fits(events, cap) for trial, cap, events in charged.values()):
            return None
        for trial, _, events in charged.values():
            trial.add(events)      # adopts the trial fits() just composed
        return out

    def _pending_of(self, acc: Accountant) -> PendingTrial:
        """The pending charges of ``acc``'s ledger (by name: one ledger however many objects open it)."""
        p = self._pending.get(acc.name)
        if p is None:
            p = self._pending[acc.name] = PendingTrial(acc)
        return p

    def clear_pending(self) -> None:
        self._pending.clear()

    def charges(self, decision: Decision, plan: ReleasePlan) -> list[tuple[str, list]]:
        """``(ledger name, events)`` of every budget an admitted ``decision`` of ``plan`` holds as
        pending (what :meth:`decide` added), so another gateway on the same store can :meth:`hold` them."""
        return [(acc.name, list(events)) for acc, events, _, _ in self._caps(decision.principal, plan)]

    def hold(self, ledger: str, events) -> None:
        """Hold ``events`` as pending on the ledger named ``ledger`` of this store until
        :meth:`clear_pending`: charges another gateway on the same store admitted and has not booked
        yet (:meth:`charges`), so this gateway's :meth:`decide` counts them."""
        acc = self.accountant if ledger == self.accountant.name else self._acc(str(ledger))
        self._pending_of(acc).add(list(events))

    def _entries(self, decision: Decision, plan: ReleasePlan) -> list:
        if not decision.admitted:
            raise ValueError(f"decision must be an admission. Found reasons {decision.reasons!r}.")
        entries = []
        for acc, _, cap, why in self._caps(decision.principal, plan):
            ev = plan.support_event() if why == "support_budget" else plan.event()
            if ev is not None:
                entries.append((acc, ev, cap))
        return entries

    def book(self, decision: Decision, plan: ReleasePlan, label: str):
        """Charge every budget of an admitted release in one transaction; returns the bookings.

        Raises :class:`~fedmem.errors.BudgetExceeded` (nothing written) if a concurrent
        writer spent the budget since :meth:`decide`.
        """
        return book_together(self._entries(decision, plan), label)

    def book_many(self, items):
        """Charge the admitted releases of a batch, ``items = [(decision, plan, label), ...]``, in
        ONE transaction (all or nothing; :func:`~fedmem.dp.accountant.book_groups`).

        Returns, per item, ``(bookings, principal's epsilon spent, principal's support bits)`` right
        after it (what :meth:`book`, :meth:`principal_spent` and :meth:`support_bits` give item by
        item), or ``None`` when the batch cannot be booked as a whole (a concurrent writer spent a
        budget since :meth:`decide`: ``BudgetExceeded``, nothing written); the caller then books
        item by item, so the items that still fit are answered."""
        groups = [self._entries(d, plan) for d, plan, _ in items]
        trace = [[(self.principal_accountant(d.principal), self.delta), (self.support_accountant(d.principal),
                                                                          self.delta)] for d, _, _ in items]
        if not any(groups):
            return None
        try:
            books, traced = book_groups(groups, [label for _, _, label in items], trace)
        except BudgetExceeded:
            return None
        ln2 = math.log(2.0)
        return [(b, eps if n else 0.0, bits / ln2 if m else 0.0) for b, ((n, eps), (m, bits)) in zip(books, traced)]
