"""Durable state for ledgers and accountants: one SQLite file, WAL, one transaction per booking.

Every booking runs inside ``BEGIN IMMEDIATE`` (a write lock taken *before* the budget
check), re-reads the rows it depends on, checks, inserts and commits. Two processes
booking against the same file are therefore serialised by SQLite: neither can lose the
other's update nor overshoot a cap. ``synchronous=FULL`` makes a commit durable before
``book`` returns, so a process killed with SIGKILL after ``book`` returned keeps the
charge, and one killed before the commit leaves no partial row (SQLite's atomic commit).

``path=None`` keeps everything in an in-memory database (tests, throwaway runs).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from fedmem import _validate as V

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_caps (
    ledger TEXT NOT NULL, attr TEXT NOT NULL, cap REAL NOT NULL,
    PRIMARY KEY (ledger, attr));
CREATE TABLE IF NOT EXISTS ledger_charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ledger TEXT NOT NULL, attrs TEXT NOT NULL,
    epsilon REAL NOT NULL, label TEXT NOT NULL, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS accountant_meta (
    accountant TEXT PRIMARY KEY, kind TEXT NOT NULL, budget_epsilon REAL, budget_delta REAL);
CREATE TABLE IF NOT EXISTS accountant_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, accountant TEXT NOT NULL, event TEXT NOT NULL,
    label TEXT NOT NULL, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS ix_ledger_charges ON ledger_charges (ledger, id);
CREATE INDEX IF NOT EXISTS ix_accountant_events ON accountant_events (accountant, id);
"""


class DurableStore:
    """A SQLite database holding ledgers and accountants (many of each, by name)."""

    def __init__(self, path: str | Path | None = None, *, timeout_s: float = 60.0):
        V.positive("timeout_s", timeout_s)
        self.path = None if path is None else Path(path)
        target = ":memory:" if path is None else str(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(target, timeout=timeout_s, isolation_level=None,
                                     check_same_thread=False)
        self._lock = threading.RLock()
        with self._lock:
            self._retry_locked(self._setup, timeout_s)

    def _setup(self):
        if self.path is not None:
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.executescript(_SCHEMA)

    def _retry_locked(self, step, timeout_s: float):
        """Run ``step`` again while SQLite reports the database locked, up to ``timeout_s``.

        Switching a new database to WAL needs its exclusive lock, and SQLite answers "database is
        locked" at once, without its busy handler, while another process holds the database
        (several processes opening one fresh store: 20 of 90 opens failed in a 3-process race,
        tests/dp/test_store.py). The setup is idempotent, so it is retried with a short backoff."""
        deadline = time.monotonic() + timeout_s
        wait = 0.001
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + wait > deadline:
                    raise
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                time.sleep(wait)
                wait = min(0.05, wait * 2)

    @contextmanager
    def transaction(self):
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolls back on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (I/O error) leaves the transaction open: end it, so the
                # write is definitely not applied and the next BEGIN works.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    @contextmanager
    def snapshot(self):
        """The connection for reads only, in autocommit: each statement sees one committed state of
        the database and takes no write lock (an accountant's catch-up read before a decision or a
        report; ``BEGIN IMMEDIATE`` ... ``COMMIT`` around it cost two more statements and the write
        lock, for nothing: the booking itself re-reads and re-checks inside its own transaction)."""
        with self._lock:
            yield self._conn

    def read(self, sql: str, params=()):
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"DurableStore({str(self.path) if self.path else ':memory:'})"
