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


# ------------------------------------------------------------------------------ the driver's seal
_SEAL_TABLES = (("ledger_charges", "id, ledger, attrs, epsilon, label, ts"),
                ("accountant_events", "id, accountant, event, label, ts"),
                ("ledger_caps", "ledger, attr, cap"),
                ("accountant_meta", "accountant, kind, budget_epsilon, budget_delta"))


class LedgerSeal:
    """A keyed MAC chain over the rows of each agent's ledger, kept by the session's driver.

    After each step of an agent the driver reads the agent's ledger file (it may not trust
    it: the agent's uid writes it) and appends every row it has not sealed yet to the chain
    ``mac_i = HMAC(key, mac_{i-1} || user || table || row)``; the chain lives in ``seal_path``
    and the key in ``key_path`` (both mode 0600, the driver's uid: never in an agent). The
    key is created once per run folder, so a resumed session continues the same chain.
    :meth:`verify` recomputes the chain over the file as it is now: a row that was never
    sealed (written outside the agent's steps: by a leftover process, by another session, or
    after the agent's last step), a sealed row that changed, or one that is gone, is a problem.
    """

    def __init__(self, seal_path, key_path):
        import os
        import sqlite3

        self.seal_path, self.key_path = str(seal_path), str(key_path)
        fd = None
        try:
            fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.write(fd, os.urandom(32))
        except FileExistsError:
            pass
        finally:
            if fd is not None:
                os.close(fd)
        with open(self.key_path, "rb") as fh:
            self._key = fh.read()
        if len(self._key) != 32:
            raise ValueError(f"key_path must hold a 32-byte key. Found {len(self._key)} bytes.")
        self._db = sqlite3.connect(self.seal_path, check_same_thread=False, isolation_level=None)
        os.chmod(self.seal_path, 0o600)
        self._db.execute("CREATE TABLE IF NOT EXISTS seal (user TEXT NOT NULL, seq INTEGER NOT NULL, "
                         "tbl TEXT NOT NULL, row TEXT NOT NULL, mac TEXT NOT NULL, PRIMARY KEY (user, seq))")
        import threading

        self._lock = threading.Lock()

    def _mac(self, prev: str, user: str, tbl: str, row: str) -> str:
        import hashlib
        import hmac

        return hmac.new(self._key, "\x1f".join((prev, user, tbl, row)).encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def _rows(path, uid) -> list[tuple[str, str]]:
        """(table, row as JSON) of every row of the ledger file at ``path``, read-only; the file must
        be a regular file (not a link) owned by ``uid`` (when given)."""
        import os
        import sqlite3
        import stat

        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
            raise ValueError(f"ledger file is not a regular file of the agent's uid (mode {st.st_mode:o})")
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            out = []
            for tbl, cols in _SEAL_TABLES:
                if tbl not in have:
                    continue
                order = "id" if cols.startswith("id") else cols.split(",")[0]
                for r in con.execute(f"SELECT {cols} FROM {tbl} ORDER BY {order}"):  # noqa: S608 - fixed names
                    out.append((tbl, json.dumps(list(r))))
            return out
        finally:
            con.close()

    def sealed(self, user: str) -> list[tuple[str, str, str]]:
        with self._lock:
            return [tuple(r) for r in self._db.execute("SELECT tbl, row, mac FROM seal WHERE user=? ORDER BY seq",
                                                       (user,))]

    def attest(self, user: str, path, uid=None) -> int:
        """Seal the rows of ``user``'s ledger not sealed yet; returns how many. Sealed rows that
        changed are not re-sealed (``verify`` reports them)."""
        rows = self._rows(path, uid)
        done = self.sealed(user)
        have = {(t, r) for t, r, _ in done}
        prev = done[-1][2] if done else ""
        new = [(t, r) for t, r in rows if (t, r) not in have]
        with self._lock:
            for i, (t, r) in enumerate(new):
                prev = self._mac(prev, user, t, r)
                self._db.execute("INSERT INTO seal VALUES (?, ?, ?, ?, ?)", (user, len(done) + i, t, r, prev))
        return len(new)

    def verify(self, user: str, path, uid=None) -> list[str]:
        """Problems of ``user``'s ledger against its seal ([] when every row is sealed and intact)."""
        try:
            rows = self._rows(path, uid)
        except Exception as exc:  # noqa: BLE001
            return [f"ledger unreadable: {type(exc).__name__}"]
        problems = []
        prev = ""
        sealed = set()
        for t, r, mac in self.sealed(user):
            prev_ok = self._mac(prev, user, t, r)
            if prev_ok != mac:
                problems.append("the seal's chain is broken")
                break
            prev = mac
            sealed.add((t, r))
        now = set(rows)
        extra = [x for x in rows if x not in sealed]
        gone = sealed - now
        if extra:
            problems.append(f"{len(extra)} ledger rows were never sealed (written outside the agent's steps)")
        if gone:
            problems.append(f"{len(gone)} sealed ledger rows are missing or changed")
        return problems
