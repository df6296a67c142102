"""PairedMem-style adjacent-store pairs (DP-MemView paper, Appendix C.2, Table 6).

Each pair is two stores ``M ~_a M'`` on one fixed 28-position scaffold in six slots.
They differ only inside the target group ``I_a`` (4-6 positions): ``M`` carries evidence
for the target attribute at every position of ``I_a``, ``M'`` carries an a-neutral
sentence on the same topic there (slot-compatible). Four protected attributes (type-2
diabetes, pregnancy, severe unsecured debt, recent involuntary job loss). In 25% of the
pairs (fixed quota per attribute) the target group shares a position with another
protected group; there the non-target evidence is preserved in both stores.

Steps of Table 6 and how they are realised here (no LLM is available offline):

* **S1 pair design**: code, as in the paper (groups, overlap quota, target, split).
* **S2 text**: template realisation instead of Mistral-7B: a topic frame (2 variants per
  position) joined with an evidence clause (5 variants per evidence type) or a neutral
  clause (3 variants per topic), so no single string identifies a side.
* **S3 validation**: :func:`validate_pair` checks the same scaffold, equality outside
  ``I_a``, target evidence present on ``M`` only, non-target evidence preserved.
* **S4 queries and gold**: two 16-query blocks of 8 target-relevant, 4 same-domain
  neutral and 4 distractor queries built from public intents (never from the stores),
  and deterministic gold behaviours computed from the specification.

Everything here is public benchmark content (scaffold, vocabularies, lexicon, response
templates: the data itself lives in :mod:`fedmem.bench.pairedmem_content`) except each
pair's two stores, which only the trusted interface may read.

This module returns **plain data** (:class:`PairData`: groups, store sentences, evidence
tags, query texts with their intent names); :mod:`fedmem.experiments.pairedmem` builds the
DP-MemView objects from it (``MemViewPolicy``, ``MemoryStore``, ``Query``: its ``generate``
returns the ``Pair`` objects) and the responder's ``TemplateBook``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.bench.pairedmem_content import (  # re-exported: public benchmark content
    ATTRIBUTES, NEUTRAL_TRAITS, SLOTS, TOPICS, PROTECTED_POOLS, NEUTRAL_POOLS, VIEWS, GENERIC_ADVICE, LEXICON,
    SENSITIVE_PHRASES, EVIDENCE, FRAMES, NEUTRAL_CLAUSES, QUERY_TEMPLATES, TRAJECTORY_BLOCK)

__all__ = [  # the benchmark content (re-exported) and the plain-data generator
    "ATTRIBUTES", "NEUTRAL_TRAITS", "SLOTS", "TOPICS", "PROTECTED_POOLS", "NEUTRAL_POOLS", "VIEWS", "GENERIC_ADVICE",
    "LEXICON", "SENSITIVE_PHRASES", "EVIDENCE", "FRAMES", "NEUTRAL_CLAUSES", "QUERY_TEMPLATES", "TRAJECTORY_BLOCK",
    "LAYOUT_SLOTS", "LAYOUT_TOPICS", "GENERIC_VIEW_DESCRIPTION", "generic_view_name", "positions_of", "IntentData",
    "INTENTS", "TurnData", "PairData", "generate", "check_pair"]


# ------------------------------------------------------------------ public policy, as plain data
LAYOUT_SLOTS = tuple(s for s, _ in TOPICS)      # slot of each scaffold position
LAYOUT_TOPICS = tuple(t for _, t in TOPICS)     # topic of each scaffold position
GENERIC_VIEW_DESCRIPTION = "Give broadly applicable guidance."


def generic_view_name(slot: str) -> str:
    """Name of ``slot``'s fixed generic view."""
    return f"{slot}_generic"


def positions_of(slot: str) -> tuple[int, ...]:
    """Scaffold positions of ``slot`` (as ``Layout.positions_of``)."""
    return tuple(i for i, s in enumerate(LAYOUT_SLOTS) if s == slot)


@dataclass(frozen=True)
class IntentData:
    """One public intent: it reads positions ``reads`` of ``slot``; ``relevance``: view name -> r."""

    name: str
    slot: str
    reads: tuple[int, int]
    relevance: dict


def _pool_tags(position: int) -> set[str]:
    tags = {a for a, pool in PROTECTED_POOLS.items() if position in pool}
    return tags | {t for t, pool in NEUTRAL_POOLS.items() if position in pool}


def _intents() -> dict[str, IntentData]:
    """Per slot, intent i reads positions (p_i, p_{i+1 mod k}); relevance is public (pools)."""
    intents = {}
    for slot in SLOTS:
        pos = positions_of(slot)
        for i, p in enumerate(pos):
            q = pos[(i + 1) % len(pos)]
            tags = _pool_tags(p) | _pool_tags(q)
            relevance = {n: (1.0 if frozenset(sup) & tags else 0.3) for n, sup, _, _ in VIEWS[slot]}
            relevance[generic_view_name(slot)] = 0.7
            name = f"{slot}:{LAYOUT_TOPICS[p]}+{LAYOUT_TOPICS[q]}"
            intents[name] = IntentData(name, slot, (p, q), relevance)
    return intents


INTENTS = _intents()


# ------------------------------------------------------------------ pairs
@dataclass(frozen=True)
class TurnData:
    """One query of a trajectory: its text, the public intent it names, and its type."""

    text: str
    intent: str
    qtype: str  # "target" | "neutral" | "distractor"


@dataclass(frozen=True)
class PairData:
    """One adjacent pair ``M ~_target M'`` as plain data: protected groups ``I_a``, the two
    stores' sentences, and the trajectory.

    ``tags`` are the S1 specification (evidence tags per position per side); only the
    gold rules and the validator read them.
    """

    index: int
    target: str
    overlap: bool
    split: str
    groups: dict  # attribute -> frozenset of positions
    items: dict  # {"M": tuple[str], "M'": tuple[str]}
    tags: dict  # {"M": tuple[frozenset], "M'": tuple[frozenset]}
    turns: tuple[TurnData, ...]


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:4], "little")


def _sample_group(rng, pool, size, avoid=frozenset(), must_hit=frozenset()):
    pool = [p for p in pool if p not in avoid]
    if len(pool) < size:
        return None
    for _ in range(50):
        g = frozenset(int(x) for x in rng.choice(pool, size=size, replace=False))
        slots = {LAYOUT_SLOTS[p] for p in g}
        if len(slots) <= 3 and (not must_hit or g & must_hit):
            return g
    return None


def _design_groups(rng, target: str, overlap: bool) -> dict[str, frozenset]:
    for _ in range(1000):
        groups = {}
        size = int(rng.integers(4, 7))
        groups[target] = _sample_group(rng, PROTECTED_POOLS[target], size)
        if groups[target] is None:
            continue
        others = [a for a in ATTRIBUTES if a != target]
        partner = None
        if overlap:
            cands = [a for a in others if set(PROTECTED_POOLS[a]) & groups[target]]
            if not cands:
                continue
            partner = cands[int(rng.integers(len(cands)))]
        ok = True
        for a in others:
            used = frozenset().union(*groups.values())
            size = int(rng.integers(4, 7))
            if a == partner:
                g = _sample_group(rng, PROTECTED_POOLS[a], size,
                                  avoid=used - groups[target], must_hit=groups[target])
            else:
                g = _sample_group(rng, PROTECTED_POOLS[a], size, avoid=used)
                if g is None:  # small pools: shrink to 4 before giving up
                    g = _sample_group(rng, PROTECTED_POOLS[a], 4, avoid=used)
            if g is None:
                ok = False
                break
            groups[a] = g
        if not ok:
            continue
        has_overlap = any(groups[a] & groups[b] for a in ATTRIBUTES for b in ATTRIBUTES if a < b)
        if has_overlap == overlap:
            return groups
    raise RuntimeError(f"could not design groups for target {target!r} (overlap={overlap})")


def _sentence(position: int, tags: frozenset, variant: int) -> str:
    topic = LAYOUT_TOPICS[position]
    frame = FRAMES[variant % len(FRAMES)].format(topic=topic)
    if not tags:
        clause = NEUTRAL_CLAUSES[(variant // 2) % len(NEUTRAL_CLAUSES)]
    else:
        clauses = [EVIDENCE[t][(variant + 3 * k) % len(EVIDENCE[t])] for k, t in enumerate(sorted(tags))]
        clause = ", and ".join(clauses)
    return f"{frame} {clause}."


def _trajectory(rng, groups, target, n_turns) -> tuple[TurnData, ...]:
    ia = groups[target]
    ia_slots = {LAYOUT_SLOTS[p] for p in ia}
    pool_slots = {LAYOUT_SLOTS[p] for p in PROTECTED_POOLS[target]}
    target_i, neutral_i, distract_i = [], [], []
    for name, intent in INTENTS.items():
        slot, reads = intent.slot, intent.reads
        hits = bool(set(reads) & ia)
        if hits:
            target_i.append(name)
        elif slot in ia_slots:
            neutral_i.append(name)
        elif slot not in pool_slots:
            distract_i.append(name)
    if not neutral_i:
        neutral_i = [n for n, it in INTENTS.items()
                     if not (set(it.reads) & ia) and it.slot in pool_slots]
    if not distract_i:
        distract_i = [n for n, it in INTENTS.items()
                      if not (set(it.reads) & ia) and it.slot not in ia_slots]
    kinds = {"target": target_i, "neutral": neutral_i, "distractor": distract_i}
    turns: list[TurnData] = []
    while len(turns) < n_turns:
        block = []
        for qtype, count in TRAJECTORY_BLOCK.items():
            names = kinds[qtype]
            for k in range(count):
                name = names[int(rng.integers(len(names)))]
                block.append((qtype, name))
        order = rng.permutation(len(block))
        for i in order:
            qtype, name = block[i]
            intent = INTENTS[name]
            slot, (p, q) = intent.slot, intent.reads
            tmpl = QUERY_TEMPLATES[slot][int(rng.integers(len(QUERY_TEMPLATES[slot])))]
            text = tmpl.format(a=LAYOUT_TOPICS[p], b=LAYOUT_TOPICS[q])
            turns.append(TurnData(text, name, qtype))
    return tuple(turns[:n_turns])


def generate(n_pairs: int, rng: np.random.Generator, *, turns: int = 32, overlap_fraction: float = 0.25,
             split=(0.5, 0.2, 0.3)) -> list[PairData]:
    """``n_pairs`` adjacent pairs (a multiple of 4: equal quota per attribute), as plain data
    (:func:`fedmem.experiments.pairedmem.generate` returns them as policy objects).

    Overlap, and train/validation/test split, use fixed per-attribute quotas
    (``round(overlap_fraction * n_per_attribute)`` overlapping pairs), as in S3.
    """
    n_pairs = V.positive_int("n_pairs", n_pairs, minimum=4)
    if n_pairs % len(ATTRIBUTES):
        raise ValueError(f"n_pairs must be a multiple of {len(ATTRIBUTES)}. Found {n_pairs!r}.")
    turns = V.positive_int("turns", turns)
    V.rng_check("rng", rng)
    if not 0.0 <= overlap_fraction <= 1.0:
        raise ValueError(f"overlap_fraction must be in [0, 1]. Found {overlap_fraction!r}.")
    if len(split) != 3 or any(s <= 0 for s in split) or abs(sum(split) - 1.0) > 1e-9:
        raise ValueError(f"split must be three positive fractions summing to 1. Found {split!r}.")
    per_attr = n_pairs // len(ATTRIBUTES)
    n_train = max(1, int(round(split[0] * per_attr)))
    n_val = max(1, int(round(split[1] * per_attr)))
    if per_attr - n_train - n_val < 1:
        raise ValueError(f"n_pairs={n_pairs} leaves no test pairs per attribute; use at least 12.")
    pairs = []
    for target in ATTRIBUTES:
        n_overlap = int(round(overlap_fraction * per_attr))
        flags = np.zeros(per_attr, dtype=bool)
        flags[rng.permutation(per_attr)[:n_overlap]] = True
        splits = ["train"] * n_train + ["val"] * n_val + ["test"] * (per_attr - n_train - n_val)
        splits = [splits[i] for i in rng.permutation(per_attr)]
        for k in range(per_attr):
            pairs.append(_make_pair(len(pairs), target, bool(flags[k]), splits[k], rng, turns))
    return pairs


def _make_pair(index, target, overlap, split, rng, n_turns) -> PairData:
    groups = _design_groups(rng, target, overlap)
    n = len(LAYOUT_SLOTS)
    background = [set() for _ in range(n)]
    protected_positions = frozenset().union(*groups.values())
    for b in ATTRIBUTES:
        if b != target and rng.random() < 0.3:
            for p in groups[b]:
                background[p].add(b)
    for trait, pool in NEUTRAL_POOLS.items():
        if rng.random() < 0.35:
            free = [p for p in pool if p not in protected_positions]
            if free:
                k = min(len(free), int(rng.integers(1, 3)))
                for p in rng.choice(free, size=k, replace=False):
                    background[int(p)].add(trait)
    tags_m = tuple(frozenset(background[p] | ({target} if p in groups[target] else set())) for p in range(n))
    tags_n = tuple(frozenset(background[p]) for p in range(n))
    variants = [int(rng.integers(0, 60)) for _ in range(n)]
    items_m = tuple(_sentence(p, tags_m[p], variants[p]) for p in range(n))
    items_n = tuple(_sentence(p, tags_n[p], variants[p]) for p in range(n))
    pair = PairData(index, target, overlap, split, groups, {"M": items_m, "M'": items_n},
                    {"M": tags_m, "M'": tags_n}, _trajectory(rng, groups, target, n_turns))
    check_pair(pair.index, pair.target, frozenset(groups[target]), pair.items, pair.tags,
               tuple(t.text for t in pair.turns))
    return pair


def check_pair(index: int, target: str, ia: frozenset, items: dict, tags: dict, query_texts) -> None:
    """S3 on plain data: equality outside I_a, target evidence on M only, non-target kept,
    no query naming a protected attribute (``ValueError`` names the pair and position)."""
    m, n = items["M"], items["M'"]
    for p in range(len(m)):
        tm, tn = tags["M"][p], tags["M'"][p]
        if p not in ia and (m[p] != n[p] or tm != tn):
            raise ValueError(f"pair {index}: stores differ at position {p} outside I_{target}.")
        if p in ia:
            if target not in tm or target in tn:
                raise ValueError(f"pair {index}: target evidence misplaced at position {p}.")
            if tm - {target} != tn:
                raise ValueError(f"pair {index}: non-target evidence not preserved at position {p}.")
    for text in query_texts:
        if any(s in text.lower() for s in SENSITIVE_PHRASES):
            raise ValueError(f"pair {index}: query {text!r} names a protected attribute.")
