"""The hunt: declare every hypothesis, spend the time budget where the bound grows, judge once.

1. The scenario's targets (:mod:`fedmem.hunt.targets`) list their arms (worlds x query
   sequences). Their number ``H`` is fixed here, before any trial: every final test runs at
   ``alpha / (3 H)`` (:mod:`fedmem.hunt.distinguish`).
2. Warm-up: every arm plays ``warm`` trial pairs (world 0 then world 1, interleaved, so drift
   hits both alike); pair ``i`` goes to the train split when ``i`` is even, else to the test split.
3. Search: :class:`~fedmem.hunt.bandit.UCB` picks the next arm from train-split progress; it
   plays a batch; until 85% of the budget is spent (the rest judges).
4. Judge: per arm, a classifier trained on its train split scores its test split; the shared
   verdict rule labels it against the largest epsilon (and, when Gaussian, the largest ``mu``)
   the system booked for any one of its trials. The hunt's verdict is LEAK if any arm is,
   else ``fedmem.attacks.verdict.worst`` of the arms (within booked only when every
   hypothesis had the power to see a leak of the booked size).
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedmem.attacks.audit import epsilon_lower_bound, roc_auc
from fedmem.attacks.verdict import LEAK, NO_LEAK_SEEN, WITHIN, worst
from fedmem.hunt import distinguish, recipe as R
from fedmem.hunt.bandit import UCB
from fedmem.hunt.observe import precompute
from fedmem.hunt.targets import targets_for

VERDICTS = (LEAK, WITHIN, NO_LEAK_SEEN)


class _Data:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.train = ([], [])
        self.test = ([], [])
        self.eps: list[float] = []
        self.mu: list = []
        self.pairs = 0
        self.errors: list[str] = []
        self.seconds = 0.0

    def booked(self, delta: float) -> dict:
        eps = max(self.eps) if self.eps else 0.0
        mu = None if (not self.mu or any(m is None for m in self.mu)) else max(self.mu)
        return {"eps": float(eps), "delta": float(delta), "mu": mu}


def _play(arm, d: _Data, pairs: int) -> None:
    """``pairs`` trial pairs; each pair's split and its worlds' order are drawn at random (a fixed
    alternation can line up with a periodic effect, e.g. a noise pool refilling every k draws)."""
    t0 = time.perf_counter()
    for _ in range(pairs):
        split = d.train if d.rng.random() < 0.5 else d.test
        for w in ((0, 1) if d.rng.random() < 0.5 else (1, 0)):
            leaves, booked = arm.trial(w)
            split[w].append(precompute(leaves))
            d.eps.append(float(booked["eps"]))
            d.mu.append(booked["mu"])
        d.pairs += 1
    d.seconds += time.perf_counter() - t0


def _threshold(s0: np.ndarray, s1: np.ndarray, delta: float) -> float | None:
    if s0.size < 2 or s1.size < 2:
        return None
    ts = np.unique(np.quantile(np.r_[s0, s1], np.linspace(0, 1, 64), method="lower"))
    best, be = None, -1.0
    for t in ts:
        e = epsilon_lower_bound(int(np.sum(s1 >= t)), s1.size, int(np.sum(s0 >= t)), s0.size, delta=delta)
        if e > be:
            best, be = float(t), e
    return best


def hunt(kind: str, cfg: dict, *, budget_s: float, seed: int = 0, alpha: float = 0.05, scenario_ref: dict | None = None,
         progress=None, warm: int = 16, batch: int = 48, max_pairs: int = 4000) -> dict:
    """Run the hunt on a scenario's configuration (module docstring); returns results.json's dict."""
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    delta = float(cfg.get("federation", {}).get("delta", 1e-6))
    targets = targets_for(kind, cfg, seed)
    arms = [a for t in targets for a in t.arms()]
    H = len(arms)
    a_each = alpha / (3 * H)
    say(f"hunt: {H} hypotheses ({', '.join(sorted({a.target for a in arms}))}); each tested at alpha {a_each:.2g}")
    data = [_Data(seed * 1000 + i) for i in range(H)]
    ucb = UCB(H)
    deadline = t_start + 0.85 * float(budget_s)
    try:
        for i, arm in enumerate(arms):
            try:
                _play(arm, data[i], warm)
            except Exception as exc:  # noqa: BLE001 - a harness failure of one arm must not end the hunt
                data[i].errors.append(f"{type(exc).__name__}: {exc}"[:300])
                ucb.done[i] = True
        while time.perf_counter() < deadline:
            i = ucb.choose()
            if i is None:
                break
            d = data[i]
            try:
                _play(arms[i], d, batch)
            except Exception as exc:  # noqa: BLE001
                d.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                ucb.done[i] = True
                continue
            auc = distinguish.quick_auc(d.train[0], d.train[1], seed)
            ucb.update(i, 2 * (auc - 0.5))
            if d.pairs >= max_pairs or (auc >= 0.999 and d.pairs >= 200):   # separated: more trials add little
                ucb.done[i] = True
            say(f"hunt: {time.perf_counter() - t_start:5.1f}s {arms[i].name}: {d.pairs} pairs, train AUC {auc:.3f}")
        rows, best_row = [], None
        for i, arm in enumerate(arms):
            d = data[i]
            row = {"arm": arm.name, "target": arm.target, "world": arm.world, "strategy": arm.strategy,
                   "pairs": d.pairs, "seconds": round(d.seconds, 3), "errors": d.errors}
            if len(d.test[0]) < 2 or len(d.train[0]) < 8:
                row.update(verdict={"label": NO_LEAK_SEEN, "text": "no leak seen (too few trials)"},
                           booked=d.booked(delta))
                rows.append(row)
                continue
            feat, model, best = distinguish.fit(d.train[0], d.train[1], seed)
            s0, s1 = distinguish.best_scores(feat, model, best, d.test[0]), distinguish.best_scores(feat, model, best, d.test[1])
            booked = d.booked(delta)
            v = distinguish.verdict(s1, s0, booked, a_each, seed)
            tr0 = distinguish.single_scores(feat, best, d.train[0])
            tr1 = distinguish.single_scores(feat, best, d.train[1])
            thr = _threshold(tr0, tr1, delta)
            rec = R.make(scenario_ref or {"kind": kind}, arm, d.pairs, best, thr, seed)
            fixed = R.threshold_test(rec, feat, d.test[0], d.test[1], booked, a_each)
            row.update(verdict=v.as_dict(), booked=booked, test_auc=float(roc_auc(s1, s0)),
                       trials_per_world=len(d.train[0]) + len(d.test[0]), recipe=rec,
                       feature_test=None if fixed is None else fixed.as_dict(),
                       roc_scores={"pos": s1.tolist(), "neg": s0.tolist()})
            rows.append(row)
            strength = _strength(row)
            if best_row is None or strength > _strength(best_row):
                best_row = row
    finally:
        for t in targets:
            t.close()
    labels = [r["verdict"] for r in rows]
    overall = LEAK if any(v.get("label") == LEAK for v in labels) else worst(labels)
    power = {"eps_power_min": min((r["verdict"].get("power", 0.0) for r in rows if "power" in r["verdict"]),
                                  default=0.0),
             "mu_power_min": min((r["verdict"].get("mu_power") or 0.0 for r in rows if "power" in r["verdict"]),
                                 default=0.0)}
    strongest = None
    if best_row is not None:
        strongest = {k: best_row[k] for k in ("arm", "verdict", "booked", "test_auc", "recipe", "feature_test")}
    for r in rows:
        r.pop("roc_scores", None) if r is not best_row else None
    return {"verdict": overall, "kind": kind, "seed": seed, "budget_s": budget_s, "alpha": alpha,
            "hypotheses": H, "alpha_each": a_each, "seconds": round(time.perf_counter() - t_start, 2),
            "power": power, "strongest": strongest, "hypotheses_tried": rows,
            "roc": None if best_row is None else best_row.get("roc_scores")}


def _strength(row: dict) -> float:
    v = row.get("verdict", {})
    if "eps_lower" not in v:
        return -1.0
    s = (2.0 if v.get("label") == LEAK else 0.0)
    b = row["booked"]
    ratio = v["eps_lower"] / b["eps"] if b["eps"] > 0 else (10.0 if v["eps_lower"] > 0 else 0.0)
    if v.get("mu_lower") is not None and b.get("mu"):
        ratio = max(ratio, v["mu_lower"] / b["mu"])
    return s + min(ratio, 10.0) + 0.01 * row.get("test_auc", 0.5)


def replay(results: dict, cfg_loader, *, pairs: int | None = None, alpha: float = 0.05, progress=None) -> dict:
    """Re-run the strongest recipe of ``results`` (module :mod:`fedmem.hunt.recipe`)."""
    say = progress or (lambda msg: None)
    st = results.get("strongest") or {}
    rec = st.get("recipe")
    if not rec:
        raise ValueError("results must hold a strongest recipe (results['strongest']['recipe']). Found none.")
    kind, cfg = cfg_loader(rec["scenario"])
    seed = int(results.get("seed", 0))
    targets = targets_for(kind, cfg, seed)
    try:
        arms = {a.name: a for t in targets for a in t.arms()}
        if rec["arm"] not in arms:
            raise ValueError(f"recipe arm must be one this scenario has. Found {rec['arm']!r}.")
        arm = arms[rec["arm"]]
        d = _Data(seed + 99)
        n = int(pairs or rec["trials_per_world"])
        say(f"replay: {arm.name}, {n} trial pairs")
        _play(arm, d, n)
        delta = float(cfg.get("federation", {}).get("delta", 1e-6))
        booked = d.booked(delta)
        feat, model, best = distinguish.fit(d.train[0], d.train[1], seed)
        s0, s1 = distinguish.best_scores(feat, model, best, d.test[0]), distinguish.best_scores(feat, model, best, d.test[1])
        v = distinguish.verdict(s1, s0, booked, alpha, seed)
        fixed = R.threshold_test(rec, feat, d.train[0] + d.test[0], d.train[1] + d.test[1], booked, alpha)
    finally:
        for t in targets:
            t.close()
    return {"verdict": v.label, "replay_of": rec["arm"], "pairs": d.pairs, "booked": booked,
            "classifier_verdict": v.as_dict(), "feature_test": None if fixed is None else fixed.as_dict(),
            "test_auc": float(roc_auc(s1, s0)) if len(s0) > 1 else math.nan, "recipe": rec}
