"""Public policy of a DP-MemView interface: layout, groups, vocabularies, router, reads.

Everything in this module is *public*: it may be shown to the application and is the
same for adjacent stores. The only private object is :class:`MemoryStore` (the contents
``m_i``), and only :class:`~fedmem.agent.memview.interface.MemViewInterface` (and the
non-private reference interfaces) may read it.

- :class:`Layout`: positions ``1..n`` (0-based here), the slot ``g`` of each position,
  and a public topic label (non-sensitive slot metadata shared by adjacent stores).
- protected groups ``I_a`` (may overlap; complete grouping is the policy's promise).
- :class:`Vocabulary`: the public view vocabulary ``V_g`` with its fixed generic view.
- :class:`Intent`: the public query family; fixes the router ``Slot(q, history)`` (C4)
  and the content-independent read sets ``R_{t,g}`` and public relevance ``r(q, v)``.
- :meth:`MemViewPolicy.charge_set`: Gamma*(R) = {a : R meets I_a} (Eq. 4).

Policies can be loaded from a TOML/JSON-like mapping (:func:`policy_from_dict`), which
rejects unknown slots, bad or duplicate group positions, declared overlaps that do not
match the groups, and views or relevance entries outside a slot's vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class Layout:
    """Memory scaffold: ``slots[i]`` and ``topics[i]`` of position ``i``."""

    slots: tuple[str, ...]
    topics: tuple[str, ...]

    def __post_init__(self):
        if not self.slots or len(self.slots) != len(self.topics):
            raise ValueError(f"slots and topics must be non-empty and of equal length. Found "
                             f"{len(self.slots)} slots and {len(self.topics)} topics.")
        for s in self.slots:
            if not isinstance(s, str) or not s:
                raise ValueError(f"slot names must be non-empty strings. Found {s!r}.")

    @property
    def n(self) -> int:
        return len(self.slots)

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.slots))

    def positions_of(self, slot: str) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.slots) if s == slot)


@dataclass(frozen=True)
class View:
    """A public response-conditioning view: how to answer, never a user fact."""

    name: str
    slot: str
    supported_by: frozenset = frozenset()  # evidence tags that make the view compatible
    description: str = ""


@dataclass(frozen=True)
class Vocabulary:
    """``V_g``: fixed generic view plus specific views (C1: shared by adjacent stores)."""

    slot: str
    generic: View
    specific: tuple[View, ...]

    def __post_init__(self):
        names = [v.name for v in self.views]
        if len(set(names)) != len(names):
            raise ValueError(f"vocabulary of slot {self.slot!r} must have distinct view names. Found {names!r}.")
        for v in self.views:
            if v.slot != self.slot:
                raise ValueError(f"view {v.name!r} belongs to slot {v.slot!r}, not {self.slot!r}.")
        if self.generic.supported_by:
            raise ValueError(f"generic view {self.generic.name!r} must not depend on evidence. "
                             f"Found supported_by={set(self.generic.supported_by)!r}.")

    @property
    def views(self) -> tuple[View, ...]:
        return (self.generic, *self.specific)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.views)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"view must be in the vocabulary of slot {self.slot!r} {list(self.names)}. "
                             f"Found {name!r}.") from None


@dataclass(frozen=True)
class Intent:
    """A public query family: active slots (in order), read positions, relevance r(q, v)."""

    name: str
    reads: Mapping[str, tuple[int, ...]]  # slot -> positions (policy order = dict order)
    relevance: Mapping[str, Mapping[str, float]]  # slot -> view name -> r in [0, 1]

    def __post_init__(self):
        object.__setattr__(self, "reads", MappingProxyType({k: tuple(v) for k, v in self.reads.items()}))
        object.__setattr__(self, "relevance", MappingProxyType(
            {k: MappingProxyType(dict(v)) for k, v in self.relevance.items()}))


@dataclass(frozen=True)
class Query:
    """A public query ``q_t``: its text and its public intent (family)."""

    text: str
    intent: str


@dataclass(frozen=True)
class MemoryStore:
    """Private store ``M = (m_1..m_n)`` on a layout. Never passed to a responder."""

    layout: Layout
    items: tuple[str, ...] = field(repr=False)

    def __post_init__(self):
        if len(self.items) != self.layout.n:
            raise ValueError(f"items must have one entry per layout position ({self.layout.n}). "
                             f"Found {len(self.items)}.")
        for i, m in enumerate(self.items):
            if not isinstance(m, str):
                raise TypeError(f"items[{i}] must be a string. Found {type(m).__name__}.")

    def __repr__(self) -> str:  # never print memory contents
        return f"MemoryStore(<{self.layout.n} private items>)"


class MemViewPolicy:
    """Public policy: layout, groups ``I_a``, vocabularies ``V_g`` and intents.

    Validated at construction: group positions exist and are not repeated; every intent
    names known slots, reads positions of that slot, and scores only views of that
    slot's vocabulary with ``r`` in [0, 1]; every slot has a vocabulary.
    """

    def __init__(self, layout: Layout, groups: Mapping[str, frozenset], vocabularies: Mapping[str, Vocabulary],
                 intents: Mapping[str, Intent]):
        self.layout = layout
        clean = {}
        for a, g in groups.items():
            if not isinstance(a, str) or not a:
                raise ValueError(f"group names must be non-empty strings. Found {a!r}.")
            g = list(g)
            if not g:
                raise ValueError(f"group I_{a} must not be empty. Found {g!r}.")
            if len(set(g)) != len(g):
                raise ValueError(f"group I_{a} must not repeat positions. Found {sorted(g)!r}.")
            bad = [p for p in g if not isinstance(p, int) or not 0 <= p < layout.n]
            if bad:
                raise ValueError(f"group I_{a} must hold positions 0..{layout.n - 1}. Found {bad!r}.")
            clean[a] = frozenset(g)
        if not clean:
            raise ValueError("groups must name at least one protected attribute. Found none.")
        self.groups: Mapping[str, frozenset] = MappingProxyType(clean)
        missing = [s for s in layout.slot_names if s not in vocabularies]
        unknown = [s for s in vocabularies if s not in layout.slot_names]
        if missing or unknown:
            raise ValueError(f"vocabularies must cover exactly the layout slots {list(layout.slot_names)}. "
                             f"Found missing {missing!r}, unknown {unknown!r}.")
        for s, voc in vocabularies.items():
            if not isinstance(voc, Vocabulary):
                raise TypeError(f"vocabularies[{s!r}] must be a Vocabulary fixed in the policy (C1). "
                                f"Found {type(voc).__name__}.")
        self.vocabularies: Mapping[str, Vocabulary] = MappingProxyType(dict(vocabularies))
        for name, it in intents.items():
            for slot, reads in it.reads.items():
                if slot not in self.vocabularies:
                    raise ValueError(f"intent {name!r} routes to unknown slot {slot!r}. "
                                     f"Known slots: {list(layout.slot_names)}.")
                bad = [p for p in reads if not 0 <= p < layout.n or layout.slots[p] != slot]
                if bad or not reads:
                    raise ValueError(f"intent {name!r} must read positions of slot {slot!r}. Found {list(reads)!r}.")
                rel = it.relevance.get(slot, {})
                voc = self.vocabularies[slot]
                for v, r in rel.items():
                    voc.index(v)
                    if not 0.0 <= float(r) <= 1.0:
                        raise ValueError(f"intent {name!r} relevance of {v!r} must be in [0, 1]. Found {r!r}.")
            for slot in it.relevance:
                if slot not in it.reads:
                    raise ValueError(f"intent {name!r} scores slot {slot!r} that it does not route to.")
        self.intents: Mapping[str, Intent] = MappingProxyType(dict(intents))
        self.attributes = tuple(sorted(self.groups))

    # ------------------------------------------------------------ orchestration (C4)
    def _intent(self, query: Query) -> Intent:
        try:
            return self.intents[query.intent]
        except KeyError:
            raise ValueError(f"query intent must be one of the policy's intents. Found {query.intent!r}.") from None

    def route(self, query: Query, history=()) -> tuple[str, ...]:
        """``G_t = Slot(q_t, history)``: active slots in policy order (public inputs only)."""
        return tuple(self._intent(query).reads)

    def read_set(self, query: Query, slot: str, history=()) -> tuple[int, ...]:
        """``R_{t,g}``: content-independent read positions (Algorithm 1, line 6)."""
        reads = self._intent(query).reads
        if slot not in reads:
            raise ValueError(f"slot {slot!r} is not active for intent {query.intent!r}.")
        return reads[slot]

    def relevance(self, query: Query, slot: str, view: str) -> float:
        return float(self._intent(query).relevance.get(slot, {}).get(view, 0.0))

    def charge_set(self, read_set) -> frozenset:
        """Gamma*(R) = {a in A : R intersects I_a} (Eq. 4)."""
        r = set(read_set)
        return frozenset(a for a, g in self.groups.items() if g & r)

    def protected_positions(self) -> frozenset:
        return frozenset().union(*self.groups.values())

    def overlapping_pairs(self) -> list[tuple[str, str]]:
        a = self.attributes
        return [(x, y) for i, x in enumerate(a) for y in a[i + 1:] if self.groups[x] & self.groups[y]]


# ------------------------------------------------------------------ loading from files
def policy_from_dict(data: Mapping) -> MemViewPolicy:
    """Build a policy from a parsed TOML/JSON mapping (see docs/memview.md for the format).

    ``{"positions": [{"slot": s, "topic": t}, ...], "groups": {a: [i, ...]},
    "overlaps": [[a, b], ...] (optional, must match), "vocabularies": {slot: {"generic": name,
    "views": {name: {"supported_by": [...], "description": "..."}}}},
    "intents": {name: {"reads": {slot: [i, ...]}, "relevance": {slot: {view: r}}}}}``
    """
    try:
        positions = data["positions"]
        layout = Layout(tuple(p["slot"] for p in positions), tuple(p.get("topic", "") for p in positions))
        known = layout.slot_names
        vocabs = {}
        for slot, spec in data["vocabularies"].items():
            if slot not in known:
                raise ValueError(f"vocabularies names unknown slot {slot!r}. Known slots: {list(known)}.")
            generic = View(spec["generic"], slot, frozenset(), spec.get("generic_description", ""))
            views = tuple(View(n, slot, frozenset(v.get("supported_by", ())), v.get("description", ""))
                          for n, v in spec.get("views", {}).items())
            vocabs[slot] = Vocabulary(slot, generic, views)
        groups = {a: list(g) for a, g in data["groups"].items()}
        intents = {n: Intent(n, {s: tuple(r) for s, r in v["reads"].items()}, v.get("relevance", {}))
                   for n, v in data.get("intents", {}).items()}
    except KeyError as exc:
        raise ValueError(f"policy must define {exc.args[0]!r}.") from None
    policy = MemViewPolicy(layout, groups, vocabs, intents)
    if "overlaps" in data:
        declared = sorted(tuple(sorted(p)) for p in data["overlaps"])
        actual = policy.overlapping_pairs()
        if declared != actual:
            raise ValueError(f"overlaps must list exactly the overlapping protected groups {actual!r}. "
                             f"Found {declared!r}.")
    return policy


def store_from_dict(layout: Layout, data: Mapping) -> MemoryStore:
    """``{"items": [{"position": i, "slot": s, "text": "..."}, ...]}`` -> MemoryStore.

    Every position exactly once; each item's slot must be the layout's slot there.
    """
    items = data.get("items")
    if not isinstance(items, list):
        raise ValueError(f"store must define a list 'items'. Found {type(items).__name__}.")
    texts: dict[int, str] = {}
    for k, item in enumerate(items):
        p, slot = item.get("position"), item.get("slot")
        if not isinstance(p, int) or not 0 <= p < layout.n:
            raise ValueError(f"items[{k}].position must be in 0..{layout.n - 1}. Found {p!r}.")
        if slot not in layout.slot_names:
            raise ValueError(f"items[{k}].slot must be a known slot {list(layout.slot_names)}. Found {slot!r}.")
        if layout.slots[p] != slot:
            raise ValueError(f"items[{k}].slot must be {layout.slots[p]!r} at position {p}. Found {slot!r}.")
        if p in texts:
            raise ValueError(f"items[{k}] repeats position {p}.")
        texts[p] = str(item.get("text", ""))
    missing = [p for p in range(layout.n) if p not in texts]
    if missing:
        raise ValueError(f"store must fill every layout position. Found missing positions {missing!r}.")
    return MemoryStore(layout, tuple(texts[p] for p in range(layout.n)))
