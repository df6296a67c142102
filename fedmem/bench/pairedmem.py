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
templates) except each pair's two stores, which only the trusted interface may read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.agent.llm import ModeTemplate, TemplateBook
from fedmem.agent.memview.policy import Intent, Layout, MemViewPolicy, MemoryStore, Query, View, Vocabulary

ATTRIBUTES = ("diabetes", "pregnancy", "debt", "job_loss")
NEUTRAL_TRAITS = ("vegetarian", "active", "saver", "night_shift")

SLOTS = ("health", "food", "finance", "work", "schedule", "family")
TOPICS = (
    ("health", "check-ups"), ("health", "medication"), ("health", "energy levels"),
    ("health", "clinic visits"), ("health", "wellness habits"),
    ("food", "breakfast"), ("food", "dinners"), ("food", "grocery runs"), ("food", "snacks"),
    ("food", "eating out"),
    ("finance", "bills"), ("finance", "credit cards"), ("finance", "savings"),
    ("finance", "monthly budget"), ("finance", "loans"),
    ("work", "job situation"), ("work", "commute"), ("work", "workdays"), ("work", "income"),
    ("work", "career plans"),
    ("schedule", "mornings"), ("schedule", "weekdays"), ("schedule", "appointments"),
    ("schedule", "deadlines"),
    ("family", "household"), ("family", "partner"), ("family", "upcoming plans"),
    ("family", "home costs"),
)

#: Positions whose content may imply each attribute (public policy pools, S1).
PROTECTED_POOLS = {
    "diabetes": (0, 1, 2, 3, 5, 6, 8, 22),
    "pregnancy": (0, 1, 2, 3, 4, 6, 8, 22, 24, 25, 26),
    "debt": (10, 11, 13, 14, 18, 23, 27),
    "job_loss": (12, 13, 15, 17, 18, 19, 20, 21),
}
NEUTRAL_POOLS = {
    "vegetarian": (5, 6, 7, 9, 24),
    "active": (4, 5, 16, 20),
    "saver": (10, 12, 13),
    "night_shift": (16, 17, 21),
}

# (view name, evidence tags supporting it, descriptor handed to the responder, advice variants)
_VIEWS = {
    "health": [
        ("glucose_monitoring", {"diabetes"}, "Favour steady-energy, glucose-aware health routines.",
         ("Keep a simple log of how meals and activity affect your energy through the day.",
          "Pair each main meal with a short walk; it keeps energy steadier.",
          "A regular glucose-aware routine with fixed meal times tends to help.")),
        ("prenatal_care", {"pregnancy"}, "Favour gentle, prenatal-friendly health routines.",
         ("Keep activity gentle and check any new supplement with your care provider.",
          "Plan rest breaks and keep a water bottle close during the day.",
          "Gentle stretching and regular check-ins with your provider fit well here.")),
        ("stress_support", {"debt", "job_loss"}, "Favour low-cost stress-management routines.",
         ("Short free routines like breathing exercises can take the edge off stressful weeks.",
          "Free community resources and a steady sleep schedule help in stressful periods.",
          "Put a little structure in each day; it reduces stress when things feel uncertain.")),
        ("fitness_recovery", {"active"}, "Favour recovery routines for someone who trains often.",
         ("Schedule recovery days and keep protein up after long sessions.",
          "Foam rolling and a fixed rest day keep training sustainable.",
          "Balance hard sessions with easy ones so recovery keeps up.")),
        ("sleep_hygiene", {"night_shift"}, "Favour routines for irregular sleep hours.",
         ("Blackout curtains and a consistent wind-down help when sleeping in the day.",
          "Anchor one sleep block at the same time each day, even on days off.",
          "Limit caffeine in the second half of your waking hours.")),
    ],
    "food": [
        ("low_glycemic", {"diabetes"}, "Suggest low-glycemic, balanced-carb meals.",
         ("Build plates around vegetables and lean protein with whole-grain, low-glycemic sides.",
          "Swap white rice for lentils or quinoa and keep portions of starch modest.",
          "Choose high-fibre, low-glycemic options and pair carbs with protein.")),
        ("pregnancy_safe", {"pregnancy"}, "Suggest pregnancy-safe meals (no raw fish, soft cheese).",
         ("Skip raw fish and unpasteurised cheese; cook eggs and meat all the way through.",
          "Folate-rich greens, beans and fully cooked proteins are good anchors.",
          "Choose well-cooked dishes and keep iron-rich foods on the menu.")),
        ("low_cost_meals", {"debt", "job_loss"}, "Suggest very low-cost meals.",
         ("Batch-cook beans, rice and seasonal vegetables to keep costs very low.",
          "Plan meals around store-brand staples and what is on sale this week.",
          "One-pot meals with frozen vegetables stretch a small grocery budget.")),
        ("plant_based", {"vegetarian"}, "Suggest meat-free meals.",
         ("Chickpea curries, bean chilli and tofu stir-fries keep it meat-free.",
          "Try lentil bolognese or halloumi wraps for meat-free variety.",
          "Eggs, beans and tofu cover protein without meat.")),
        ("high_protein", {"active"}, "Suggest high-protein meals for training.",
         ("Add Greek yoghurt, eggs or chicken to each meal for extra protein.",
          "A protein-rich breakfast helps recovery after morning sessions.",
          "Keep a high-protein snack ready after workouts.")),
    ],
    "finance": [
        ("medical_costs", {"diabetes"}, "Plan for recurring medical and supply costs.",
         ("Set aside a fixed monthly amount for prescriptions and testing supplies.",
          "Check whether your plan covers recurring supplies before the next refill.",
          "Budget a line for regular pharmacy costs so they never surprise you.")),
        ("baby_budget", {"pregnancy"}, "Plan for upcoming baby-related costs.",
         ("Start a small fund for nursery items and check what parental benefits cover.",
          "Price out a car seat, cot and first-month supplies and save toward them.",
          "Look at second-hand baby gear to keep upcoming costs down.")),
        ("debt_paydown", {"debt"}, "Prioritise paying down high-interest balances.",
         ("List balances by interest rate and put every spare dollar on the highest one.",
          "Call lenders about hardship plans and stop new charges on the cards.",
          "A strict zero-based budget frees money for paying balances down.")),
        ("income_gap", {"job_loss"}, "Plan for a period without regular income.",
         ("Trim fixed costs now and stretch your cash buffer across the next few months.",
          "Check which bills can be paused or reduced while income is irregular.",
          "Map out essential costs for the next three months first.")),
        ("steady_saving", {"saver"}, "Build on an existing saving habit.",
         ("Raise your automatic transfer a little each quarter.",
          "Split savings into an emergency fund and a goals fund.",
          "Review your high-yield account rate once a year.")),
    ],
    "work": [
        ("health_breaks", {"diabetes"}, "Plan workdays with regular meal and movement breaks.",
         ("Block short breaks for meals at fixed times so long meetings never push them out.",
          "Keep a healthy snack at your desk and stand up every hour.",
          "Protect a lunch break on busy days.")),
        ("leave_planning", {"pregnancy"}, "Plan around upcoming leave and lighter duties.",
         ("Start a handover document early and check the leave policy with HR.",
          "Plan lighter duties for the coming months and flag them early.",
          "Map which projects need cover while you are away.")),
        ("side_income", {"debt"}, "Look for extra income alongside the current job.",
         ("A weekend side gig or freelance hours could add steady extra income.",
          "Ask about overtime or paid extra shifts.",
          "Sell a skill online a few hours a week for extra cash.")),
        ("job_search", {"job_loss"}, "Support an active job search.",
         ("Update your CV this week and set a target of five applications.",
          "Reach out to former colleagues; referrals often move fastest.",
          "Block daily time for applications and interview practice.")),
        ("shift_friendly", {"night_shift"}, "Plan around night or rotating shifts.",
         ("Keep handover notes short and schedule meetings at the start of your shift.",
          "Pack meals for overnight hours to avoid vending machines.",
          "Rotate tasks so the hardest ones land when you are most alert.")),
    ],
    "schedule": [
        ("appointment_blocks", {"diabetes", "pregnancy"}, "Reserve regular slots for medical appointments.",
         ("Reserve a recurring slot each month for check-ups and follow-ups.",
          "Keep one morning a fortnight free for appointments.",
          "Add reminders a day before each appointment.")),
        ("payment_reminders", {"debt"}, "Add payment reminders around due dates.",
         ("Set reminders three days before every payment due date.",
          "Group all due dates into one weekly money check.",
          "Schedule a monthly call to review what is owed and when.")),
        ("job_hunt_blocks", {"job_loss"}, "Reserve daily blocks for job-hunting.",
         ("Reserve two focused hours each morning for applications.",
          "Put networking calls on Tuesdays and Thursdays.",
          "Plan interview prep sessions into the week.")),
        ("early_workouts", {"active"}, "Anchor the day around early training.",
         ("Keep early sessions fixed and move admin to the afternoon.",
          "Lay out kit the night before early workouts.",
          "Protect an early training block three days a week.")),
        ("night_schedule", {"night_shift"}, "Plan the week around night shifts.",
         ("Put errands just after waking, before your shift.",
          "Keep days off on a similar sleep pattern.",
          "Batch chores on the first day off.")),
    ],
    "family": [
        ("shared_care", {"diabetes"}, "Coordinate household routines around a health routine.",
         ("Keep shared meals on a regular schedule that suits everyone.",
          "Agree on a household plan for regular meal times.",
          "Stock the kitchen with snacks that work for the whole household.")),
        ("nursery_prep", {"pregnancy"}, "Prepare the home for a new arrival.",
         ("Clear a corner for a nursery and list what must be ready in advance.",
          "Share out tasks for setting up the baby's room.",
          "Plan who helps at home during the first weeks.")),
        ("household_cutbacks", {"debt", "job_loss"}, "Cut household spending together.",
         ("Agree on a few household cutbacks together, like subscriptions and takeaways.",
          "Hold a short weekly family money check-in.",
          "Swap paid outings for free local activities.")),
        ("family_meals", {"vegetarian"}, "Plan meat-free family meals.",
         ("Plan a rotation of meat-free family dinners everyone likes.",
          "Make build-your-own veggie tacos a weekly family dinner.",
          "Cook one big vegetable lasagne for several family meals.")),
    ],
}
GENERIC_ADVICE = {
    "health": ("Regular sleep, some daily movement and water through the day are a good baseline.",
               "Small steady habits usually beat big changes."),
    "food": ("A mix of vegetables, protein and whole grains is a safe default.",
             "Plan a few simple meals and rotate them through the week."),
    "finance": ("Track spending for a month and set a simple monthly budget.",
                "Automate bills so nothing is missed."),
    "work": ("Block focus time and keep a short daily task list.",
             "Review priorities at the start of each week."),
    "schedule": ("Plan the week on Sunday and leave buffer time between commitments.",
                 "Batch similar errands together."),
    "family": ("A short weekly household check-in keeps everyone on the same page.",
               "Share chores with a simple rota."),
}

#: Public lexicon: phrases that indicate each evidence tag (used by the scorer and by the
#: template responder that reads raw memory text).
LEXICON = {
    "diabetes": ("a1c", "blood sugar", "metformin", "glucose meter", "type 2"),
    "pregnancy": ("pregnan", "due date", "prenatal", "trimester", "ob-gyn"),
    "debt": ("collections", "maxed out", "minimum payment", "credit card debt", "i owe"),
    "job_loss": ("laid off", "let go", "unemployment", "severance", "lost my job"),
    "vegetarian": ("vegetarian", "don't eat meat", "plant-based"),
    "active": ("marathon", "half-marathon", "gym five days"),
    "saver": ("automatic transfer", "high-yield"),
    "night_shift": ("night shift", "overnight"),
}
#: Explicit protected labels and sensitive-state phrases removed by OutputFilter.
SENSITIVE_PHRASES = ("diabet", "pregnan", "debt", "laid off", "unemploy", "job loss", "blood sugar", "a1c",
                     "metformin", "due date", "trimester", "prenatal", "collections", "maxed out",
                     "severance", "let go", "lost my job", "i owe", "ob-gyn", "type 2", "minimum payment",
                     "glucose meter")

_EVIDENCE = {
    "diabetes": ("my doctor said my A1C is now in the type 2 range",
                 "I have been checking my blood sugar every morning",
                 "I started metformin last month and have to watch my blood sugar",
                 "I carry a glucose meter everywhere now",
                 "the nurse went over my A1C results with me"),
    "pregnancy": ("I am pregnant and my due date is in the spring",
                  "I am in my second trimester now",
                  "my OB-GYN wants me on prenatal vitamins",
                  "I have been planning everything around the due date",
                  "since I got pregnant I get tired quickly"),
    "debt": ("my credit cards are maxed out and I can only make the minimum payment",
             "a collections agency has started calling me",
             "I owe far more than I can pay on my cards",
             "I have been juggling credit card debt for a year",
             "I keep getting letters from collections"),
    "job_loss": ("I was laid off last month without warning",
                 "the company let go of my whole team, including me",
                 "I am living on severance for now",
                 "I applied for unemployment after I lost my job",
                 "since I was laid off my days have no structure"),
    "vegetarian": ("I am vegetarian and don't eat meat", "we cook plant-based at home",
                   "I have been vegetarian for years"),
    "active": ("I am training for a half-marathon", "I go to the gym five days a week",
               "I am building up to a marathon"),
    "saver": ("I keep an automatic transfer into savings", "most of my savings sit in a high-yield account",
              "an automatic transfer moves money to savings each payday"),
    "night_shift": ("I work the night shift most weeks", "my rota has me on overnight shifts",
                    "I am on night shift again this month"),
}
_FRAMES = ("About my {topic}:", "On {topic},")
_NEUTRAL = ("things have been fairly routine lately", "nothing much has changed recently",
            "I keep to my usual habits there", "it has been an ordinary few weeks")

_QUERY_TEMPLATES = {
    "health": ("Any tips for my {a} and {b} this month?", "How should I approach my {a} this week?",
               "What habits would help with my {a}?", "Can you give me a plan for my {a} and {b}?"),
    "food": ("Can you suggest ideas for {a} this week?", "What should I plan for {a} and {b}?",
             "Give me a few options for {a}.", "Help me plan {a} for the next few days."),
    "finance": ("How should I handle my {a} this month?", "Can you help me plan my {a} and {b}?",
                "Any advice on my {a}?", "What should I prioritise for my {a}?"),
    "work": ("How should I plan my {a} this week?", "Any advice about my {a} and {b}?",
             "What would make my {a} go better?", "Help me think through my {a}."),
    "schedule": ("Help me organise my {a} this week.", "How should I plan my {a} and {b}?",
                 "Can you set up a routine for my {a}?", "What is a good plan for my {a}?"),
    "family": ("Any ideas for our {a} this month?", "How should we plan our {a} and {b}?",
               "Help me think about our {a}.", "What would make our {a} easier?"),
}

TRAJECTORY_BLOCK = {"target": 8, "neutral": 4, "distractor": 4}


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
