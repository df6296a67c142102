"""Compared interfaces (Table 1 / Table 8) and safeguard ablations (Table 4).

Every method produces, for one store and one public trajectory, the response-model input
of each turn; the same responder turns it into text. Memory-text methods read the raw
store (they are the non-private references of the paper); the DP methods go through
:class:`~fedmem.agent.memview.interface.MemViewInterface`, so only released views reach
the responder.

=====================  ==============================================================
GenericOnly            fixed generic view of each active slot
RawReadSet             raw read-set items ``M_R`` ordered by position
TypedMask              read set with items of any protected group replaced by a
                       slot-typed placeholder (MemPrivacy adaptation)
TaskMin                fixed union of positions read by the target-relevant and
                       same-domain query families of the trajectory (AirGapAgent)
OutputFilter           RawReadSet, then sentences with explicit protected labels or
                       sensitive-state phrases are deleted from the response
DP-MemView (on)        EM view, eps = min B_a / K, ledger + prospective cap
DP-MemView (pre)       EM view, eps = min B_a / C_a, ledger + prospective cap
IncompleteCharge       (on) but a multi-group read charges only one attribute (C2)
CappedArgmax           (on) but argmax instead of EM, ledger/fallback kept (C3)
NoCap                  (on) with complete charging but no cap check/fallback (C5)
=====================  ==============================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from fedmem.agent.llm import memview_messages
from fedmem.agent.memview.interface import MemViewInterface, first_attribute_only, plan_charges

TABLE2_METHODS = ("GenericOnly", "RawReadSet", "TypedMask", "TaskMin", "OutputFilter",
                  "DP-MemView (on)", "DP-MemView (pre)")
ABLATIONS = ("IncompleteCharge", "CappedArgmax", "NoCap")
ALL_METHODS = TABLE2_METHODS + ABLATIONS
DP_METHODS = ("DP-MemView (on)", "DP-MemView (pre)", "IncompleteCharge", "NoCap")  # EM-based (seeded)
INTERFACE_METHODS = DP_METHODS + ("CappedArgmax",)
IDENTICAL_BY_CONSTRUCTION = ("GenericOnly", "TypedMask")
VIOLATES = {"IncompleteCharge": "C2", "CappedArgmax": "C3", "NoCap": "C5"}

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def output_filter(text: str, phrases) -> str:
    """Delete every sentence that contains an explicit label or sensitive-state phrase."""
    low_phrases = tuple(p.lower() for p in phrases)
    kept = [s for s in _SENTENCE.split(text) if not any(p in s.lower() for p in low_phrases)]
    return " ".join(kept)


@dataclass
class Transcript:
    responses: list[str]
    target_spent: float = 0.0  # operational ledger L_target at the end
    target_reconstructed: float = 0.0  # complete-charging cost of the target attribute
    identical_conditioning: bool = False
    views: list | None = None  # per turn, released (slot, view) pairs; None for memory-text methods
    fallbacks: list | None = None  # per turn, True when a slot fell back to generic (observable control c_t)


def run_method(method: str, pair, side: str, responder, *, turns: int, cap: float, K: int,
               rng: np.random.Generator | None = None, sensitive_phrases=(), scorer=None,
               cache: dict | None = None, ledger_store=None, ledger_name: str = "memview") -> Transcript:
    """Responses of ``method`` on ``pair.stores[side]`` for the first ``turns`` queries."""
    policy, store = pair.policy, pair.stores[side]
    queries = pair.queries[:turns]
    cache = {} if cache is None else cache

    def respond(q, views=(), memory=()):
        slots = policy.route(q)
        msgs = memview_messages(q.text, slots, views, memory)
        key = msgs[-1]["content"]
        if key not in cache:
            cache[key] = responder.respond(msgs)
        return cache[key]

    def desc(slot, name):
        voc = policy.vocabularies[slot]
        return voc.views[voc.index(name)].description

    out = Transcript([])
    if method in INTERFACE_METHODS:
        caps = {a: cap for a in policy.attributes}
        kwargs = dict(caps=caps, rng=rng, K=K, ledger_store=ledger_store, name=ledger_name)
        if method == "DP-MemView (pre)":
            kwargs.update(mode="preallocated", K=None, planned=plan_charges(policy, queries))
        elif method == "IncompleteCharge":
            kwargs.update(charge_rule=first_attribute_only, unsafe_ablation="C2")
        elif method == "CappedArgmax":
            kwargs.update(selection="argmax", unsafe_ablation="C3")
        elif method == "NoCap":
            kwargs.update(enforce_cap=False, unsafe_ablation="C5")
        iface = MemViewInterface(policy, store, scorer, **kwargs)
        out.views, out.fallbacks = [], []
        for q in queries:
            rel = iface.answer(q)
            out.views.append(rel.views)
            out.fallbacks.append(any(rel.control))
            out.responses.append(respond(q, views=tuple((s, v, desc(s, v)) for s, v in rel.views)))
        out.target_spent = iface.spent()[pair.target]
        out.target_reconstructed = iface.reconstructed_spent()[pair.target]
        return out

    protected = policy.protected_positions()
    if method == "TaskMin":
        union = sorted({p for t in pair.turns if t.qtype in ("target", "neutral")
                        for s in policy.route(t.query) for p in policy.read_set(t.query, s)})
    for q in queries:
        if method == "GenericOnly":
            views = tuple((s, policy.vocabularies[s].generic.name, policy.vocabularies[s].generic.description)
                          for s in policy.route(q))
            out.views = (out.views or []) + [tuple((s, v) for s, v, _ in views)]
            out.responses.append(respond(q, views=views))
            out.identical_conditioning = True
            continue
        memory = []
        for s in policy.route(q):
            positions = union if method == "TaskMin" else policy.read_set(q, s)
            for p in positions:
                if method == "TypedMask" and p in protected:
                    memory.append((s, f"[{policy.layout.slots[p]} item withheld]"))
                else:
                    memory.append((s, store.items[p]))
        text = respond(q, memory=tuple(memory))
        if method == "OutputFilter":
            text = output_filter(text, sensitive_phrases)
        elif method not in ("RawReadSet", "TypedMask", "TaskMin"):
            raise ValueError(f"method must be one of {ALL_METHODS}. Found {method!r}.")
        out.responses.append(text)
        out.identical_conditioning = method == "TypedMask"
    return out
