"""``AgentLedger``: one user's end-to-end ledger over the four boundaries (durable; read back
from the agent's store and the federation's per-principal accountant)."""

from __future__ import annotations

import json
import math
from typing import Sequence

from fedmem import _validate as V
from fedmem.agent.config import DPMIND_ATTR, NO_CAP, AgentConfig
from fedmem.dp import Accountant, AttributeLedger, DurableStore, PureDpEvent
from fedmem.dp.accountant import event_from_dict


class AgentLedger:
    """One user's end-to-end ledger: names ``agent/<user>/{brace,memview,dpmind}`` in ``store``,
    plus the federation principal's accountant (``<fed>/principal/<label>``): read from
    ``federation_store`` (the operator, or an in-process session), or, for an agent that may
    not open the federation's file, from ``federation_reader``: a callable
    returning the (event dict, label) bookings of the agent's own capability (the gate's or
    the isolated RPC's ``bookings``). ``principal`` is kept as its public label only.
    """

    def __init__(self, user: str, store: DurableStore, config: AgentConfig, attributes: Sequence[str], *,
                 federation_store: DurableStore | None = None, federation_accountant: str = "federation",
                 principal: str | None = None, federation_delta: float = 1e-6, federation_reader=None):
        if not isinstance(user, str) or not user or "/" in user:
            raise ValueError(f"user must be a non-empty string without '/'. Found {user!r}.")
        if not isinstance(store, DurableStore):
            raise TypeError(f"store must be a DurableStore. Found {type(store).__name__}.")
        self.user = user
        self.store = store
        self.config = config
        prefix = f"agent/{user}"
        self.brace = Accountant("rdp", store=store, name=f"{prefix}/brace",
                                budget=(config.brace_budget_epsilon, config.brace_budget_delta))
        self.memview_name = f"{prefix}/memview"
        self.memview_caps = {a: config.memview_cap for a in attributes}
        cap = NO_CAP if math.isinf(config.dpmind_token_cap) else config.dpmind_token_cap
        self.dpmind = AttributeLedger({DPMIND_ATTR: cap}, store=store, name=f"{prefix}/dpmind")
        self.federation_store = federation_store
        self.federation_reader = federation_reader
        principal = None if principal is None else str(principal)      # the label, never the capability
        self.federation_name = None if principal is None else f"{federation_accountant}/principal/{principal}"
        self.principal = principal
        self.federation_delta = V.open_unit("federation_delta", federation_delta)

    # ---- reading (durable: a fresh AgentLedger on the same file sees the same numbers)
    def memview_ledger(self) -> AttributeLedger:
        return AttributeLedger(self.memview_caps, store=self.store, name=self.memview_name)

    def federation_bookings(self) -> list[tuple[dict, str]]:
        """(event, label) of every release the federation booked to this user's principal."""
        if self.federation_store is None and self.federation_reader is not None:
            return [(dict(e), str(lbl)) for e, lbl in self.federation_reader()]
        if self.federation_store is None or self.federation_name is None:
            return []
        rows = self.federation_store.read(
            "SELECT event, label FROM accountant_events WHERE accountant=? ORDER BY id", (self.federation_name,))
        return [(json.loads(e), lbl) for e, lbl in rows]

    def federation_epsilon(self) -> float:
        if self.federation_store is None and self.federation_reader is not None:
            acc = Accountant("rdp")
            for ev, lbl in self.federation_bookings():
                acc.book(event_from_dict(ev), label=lbl)
            return float(acc.spent(self.federation_delta)) if acc.count else 0.0
        if self.federation_store is None or self.federation_name is None:
            return 0.0
        acc = Accountant("rdp", store=self.federation_store, name=self.federation_name)
        return float(acc.spent(self.federation_delta)) if acc.count else 0.0

    def summary(self) -> dict:
        mv = self.memview_ledger().spent()
        brace_eps = float(self.brace.spent(self.config.brace_budget_delta)) if self.brace.count else 0.0
        dpm = self.dpmind.history()
        return {
            "user": self.user,
            "principal": self.principal,
            "federation": {"epsilon": self.federation_epsilon(), "delta": self.federation_delta,
                           "releases": len(self.federation_bookings())},
            "memview": {"per_attribute": mv, "max_epsilon": max(mv.values()) if mv else 0.0,
                        "charges": len(self.memview_ledger().history())},
            "brace": {"epsilon": brace_eps, "delta": self.config.brace_budget_delta, "releases": self.brace.count},
            "dpmind": {"epsilon_per_token": self.config.dpmind_epsilon, "contexts": len(dpm),
                       "summed_per_token": float(sum(c.epsilon for c in dpm))},
        }

    def composed(self, delta: float) -> dict:
        """(epsilon, delta) of federation + BRACE + the largest DP-MemView attribute spend,
        composed by dp-accounting (RDP) as if one individual's data reached all three
        (an upper bound; DP-MIND's metric DP is reported apart, never composed)."""
        acc = Accountant("rdp")
        parts = {}
        for ev, lbl in self.federation_bookings():
            acc.book(event_from_dict(ev), label=lbl)
        parts["federation"] = float(acc.spent(delta)) if acc.count else 0.0
        n = acc.count
        for b in self.brace.history:
            acc.book(event_from_dict(b.event), label=b.label)
        mv = self.memview_ledger().spent()
        top = max(mv.values()) if mv else 0.0
        if top > 0:
            acc.book(PureDpEvent(top), label="memview max attribute")
        total = float(acc.spent(delta)) if acc.count else 0.0
        return {"epsilon": total, "delta": delta, "federation_only": parts["federation"], "events": acc.count,
                "federation_events": n}
