"""``check_bookings``: per boundary, what an agent's taps saw leave against what it booked.

The tests run it on a correct agent and on broken ones (clean context to the external
model, a BRACE recall without booking, an under-booked DP-MIND epsilon).
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.agent.config import BOUNDARIES


def check_bookings(agent, tasks: Sequence, *, rng: np.random.Generator,
                   dpmind_alpha: float = 1e-6, dpmind_stat_contexts: int | None = None) -> dict[str, list[str]]:
    """Per boundary, problems found comparing what left (taps) with what was booked, for an
    :class:`~fedmem.agent.client.AgentClient` ``agent`` and its tasks (:class:`~fedmem.agent.client.Task`).

    * federation: every response the agent received has a booking in the principal's
      accountant with its query id and exactly its event; no response without one.
    * memview: the ledger's per-attribute spend equals what the released, non-fallback
      views cost under the public policy (eps = B_a/K on every attribute whose group
      meets the read set); every message the app got carries only released views.
    * brace: one ``ApproxDpEvent(eps, delta)`` booking per released recall.
    * dpmind: one booking per context sent, with the perturber's epsilon; every chunk in
      the external transcript is one of the booked contexts' chunks; and the sent chunks
      are statistically consistent with the booked epsilon: the fraction of tokens left
      unchanged must not exceed a one-sided binomial upper bound (level ``dpmind_alpha``)
      of the fraction the booked mechanism leaves unchanged on the same clean text
      (re-sampled here with ``rng``). A clean context (fraction 1) or noise for a larger
      epsilon than booked fails this. ``dpmind_stat_contexts``: run the statistical part on
      that many contexts drawn with ``rng`` (None: all); the counting checks always cover all.
    """
    from fractions import Fraction

    from scipy import stats

    problems: dict[str, list[str]] = {b: [] for b in BOUNDARIES}
    led = agent.ledger
    # ---- federation
    booked = led.federation_bookings()
    by_q = {}
    for ev, lbl in booked:
        qid = lbl.split(" ", 1)[0]
        by_q[qid] = ev
    for r in agent.federation_seen:
        ev = by_q.get(f"q{r['query_id']}")
        if ev is None:
            problems["federation"].append(f"response q{r['query_id']} left without a booking")
        elif r["event"] is not None and json.dumps(ev, sort_keys=True) != json.dumps(r["event"], sort_keys=True):
            problems["federation"].append(f"response q{r['query_id']} booked {ev} but released {r['event']}")
    if len(booked) != len(agent.federation_seen):
        problems["federation"].append(f"{len(booked)} bookings for {len(agent.federation_seen)} responses")
    # ---- memview
    pol = agent.memview.policy
    expected = {a: Fraction(0) for a in pol.attributes}
    released_views = set()
    for rel in agent.memview_released:
        for s in rel.slots:
            released_views.add((rel.turn, s.slot, s.view))
            gamma = pol.charge_set(pol.read_set(rel.query, s.slot))
            if gamma and not s.fallback:
                eps = Fraction(agent.memview.epsilon_for(gamma))
                for a in gamma:
                    expected[a] += eps
    spent = led.memview_ledger().spent()
    for a in pol.attributes:
        if abs(spent[a] - float(expected[a])) > 1e-12:
            problems["memview"].append(f"attribute {a}: booked {spent[a]} but released views cost {float(expected[a])}")
    n_views = sum(len(r.slots) for r in agent.memview_released)
    app_view_lines = sum(1 for msgs in agent.app.messages for line in msgs[-1]["content"].splitlines()
                         if line.startswith("View["))
    if app_view_lines > n_views:
        problems["memview"].append(f"the app received {app_view_lines} view lines for {n_views} released views")
    if len(agent.app.messages) != len(agent.memview_released):
        problems["memview"].append(f"{len(agent.app.messages)} app messages for {len(agent.memview_released)} "
                                   f"interface releases")
    # ---- brace
    hist = led.brace.history
    want = agent.brace_params.event()
    from fedmem.dp.accountant import event_to_dict  # lazy: loads dp_accounting (~300 ms)

    if len(hist) != len(agent.brace_released):
        problems["brace"].append(f"{len(hist)} bookings for {len(agent.brace_released)} released recalls")
    for b in hist:
        if json.dumps(b.event, sort_keys=True) != json.dumps(event_to_dict(want), sort_keys=True):
            problems["brace"].append(f"booking {b.id} is {b.event}, recall releases {event_to_dict(want)}")
    # ---- dpmind
    charges = led.dpmind.history()
    labels = {c.label: c.epsilon for c in charges}
    sent_chunks: set[str] = set()
    for s in agent.dpmind_sent:
        eps = labels.get(s["booking"])
        if eps is None:
            problems["dpmind"].append(f"context {s['context']} sent without a booking")
        elif eps != agent._perturber.epsilon:
            problems["dpmind"].append(f"context {s['context']} booked eps={eps}, perturbed at {agent._perturber.epsilon}")
        sent_chunks.update(s["chunks"])
    if len(charges) != len(agent.dpmind_sent):
        problems["dpmind"].append(f"{len(charges)} bookings for {len(agent.dpmind_sent)} contexts sent")
    n_chunks = sum(len(s["chunks"]) for s in agent.dpmind_sent)
    carrying = sum(1 for msgs in agent.external.messages if any(c in msgs[-1]["content"] for c in sent_chunks))
    if carrying < n_chunks:
        problems["dpmind"].append(f"{carrying} external prompts carry a booked chunk, {n_chunks} chunks were sent")
    # statistical: what left vs. the booked mechanism on the same clean text (same pipeline)
    from fedmem.agent.dpmind import DPMindClient, TokenPerturber  # lazy: loads dp_accounting (~670 ms)
    from fedmem.dp import MetricLaplace  # lazy: loads dp_accounting (~210 ms)

    by_task = {t.index: t for t in tasks}
    same = same_ref = total = 0
    codec = agent._codec
    stat = list(agent.dpmind_sent)
    if dpmind_stat_contexts is not None:
        V.positive_int("dpmind_stat_contexts", dpmind_stat_contexts)
        if len(stat) > dpmind_stat_contexts:
            pick = sorted(rng.choice(len(stat), size=dpmind_stat_contexts, replace=False).tolist())
            stat = [stat[i] for i in pick]
    for s in stat:
        t = by_task.get(s["task"])
        if t is None:
            problems["dpmind"].append(f"context {s['context']}: task {s['task']} not given to the check")
            continue
        eps = labels.get(s["booking"], agent._perturber.epsilon)
        ref = DPMindClient(TokenPerturber(MetricLaplace(float(eps), agent._perturber.table.dim),
                                          agent._perturber.table, agent._perturber.projector), codec,
                           chunk_tokens=agent.config.dpmind_chunk_tokens)
        ref.ingest(t.context, rng)
        clean = _bag(codec.encode(t.context))
        same += _overlap(clean, _bag(codec.encode(" ".join(s["chunks"]))))
        same_ref += _overlap(clean, _bag(codec.encode(" ".join(ref.chunks))))
        total += sum(clean.values())
    if total:
        p_ref = min(1.0, (same_ref + 1) / (total + 1))
        upper = total if p_ref >= 1 else float(stats.binom.isf(dpmind_alpha, total, p_ref))
        if same > upper:
            problems["dpmind"].append(
                f"{same}/{total} clean tokens survive in what left, above {upper:.0f} (alpha={dpmind_alpha}) "
                f"for the booked epsilon (reference {same_ref}/{total}): less perturbed than booked")
    return problems


def _bag(ids) -> dict:
    from collections import Counter

    return Counter(int(i) for i in ids)


def _overlap(a: dict, b: dict) -> int:
    """Clean tokens that survive in the sent text (multiset intersection: robust to re-tokenisation shifts)."""
    return int(sum(min(c, b.get(k, 0)) for k, c in a.items()))
