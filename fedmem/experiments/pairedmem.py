"""PairedMem pairs as DP-MemView objects, built from the benchmark's plain data.

:mod:`fedmem.bench.pairedmem` generates the pairs as plain data (groups, store sentences,
evidence tags, query texts with their intent names); this module builds the public policy
(``Layout``, ``Vocabulary``, ``Intent``, ``MemViewPolicy``), the two stores (``MemoryStore``) and
the ``Query`` trajectory of each pair, the benchmark's responder templates
(:func:`template_book`) and the gold behaviours the experiments score against. The
benchmark content is re-exported, so ``from fedmem.experiments import pairedmem as pm``
gives everything the memview experiments and the agent worlds use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmem.agent.llm import ModeTemplate, TemplateBook
from fedmem.agent.memview.policy import (  # MemoryStore, Query: re-exported
    Intent, Layout, MemViewPolicy, MemoryStore, Query, View, Vocabulary)
from fedmem.bench import pairedmem as data
from fedmem.bench.pairedmem import (  # re-exported: public benchmark content
    ATTRIBUTES, NEUTRAL_TRAITS, SLOTS, TOPICS, PROTECTED_POOLS, NEUTRAL_POOLS, VIEWS, GENERIC_ADVICE, LEXICON,
    SENSITIVE_PHRASES, TRAJECTORY_BLOCK, PairData)

__all__ = [  # the benchmark content (re-exported) and the pairs as policy objects
    "ATTRIBUTES", "NEUTRAL_TRAITS", "SLOTS", "TOPICS", "PROTECTED_POOLS", "NEUTRAL_POOLS", "VIEWS", "GENERIC_ADVICE",
    "LEXICON", "SENSITIVE_PHRASES", "TRAJECTORY_BLOCK", "MemoryStore", "Query", "LAYOUT", "VOCABULARIES", "INTENTS",
    "template_book", "Turn", "Pair", "build_pair", "generate", "validate_pair", "target_views", "supported_views",
    "store_tags"]


# ------------------------------------------------------------------ public policy
def _vocabularies() -> dict[str, Vocabulary]:
    out = {}
    for slot, views in VIEWS.items():
        generic = View(data.generic_view_name(slot), slot, frozenset(), data.GENERIC_VIEW_DESCRIPTION)
        out[slot] = Vocabulary(slot, generic, tuple(View(n, slot, frozenset(s), d) for n, s, d, _ in views))
    return out


LAYOUT = Layout(data.LAYOUT_SLOTS, data.LAYOUT_TOPICS)
VOCABULARIES = _vocabularies()
INTENTS = {name: Intent(name, {it.slot: it.reads}, {it.slot: it.relevance}) for name, it in data.INTENTS.items()}


def template_book() -> TemplateBook:
    """Public response templates of the benchmark's deterministic responder."""
    modes = {}
    for slot, views in VIEWS.items():
        for name, tags, _, advice in views:
            modes[name] = ModeTemplate(name, slot, frozenset(tags), advice)
    return TemplateBook(
        slots=SLOTS, modes=modes, generic=dict(GENERIC_ADVICE), lexicon=dict(LEXICON),
        openings=("Here is a practical take on your {topic}.", "Good question about your {topic}.",
                  "Let's look at your {topic}.", "A few thoughts on your {topic}."),
        closings=("Adjust as the week goes.", "Start small and build from there.", "Hope this helps."),
    )


# ------------------------------------------------------------------ pairs
@dataclass(frozen=True)
class Turn:
    query: Query
    qtype: str  # "target" | "neutral" | "distractor"


@dataclass(frozen=True)
class Pair:
    """One adjacent pair ``M ~_target M'`` with its public policy and trajectory.

    ``tags`` are the S1 specification (evidence tags per position per side); only the
    gold rules and the validator read them.
    """

    index: int
    target: str
    overlap: bool
    split: str
    policy: MemViewPolicy
    stores: dict  # {"M": MemoryStore, "M'": MemoryStore}
    tags: dict  # {"M": tuple[frozenset], "M'": tuple[frozenset]}
    turns: tuple[Turn, ...]

    @property
    def queries(self) -> tuple[Query, ...]:
        return tuple(t.query for t in self.turns)


def build_pair(d: PairData) -> Pair:
    """The policy objects of one plain-data pair (stores on the shared layout, shared vocabularies
    and intents)."""
    store_m = MemoryStore(LAYOUT, d.items["M"])
    store_n = MemoryStore(LAYOUT, d.items["M'"])
    policy = MemViewPolicy(LAYOUT, d.groups, VOCABULARIES, INTENTS)
    return Pair(d.index, d.target, d.overlap, d.split, policy, {"M": store_m, "M'": store_n},
                {"M": d.tags["M"], "M'": d.tags["M'"]}, tuple(Turn(Query(t.text, t.intent), t.qtype) for t in d.turns))


def generate(n_pairs: int, rng: np.random.Generator, *, turns: int = 32, overlap_fraction: float = 0.25,
             split=(0.5, 0.2, 0.3)) -> list[Pair]:
    """``n_pairs`` adjacent pairs (:func:`fedmem.bench.pairedmem.generate`, same arguments, same RNG
    draws), each built into its policy objects."""
    return [build_pair(d) for d in data.generate(n_pairs, rng, turns=turns, overlap_fraction=overlap_fraction,
                                                 split=split)]


def validate_pair(pair: Pair) -> None:
    """S3: same scaffold, equality outside I_a, target evidence on M only, non-target kept."""
    m, n = pair.stores["M"], pair.stores["M'"]
    if m.layout != n.layout:
        raise ValueError(f"pair {pair.index}: stores must share one layout.")
    data.check_pair(pair.index, pair.target, pair.policy.groups[pair.target], {"M": m.items, "M'": n.items},
                    pair.tags, tuple(t.query.text for t in pair.turns))


# ------------------------------------------------------------------ gold behaviours
def target_views(pair: Pair, slot: str) -> frozenset[str]:
    """Target-specific views of ``slot``: those supported by the target attribute."""
    return frozenset(v.name for v in pair.policy.vocabularies[slot].specific if pair.target in v.supported_by)


def supported_views(pair: Pair, side: str, query: Query) -> dict[str, frozenset[str]]:
    """Per active slot, the views the side's read-set evidence supports (from the spec)."""
    out = {}
    for slot in pair.policy.route(query):
        tags = frozenset().union(*(pair.tags[side][p] for p in pair.policy.read_set(query, slot)))
        out[slot] = frozenset(v.name for v in pair.policy.vocabularies[slot].specific if v.supported_by & tags)
    return out


def store_tags(pair: Pair, side: str) -> frozenset[str]:
    return frozenset().union(*pair.tags[side])
