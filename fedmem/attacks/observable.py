"""Attacks on everything a querying agent can observe (fedmem's threat model).

The threat model (``docs/federation.md``): a querying agent sees every field of a
:class:`~fedmem.federation.engine.Response`, every exception (type, text, attributes,
length), and whether and when an answer arrives. Each of these must be booked or
independent of the private data. The attacks here read exactly those things through
the public client API (:meth:`Federation.connect` -> ``MemoryClient``); nothing else.

Every attack is a membership game in the DP sense: the adversary knows the neighbouring
datasets (with and without one target record; it may search them offline) and must tell
which one the federation holds. An attack turns one *trial* (one or a few queries and
what came back) into a score; :func:`fedmem.attacks.support.membership_report` turns
the scores of both worlds into AUC (+CI), TPR at 1% FPR and a Clopper-Pearson epsilon
lower bound, which :func:`fedmem.attacks.verdict.judge` compares with the epsilon booked for what the
adversary saw in one trial (:func:`booked_epsilon`).

Attacks (names as in the reports):

* ``refusal_content``: the observation *category* — refusal type, text, attributes,
  text length; or for an answer, its selection and channel names — compared with the
  categories the adversary sees on the neighbour it knows (a reference run). A
  data-dependent refusal text (e.g. one naming the realized count) separates the worlds.
* ``admission_oracle``: the adversary searches offline (:func:`search_boundary_query`)
  for a query whose selected count, with and without the target, straddles an admission
  boundary a data-dependent gateway might use (``|n - n_bound| <= tolerance``), then
  reads only "answered or refused".
* ``timing``: the wall time of one query, asked alternately in both worlds (interleaved,
  so machine drift hits both alike).
* ``retry_averaging``: ``r`` silent re-asks of one query by one principal, values averaged.
* ``near_duplicate``: ``r`` slightly perturbed copies of the query, values averaged.
* ``principal_spreading`` (a budget check, not a membership game,
  :func:`spreading_report`): a Sybil connects many principals and spreads queries over
  them; what its answers reveal through support channels (composed bits) is compared
  with the federation's total support budget.

The older support attacks (receipt differencing, value/noise-scale, cardinality
reconstruction) are in :mod:`fedmem.attacks.support`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.attacks.support import REJECTED_SCORE, value_score
from fedmem.errors import FedmemError

OBSERVABLE_ATTACKS = ("refusal_content", "admission_oracle", "timing", "retry_averaging", "near_duplicate")


# ------------------------------------------------------------------ observations
@dataclass(frozen=True)
class Observation:
    """What one query gave the adversary: the response, or the refusal, and the time it took."""

    response: object | None          # Response when answered
    refusal: BaseException | None    # the exception when refused
    latency_s: float

    @property
    def answered(self) -> bool:
        return self.response is not None


def fingerprint(obs: Observation) -> str:
    """The observation's category: everything but the noised numbers.

    Refusals: exception type, text, text length and every attribute except the public
    sequential ``query_id``. Answers: "answered", the selection and the channel names.
    """
    if obs.response is None:
        exc = obs.refusal
        attrs = {k: v for k, v in sorted(vars(exc).items()) if k != "query_id"} if exc is not None else {}
        text = str(exc)
        return f"refused|{type(exc).__name__}|{len(text)}|{text}|{attrs!r}"
    r = obs.response
    return f"answered|{getattr(r, 'selection', '')}|{','.join(getattr(r, 'channels', ()))}"


def observations(results, latency_s: float) -> list[Observation]:
    """One :class:`Observation` per entry of a ``retrieve_many`` result (a Response or a refusal)."""
    return [Observation(None, r, latency_s) if isinstance(r, BaseException) else Observation(r, None, latency_s)
            for r in results]


def observe_batch(client, qs, families=None) -> list[Observation]:
    """Ask a batch through ``client.retrieve_many``; latency is the batch time per query."""
    t0 = time.perf_counter()
    got = client.retrieve_many(qs, families)
    return observations(got, (time.perf_counter() - t0) / max(1, len(got)))


def observe_one(client, q) -> Observation:
    """Ask one query through ``client.retrieve`` and time it (perf_counter)."""

    t0 = time.perf_counter()
    try:
        r = client.retrieve(q)
        return Observation(r, None, time.perf_counter() - t0)
    except FedmemError as exc:
        return Observation(None, exc, time.perf_counter() - t0)


def booked_epsilon(observations: Sequence[Observation], delta: float, kind: str = "rdp") -> float:
    """Epsilon (at ``delta``) booked for the answers the adversary saw in one trial.

    The composition (dp-accounting, through a throw-away :class:`~fedmem.dp.Accountant`)
    of the DP events the responses carry. Refusals book nothing. An answer whose event
    is unknown (``event=None`` while it carries a ``"value"`` channel) counts as infinite.
    """
    from fedmem.dp import Accountant  # lazy: loads dp_accounting (~180 ms)
    from fedmem.dp.accountant import event_from_dict  # lazy: loads dp_accounting (~86 ms)

    events = []
    for o in observations:
        if o.response is None:
            continue
        ev = getattr(o.response, "event", None)
        if ev is None:
            if "value" in getattr(o.response, "channels", ("value",)):
                return math.inf
            continue
        events.append(event_from_dict(ev))
    if not events:
        return 0.0
    acc = Accountant(kind)
    for e in events:
        acc.book(e)
    return acc.spent(delta)


# ------------------------------------------------------------------ scores
def category_score(obs: Observation, reference: set[str]) -> float:
    """``refusal_content``: 1 if the observation's category never occurred on the known neighbour."""
    return 0.0 if fingerprint(obs) in reference else 1.0


def answered_score(obs: Observation, answered_means_member: bool = True) -> float:
    """``admission_oracle``: 1 if the observation is what the adversary predicted for the world
    *with* the record (offline, from the boundary search): answered, or refused when the rule
    it hypothesises would refuse that world; else 0."""
    return 1.0 if obs.answered == answered_means_member else 0.0


def latency_score(obs: Observation) -> float:
    """``timing``: the wall time of the query, in seconds."""
    return float(obs.latency_s)


def averaged_value_score(observations: Sequence[Observation], target_value) -> float:
    """``retry_averaging`` / ``near_duplicate``: projection of the mean of the answered values
    on the target's value (``<mean r, v> / ||v||``); -1e6 when nothing was answered."""

    vals = [np.asarray(o.response.value, dtype=np.float64) for o in observations if o.answered]
    if not vals:
        return REJECTED_SCORE

    class _R:
        value = np.mean(np.stack(vals), axis=0)

    return value_score(_R, target_value)


def near_duplicates(q, r: int, radius: float, rng: np.random.Generator) -> np.ndarray:
    """``r`` unit vectors at angle about ``radius`` (radians) from ``q``: "different" queries
    that select the same records."""
    q = V.finite_array("q", q, ndim=1)
    r = V.positive_int("r", r)
    radius = V.nonnegative("radius", radius)
    V.rng_check("rng", rng)
    q = q / np.linalg.norm(q)
    z = rng.standard_normal((r, q.size))
    z -= (z @ q)[:, None] * q[None]
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    out = math.cos(radius) * q[None] + math.sin(radius) * z
    return out / np.linalg.norm(out, axis=1, keepdims=True)


# ------------------------------------------------------------------ offline boundary search
def search_boundary_query(count_without: Callable[[np.ndarray], int], count_with: Callable[[np.ndarray], int],
                          key, boundary: Callable[[int, int], bool], rng: np.random.Generator, *,
                          directions=None, tries: int = 400, max_angle: float = 1.2,
                          steps: int = 24) -> tuple[np.ndarray, int, int, bool]:
    """The adversary's offline search for an admission-oracle query (it knows both datasets).

    Moves the query from ``key`` toward each of ``directions`` (e.g. the topic centres of
    the dataset it knows: moving toward a common topic raises the selected count while the
    target may stay selected), ``steps`` points per direction, then samples random
    tangent directions (angles up to ``max_angle``) for the rest of ``tries``. Returns the
    first query whose counts ``(n_without, n_with)`` satisfy ``boundary`` — the admission
    rule a data-dependent gateway would apply flips between the worlds — else the query
    whose counts differ and whose ``n_without`` is closest to flipping. Returns ``(q,
    n_without, n_with, found)``.
    """
    key = V.finite_array("key", key, ndim=1)
    key = key / np.linalg.norm(key)
    tries = V.positive_int("tries", tries)
    steps = V.positive_int("steps", steps)
    V.rng_check("rng", rng)
    best, best_gap = key, math.inf
    best_counts = (count_without(key), count_with(key))
    candidates = []
    if directions is not None:
        for d in np.atleast_2d(V.finite_array("directions", directions)):
            d = d / np.linalg.norm(d)
            for t in np.linspace(0.0, 1.0, steps + 1)[1:]:
                q = (1 - t) * key + t * d
                if np.linalg.norm(q) > 0:
                    candidates.append(q / np.linalg.norm(q))
    for i in range(max(0, tries - len(candidates))):
        ang = max_angle * (i + 1) / tries
        candidates.append(near_duplicates(key, 1, ang * rng.uniform(0.5, 1.0), rng)[0])
    for q in candidates:
        a, b = count_without(q), count_with(q)
        if a == b:
            continue
        if boundary(a, b):
            return q, a, b, True
        gap = abs(a - b)
        if gap < best_gap:
            best, best_gap, best_counts = q, gap, (a, b)
    return best, best_counts[0], best_counts[1], False


def tolerance_boundary(n_bound: int, tolerance: int) -> Callable[[int, int], bool]:
    """The rule of a data-dependent calibration check: admitted iff ``|n - n_bound| <= tolerance``.
    The boundary is crossed when the two worlds' counts fall on different sides."""
    def crossed(a: int, b: int) -> bool:
        return (abs(a - n_bound) <= tolerance) != (abs(b - n_bound) <= tolerance)
    return crossed


# ------------------------------------------------------------------ verdicts
# One rule decides every verdict: :mod:`fedmem.attacks.verdict` (``judge`` / ``judge_counts``).
from fedmem.attacks.verdict import LEAK as LEAKS, WITHIN  # noqa: E402  (thin aliases)


def verdict(eps_lower: float, eps_booked: float, ceiling_violations: int = 0) -> str:
    """Thin alias kept for old callers: the label of :func:`fedmem.attacks.verdict.judge` when
    only the bound is known (no power, no separation test). New code calls ``judge``."""
    if eps_lower > eps_booked + 1e-12 or ceiling_violations > 0:
        return LEAKS
    return WITHIN


@dataclass(frozen=True)
class SpreadingReport:
    principals: int
    queries: int
    answered: int
    support_bits_seen: float       # composed support bits of the answers the adversary got
    total_support_budget_bits: float
    epsilon_seen: float            # composed epsilon of every answer the adversary got
    total_epsilon_budget: float
    verdict: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def spreading_report(observations: Sequence[Observation], principals: int, delta: float,
                     total_support_budget_bits: float, total_epsilon_budget: float,
                     kind: str = "rdp") -> SpreadingReport:
    """Composed support bits and epsilon of everything a Sybil adversary got across its principals.

    The support part of each answer's event is the receipts' event (``receipts`` channel
    booked as DP); the bits are its composed epsilon at ``delta`` over ln 2. A federation
    whose budgets are keyed by something the caller controls lets the adversary exceed
    the total budget: verdict ``"EXCEEDS TOTAL BUDGET"``.
    """
    sup_obs = [Observation(_EventOnly(ev), None, 0.0) for o in observations if o.answered
               for ev in support_events(o.response)]
    bits = booked_epsilon(sup_obs, delta, kind) / math.log(2.0) if sup_obs else 0.0
    eps = booked_epsilon(observations, delta, kind)
    answered = sum(o.answered for o in observations)
    over = bits > total_support_budget_bits + 1e-9 or eps > total_epsilon_budget + 1e-9
    return SpreadingReport(principals, len(observations), answered, bits, float(total_support_budget_bits), eps,
                           float(total_epsilon_budget), "EXCEEDS TOTAL BUDGET" if over else "within total budget")


def support_events(response) -> list:
    """The support part of a response's booked event: every part after the value's (the
    aggregator's plans list the value channel first), as dp-accounting events."""
    import dp_accounting

    from fedmem.dp.accountant import event_from_dict  # lazy: loads dp_accounting (~86 ms)

    ev = getattr(response, "event", None)
    if not ev:
        return []
    ev = event_from_dict(ev)
    if isinstance(ev, dp_accounting.ComposedDpEvent) and len(ev.events) > 1:
        return list(ev.events[1:])
    return []


class _EventOnly:
    """A stand-in response carrying one booked event (for composing support parts)."""

    def __init__(self, event):
        from fedmem.dp.accountant import event_to_dict  # lazy: loads dp_accounting (~86 ms)

        self.event = event_to_dict(event)
        self.channels = ("support",)
