"""Durability with real processes: SIGKILL at random moments, and concurrent writers.

The worker (``tests/dp/durability_worker.py``) prints a line only after ``book``/``charge``
has returned. Killing it with SIGKILL at a random moment (possibly mid-transaction) must
leave every printed booking in the SQLite file, and at most one more (a commit that
landed just before the kill, whose print did not): nothing booked is lost, nothing
half-written appears. Two workers racing to the same caps must together admit exactly
what one process would have admitted alone: no lost update, no overshoot.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from fedmem.dp import Accountant, AttributeLedger, DurableStore, PureDpEvent
from fedmem.errors import BudgetExceeded

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "durability_worker.py"
from tests.dp import durability_worker as W  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


def _spawn(*args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def _stored(path):
    store = DurableStore(path)
    acc = Accountant("rdp", store=store, name="loop")
    led = AttributeLedger(W.LOOP_CAPS, store=store, name="loop")
    return [b.label for b in acc.history], [c.label for c in led.history()], led.spent()


def test_sigkill_at_random_points_keeps_every_returned_booking(tmp_path):
    path = tmp_path / "kill.sqlite"
    rnd = random.Random(20261130)
    printed_acc: list[str] = []
    printed_led: list[str] = []
    for round_ in range(3):
        proc = _spawn("loop", path)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            lines = rnd.randint(3, 60)
            for _ in range(lines):
                line = proc.stdout.readline().strip()
                (printed_acc if line.startswith("acc") else printed_led).append(line)
            time.sleep(rnd.uniform(0.0, 0.004))      # let it get into the next transaction
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            # Lines printed between our last read and the kill also count as returned.
            for line in proc.stdout.read().splitlines():
                (printed_acc if line.startswith("acc") else printed_led).append(line.strip())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        acc_labels, led_labels, spent = _stored(path)
        # Every printed booking is stored; the stored sequence is gap-free and in order.
        assert acc_labels[: len(printed_acc)] == printed_acc, f"round {round_}"
        assert led_labels[: len(printed_led)] == printed_led, f"round {round_}"
        assert acc_labels == [f"acc {i}" for i in range(len(acc_labels))]
        assert led_labels == [f"led {i}" for i in range(len(led_labels))]
        # At most one unprinted commit per kind (the kill landed between commit and print).
        assert len(acc_labels) - len(printed_acc) <= 1 and len(led_labels) - len(printed_led) <= 1
        # L_a equals the sum of the surviving charges: no half-applied set charge.
        n_ab = sum(1 for i in range(len(led_labels)) if i % 2)
        assert spent == {"a": 0.5 * len(led_labels), "b": 0.5 * n_ab}
        # Continue the sequence from what is stored (a charge may have landed unprinted).
        printed_acc = list(acc_labels)
        printed_led = list(led_labels)
    assert len(printed_acc) >= 3


def _sequential_admissions() -> tuple[int, int]:
    """What one process alone admits: the reference for the race."""
    led = AttributeLedger(W.RACE_CAPS)
    n_led = 0
    while led.try_charge(["a", "b"], 0.01):
        n_led += 1
    acc = Accountant("rdp", budget=W.RACE_BUDGET)
    n_acc = 0
    try:
        while True:
            acc.book(PureDpEvent(0.01))
            n_acc += 1
    except BudgetExceeded:
        pass
    return n_led, n_acc


@contextlib.contextmanager
def _ready_workers(count: int, *args):
    """``count`` workers started with ``args``, each past its setup (it printed ``ready``); the ones still
    running when the block ends are killed."""
    procs = [_spawn(*args) for _ in range(count)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _output(p: subprocess.Popen) -> str:
    """What a worker printed after ``ready``, once it exited cleanly."""
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return out


def _race(folder: Path, n_plain: int) -> list[dict]:
    """Run two race workers against ``folder/race.sqlite``; return their own counts."""
    path, go = folder / "race.sqlite", folder / "go"
    with _ready_workers(2, "race", path, go, n_plain) as procs:   # both set up before the start signal
        go.touch()
        return [json.loads(_output(p).strip().splitlines()[-1]) for p in procs]


def test_concurrent_writers_lose_nothing_and_never_overshoot(tmp_path):
    n_plain = 40
    n_led, n_acc = _sequential_admissions()
    assert n_led == 399  # 400 * 0.01 exceeds 4.0 in exact binary rationals
    interleaved = False
    for attempt in range(3):  # the invariants hold on every attempt; we need one real race
        folder = tmp_path / f"attempt{attempt}"
        folder.mkdir()
        outs = _race(folder, n_plain)
        store = DurableStore(folder / "race.sqlite")
        led = AttributeLedger(W.RACE_CAPS, store=store, name="race")
        capped = Accountant("rdp", store=store, name="capped", budget=W.RACE_BUDGET)
        plain = Accountant("rdp", store=store, name="plain")
        # Together exactly what one process admits alone: no overshoot, no lost update.
        assert sum(o["ledger"] for o in outs) == n_led == len(led.history()), outs
        assert sum(o["capped"] for o in outs) == n_acc == capped.count, outs
        assert Fraction(led.spent("a")) <= 4 and led.spent("a") == led.spent("b")
        assert capped.spent(1e-6) <= 4.0
        assert plain.count == 2 * n_plain
        # Every charge is attributed to the process that says it made it.
        labels = [c.label for c in led.history()]
        # (a worker that admitted nothing wrote no label, so it has no count on the left)
        assert sorted(labels.count(lbl) for lbl in set(labels)) == sorted(o["ledger"] for o in outs if o["ledger"])
        store.close()
        # Did both really race for the capped resources? (On a heavily loaded machine one
        # worker can occasionally finish before the other is scheduled: then run again.)
        if all(o["ledger"] > 0 and o["capped"] > 0 for o in outs):
            interleaved = True
            break
    assert interleaved, "the two workers never overlapped in 3 attempts"


def _open_race(folder: Path, broken: bool, n: int = 20, procs: int = 3) -> dict:
    """``procs`` processes open each of ``n`` fresh stores at the same moment; counts per outcome."""
    with _ready_workers(procs, "open_race", folder, n, int(broken)) as ps:
        for i in range(n):
            (folder / f"go{i}").touch()
            time.sleep(0.05)
        got = {"opened": 0, "locked": 0}
        for p in ps:
            for line in _output(p).split():
                if line in got:
                    got[line] += 1
        return got


def test_processes_opening_one_fresh_store_together_all_succeed(tmp_path):
    """Several processes opening the same new store at once (e.g. agents and services starting
    together): switching a new database to WAL needs its exclusive lock and SQLite may answer
    "database is locked" without waiting, so a setup that is not retried fails some of them (the CI
    flake that found it; on the development machine the same race with the retry disabled failed 0-10
    of 120 opens per run, 20 of 90 in a first 3-process trial: too irregular to assert, hence the
    deterministic companion below). With the retry every open succeeds."""
    got = _open_race(tmp_path, broken=False, n=30, procs=4)
    assert got == {"opened": 120, "locked": 0}, got


def test_store_setup_is_retried_only_while_the_database_is_locked():
    """_retry_locked: a setup step that meets "database is locked" twice is run again and succeeds;
    any other SQLite error, and a lock that outlasts the timeout, are raised. Companion: the setup
    without the retry (the code before the fix) fails at the first lock."""
    import sqlite3

    store = DurableStore(None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert store._retry_locked(flaky, 5.0) == "done" and len(calls) == 3

    def other():
        raise sqlite3.OperationalError("no such table: x")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        store._retry_locked(other, 5.0)

    def always():
        raise sqlite3.OperationalError("database is locked")

    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store._retry_locked(always, 0.2)
    assert 0.1 < time.monotonic() - t0 < 2.0
    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="locked"):   # no retry: the first lock fails
        (lambda step, timeout_s: step())(flaky, 5.0)
    assert len(calls) == 1
