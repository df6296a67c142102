"""Where the time budget goes: UCB1 over the hypotheses (arms), on the train split only.

Each arm's reward is the search's progress signal (:func:`fedmem.hunt.distinguish.quick_auc`,
a classifier's AUC within the train split, folded to ``[0.5, 1]`` and mapped to ``[0, 1]``):
the arms whose distinguisher improves get the next batches, so the held-out lower bound
grows where it can. The test split is never read by the search, so the final tests stay valid
whatever the bandit did (trials are independent; the sample sizes depend on train data only).
"""

from __future__ import annotations

import math


class UCB:
    def __init__(self, n_arms: int, c: float = 0.35):
        self.n = [0] * n_arms
        self.reward = [0.0] * n_arms
        self.c = float(c)
        self.done = [False] * n_arms

    def update(self, arm: int, reward: float) -> None:
        self.n[arm] += 1
        self.reward[arm] = float(reward)      # the latest signal (it improves with data, it is not a mean)

    def choose(self) -> int | None:
        live = [i for i in range(len(self.n)) if not self.done[i]]
        if not live:
            return None
        for i in live:
            if self.n[i] == 0:
                return i
        t = sum(self.n) + 1
        return max(live, key=lambda i: self.reward[i] + self.c * math.sqrt(math.log(t) / self.n[i]))
