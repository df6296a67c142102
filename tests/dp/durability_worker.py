"""Subprocess worker for tests/dp/test_store.py (not a test module itself).

Usage::

    python durability_worker.py loop PATH           # book forever, print after each return
    python durability_worker.py race PATH GO N       # wait for file GO, then race to the caps

``loop`` alternates an accountant booking and a ledger charge, continuing the sequence
numbers already in the store, and prints ``acc <i>`` / ``led <i>`` only after ``book`` /
``book`` has *returned*; the parent SIGKILLs it at a random moment and checks that
every printed booking survived.

``race`` prints ``ready`` once set up, waits until GO exists (the parent creates it when
both workers are ready, so they start together), then alternates, until
each is refused: a ledger charge of 0.01 against a cap of 4.0 on attributes a and b, a
pure-DP booking of 0.01 into an accountant with budget (4.0, 1e-6); and it books N
unbudgeted Gaussian events. It prints one JSON line with its own counts.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time

from dp_accounting import GaussianDpEvent

from fedmem.dp import Accountant, AttributeLedger, DurableStore, PureDpEvent
from fedmem.errors import BudgetExceeded

LOOP_CAPS = {"a": 1e9, "b": 1e9}
RACE_CAPS = {"a": 4.0, "b": 4.0}
RACE_BUDGET = (4.0, 1e-6)


def loop(path: str) -> None:
    store = DurableStore(path)
    acc = Accountant("rdp", store=store, name="loop")
    led = AttributeLedger(LOOP_CAPS, store=store, name="loop")
    i = acc.count
    j = len(led.history())
    print("ready", flush=True)
    while True:
        acc.book(GaussianDpEvent(50.0), label=f"acc {i}")
        print(f"acc {i}", flush=True)
        i += 1
        led.book(["a", "b"] if j % 2 else ["a"], 0.5, label=f"led {j}")
        print(f"led {j}", flush=True)
        j += 1


def race(path: str, go: str, n_plain: int) -> None:
    store = DurableStore(path)
    led = AttributeLedger(RACE_CAPS, store=store, name="race")
    capped = Accountant("rdp", store=store, name="capped", budget=RACE_BUDGET)
    plain = Accountant("rdp", store=store, name="plain")
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    counts = {"ledger": 0, "capped": 0, "plain": 0}
    led_open = cap_open = True
    while led_open or cap_open or counts["plain"] < n_plain:
        if led_open:
            if led.try_charge(["a", "b"], 0.01, label=f"{os.getpid()}"):
                counts["ledger"] += 1
            else:
                led_open = False
        if cap_open:
            try:
                capped.book(PureDpEvent(0.01), label=f"{os.getpid()}")
                counts["capped"] += 1
            except BudgetExceeded:
                cap_open = False
        if counts["plain"] < n_plain:
            plain.book(GaussianDpEvent(50.0), label=f"{os.getpid()}")
            counts["plain"] += 1
        # Step off the CPU between rounds: SQLite's busy handler backs off by sleeping, so
        # without this a worker that holds the lock can take every booking in a row and
        # the two processes never actually interleave.
        time.sleep(0.0005)
    print(json.dumps(counts), flush=True)


def open_race(folder: str, n: int, broken: str) -> None:
    """For i in 0..n-1: wait until ``folder/go<i>`` exists, then open the fresh store ``folder/s<i>.sqlite``;
    prints ``opened <i>`` or ``locked <i>``. ``broken="1"``: the store's setup is not retried when
    SQLite reports the database locked (the code before the fix)."""
    if broken == "1":
        DurableStore._retry_locked = lambda self, step, timeout_s: step()
    print("ready", flush=True)
    for i in range(n):
        go = os.path.join(folder, f"go{i}")
        while not os.path.exists(go):
            time.sleep(0.0002)
        try:
            DurableStore(os.path.join(folder, f"s{i}.sqlite")).close()
            print(f"opened {i}", flush=True)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            print(f"locked {i}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "loop":
        loop(sys.argv[2])
    elif mode == "race":
        race(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "open_race":
        open_race(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
