"""Durable ledgers of a run folder: the last booking per SQLite store, the bookings made after
a mark, and per accountant / ledger the bookings and epsilon of this run next to the folder's
total across resumes (with their table in report.md)."""

from __future__ import annotations

import functools
import json
from pathlib import Path


def _ro(path: Path):
    import sqlite3

    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def ledger_marks(folder: Path) -> dict[str, dict[str, int]]:
    """For every SQLite store under ``folder``: the last accountant-event and ledger-charge id."""
    import sqlite3

    marks = {}
    for p in sorted(Path(folder).rglob("*.sqlite")):
        try:
            conn = _ro(p)
            try:
                names = _tables(conn)
                m = {}
                for table in ("accountant_events", "ledger_charges"):
                    if table in names:
                        m[table] = int(conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0])
                if m:
                    marks[p.relative_to(folder).as_posix()] = m
            finally:
                conn.close()
        except sqlite3.Error:
            continue
    return marks


def count_bookings(folder: Path, marks: dict | None = None) -> int:
    """Bookings in the stores under ``folder`` made after ``marks`` (all of them when None)."""
    now = ledger_marks(folder)
    total = 0
    for f, m in now.items():
        for table, last in m.items():
            total += max(0, last - ((marks or {}).get(f, {}).get(table, 0)))
    return total


COMPOSE_LIMIT = 2000  # events per accountant composed for the report (beyond: counts only)


def _compose(kind: str, events: list[str], delta: float) -> float:
    return _composed(kind, tuple(events), float(delta))


@functools.lru_cache(maxsize=4096)
def _composed(kind: str, events: tuple[str, ...], delta: float) -> float:
    """Epsilon of a ledger's rows (their stored JSON text) at ``delta``: a pure function of its
    arguments, memoised because a run's principals mostly hold the same few histories (a
    membership game gives every trial a fresh principal with the same one or two bookings:
    ~560 ledgers, a few dozen distinct histories, per support-leak run)."""
    from fedmem.dp.accountant import composed_epsilon  # lazy: loads dp_accounting (~190 ms)
    from fedmem.dp.events import event_from_text  # lazy: loads dp_accounting (~130 ms)

    return composed_epsilon(kind, [event_from_text(ev) for ev in events], delta)


def _top_level(names) -> dict[str, int]:
    """The top-level names among ``names`` (no ``/``, or whose parent is not there), each with how
    many sub-ledgers (``name/...``: per principal, per support channel) it has."""
    names = list(names)
    present = set(names)
    tops: dict[str, int] = {}
    for n in names:
        parts = n.split("/")
        parent = next((("/".join(parts[:i])) for i in range(1, len(parts)) if "/".join(parts[:i]) in present), None)
        if parent is None:
            tops.setdefault(n, 0)
    for n in names:
        parts = n.split("/")
        for i in range(1, len(parts)):
            p = "/".join(parts[:i])
            if p in tops:
                tops[p] += 1
                break
    return tops


def ledger_summary(folder: Path, marks: dict, delta: float | None = None, limit: int = 500) -> list[dict]:
    """Per top-level accountant / ledger of every store under ``folder``: bookings and epsilon of
    this run (after ``marks``) next to the total across every run in the folder (resumes included),
    and ``sub_ledgers``: how many per-principal / per-channel accountants below it (``name/...``)
    hold a share of its bookings (they are not rows: the top-level one books every event).

    Accountants report epsilon at their budget's delta, else at ``delta`` (None: counts only);
    pure ledgers report the largest per-attribute spend. At most ``limit`` rows.
    """
    import sqlite3

    rows: list[dict] = []
    for f in sorted(ledger_marks(folder)):
        start = marks.get(f, {})
        try:
            conn = _ro(Path(folder) / f)
        except sqlite3.Error:
            continue
        try:
            names = _tables(conn)
            if "accountant_events" in names and "accountant_meta" in names:
                meta = {a: (k, bd) for a, k, bd in conn.execute(
                    "SELECT accountant, kind, budget_delta FROM accountant_meta ORDER BY accountant")}
                for acc_name, subs in _top_level(meta).items():
                    kind, bdelta = meta[acc_name]
                    evs = conn.execute("SELECT id, event FROM accountant_events WHERE accountant=? ORDER BY id",
                                       (acc_name,)).fetchall()
                    mine = [e for i, e in evs if i > start.get("accountant_events", 0)]
                    at = bdelta if bdelta is not None else delta
                    row = {"store": f, "type": "accountant", "name": acc_name, "kind": kind,
                           "bookings_this_run": len(mine), "bookings_total": len(evs),
                           "delta": at, "epsilon_this_run": None, "epsilon_total": None, "sub_ledgers": subs}
                    if at is not None and 0 < at < 1 and len(evs) <= COMPOSE_LIMIT:
                        try:
                            row["epsilon_total"] = _compose(kind, [e for _, e in evs], at)
                            row["epsilon_this_run"] = (_compose(kind, mine, at) if len(mine) != len(evs)
                                                       else row["epsilon_total"])
                        except Exception:  # noqa: BLE001 - a summary never fails a run
                            pass
                    rows.append(row)
            if "ledger_charges" in names:
                lnames = [n for (n,) in conn.execute("SELECT DISTINCT ledger FROM ledger_charges ORDER BY ledger")]
                for lname, subs in _top_level(lnames).items():
                    tot: dict = {}
                    run: dict = {}
                    n_all = n_mine = 0
                    for i, attrs, eps in conn.execute(
                            "SELECT id, attrs, epsilon FROM ledger_charges WHERE ledger=? ORDER BY id", (lname,)):
                        n_all += 1
                        new = i > start.get("ledger_charges", 0)
                        n_mine += new
                        for a in json.loads(attrs):
                            tot[a] = tot.get(a, 0.0) + eps
                            if new:
                                run[a] = run.get(a, 0.0) + eps
                    rows.append({"store": f, "type": "ledger (pure eps, largest attribute)", "name": lname,
                                 "kind": "pure", "bookings_this_run": n_mine, "bookings_total": n_all,
                                 "delta": None, "epsilon_this_run": max(run.values(), default=0.0),
                                 "epsilon_total": max(tot.values(), default=0.0), "sub_ledgers": subs})
        except (sqlite3.Error, ValueError):
            pass
        finally:
            conn.close()
        if len(rows) >= limit:
            break
    return rows[:limit]


LEDGER_ROWS = 30  # report.md lists at most this many top-level accountants / ledgers


def ledger_markdown(rows: list[dict], resumed: bool, shown: int = LEDGER_ROWS) -> str:
    def e(x):
        return "-" if x is None else f"{x:.4g}"

    lines = ["| store | accountant / ledger | sub-ledgers | bookings this run | bookings total | eps this run "
             "| eps total | at delta |", "|---|---|---|---|---|---|---|---|"]
    for r in rows[:shown]:
        at = "-" if r["delta"] is None else f"{r['delta']:g}"
        lines.append(f"| {r['store']} | {r['name']} ({r['kind']}) | {r.get('sub_ledgers', 0)} | "
                     f"{r['bookings_this_run']} | {r['bookings_total']} | {e(r['epsilon_this_run'])} | "
                     f"{e(r['epsilon_total'])} | {at} |")
    if len(rows) > shown:
        lines.append(f"| {len(rows) - shown} more (see ledger.sqlite) | | | | | | | |")
    lines += ["", "One row per top-level accountant or ledger; its sub-ledgers (per principal, per support "
              "channel: `name/...`) each hold a share of its bookings and are in ledger.sqlite. "
              "This run: bookings made (and epsilon composed) by this run only. Total: every booking in the "
              "store, across " + ("the earlier runs resumed here and this one" if resumed else
                                  "every run in this folder (only this one)") +
              ". Epsilon of accountants is composed at their budget's delta, else at the scenario's delta "
              "(- when neither is known or there are too many events); pure ledgers show the largest "
              "per-attribute spend."]
    return "\n".join(lines)
