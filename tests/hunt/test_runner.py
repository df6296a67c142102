"""The hunt flags a seeded defect and not a correct mechanism (fixed seeds, tiny budget)."""

from __future__ import annotations

import numpy as np

from fedmem.hunt import runner
from fedmem.hunt.observe import capture, flatten
from fedmem.hunt.targets import Arm


class _Target:
    """A Gaussian release of a count (booked mu = 1/sigma); ``leak`` adds the exact count to the error text."""

    name = "toy"

    def __init__(self, leak: bool):
        self.leak = leak
        self.rng = np.random.default_rng(5)

    def arms(self):
        def trial(w):
            def release():
                if self.rng.random() < 0.3:
                    raise ValueError("no memory available" + (f" (n={w})" if self.leak else ""))
                return {"value": np.array([w + 4.0 * self.rng.standard_normal()])}
            return flatten(capture(release)), {"eps": 1.0, "mu": 0.25}
        return [Arm(self.name, {"name": "count"}, {"op": "one"}, trial)]

    def close(self):
        pass


def _hunt(monkeypatch, leak: bool) -> dict:
    monkeypatch.setattr(runner, "targets_for", lambda kind, cfg, seed: [_Target(leak)])
    return runner.hunt("toy.kind", {"federation": {"delta": 1e-6}}, budget_s=3.0, seed=1, max_pairs=400)


def test_hunt_flags_the_seeded_text_leak(monkeypatch):
    res = _hunt(monkeypatch, leak=True)
    assert res["verdict"] == "LEAK"
    assert res["strongest"]["recipe"]["arm"] == "toy/count/one"


def test_hunt_does_not_flag_the_correct_release(monkeypatch):
    res = _hunt(monkeypatch, leak=False)
    assert res["verdict"] != "LEAK"
    assert res["hypotheses"] == 1
