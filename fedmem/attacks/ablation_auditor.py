"""The ablation-aware auditor of DP-MemView Table 4 (papers/000; docs/memview.md, "Ablation-aware
auditor"): the exact EM log-likelihood ratio of the selections an ablation releases past the
target's pathwise cap. Scored per attribute by :func:`fedmem.attacks.memview_auditor.score_audit`."""

from __future__ import annotations

from typing import Sequence


def extra_selection_llr(policy, target: str, queries: Sequence, released: Sequence, fallbacks: Sequence,
                        items_m: Sequence[str], items_n: Sequence[str], scorer, *, eps: float,
                        cap: float) -> list[float]:
    """Per turn, the exact log-likelihood ratio ``log P_M(v) / P_M'(v)`` of the views released
    *past the target's pathwise cap*, 0 for every other turn.

    The auditor knows the ablation and the neighbouring pair (as in tight auditing): it
    replays, from public data only (each turn's read set, the charge set ``Gamma*`` it
    meets, the observable fallback control and the public per-selection ``eps``), the
    complete-charging cost of ``target``. A released EM selection whose read set meets
    ``I_target`` adds ``eps``; once that cost exceeds ``cap`` the selection is one the
    compliant ledger would never have admitted: IncompleteCharge reaches it through
    selections whose charge of the target was omitted (C2), NoCap through the missing
    cap check (C5). Only these selections carry the *extra* leakage; on them the
    Neyman-Pearson optimal statistic is the exact EM log-ratio, computed from the scorer's
    utilities on the read-set items of ``M`` and of ``M'`` (``items_m`` / ``items_n``).
    The compliant interface never releases such a selection, so every score is 0 there
    unless its ledger is broken; that is what the auditor tests.

    ``released[t]``: (slot, view) pairs of turn t; ``fallbacks[t]``: the turn's control.
    """
    from fractions import Fraction

    from fedmem.dp import ExponentialMechanism  # lazy: loads dp_accounting, numpy (~510 ms)

    if target not in policy.groups:
        raise ValueError(f"target must be a protected attribute of the policy {list(policy.groups)}. "
                         f"Found {target!r}.")
    if not eps > 0:
        raise ValueError(f"eps must be positive. Found {eps!r}.")
    if not cap > 0:
        raise ValueError(f"cap must be positive. Found {cap!r}.")
    if len(fallbacks) != len(released) or len(released) > len(queries):
        raise ValueError(f"released and fallbacks must have one entry per turn (at most {len(queries)}). "
                         f"Found {len(released)} and {len(fallbacks)}.")
    em = ExponentialMechanism(eps, scorer.sensitivity)
    cost, limit, step = Fraction(0), Fraction(cap), Fraction(eps)
    out = []
    for q, views, fb in zip(queries, released, fallbacks):
        llr = 0.0
        for slot, name in views:
            reads = policy.read_set(q, slot)
            if target not in policy.charge_set(reads) or fb:
                continue  # cannot depend on I_target (Lemma 1), or the generic fallback (no selection)
            cost += step
            if cost <= limit:
                continue  # within the pathwise cap: booked leakage, the compliant interface releases it too
            voc = policy.vocabularies[slot]
            k = voc.index(name)
            lp = [em.log_probabilities(scorer.scores(policy, q, slot, tuple(items[p] for p in reads),
                                                     vocabulary=voc))[k] for items in (items_m, items_n)]
            llr += float(lp[0] - lp[1])
        out.append(llr)
    return out
