"""Query-sequence strategies: a small grammar, interpreted by each target.

A strategy is a JSON-able dict ``{"op": ..., parameters}``; :func:`steps` expands it into
steps ``{"p": principal index, "q": "target" | "near", "retry": bool}``:

* ``one``: one query of the worlds' query by a fresh principal;
* ``repeat r``: the same query ``r`` times by one principal (undeclared re-asks);
* ``retry r``: the query, then ``r - 1`` declared retries of it (``retry_of``);
* ``near r``: ``r`` near-duplicates of the query (``radius`` radians) by one principal;
* ``spread k``: the query once by each of ``k`` fresh principals (a Sybil spreading its spend);
* ``interleave``: two principals alternating the query and a near-duplicate;
* ``exhaust``: one principal asking until refused (at most ``r`` asks; the budget state it sees).

:func:`sequence_leaves` flattens what a whole sequence showed: each step's leaves under
``s<i>.``, plus, for every numeric leaf present at every step, its mean over the steps (what an
averaging adversary computes) and the count of answered steps.
"""

from __future__ import annotations

import numpy as np

from fedmem.hunt.observe import flatten

ENGINE_STRATEGIES = ({"op": "one"}, {"op": "retry", "r": 4})
"""The default sequences (every op of the grammar is available to a target; these fit a 30-60 s budget)."""
LEDGER_STRATEGIES = ({"op": "retry", "r": 2},)
ALL_OPS = ("one", "repeat", "retry", "near", "spread", "interleave", "exhaust", "round")


def name_of(st: dict) -> str:
    rest = ",".join(f"{k}={v}" for k, v in sorted(st.items()) if k != "op")
    return st["op"] + (f"({rest})" if rest else "")


def steps(st: dict) -> list[dict]:
    op, r = st["op"], int(st.get("r", 1))
    if op == "one":
        return [{"p": 0, "q": "target"}]
    if op == "repeat":
        return [{"p": 0, "q": "target"}] * r
    if op == "retry":
        return [{"p": 0, "q": "target"}] + [{"p": 0, "q": "target", "retry": True}] * (r - 1)
    if op == "near":
        return [{"p": 0, "q": "near"}] * r
    if op == "spread":
        return [{"p": i, "q": "target"} for i in range(int(st.get("k", 3)))]
    if op == "interleave":
        return [{"p": 0, "q": "target"}, {"p": 1, "q": "near"}] * 2
    if op == "exhaust":
        return [{"p": 0, "q": "target"}] * r
    raise ValueError(f"strategy op must be one of {ALL_OPS}. Found {op!r}.")


def sequence_leaves(seq: list[dict]) -> dict:
    out: dict = {}
    per = [flatten(o) for o in seq]
    for i, lv in enumerate(per):
        for k, v in lv.items():
            out[f"s{i}.{k}"] = v
    out["answered"] = sum(1 for o in seq if o.get("ok"))
    out["steps"] = len(seq)
    if len(per) > 1:
        common = set(per[0])
        for lv in per[1:]:
            common &= set(lv)
        for k in sorted(common):
            vals = [lv[k] for lv in per]
            if all(isinstance(v, np.ndarray) and v.dtype.kind in "biuf" for v in vals) and \
                    len({v.shape for v in vals}) == 1:
                out[f"mean.{k}"] = np.mean(np.stack([v.astype(np.float64) for v in vals]), axis=0)
            elif all(isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) for v in vals):
                out[f"mean.{k}"] = float(np.mean(vals))
    return out
