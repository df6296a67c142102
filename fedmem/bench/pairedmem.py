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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.agent.llm import ModeTemplate, TemplateBook
from fedmem.agent.memview.policy import Intent, Layout, MemViewPolicy, MemoryStore, Query, View, Vocabulary
from fedmem.bench.pairedmem_content import (  # noqa: F401 (re-exported: public benchmark content)
    ATTRIBUTES, NEUTRAL_TRAITS, SLOTS, TOPICS, PROTECTED_POOLS, NEUTRAL_POOLS, _VIEWS, GENERIC_ADVICE, LEXICON,
    SENSITIVE_PHRASES, _EVIDENCE, _FRAMES, _NEUTRAL, _QUERY_TEMPLATES, TRAJECTORY_BLOCK)


# ------------------------------------------------------------------ public policy
def _vocabularies() -> dict[str, Vocabulary]:
    out = {}
    for slot, views in _VIEWS.items():
        generic = View(f"{slot}_generic", slot, frozenset(), "Give broadly applicable guidance.")
        out[slot] = Vocabulary(slot, generic, tuple(View(n, slot, frozenset(s), d) for n, s, d, _ in views))
    return out


def _pool_tags(position: int) -> set[str]:
    tags = {a for a, pool in PROTECTED_POOLS.items() if position in pool}
    return tags | {t for t, pool in NEUTRAL_POOLS.items() if position in pool}


def _intents(layout: Layout, vocabularies: dict[str, Vocabulary]) -> dict[str, Intent]:
    """Per slot, intent i reads positions (p_i, p_{i+1 mod k}); relevance is public (pools)."""
    intents = {}
    for slot in SLOTS:
        pos = layout.positions_of(slot)
        for i, p in enumerate(pos):
            q = pos[(i + 1) % len(pos)]
            tags = _pool_tags(p) | _pool_tags(q)
            relevance = {v.name: (1.0 if v.supported_by & tags else 0.3) for v in vocabularies[slot].specific}
            relevance[vocabularies[slot].generic.name] = 0.7
            name = f"{slot}:{layout.topics[p]}+{layout.topics[q]}"
            intents[name] = Intent(name, {slot: (p, q)}, {slot: relevance})
    return intents


_LAYOUT = Layout(tuple(s for s, _ in TOPICS), tuple(t for _, t in TOPICS))
_VOCABS = _vocabularies()
_INTENTS = _intents(_LAYOUT, _VOCABS)


def template_book() -> TemplateBook:
    """Public response templates of the benchmark's deterministic responder."""
    modes = {}
    for slot, views in _VIEWS.items():
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


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:4], "little")


def _sample_group(rng, pool, size, avoid=frozenset(), must_hit=frozenset()):
    pool = [p for p in pool if p not in avoid]
    if len(pool) < size:
        return None
    for _ in range(50):
        g = frozenset(int(x) for x in rng.choice(pool, size=size, replace=False))
        slots = {_LAYOUT.slots[p] for p in g}
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
    topic = _LAYOUT.topics[position]
    frame = _FRAMES[variant % len(_FRAMES)].format(topic=topic)
    if not tags:
        clause = _NEUTRAL[(variant // 2) % len(_NEUTRAL)]
    else:
        clauses = [_EVIDENCE[t][(variant + 3 * k) % len(_EVIDENCE[t])] for k, t in enumerate(sorted(tags))]
        clause = ", and ".join(clauses)
    return f"{frame} {clause}."


def _trajectory(rng, groups, target, n_turns) -> tuple[Turn, ...]:
    ia = groups[target]
    ia_slots = {_LAYOUT.slots[p] for p in ia}
    pool_slots = {_LAYOUT.slots[p] for p in PROTECTED_POOLS[target]}
    target_i, neutral_i, distract_i = [], [], []
    for name, intent in _INTENTS.items():
        (slot, reads), = intent.reads.items()
        hits = bool(set(reads) & ia)
        if hits:
            target_i.append(name)
        elif slot in ia_slots:
            neutral_i.append(name)
        elif slot not in pool_slots:
            distract_i.append(name)
    if not neutral_i:
        neutral_i = [n for n, it in _INTENTS.items()
                     if not (set(next(iter(it.reads.values()))) & ia) and next(iter(it.reads)) in pool_slots]
    if not distract_i:
        distract_i = [n for n, it in _INTENTS.items()
                      if not (set(next(iter(it.reads.values()))) & ia) and next(iter(it.reads)) not in ia_slots]
    kinds = {"target": target_i, "neutral": neutral_i, "distractor": distract_i}
    turns: list[Turn] = []
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
            intent = _INTENTS[name]
            (slot, (p, q)), = intent.reads.items()
            tmpl = _QUERY_TEMPLATES[slot][int(rng.integers(len(_QUERY_TEMPLATES[slot])))]
            text = tmpl.format(a=_LAYOUT.topics[p], b=_LAYOUT.topics[q])
            turns.append(Turn(Query(text, name), qtype))
    return tuple(turns[:n_turns])


def generate(n_pairs: int, rng: np.random.Generator, *, turns: int = 32, overlap_fraction: float = 0.25,
             split=(0.5, 0.2, 0.3)) -> list[Pair]:
    """``n_pairs`` adjacent pairs (a multiple of 4: equal quota per attribute).

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


def _make_pair(index, target, overlap, split, rng, n_turns) -> Pair:
    groups = _design_groups(rng, target, overlap)
    n = _LAYOUT.n
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
    store_m = MemoryStore(_LAYOUT, tuple(_sentence(p, tags_m[p], variants[p]) for p in range(n)))
    store_n = MemoryStore(_LAYOUT, tuple(_sentence(p, tags_n[p], variants[p]) for p in range(n)))
    policy = MemViewPolicy(_LAYOUT, groups, _VOCABS, _INTENTS)
    pair = Pair(index, target, overlap, split, policy, {"M": store_m, "M'": store_n},
                {"M": tags_m, "M'": tags_n}, _trajectory(rng, groups, target, n_turns))
    validate_pair(pair)
    return pair


def validate_pair(pair: Pair) -> None:
    """S3: same scaffold, equality outside I_a, target evidence on M only, non-target kept."""
    ia = pair.policy.groups[pair.target]
    m, n = pair.stores["M"], pair.stores["M'"]
    if m.layout != n.layout:
        raise ValueError(f"pair {pair.index}: stores must share one layout.")
    for p in range(m.layout.n):
        tm, tn = pair.tags["M"][p], pair.tags["M'"][p]
        if p not in ia and (m.items[p] != n.items[p] or tm != tn):
            raise ValueError(f"pair {pair.index}: stores differ at position {p} outside I_{pair.target}.")
        if p in ia:
            if pair.target not in tm or pair.target in tn:
                raise ValueError(f"pair {pair.index}: target evidence misplaced at position {p}.")
            if tm - {pair.target} != tn:
                raise ValueError(f"pair {pair.index}: non-target evidence not preserved at position {p}.")
    for t in pair.turns:
        text = t.query.text.lower()
        if any(s in text for s in SENSITIVE_PHRASES):
            raise ValueError(f"pair {pair.index}: query {t.query.text!r} names a protected attribute.")


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
