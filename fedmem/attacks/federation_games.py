"""The attack library for games against a running :class:`~fedmem.federation.engine.Federation`.

The attack names, and what the games measure from each answer: the leak judgement of a
forwarded response against the ground truth (:func:`leak_reasons`), the booked DP events, the
reference support and selection (:func:`reference_support`, :func:`relevant_selection`), the
float low-bit hypotheses per world (:func:`float_hypotheses`, :func:`float_bits_score`), the
worst-case candidate record and the two neighbouring worlds of a membership game
(:func:`worst_case_candidate`, :func:`neighbours`), and the per-world booking a row is judged
against (:func:`booked_per_world`). Everything takes library objects (the federation config,
data, responses, ground truth, RNGs).

The scenario-driven game runners that build federations from a scenario and drive these
pieces through the public client API (``run_reconstruction``, ``run_games``,
``run_spreading``, ``run_retries``, ``game_config``) are in
:mod:`fedmem.experiments.support_leak_games`.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from fedmem.attacks import float_bits as FB

ATTACKS = ("reconstruction", "differencing", "noise_scale", "refusal_content", "admission_oracle", "timing",
           "retry_averaging", "near_duplicate", "float_bits", "principal_spreading", "retries")
GAME_ATTACKS = ("differencing", "noise_scale", "refusal_content", "admission_oracle", "timing", "retry_averaging",
                "near_duplicate", "float_bits")
VALUE_ATTACKS = ("differencing", "noise_scale")
"""Attacks that read released values: wherever one runs, ``float_bits`` runs too, on the same
trials (no extra queries): every scenario that releases floats is checked for low-bit leaks."""


def exact_mean(truth) -> np.ndarray | None:
    c = int(truth.count)
    return None if c <= 0 else np.asarray(truth.sum, dtype=np.float64) / c


def leak_reasons(resp, truth, f) -> list[str]:
    """Why a *forwarded* response leaks support beyond the accountant (papers/003 Conditions).

    Exact per-shard receipts or an exact selected count whose value depends on the data
    (also implicitly, as the exact denominator of the mean), or a value released with
    noise calibrated for an n that misses the realized one by more than the tolerance
    (global calibration). Judged from the ground truth, not from the engine's labels.
    """
    why = []
    data_dependent = getattr(resp, "selection", f.selection) != "broadcast" and f.receipts != "broadcast"
    if resp.receipts is not None and data_dependent:
        r = np.asarray(resp.receipts, dtype=np.float64)
        if np.array_equal(r, np.asarray(truth.tallies, dtype=np.float64)):
            why.append("exact receipts")
    if resp.count is not None and data_dependent and float(resp.count) == float(truth.count):
        why.append("exact count")
    if "count:implicit" in resp.channels:
        why.append("implicit exact count")
    if "value:calibration" in resp.channels:
        if int(truth.count) < f.n_bound:   # delivered multiplier sigma * n / n_bound < sigma booked
            why.append("calibration mismatch")
    return why


def leaf_events(d) -> int:
    """Number of elementary DP events in a booked event (a stored dict or a dp-accounting event)."""
    import dp_accounting

    from fedmem.dp.accountant import event_from_dict  # lazy: loads dp_accounting (~480 ms)

    ev = event_from_dict(d) if isinstance(d, dict) else d
    if isinstance(ev, dp_accounting.ComposedDpEvent):
        return sum(leaf_events(e) for e in ev.events)
    if isinstance(ev, dp_accounting.SelfComposedDpEvent):
        return int(ev.count) * leaf_events(ev.event)
    return 1


def dp_channels_expected(resp, f) -> int:
    """DP channels a released response carries: the value, plus the receipts when noised."""
    n = 1 if "value" in resp.channels else 0
    if f.receipts == "noised" and f.selection != "broadcast" and "receipts" in resp.channels:
        n += 1
    return n


def noise_std_of_n(f):
    """Public noise std of the released mean as a function of the selected count n.

    Realized calibration divides the sum's noise ``sigma * 2C`` by the realized count
    (``fedmem.federation.aggregator``), so the noise itself tracks n; under global
    calibration it does not, and the adversary gets nothing from it.
    """
    if f.calibration != "realized" or f.noise != "gaussian" or f.receipts in ("noised", "broadcast"):
        return None
    return lambda n: f.sigma * 2.0 * f.clip / max(1, n)


def is_broadcast(f) -> bool:
    return f.selection == "broadcast" or f.receipts == "broadcast"


_SHARD_MEMO = threading.local()
"""Per thread: the last query's per-shard selections, keyed by the shard's arrays (see relevant_selection)."""


def relevant_selection(data, q, f) -> tuple[int, np.ndarray | None, int]:
    """What a data-dependent threshold selection would pick for ``q`` (numpy, evaluation only).

    Each shard's local top-``k_local`` records with cosine >= ``threshold``. Returns
    ``(shards holding one, mean of their values or None, record count)``. Under broadcast this is
    the support the adversary is after and the mean the agent actually wants (the
    broadcast mean also averages irrelevant records and zero dummies).

    A membership game asks this for the same query in two worlds that share every shard's
    arrays but one (``fedmem.bench.shards.with_record``), so each shard's selection for the last
    query is kept, keyed by the shard's own key and value arrays (identity, checked), and reused:
    the second world computes one shard (the same numbers: each shard's part is computed as
    before and summed in the same order; tested)."""
    qn = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    memo_key = (qn.tobytes(), int(f.k_local), float(f.threshold))
    if getattr(_SHARD_MEMO, "key", None) != memo_key:
        _SHARD_MEMO.key, _SHARD_MEMO.per = memo_key, {}
    per = _SHARD_MEMO.per
    shards, total, count = 0, np.zeros(data.value_dim), 0
    for k, v in zip(data.keys, data.values):
        got = per.get((id(k), id(v)))
        if got is None or got[0] is not k or got[1] is not v:
            sc = k @ qn
            top = np.argsort(-sc, kind="stable")[: f.k_local]
            sel = top[sc[top] >= f.threshold]
            got = per[(id(k), id(v))] = (k, v, int(sel.size), v[sel].sum(axis=0) if sel.size else None)
        if got[2]:
            shards += 1
            total += got[3]
            count += got[2]
    return shards, (total / count if count else None), count


def reference_support(data, q, f, truth) -> int:
    """The support the adversary is after: how many shards hold memories relevant to ``q``.

    For threshold and top-k selection this is the engine's contributing set
    (``Truth.contributing``). Under broadcast every shard "contributes" by construction,
    so the target is what a data-dependent threshold selection would have revealed
    (:func:`relevant_selection`).
    """
    from fedmem.attacks.support import true_cardinality  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    if not is_broadcast(f):
        return true_cardinality(truth)
    return relevant_selection(data, q, f)[0]


# ------------------------------------------------------------------ float low bits
def float_hypotheses(feds: dict, truths: dict):
    """The adversary's hypothesis per world for a primary-route release: the world's policy
    (public configuration: noise, sampling, calibration, denominator), the denominator it
    applies, and the sum it selects. The adversary knows both neighbouring datasets in the DP
    game, so it computes both sums offline; ``ground_truth`` is that computation, with the
    parties' fixed-point encoding. Returns ``bad(resp, world)``: the coordinates of
    ``resp.value`` (and of noised receipts) that ``world`` cannot have produced."""

    def scale_of(pol, mech):
        return mech.sigma if pol.noise == "gaussian" else mech.scale

    def bad(resp, w) -> int:
        pol, truth = feds[w].policy, truths[w]
        kind = pol.denominator_kind
        if kind == "public":
            d = float(pol.public_count)
        elif kind == "noised":
            d = max(1.0, float(resp.count))
        else:
            d = float(max(1, int(truth.count)))
        v = np.asarray(resp.value, dtype=np.float64)
        total = np.asarray(truth.sum, dtype=np.float64)
        extra = 0
        if pol.receipts == "noised" and resp.receipts is not None and truth.tallies is not None:
            # noised receipts are floats too: fl(tally + Z) per shard
            rm = pol.receipt_mechanism()
            extra = int(np.sum(~FB.consistent(np.asarray(resp.receipts, dtype=np.float64),
                                              np.asarray(truth.tallies, dtype=np.float64), 1.0,
                                              FB.model_for(pol.noise, pol.sampling, scale_of(pol, rm)))))
        if pol.calibration == "realized":
            model = FB.model_for(pol.noise, pol.sampling, scale_of(pol, pol._mechanism(pol.sigma)))
            return extra + int(np.sum(~FB.consistent(v, total, d, model)))
        eff = pol._mechanism(pol.sigma * d / pol.n_bound, d)
        model = FB.model_for(pol.noise, pol.sampling, scale_of(pol, eff))
        return extra + int(np.sum(~FB.consistent(v, total / d, 1.0, model)))

    return bad


def float_bits_score(obs, bad, primary_selection: str) -> float:
    """``#coords inconsistent with the world without the target - #coords inconsistent with the
    world with it`` for one trial; 0 for a refusal or an answer from another route (its sum is
    not the primary selection's)."""
    if not obs.answered or getattr(obs.response, "selection", primary_selection) != primary_selection:
        return 0.0
    return float(bad(obs.response, "without") - bad(obs.response, "with"))


# ------------------------------------------------- membership games over every observable
def worst_case_candidate(data, rng, f):
    """The auditor's candidate record: worst case, as privacy audits choose their neighbours.

    A key near one of the rarest topics (fewest holding shards: the smallest contributing
    sets, where global calibration is most wrong), placed on a shard that holds no
    record of that topic (so its presence changes that shard's receipt), with a random
    value of norm ``clip``. Returns ``(shard, key, value, topic)``.
    """
    n_topics = len(data.centers)
    if data.topics is not None:
        holders = np.array([[c in set(t.tolist()) for c in range(n_topics)] for t in data.topics])
        prevalence = holders.sum(axis=0)
        rare = np.argsort(prevalence, kind="stable")[: max(1, n_topics // 4)]
        c = int(rare[rng.integers(0, rare.size)])
        free = np.flatnonzero(~holders[:, c])
        shard = int(free[rng.integers(0, free.size)]) if free.size else int(rng.integers(0, f.shards))
    else:
        c, shard = int(rng.integers(0, n_topics)), int(rng.integers(0, f.shards))
    key = data.centers[c] + 0.1 * rng.standard_normal(f.key_dim) / math.sqrt(f.key_dim)
    key /= np.linalg.norm(key)
    v = rng.standard_normal(f.value_dim)
    v *= f.clip / np.linalg.norm(v)
    return shard, key, v, c


NEIGHBOURS = ("replace-one", "add-remove")


def neighbours(data, shard: int, key, value, relation: str, rng) -> dict:
    """The two worlds of a membership game. ``"replace-one"`` (the default): the world without
    the target holds, in the same slot of the same shard, a filler record whose key is
    orthogonal to the target's (so it is not what the query selects) and whose value is the
    target's negated; every shard size is the same in both worlds. Shard sizes are a declared
    public parameter of the scenario (they decide, e.g., whether top-k has ``k`` candidates and
    so whether it answers with a public denominator), and the value channel is calibrated to
    the replace-one sensitivity ``2 clip`` already. ``"add-remove"``: the world without is the
    dataset without the record; shard sizes then differ between the worlds, and any decision
    taken from them is a channel the games measure (judged against each world's booking)."""
    from fedmem.bench.shards import with_record  # lazy: ~51 ms, no heavy package

    if relation not in NEIGHBOURS:
        raise ValueError(f"relation must be one of {NEIGHBOURS}. Found {relation!r}.")
    world_with = with_record(data, shard, key, value)
    if relation == "add-remove":
        return {"with": world_with, "without": data}
    k = np.asarray(key, dtype=np.float64)
    k = k / np.linalg.norm(k)
    filler = rng.standard_normal(k.size)
    filler -= (filler @ k) * k
    filler /= np.linalg.norm(filler)
    return {"with": world_with, "without": with_record(data, shard, filler, -np.asarray(value, dtype=np.float64))}


def booked_per_world(g: dict) -> tuple[float, float, float]:
    """``(booked in the world with the target, booked without it, the epsilon the row is judged
    against)``. Per world, the most one trial booked. The row is judged against the smaller of
    the two: a distinguishing test bounds the privacy loss between the two worlds' views, and
    what the world with the smaller booking claimed about its view is what the test refutes.
    (Judging against ``max`` over both worlds let a world that booked 0 borrow the other's
    booking.) With bookings decided from public facts both worlds book the same."""
    bp = float(max(g.get("booked_pos") or [0.0]))
    bn = float(max(g.get("booked_neg") or [0.0]))
    return bp, bn, min(bp, bn)


def booked_mu_per_world(g: dict) -> float | None:
    """The exact GDP ``mu`` a row is judged against when every trial of both worlds booked Gaussian
    events only (else ``None``): per world the most one trial booked, and the smaller of the two
    worlds, as :func:`booked_per_world` does for epsilon."""
    mp, mn = g.get("mu_pos") or [], g.get("mu_neg") or []
    if not mp or not mn or any(m is None for m in mp + mn):
        return None
    return float(min(max(mp), max(mn)))


def has_support_event(resp) -> bool:
    """The response's booked event has a support part besides the value (aggregator plan order)."""
    from fedmem.attacks.observable import support_events  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    return bool(support_events(resp))
