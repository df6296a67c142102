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
