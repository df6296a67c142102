"""Scenario-driven attack games against a running :class:`~fedmem.federation.engine.Federation`.

The adversary library of :mod:`fedmem.attacks.observable`, :mod:`fedmem.attacks.support` and
:mod:`fedmem.attacks.federation_games` driven through the public client API only
(``Federation.connect()``); the operator's audit log, the accountant and the ground truth are
read for evaluation only.

* :func:`run_reconstruction`: (a) the adaptive cardinality-reconstruction stream.
* :func:`run_games`: membership games (world with / without a worst-case record, alive at
  once) for every observable: (b) differencing, (c) noise scale, refusal content, admission
  oracle (offline boundary search), timing (interleaved), silent-retry and near-duplicate
  averaging, float low-bit reachability (:mod:`fedmem.attacks.float_bits`, on the same
  single-query trials); every trial from a fresh principal.
* :func:`run_spreading`: one adversary spread over many principals (real budgets).
* :func:`run_retries`: (d) one query re-asked ``r`` times, declared and silent.

Each function takes library objects: the federation's :class:`FederationConfig`, the
attack's :class:`AttackParams`, the data, a federation factory (:data:`NewFederation`: the
run's Ray address and compute parties bound in), an accountant per world, and ``rng_for``
(seeded RNG streams by name). The scenario is turned into these once, in
:mod:`fedmem.experiments.support_leak`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from fedmem.attacks import observable as O
from fedmem.attacks.adaptive import AdaptiveAdversary
from fedmem.attacks.federation_games import (GAME_ATTACKS, VALUE_ATTACKS, dp_channels_expected,
                                             exact_mean, float_bits_score, float_hypotheses, has_support_event,
                                             is_broadcast, leaf_events, leak_reasons, neighbours, noise_std_of_n,
                                             reference_support, relevant_selection, worst_case_candidate)
from fedmem.attacks.observable import observations
from fedmem.attacks.support import (average_releases, differencing_score, reconstruct_cardinality, reconstruct_count,
                                    value_score)
from fedmem.bench.shards import sample_queries
from fedmem.errors import SupportPrivacyViolation
from fedmem.federation.config import FederationConfig

NewFederation = Callable[..., object]
"""``new_federation(config, data, accountant, rng)``: a running Federation (Ray address and compute
parties bound in by the caller)."""


@dataclass(frozen=True)
class AttackParams:
    """The attacks' knobs (the scenario's ``[attack]`` section, as plain values)."""

    attacks: tuple[str, ...]
    queries: int
    anchor_noise: float
    step: float
    explore: float
    targets: int
    repeats: int
    r: int
    near_duplicate_radius: float
    timing_trials: int
    references: int
    boundary_tolerance: int
    sybils: int
    sybil_queries: int
    retry_counts: tuple[int, ...]
    neighbours: str
    accountant: str


def _no_progress(iterable: Iterable, total: int | None = None, description: str = "") -> Iterator:
    return iter(iterable)


@dataclass
class QueryRecord:
    index: int
    family: str
    retry_of: int | None
    released: bool
    reasons: tuple
    channels: tuple
    estimate: float
    channel_used: str
    true_n: int
    count_est: float
    count_true: int
    mse: float
    leaky: bool
    bookings: int
    booked_events: int         # DP events (leaves) booked for this query
    uncovered: bool            # released with a channel the bookings do not cover
    eps_after: float


# ------------------------------------------------------------------- (a) reconstruction
def run_reconstruction(f: FederationConfig, a: AttackParams, data, fed, acc, rng_for,
                       progress=_no_progress) -> list[QueryRecord]:
    """The adaptive stream: one query at a time (the next depends on this answer).

    The adversary is one principal (``fed.connect()``); refusals are read as such. The
    reasons and bookings come from the operator's audit log and accountant (evaluation
    only, never shown to the adversary).
    """
    arng = rng_for("adversary")
    anchors = data.centers + a.anchor_noise * arng.standard_normal(data.centers.shape) / math.sqrt(f.key_dim)
    adv = AdaptiveAdversary(anchors, arng, shards=f.shards, k_local=f.k_local, step=a.step, explore=a.explore)
    client = fed.connect()
    std_of_n = noise_std_of_n(f)
    records: list[QueryRecord] = []
    norms_sq: list[float] = []   # the adversary's own history of ||released||^2
    for _ in progress(range(a.queries), a.queries, "adaptive queries"):
        p = adv.next_query()
        before = acc.count
        resp = None
        try:
            resp = client.retrieve(p.q, family=p.family, retry_of=p.retry_of)
        except SupportPrivacyViolation:
            pass
        last = fed.audit[-1] if fed.audit else None
        reasons = tuple(last.reasons) if last is not None else ()
        if last is not None and last.decision == "admitted_fallback":
            reasons = reasons + ("(answered by the support-safe broadcast)",)
        adv.observe(p, resp)
        truth = fed.ground_truth(p.q)
        hist = acc.history[before:] if acc.count > before else []
        n_events = sum(leaf_events(b.event) for b in hist)
        if resp is not None:
            # signal prior learnt from past answers: the quietest releases (largest n) are ~ ||mean||^2
            sig = float(np.min(norms_sq)) if len(norms_sq) >= 10 else f.clip ** 2 / 2
            est, used = reconstruct_cardinality(resp, shards=f.shards, k_local=f.k_local, noise_std_of_n=std_of_n,
                                                signal_sq=sig)
            cest = reconstruct_count(resp, shards=f.shards, k_local=f.k_local, noise_std_of_n=std_of_n,
                                     signal_sq=sig)
            norms_sq.append(float(np.sum(np.asarray(resp.value, dtype=np.float64) ** 2)))
            bcast = is_broadcast(f) or resp.selection == "broadcast"
            exact = relevant_selection(data, p.q, f)[1] if bcast else exact_mean(truth)
            mse = float(np.mean((np.asarray(resp.value) - exact) ** 2)) if exact is not None else float("nan")
            why = leak_reasons(resp, truth, f)
            channels = tuple(resp.channels)
            uncovered = bool(why) or n_events < dp_channels_expected(resp, f)
        else:
            uncovered = False
            est, cest, used, mse, why, channels = float("nan"), float("nan"), "rejected", float("nan"), [], ()
        eps = acc.spent(f.delta) if acc.count else 0.0
        records.append(QueryRecord(p.index, p.family, p.retry_of, resp is not None, reasons, channels, est, used,
                                   reference_support(data, p.q, f, truth), cest,
                                   relevant_selection(data, p.q, f)[2] if is_broadcast(f) else int(truth.count),
                                   mse, bool(why),
                                   acc.count - before, n_events, uncovered, eps))
    return records


def _ask_trials(fed, qs, per_trial: int, max_batch: int):
    """Ask ``qs`` in trials of ``per_trial`` consecutive queries, each trial from its own fresh
    principal, batched across principals. Returns (observations, what each trial booked), the
    latter read from the federation's own per-principal accountant (what it charged, not what
    the responses claim): ``(epsilon, mu)`` per trial, ``mu`` the exact GDP parameter when
    everything the trial booked is Gaussian, else None."""
    qs = np.asarray(qs, dtype=np.float64)
    n_trials = qs.shape[0] // per_trial
    pids = [fed.connect().principal for _ in range(n_trials)]
    plist = [pids[i // per_trial] for i in range(n_trials * per_trial)]
    obs = []
    for i in range(0, len(plist), max_batch):
        t0 = time.perf_counter()
        got = fed.retrieve_many(qs[i:i + max_batch], principal=plist[i:i + max_batch])
        obs += observations(got, (time.perf_counter() - t0) / max(1, len(got)))
    return obs, [fed.gateway.principal_booked(p) for p in pids]


def _count_fn(data, f):
    """The adversary's offline count of selected records for a query (it knows this dataset)."""
    def count(q):
        if is_broadcast(f):
            return f.shards * f.k_local
        if f.selection == "topk":
            return f.k
        return relevant_selection(data, q, f)[2]
    return count


def _topic_directions(centers) -> np.ndarray:
    """Directions the admission-oracle search moves the query toward: every topic centre and
    every pair of them (the adversary knows the dataset in the DP game)."""
    c = np.asarray(centers, dtype=np.float64)
    pairs = [c[i] + c[j] for i, j in itertools.combinations(range(len(c)), 2)]
    return np.array(pairs + list(c)) if pairs else c


def game_config(config: FederationConfig) -> FederationConfig:
    """The scenario's federation with every budget lifted (``math.inf``).

    Budget refusals are decided from public state, so they cannot separate the worlds;
    lifting them only gives the adversary more answers, which makes the audit
    conservative (it can find more leakage, never less).
    """
    lifted = {k: math.inf for k in ("epsilon_budget", "total_epsilon_budget", "support_budget_bits",
                                     "total_support_budget_bits")}
    return dataclasses.replace(config, **lifted)


def run_games(f: FederationConfig, a: AttackParams, data, new_federation: NewFederation, world_accountant,
              rng_for, progress=_no_progress) -> dict:
    """Membership games: for each target, a world with and a world without the record.

    Both worlds run at once (so the timing attack can interleave them). Per world each
    attack gets ``repeats`` trials from its own principal; the adversary's reference runs
    (its knowledge of the neighbour without the record, as in the DP game) come from a
    separate principal on that world. Returns per attack the positive/negative scores
    and the epsilon booked for one trial.
    """
    want = [x for x in GAME_ATTACKS if x in a.attacks]
    if "float_bits" not in want and set(VALUE_ATTACKS) & set(want):
        want.append("float_bits")
    trng = rng_for("targets")
    out: dict = {name: {"pos": [], "neg": [], "booked": [], "booked_pos": [], "booked_neg": []} for name in want}
    out.update({"queries": 0, "refused": {"with": 0, "without": 0}, "eps_one": [], "n_target": [],
                "boundary_found": 0})
    config = game_config(f)
    mb = config.max_batch
    R, T = a.repeats, a.r

    for t in progress(range(a.targets), a.targets, "membership targets"):
        shard, key, value, _ = worst_case_candidate(data, trng, f)
        worlds = neighbours(data, shard, key, value, a.neighbours, rng_for("filler", t))
        feds = {}
        try:
            for w, wdata in worlds.items():
                feds[w] = new_federation(config, wdata, world_accountant(f"target{t}-{w}"), rng_for("engine", t, w))
            bq, with_answered = key, True
            if "admission_oracle" in want:
                bq, _, n_with, found = O.search_boundary_query(
                    _count_fn(worlds["without"], f), _count_fn(worlds["with"], f), key,
                    O.tolerance_boundary(f.n_bound, a.boundary_tolerance), rng_for("boundary", t),
                    directions=_topic_directions(worlds["without"].centers), steps=30)
                out["boundary_found"] += int(found)
                with_answered = abs(n_with - f.n_bound) <= a.boundary_tolerance   # the hypothesised rule
            fbad = None
            if "float_bits" in want:
                fbad = float_hypotheses(feds, {w: feds[w].ground_truth(key) for w in feds})
            refs, _ = _ask_trials(feds["without"], np.repeat(key[None], a.references, axis=0), 1, mb)
            ref_fps = {O.fingerprint(o) for o in refs}
            reference = refs[0].response
            for w, fed in feds.items():
                tag = "pos" if w == "with" else "neg"
                single, booked = _ask_trials(fed, np.repeat(key[None], R, axis=0), 1, mb)
                out["queries"] += len(single)
                out["refused"][w] += sum(not o.answered for o in single)
                out["eps_one"] += [e for o, (e, _) in zip(single, booked) if o.answered]
                if w == "with":
                    out["n_target"].append(int(fed.ground_truth(key).count))
                for o, e in zip(single, booked):
                    scores = {"differencing": lambda: differencing_score(o.response, reference, shard),
                              "noise_scale": lambda: value_score(o.response, value),
                              "refusal_content": lambda: O.category_score(o, ref_fps),
                              "float_bits": lambda: float_bits_score(o, fbad, fed.policy.selection)}
                    for name, fn in scores.items():
                        if name in want:
                            out[name][tag].append(fn())
                            _book(out[name], tag, e)
                if "admission_oracle" in want:
                    adm, booked = _ask_trials(fed, np.repeat(bq[None], R, axis=0), 1, mb)
                    out["queries"] += len(adm)
                    for o, e in zip(adm, booked):
                        out["admission_oracle"][tag].append(O.answered_score(o, with_answered))
                        _book(out["admission_oracle"], tag, e)
                for name in ("retry_averaging", "near_duplicate"):
                    if name not in want:
                        continue
                    if name == "retry_averaging":
                        qs = np.repeat(key[None], R * T, axis=0)
                    else:
                        nrng = rng_for("near-duplicates", t)    # the same perturbations in both worlds
                        qs = np.concatenate([O.near_duplicates(key, T, a.near_duplicate_radius, nrng)
                                             for _ in range(R)])
                    obs, booked = _ask_trials(fed, qs, T, mb)
                    out["queries"] += len(obs)
                    for i in range(R):
                        out[name][tag].append(O.averaged_value_score(obs[i * T:(i + 1) * T], value))
                        _book(out[name], tag, booked[i])
            if "timing" in want:
                order_rng = rng_for("timing-order", t)
                for _ in range(a.timing_trials):
                    for w in (("with", "without") if order_rng.random() < 0.5 else ("without", "with")):
                        client = feds[w].connect()
                        o = O.observe_one(client, key)
                        out["timing"]["pos" if w == "with" else "neg"].append(O.latency_score(o))
                        _book(out["timing"], "pos" if w == "with" else "neg",
                              feds[w].gateway.principal_booked(feds[w].gateway.resolve(client.principal)))
                        out["queries"] += 1
        finally:
            for fed in feds.values():
                fed.close()
    return out


def _book(g: dict, tag: str, booked: tuple) -> None:
    """Record what one trial booked, ``(epsilon, mu or None)``, per world (each world's attack is
    judged against what that world booked: :func:`booked_per_world`, :func:`booked_mu_per_world`)."""
    eps, mu = booked
    g["booked"].append(eps)
    g["booked_pos" if tag == "pos" else "booked_neg"].append(eps)
    g.setdefault("mu_pos" if tag == "pos" else "mu_neg", []).append(mu)


def run_spreading(config: FederationConfig, a: AttackParams, data, new_federation: NewFederation,
                  world_accountant, rng_for):
    """``principal_spreading``: a Sybil spreads one query over many principals (real budgets)."""
    q = sample_queries(data, 1, rng_for("spreading-query"))[0]
    fed = new_federation(config, data, world_accountant("spreading"), rng_for("engine", "spreading"))
    try:
        clients = [fed.connect() for _ in range(a.sybils)]
        obs = []
        for i in range(a.sybil_queries):
            c = clients[i % len(clients)]
            obs += O.observe_batch(c, q[None], [f"label-{i}"])     # a fresh label every time, too
        unbooked = any(o.answered and o.response.selection != "broadcast" and
                       any(ch in o.response.channels for ch in ("receipts", "count", "count:implicit",
                                                                  "value:calibration"))
                       and not has_support_event(o.response) for o in obs)
        rep = O.spreading_report(obs, a.sybils, config.delta, config.total_support_budget_bits,
                                 config.total_epsilon_budget, a.accountant)
        if unbooked:   # exact support channels: no finite bound on what they reveal
            rep = O.SpreadingReport(rep.principals, rep.queries, rep.answered, math.inf,
                                    rep.total_support_budget_bits, rep.epsilon_seen, rep.total_epsilon_budget,
                                    "EXCEEDS TOTAL BUDGET")
        return rep
    finally:
        fed.close()


# ------------------------------------------------------------------------ (d) retries
def run_retries(f: FederationConfig, a: AttackParams, data, new_federation: NewFederation, world_accountant,
                rng_for) -> list[list]:
    q = sample_queries(data, 1, rng_for("retry-query"))[0]
    rows = []
    rmax = max(a.retry_counts)
    for mode in ("declared", "silent"):
        acc = world_accountant(f"retries-{mode}")
        fed = new_federation(f, data, acc, rng_for("engine", "retries", mode))
        try:
            client = fed.connect()
            exact = relevant_selection(data, q, f)[1] if is_broadcast(f) else exact_mean(fed.ground_truth(q))
            values, eps, refused, first = [], [], 0, None
            for i in range(rmax):
                try:
                    r = client.retrieve(q, family="retry",
                                        retry_of=(first if mode == "declared" and i > 0 else None))
                    if first is None:
                        first = r.query_id
                    if exact is None and r.selection == "broadcast":
                        exact = relevant_selection(data, q, f)[1]
                    values.append(np.asarray(r.value))
                except SupportPrivacyViolation:
                    refused += 1
                eps.append(client.epsilon_spent)
                if (i + 1) in a.retry_counts:
                    mse = (float(np.mean((average_releases(values) - exact) ** 2))
                           if values and exact is not None else float("nan"))
                    rows.append([mode, i + 1, len(values), refused, mse, eps[0], eps[-1]])
        finally:
            fed.close()
    return rows
