"""The strongest attack as a replayable recipe, and its replay.

A recipe names everything needed to play the attack again without the search: the scenario
(path, overrides, seed), the target and arm (worlds and query sequence, JSON), the number of
trials per world, the classifier (scikit-learn ``HistGradientBoostingClassifier`` and its seed)
and the best single feature with its direction and threshold (the readable form of the
attack: ``feature * direction >= threshold`` says "world 1"). :func:`replay` rebuilds the
system, plays the arm afresh (new trials), retrains on a fresh train split and judges the
fresh test split by the shared rule at ``alpha`` (one pre-registered hypothesis: no
multiple-comparison correction), and also the fixed single-feature threshold test
(:func:`fedmem.attacks.verdict.judge_counts`) on the whole fresh sample.
"""

from __future__ import annotations

import numpy as np

from fedmem.attacks.verdict import judge_counts


def make(scenario: dict, arm, n_per_world: int, best, threshold: float | None, seed: int) -> dict:
    name, sign, auc = best
    return {"scenario": scenario, "target": arm.target, "arm": arm.name, "world": arm.world,
            "strategy": arm.strategy, "trials_per_world": int(n_per_world),
            "classifier": {"kind": "sklearn.ensemble.HistGradientBoostingClassifier", "seed": int(seed)},
            "feature": name, "direction": float(sign), "threshold": threshold, "train_auc_feature": float(auc)}


def threshold_test(recipe: dict, feat, leaves0: list, leaves1: list, booked: dict, alpha: float):
    """The recipe's fixed single-feature test on a sample (the judge_counts verdict), or None."""
    from fedmem.hunt.distinguish import single_scores

    if recipe.get("feature") is None or recipe.get("threshold") is None or recipe["feature"] not in feat.names:
        return None
    best = (recipe["feature"], recipe["direction"], 0.0)
    s0, s1 = single_scores(feat, best, leaves0), single_scores(feat, best, leaves1)
    t = recipe["threshold"]
    return judge_counts(int(np.sum(s1 >= t)), len(s1), int(np.sum(s0 >= t)), len(s0),
                        booked["eps"], booked["delta"], alpha=alpha)
