"""Agent test doubles (and the lost-charge check) shared by agent/test_actors.py (Ray-actor agents)
and agent/test_isolated.py (isolated agent processes). A module of its own, beside the tests, so that both the Ray workers
and the isolated agents' zygote import the classes by name, as they import the test modules."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fedmem.agent.client import AgentClient


class SlowAfterRelease(AgentClient):
    """Correct agent; after task 1's context reached the external model it signals (a
    ``.released`` file beside its ledger) and stalls, so the test can kill it there, mid-task,
    before the step returns."""

    def _dpmind(self, task):
        out = super()._dpmind(task)
        if task.index == 1:
            # written whole, then renamed: the test waits for the name to appear and kills this agent at
            # once, so a file created empty and then written could be read before its text (seen once)
            flag = Path(self.ledger.store.path).with_suffix(".released")
            tmp = flag.with_suffix(".released-tmp")
            tmp.write_text(str(len(self.dpmind_sent)))
            os.replace(tmp, flag)
            time.sleep(60)
        return out


class LateBooking(SlowAfterRelease):
    """Broken: books the DP-MIND charge only after the context was sent."""

    def _book_dpmind(self, task):
        return f"task={task.index} ctx={len(self.dpmind_sent)}"

    def _dpmind(self, task):
        out = super()._dpmind(task)
        AgentClient._book_dpmind(self, task)
        return out


def lost_charges(ledger, released_contexts: int, released_feds: int) -> list[str]:
    """What left (contexts the external model got, admitted federation releases) but is not on disk."""
    s = ledger.summary()
    problems = []
    if s["dpmind"]["contexts"] < released_contexts:
        problems.append(f"dpmind: {released_contexts} contexts released, {s['dpmind']['contexts']} on disk")
    if s["federation"]["releases"] < released_feds:
        problems.append(f"federation: {released_feds} releases, {s['federation']['releases']} on disk")
    return problems


# ---- hostile agents (issue 38): attack the sandbox itself
class DaemonForker(AgentClient):
    """Forks 20 ``setsid`` daemons at its first step (they sleep, hoping to outlive the session)."""

    def step(self, task):
        if task.index == 0:
            for _ in range(20):
                if os.fork() == 0:
                    try:
                        os.setsid()
                        if os.fork() == 0:
                            time.sleep(600)
                    finally:
                        os._exit(0)
        return super().step(task)


class NoneResult(AgentClient):
    """Its step returns ``None`` (a malformed result)."""

    def step(self, task):
        super().step(task)
        return None


class LedgerTamper(AgentClient):
    """Writes a charge row into its own ledger outside any step (when asked for its spend)."""

    def spend(self):
        _raw_insert(self.ledger.store.path, self.user)
        return super().spend()


def _raw_insert(path, user):
    import sqlite3

    con = sqlite3.connect(str(path))
    con.execute("INSERT INTO ledger_charges (ledger, attrs, epsilon, label, ts) VALUES (?,?,?,?,?)",
                (f"agent/{user}/memview", "[]", 0.0, "forged", 0.0))
    con.commit()
    con.close()


class FrameFlood(AgentClient):
    """Announces a 64 MiB frame on its own connection and sends 4 MiB of it, then stalls."""

    def step(self, task):
        import socket
        import struct

        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    s = socket.socket(fileno=os.dup(int(fd)))
                    s.sendall(struct.pack(">I", 64 << 20) + b"\0" * (4 << 20))
            except OSError:
                continue
        time.sleep(30)
        return super().step(task)
