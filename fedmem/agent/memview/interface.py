"""The DP-MemView interface: Algorithm 1 with the interface contract C1-C6.

:class:`MemViewInterface` holds the private store; its only output per turn is a
:class:`Release` (the view names chosen for the active slots and the observable control
``c_t``). Raw memory and internal scores never leave the object: there is no accessor
for them, ``repr`` hides them, and the responder is handed only ``(q_t, v_t, tau_<t)``.

Per slot-level operation (Algorithm 1, lines 4-16)::

    R      = ReadPolicy(q, g, h)                      content-independent (C4)
    Gamma  = Gamma*(R) = {a : R meets I_a}           Eq. (4), complete charging (C2)
    eps    = min_{a in Gamma} B_a / K                 online mode, or
           = min_{a in Gamma} B_a / C_a               preallocated mode (C_a planned charges)
    if the ledger admits L_a + eps <= B_a for all a in Gamma (booked atomically, C5):
        u = scorer(q, V_g, M_R) ; v ~ EM_eps,Delta_u(u)     Eq. (5)-(7) (C3)
    else:
        v = v_g^gen (fixed generic view, zero cost)

The ledger is a durable :class:`~fedmem.dp.AttributeLedger`; the charge is booked
*before* the view is sampled, so a crash between the two never releases an unbooked
view. ``c_t`` (one fallback flag per active slot) depends only on the ledger state,
which is itself a function of the released prefix (C6).

Ablations (Table 4) are explicit: a configuration that violates C1 (store-dependent
vocabulary), C2 (a charge rule that omits an affected attribute), C3 (argmax instead
of the EM: CappedArgmax) or C5 (no cap: NoCap) raises
:class:`~fedmem.errors.ContractViolation` unless ``unsafe_ablation=`` names exactly that
violation. For every variant the interface also keeps the *reconstructed* charge of
each attribute (what complete charging with Gamma* would have booked), which is the DP
bound that Table 4 reports.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping, Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.agent.memview.policy import MemoryStore, MemViewPolicy, Query, Vocabulary
from fedmem.dp import AttributeLedger, DurableStore, ExponentialMechanism
from fedmem.errors import ContractViolation

MODES = ("online", "preallocated")
UNSAFE_ABLATIONS = {
    "C1": "store-dependent view vocabulary",
    "C2": "IncompleteCharge: charge set omits an affected attribute",
    "C3": "CappedArgmax: deterministic highest-score selection instead of the EM",
    "C5": "NoCap: no prospective cap check or generic fallback",
}
NO_CAP = 1e300  # NoCap ablation: caps so large they never bind


@dataclass(frozen=True)
class SlotRelease:
    slot: str
    view: str
    fallback: bool  # observable control: True when the cap check returned the generic view


@dataclass(frozen=True)
class Release:
    """What leaves the interface at turn t: views ``v_t`` and controls ``c_t``."""

    turn: int
    query: Query
    slots: tuple[SlotRelease, ...]

    @property
    def views(self) -> tuple[tuple[str, str], ...]:
        return tuple((s.slot, s.view) for s in self.slots)

    @property
    def control(self) -> tuple[bool, ...]:
        return tuple(s.fallback for s in self.slots)


@functools.lru_cache(maxsize=4096)
def _share(cap: float, n: int) -> float:
    """Largest float eps with n * eps <= cap exactly (the ledger sums rationals), so that
    n equal charges always fit under the cap despite float rounding of cap / n."""
    eps = cap / n
    while Fraction(eps) * n > Fraction(cap):
        eps = math.nextafter(eps, 0.0)
    return eps


def plan_charges(policy: MemViewPolicy, queries: Sequence[Query]) -> dict[str, int]:
    """C_a: the planned number of charged selections of each attribute over a public plan.

    Counts (t, g) with ``a in Gamma*(R_{t,g})``; uses only public queries and policy.
    """
    counts = {a: 0 for a in policy.attributes}
    for q in queries:
        for slot in policy.route(q):
            for a in policy.charge_set(policy.read_set(q, slot)):
                counts[a] += 1
    return counts


def first_attribute_only(gamma_star: frozenset, policy: MemViewPolicy) -> frozenset:
    """IncompleteCharge's rule: when a read meets several groups, charge only the first
    attribute in the policy's (alphabetical) order."""
    return frozenset(sorted(gamma_star)[:1])


class MemViewInterface:
    """Trusted DP-MemView interface over one private store (one ledger per store/trajectory)."""

    def __init__(self, policy: MemViewPolicy, store: MemoryStore, scorer, *, caps: Mapping[str, float],
                 rng: np.random.Generator, mode: str = "online", K: int | None = 3,
                 planned: Mapping[str, int] | None = None, ledger_store: DurableStore | None = None,
                 name: str = "memview", unsafe_ablation: str | None = None,
                 charge_rule: Callable[[frozenset, MemViewPolicy], frozenset] | None = None,
                 selection: str = "em", enforce_cap: bool = True,
                 vocabulary_fn: Callable[[str, MemoryStore], Vocabulary] | None = None):
        if not isinstance(policy, MemViewPolicy):
            raise TypeError(f"policy must be a MemViewPolicy. Found {type(policy).__name__}.")
        if not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore. Found {type(store).__name__}.")
        if store.layout != policy.layout:
            raise ValueError("store must use the policy's layout (same positions and slots).")
        V.rng_check("rng", rng)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}. Found {mode!r}.")
        if selection not in ("em", "argmax"):
            raise ValueError(f"selection must be 'em' or 'argmax'. Found {selection!r}.")
        if unsafe_ablation is not None and unsafe_ablation not in UNSAFE_ABLATIONS:
            raise ValueError(f"unsafe_ablation must be one of {sorted(UNSAFE_ABLATIONS)} or None. "
                             f"Found {unsafe_ablation!r}.")
        sens = getattr(scorer, "sensitivity", None)
        if sens is None or not callable(getattr(scorer, "scores", None)):
            raise TypeError("scorer must provide scores(...) and a declared sensitivity (Eq. 6).")
        self._sensitivity = V.positive("scorer.sensitivity", sens)
        missing = [a for a in policy.attributes if a not in caps]
        extra = [a for a in caps if a not in policy.attributes]
        if missing or extra:
            raise ValueError(f"caps must give B_a for exactly the protected attributes {list(policy.attributes)}. "
                             f"Found missing {missing!r}, unknown {extra!r}.")
        self.caps = {a: V.positive(f"caps[{a!r}]", caps[a]) for a in policy.attributes}
        if mode == "online":
            self.K = V.positive_int("K", K)
            self.planned = None
        else:
            if planned is None:
                raise ValueError("planned must give C_a (planned charges) in preallocated mode. Found None.")
            self.planned = {a: int(planned.get(a, 0)) for a in policy.attributes}
            if any(c < 0 for c in self.planned.values()):
                raise ValueError(f"planned must hold non-negative counts. Found {dict(planned)!r}.")
            self.K = None

        # ---- contract checks (fail closed unless the violation is named)
        violations = set()
        if vocabulary_fn is not None:
            violations.add("C1")
        if charge_rule is not None:
            for intent in policy.intents.values():
                for slot, reads in intent.reads.items():
                    gs = policy.charge_set(reads)
                    if not gs <= frozenset(charge_rule(gs, policy)):
                        violations.add("C2")
        if selection == "argmax":
            violations.add("C3")
        if not enforce_cap:
            violations.add("C5")
        if len(violations) > 1 or (violations and unsafe_ablation not in violations):
            raise ContractViolation(
                f"configuration violates {sorted(violations)} "
                f"({'; '.join(UNSAFE_ABLATIONS[v] for v in sorted(violations))}); pass unsafe_ablation= naming "
                f"the single violation only to reproduce an ablation. Found unsafe_ablation={unsafe_ablation!r}.")
        if unsafe_ablation is not None and unsafe_ablation not in violations:
            raise ValueError(f"unsafe_ablation={unsafe_ablation!r} names a violation this configuration does not "
                             f"have ({UNSAFE_ABLATIONS[unsafe_ablation]}).")
        self.unsafe_ablation = unsafe_ablation

        self.policy = policy
        self.mode = mode
        self.__store = store
        self.__scorer = scorer
        self.__rng = rng
        self.__vocabulary_fn = vocabulary_fn
        self._charge_rule = charge_rule
        self._selection = selection
        ledger_caps = self.caps if enforce_cap else {a: NO_CAP for a in self.caps}
        self.ledger = AttributeLedger(ledger_caps, store=ledger_store, name=name)
        self._ledger_caps = {a: Fraction(c) for a, c in ledger_caps.items()}
        # Lower bound on the durable ledger's L_a (charges this object booked): a refusal
        # it predicts is certain, so the durable ledger is consulted only when it may admit.
        self._own = {a: Fraction(v) for a, v in self.ledger.spent().items()}
        self._reconstructed = {a: Fraction(0) for a in policy.attributes}
        self._history: list[Release] = []

    def __repr__(self) -> str:
        return (f"MemViewInterface(mode={self.mode!r}, caps={self.caps!r}, unsafe_ablation={self.unsafe_ablation!r}, "
                f"store=<private>)")

    def __reduce__(self):  # the private store must not be copied out by pickling
        raise TypeError("MemViewInterface holds a private store and cannot be pickled.")

    # ------------------------------------------------------------------ public state
    @property
    def history(self) -> tuple[Release, ...]:
        return tuple(self._history)

    def spent(self) -> dict[str, float]:
        """Operational ledger L_a (what this variant booked)."""
        return self.ledger.spent()

    def reconstructed_spent(self) -> dict[str, float]:
        """Sum of eps over admitted selections with a in Gamma*(R): the attribute's true
        cumulative pure-DP cost (equals :meth:`spent` for the compliant interface)."""
        return {a: float(v) for a, v in self._reconstructed.items()}

    def epsilon_for(self, gamma: frozenset) -> float:
        """BudgetRule (Algorithm 1, line 8): online B/K or preallocated B/C_a, min over Gamma."""
        if not gamma:
            raise ValueError("gamma must name at least one attribute.")
        if self.mode == "online":
            return min(_share(self.caps[a], self.K) for a in gamma)
        counts = [self.planned[a] for a in gamma]
        if min(counts) < 1:
            raise ContractViolation(f"preallocated mode has no planned charge for {sorted(gamma)}; "
                                    f"the plan must cover every charged selection.")
        return min(_share(self.caps[a], self.planned[a]) for a in gamma)

    def _charge(self, gamma: frozenset, eps: float, label: str) -> bool:
        """Prospective cap check + booking (C5), atomic in the durable ledger."""
        e = Fraction(eps)
        if any(self._own[a] + e > self._ledger_caps[a] for a in gamma):
            return False
        if not self.ledger.try_charge(gamma, eps, label=label):
            return False
        for a in gamma:
            self._own[a] += e
        return True

    # ------------------------------------------------------------------ Algorithm 1
    def answer(self, query: Query) -> Release:
        """Run one turn; return only the released views and controls."""
        if not isinstance(query, Query):
            raise TypeError(f"query must be a Query. Found {type(query).__name__}.")
        t = len(self._history)
        slots = []
        for slot in self.policy.route(query, self._history):
            reads = self.policy.read_set(query, slot, self._history)
            gamma_star = self.policy.charge_set(reads)
            gamma = gamma_star if self._charge_rule is None else frozenset(self._charge_rule(gamma_star, self.policy))
            if not gamma_star <= gamma and self.unsafe_ablation != "C2":
                raise ContractViolation(f"charge set {sorted(gamma)} omits affected attributes "
                                        f"{sorted(gamma_star - gamma)} (C2).")
            vocab = self.policy.vocabularies[slot] if self.__vocabulary_fn is None \
                else self.__vocabulary_fn(slot, self.__store)
            if not gamma_star:
                # read set meets no protected group: the view is adjacency-invariant for every a
                # (Lemma 1); the paper's router never activates such slots, we release generic.
                slots.append(SlotRelease(slot, vocab.generic.name, False))
                continue
            eps = self.epsilon_for(gamma if gamma else gamma_star)
            # prospective cap check and booking in one transaction, before any release (C5)
            admitted = self._charge(gamma, eps, label=f"t={t} slot={slot}") if gamma else True
            if not admitted:
                slots.append(SlotRelease(slot, vocab.generic.name, True))
                continue
            for a in gamma_star:  # booked for the reconstruction before anything is released
                self._reconstructed[a] += Fraction(eps)
            items = tuple(self.__store.items[p] for p in reads)
            u = self.__scorer.scores(self.policy, query, slot, items, vocabulary=vocab)
            if self._selection == "em":
                k = ExponentialMechanism(eps, self._sensitivity).select(u, self.__rng)
            else:
                k = int(np.argmax(u))
            slots.append(SlotRelease(slot, vocab.views[k].name, False))
        release = Release(t, query, tuple(slots))
        self._history.append(release)
        return release
