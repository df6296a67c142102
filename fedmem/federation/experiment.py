"""``federation.support_leak``: papers/003's 40-shard attack scenario, undefended or defended.

One run builds clustered shards (:mod:`fedmem.bench.shards`), a :class:`Federation`
configured from ``[federation]`` (a mirror of :class:`FederationConfig`; the security
keys are required), and runs the adversary library of :mod:`fedmem.attacks` through the
public client API only (``Federation.connect()``):

(a) **reconstruction**: an :class:`~fedmem.attacks.adaptive.AdaptiveAdversary` (one
    principal) asks ``attack.queries`` adaptive queries; each answer's support channel is
    read back into a contributing-set size and compared with the truth. Every forwarded
    response is classified as support-leaky or not from the ground truth, and its
    bookings are compared with the channels it carried.
Membership games (:func:`run_games`): for each of ``attack.targets`` worst-case candidate
    records, a world with it and one without, alive at once; every trial from a fresh
    principal, the epsilon booked for it read from the federation's accountant. Attacks:
    (b) differencing, (c) noise scale, refusal content, admission oracle (offline boundary
    search), timing (interleaved), silent-retry and near-duplicate averaging. Each gives
    AUC (+CI), TPR@1%FPR, a Clopper-Pearson epsilon lower bound and a verdict against the
    booked epsilon (:func:`fedmem.attacks.observable.verdict`). The games lift the budgets
    (budget refusals are public, lifting them only helps the adversary).
**principal spreading** (:func:`run_spreading`): a Sybil over many principals with fresh
    labels, under the scenario's real budgets.
(d) **retries**: one query re-asked ``r`` times (declared and silent); the averaged
    release's error and the booked epsilon after ``r`` releases.

The report has tables (attack metrics with one verdict each and an overall verdict,
reconstruction, gateway and accounting, refusals by reason, utility, spreading,
retries) and plots (reconstructed vs true cardinality, membership ROC with the DP
ceiling of the booked epsilon, booked vs empirical epsilon).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, fields

import numpy as np

from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, at_least, nonnegative, open_unit, positive

ATTACKS = ("reconstruction", "differencing", "noise_scale", "refusal_content", "admission_oracle", "timing",
           "retry_averaging", "near_duplicate", "principal_spreading", "retries")
GAME_ATTACKS = ("differencing", "noise_scale", "refusal_content", "admission_oracle", "timing", "retry_averaging",
                "near_duplicate")

# ---------------------------------------------------------------------------- schema
FEDERATION_SCHEMA = {
    "shards": Param(int, 40, "number of memory shards", check=positive),
    "records_per_shard": Param(int, 50, "records on each shard", check=positive),
    "key_dim": Param(int, 128, "key embedding dimension", check=positive),
    "value_dim": Param(int, 128, "value vector dimension (the released aggregate)", check=positive),
    "clip": Param(float, 1.0, "value vectors are clipped to this L2 norm C", check=positive),
    "k_local": Param(int, 5, "k': candidates each shard sends, padded to exactly k'", check=positive),
    "selection": Param(str, help="global selection rule (required: it decides the support)",
                       choices=("topk", "threshold", "broadcast")),
    "k": Param(int, 5, "global k of topk selection", check=positive),
    "threshold": Param(float, 0.5, "score threshold of threshold selection (cosine)"),
    "parties": Param(int, 2, "MPC compute parties (2 or 3)", choices=(2, 3)),
    "mpc": Param(str, "crypten", "MPC backend: crypten (real secret sharing) or plaintext (bit-identical reference)",
                 choices=("crypten", "plaintext")),
    "noise": Param(str, "gaussian", "central DP noise on the aggregate", choices=("gaussian", "laplace")),
    "sigma": Param(float, 1.2, "noise multiplier (noise std = sigma * sensitivity)", check=positive),
    "delta": Param(float, 1e-6, "delta of the accountant and of every Gaussian release", check=open_unit),
    "calibration": Param(str, help="required. realized: noise calibrated to the denominator applied; global: noise "
                         "sized for n_bound (papers/003's flawed practice; refused with the gateway on and a "
                         "data-dependent count)", choices=("global", "realized")),
    "n_bound": Param(int, 40, "contributor count assumed by global calibration", check=positive),
    "receipts": Param(str, help="receipt (per-shard tally) policy (required)",
                      choices=("expose", "suppress", "noised", "broadcast")),
    "receipt_sigma": Param(float, 1.0, "noise multiplier of noised tallies", check=positive),
    "gateway": Param(bool, help="required: run the support-leak gateway (papers/003 Decision Boundary); false = "
                     "undefended"),
    "on_reject": Param(str, help="required. gateway: refuse, or answer by the support-safe broadcast when the primary "
                       "release cannot be admitted", choices=("raise", "rerun_broadcast")),
    "support_budget_bits": Param(float, help="required: support-channel bits allowed per principal (inf disables)",
                                 check=positive, allow_inf=True),
    "total_support_budget_bits": Param(float, help="required: support-channel bits allowed over all principals (inf "
                                       "disables)", check=positive, allow_inf=True),
    "epsilon_budget": Param(float, help="required: epsilon (at delta) allowed per principal (inf disables)",
                            check=positive, allow_inf=True),
    "total_epsilon_budget": Param(float, help="required: epsilon (at delta) allowed over all principals (inf disables)",
                                  check=positive, allow_inf=True),
    "max_batch": Param(int, 1024, "most queries per retrieve_many call", check=positive),
    "sampling": Param(str, "fast", "noise sampler", choices=("fast", "secure")),
    "timeout_s": Param(float, 30.0, "timeout of every remote call", check=positive),
    "hosts": Param(int, 2, "shard-host Ray actors (shards are split among them)", check=positive),
}

SCHEMA = {
    "federation": FEDERATION_SCHEMA,
    "data": {
        "clusters": Param(int, 12, "topic clusters (rare topics on few shards, common on all)", check=positive),
        "spread": Param(float, 0.35, "spread of keys around their topic centre", check=positive),
    },
    "attack": {
        "attacks": Param(list, list(ATTACKS), "attacks to run", item_type=str,
                         check=lambda v: None if set(v) <= set(ATTACKS) and v else
                         f"must be a non-empty subset of {list(ATTACKS)}, found {v!r}"),
        "queries": Param(int, 300, "adaptive queries of the reconstruction attack", check=positive),
        "tolerance": Param(int, 2, "reconstruction counts as a hit within this many shards", check=nonnegative),
        "anchor_noise": Param(float, 0.3, "how far the adversary's public topic hints are from the true centres",
                              check=nonnegative),
        "step": Param(float, 0.6, "adversary's largest perturbation radius", check=positive),
        "explore": Param(float, 0.3, "adversary's exploration probability", check=lambda v: None if 0 <= v <= 1
                         else f"must be in [0, 1], found {v!r}"),
        "targets": Param(int, 8, "candidate records of the membership games", check=positive),
        "repeats": Param(int, 100, "queries per target and world in the membership games (a Clopper-Pearson "
                         "bound from T trials per world cannot exceed about ln(T/7))", check=at_least(4)),
        "r": Param(int, 4, "queries per trial of retry_averaging and near_duplicate (values averaged)",
                   check=positive),
        "near_duplicate_radius": Param(float, 0.05, "angle (radians) of near-duplicate queries from the target "
                                       "query", check=nonnegative),
        "timing_trials": Param(int, 40, "timed single queries per target and world (interleaved between worlds)",
                               check=at_least(4)),
        "references": Param(int, 5, "reference queries on the known neighbour (refusal_content's categories)",
                             check=positive),
        "boundary_tolerance": Param(int, 2, "admission_oracle: the |n - n_bound| <= tolerance rule whose boundary "
                                    "the adversary searches for offline", check=nonnegative),
        "sybils": Param(int, 8, "principal_spreading: principals the adversary connects", check=positive),
        "sybil_queries": Param(int, 64, "principal_spreading: queries spread over the sybils", check=positive),
        "retry_counts": Param(list, [1, 2, 4, 8, 16], "retry counts r of the silent-retry attack", item_type=int,
                              check=lambda v: None if v and all(x >= 1 for x in v) else
                              f"must be a non-empty list of integers >= 1, found {v!r}"),
        "alpha": Param(float, 0.05, "confidence level of CIs and epsilon lower bounds (1 - alpha)",
                       check=open_unit),
        "accountant": Param(str, "rdp", "composition backend", choices=("rdp", "pld")),
    },
}


def cross_checks(cfg) -> list[tuple[str, str]]:
    """Cross-field problems, all reported at once (ScenarioError lists them)."""
    f, problems = cfg.federation, []
    cap = f.shards * f.k_local
    if f.selection == "topk" and f.k > cap:
        problems.append(("federation.k", f"k={f.k} is larger than the candidates sent, shards*k_local={cap}"))
    if f.k_local > f.records_per_shard:
        problems.append(("federation.k_local",
                         f"k_local={f.k_local} exceeds records_per_shard={f.records_per_shard}"))
    if f.selection == "threshold" and not -1.0 <= f.threshold <= 1.0:
        problems.append(("federation.threshold", f"cosine threshold must be in [-1, 1], found {f.threshold!r}"))
    if f.calibration == "global" and f.n_bound > cap:
        problems.append(("federation.n_bound", f"n_bound={f.n_bound} exceeds the most contributors possible, "
                                               f"shards*k_local={cap}"))
    if f.hosts > f.shards:
        problems.append(("federation.hosts", f"hosts={f.hosts} exceeds shards={f.shards}"))
    if f.receipts == "broadcast" and f.selection != "broadcast":
        problems.append(("federation.receipts", "receipts='broadcast' needs selection='broadcast' "
                                                f"(found selection={f.selection!r})"))
    if f.mpc == "crypten" and f.parties not in (2, 3):
        problems.append(("federation.parties", f"crypten needs 2 or 3 parties, found {f.parties}"))
    if f.gateway and f.calibration == "global" and f.selection == "threshold" and f.receipts != "broadcast":
        problems.append(("federation.calibration",
                         "calibration='global' with selection='threshold' cannot be defended (gateway=true): the "
                         "delivered noise depends on the exact selected count, and refusing by |n - n_bound| would "
                         "make the refusal itself a leak; use calibration='realized', selection='topk' or "
                         "'broadcast', or gateway=false to demonstrate the leak"))
    return problems


# ---------------------------------------------------------------------- engine glue
def federation_config(cfg):
    """``FederationConfig`` from the ``[federation]`` section (keys it does not know are dropped)."""
    from fedmem.federation.engine import FederationConfig

    names = {f.name for f in fields(FederationConfig)}
    return FederationConfig(**{k: v for k, v in cfg.federation.to_dict().items() if k in names})


def make_federation(config, data, *, accountant, rng, ray_address, parties=None):
    """Indirection so tests can substitute a small fake with the same API."""
    from fedmem.federation.engine import Federation

    return Federation(config, data, accountant=accountant, rng=rng, ray_address=ray_address, parties=parties)


class Services:
    """Ray and the compute parties, started once per run and shared by every world's Federation.

    A run that finds Ray already initialised (or is given ``--ray-address``) attaches and
    leaves the cluster running; otherwise it starts a private local Ray (``fedmem._ray``, sized
    by the scenario's ``[ray]`` table) and stops it at the end. One set of compute parties (CrypTen actors or the plaintext reference)
    serves all Federations of the run, so the membership games do not restart CrypTen.
    """

    def __init__(self, cfg, ray_address):
        self.owns_ray, self.parties = False, None
        from fedmem._ray import ensure_ray

        opts = cfg.get("ray", {}) if hasattr(cfg, "get") else {}
        self.owns_ray = ensure_ray(ray_address, num_cpus=opts.get("num_cpus") or None,
                                   object_store_mb=opts.get("object_store_mb") or None)
        from fedmem.federation import mpc

        f = cfg.federation
        try:
            self.parties = (mpc.PlaintextParties(f.parties) if f.mpc == "plaintext"
                            else mpc.CryptenParties(f.parties, timeout_s=max(60.0, f.timeout_s),
                                                    placement="pack" if self.owns_ray else "auto"))
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.parties is not None:
            try:
                self.parties.close()
            finally:
                self.parties = None
        if self.owns_ray:
            import ray

            if ray.is_initialized():
                ray.shutdown()
            self.owns_ray = False


def make_data(cfg, rng):
    from fedmem.bench.shards import make_clustered_shards

    f = cfg.federation
    return make_clustered_shards(f.shards, f.records_per_shard, f.key_dim, f.value_dim, f.clip, rng,
                                 clusters=cfg.data.clusters, spread=cfg.data.spread)


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


def _exact_mean(truth) -> np.ndarray | None:
    c = int(truth.count)
    return None if c <= 0 else np.asarray(truth.sum, dtype=np.float64) / c


def _leaky(resp, truth, f) -> list[str]:
    """Why a *forwarded* response leaks support beyond the accountant (papers/003 Conditions).

    Exact per-shard receipts or an exact selected count whose value depends on the data
    (also implicitly, as the exact denominator of the mean), or a value released with
    noise calibrated for an n that misses the realized one by more than the tolerance
    (global calibration). Judged from the ground truth, not from the engine's labels.
    """
    why = []
    data_dependent = getattr(resp, "selection", f.selection) != "broadcast" and f.receipts != "broadcast"
    if resp.receipts is not None and data_dependent:
        r = np.asarray(resp.receipts, dtype=np.float64)
        if np.array_equal(r, np.asarray(truth.tallies, dtype=np.float64)):
            why.append("exact receipts")
    if resp.count is not None and data_dependent and float(resp.count) == float(truth.count):
        why.append("exact count")
    if "count:implicit" in resp.channels:
        why.append("implicit exact count")
    if "value:calibration" in resp.channels:
        if int(truth.count) < f.n_bound:   # delivered multiplier sigma * n / n_bound < sigma booked
            why.append("calibration mismatch")
    return why


def _leaf_events(d) -> int:
    """Number of elementary DP events in a booked event (a stored dict or a dp-accounting event)."""
    import dp_accounting

    from fedmem.dp.accountant import event_from_dict

    ev = event_from_dict(d) if isinstance(d, dict) else d
    if isinstance(ev, dp_accounting.ComposedDpEvent):
        return sum(_leaf_events(e) for e in ev.events)
    if isinstance(ev, dp_accounting.SelfComposedDpEvent):
        return int(ev.count) * _leaf_events(ev.event)
    return 1


def _dp_channels_expected(resp, f) -> int:
    """DP channels a released response carries: the value, plus the receipts when noised."""
    n = 1 if "value" in resp.channels else 0
    if f.receipts == "noised" and f.selection != "broadcast" and "receipts" in resp.channels:
        n += 1
    return n


def _noise_std_of_n(f):
    """Public noise std of the released mean as a function of the selected count n.

    Realized calibration divides the sum's noise ``sigma * 2C`` by the realized count
    (``fedmem.federation.aggregator``), so the noise itself tracks n; under global
    calibration it does not, and the adversary gets nothing from it.
    """
    if f.calibration != "realized" or f.noise != "gaussian" or f.receipts in ("noised", "broadcast"):
        return None
    return lambda n: f.sigma * 2.0 * f.clip / max(1, n)


def _broadcast(f) -> bool:
    return f.selection == "broadcast" or f.receipts == "broadcast"


def relevant_selection(data, q, f) -> tuple[int, np.ndarray | None, int]:
    """What a data-dependent threshold selection would pick for ``q`` (numpy, evaluation only).

    Each shard's local top-``k_local`` records with cosine >= ``threshold``. Returns
    ``(shards holding one, mean of their values or None, record count)``. Under broadcast this is
    the support the adversary is after and the mean the agent actually wants (the
    broadcast mean also averages irrelevant records and zero dummies).
    """
    qn = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    shards, total, count = 0, np.zeros(data.value_dim), 0
    for k, v in zip(data.keys, data.values):
        sc = k @ qn
        top = np.argsort(-sc, kind="stable")[: f.k_local]
        sel = top[sc[top] >= f.threshold]
        if sel.size:
            shards += 1
            total += v[sel].sum(axis=0)
            count += sel.size
    return shards, (total / count if count else None), count


def reference_support(data, q, f, truth) -> int:
    """The support the adversary is after: how many shards hold memories relevant to ``q``.

    For threshold and top-k selection this is the engine's contributing set
    (``Truth.contributing``). Under broadcast every shard "contributes" by construction,
    so the target is what a data-dependent threshold selection would have revealed
    (:func:`relevant_selection`).
    """
    from fedmem.attacks.support import true_cardinality

    if not _broadcast(f):
        return true_cardinality(truth)
    return relevant_selection(data, q, f)[0]


# ------------------------------------------------------------------- (a) reconstruction
def run_reconstruction(cfg, ctx, data, fed, acc) -> list[QueryRecord]:
    """The adaptive stream: one query at a time (the next depends on this answer).

    The adversary is one principal (``fed.connect()``); refusals are read as such. The
    reasons and bookings come from the operator's audit log and accountant (evaluation
    only, never shown to the adversary).
    """
    from fedmem.attacks.adaptive import AdaptiveAdversary
    from fedmem.attacks.support import reconstruct_cardinality, reconstruct_count
    from fedmem.errors import SupportPrivacyViolation

    f, a = cfg.federation, cfg.attack
    arng = ctx.rng("adversary")
    anchors = data.centers + a.anchor_noise * arng.standard_normal(data.centers.shape) / math.sqrt(f.key_dim)
    adv = AdaptiveAdversary(anchors, arng, shards=f.shards, k_local=f.k_local, step=a.step, explore=a.explore)
    client = fed.connect()
    std_of_n = _noise_std_of_n(f)
    records: list[QueryRecord] = []
    norms_sq: list[float] = []   # the adversary's own history of ||released||^2
    for _ in ctx.progress(range(a.queries), a.queries, "adaptive queries"):
        p = adv.next_query()
        before = acc.count
        resp = None
        try:
            resp = client.retrieve(p.q, family=p.family, retry_of=p.retry_of)
        except SupportPrivacyViolation:
            pass
        log = getattr(fed, "audit", None)
        last = log[-1] if log else None
        reasons = tuple(last.reasons) if last is not None else ()
        if last is not None and last.decision == "admitted_fallback":
            reasons = reasons + ("(answered by the support-safe broadcast)",)
        adv.observe(p, resp)
        truth = fed.ground_truth(p.q)
        hist = acc.history[before:] if acc.count > before else []
        n_events = sum(_leaf_events(b.event) for b in hist)
        if resp is not None:
            # signal prior learnt from past answers: the quietest releases (largest n) are ~ ||mean||^2
            sig = float(np.min(norms_sq)) if len(norms_sq) >= 10 else f.clip ** 2 / 2
            est, used = reconstruct_cardinality(resp, shards=f.shards, k_local=f.k_local, noise_std_of_n=std_of_n,
                                                signal_sq=sig)
            cest = reconstruct_count(resp, shards=f.shards, k_local=f.k_local, noise_std_of_n=std_of_n,
                                     signal_sq=sig)
            norms_sq.append(float(np.sum(np.asarray(resp.value, dtype=np.float64) ** 2)))
            bcast = _broadcast(f) or getattr(resp, "selection", f.selection) == "broadcast"
            exact = relevant_selection(data, p.q, f)[1] if bcast else _exact_mean(truth)
            mse = float(np.mean((np.asarray(resp.value) - exact) ** 2)) if exact is not None else float("nan")
            why = _leaky(resp, truth, f)
            channels = tuple(resp.channels)
            uncovered = bool(why) or n_events < _dp_channels_expected(resp, f)
        else:
            uncovered = False
            est, cest, used, mse, why, channels = float("nan"), float("nan"), "rejected", float("nan"), [], ()
        eps = acc.spent(f.delta) if acc.count else 0.0
        records.append(QueryRecord(p.index, p.family, p.retry_of, resp is not None, reasons, channels, est, used,
                                   reference_support(data, p.q, f, truth), cest,
                                   relevant_selection(data, p.q, f)[2] if _broadcast(f) else int(truth.count),
                                   mse, bool(why),
                                   acc.count - before, n_events, uncovered, eps))
    return records


# ------------------------------------------------- membership games over every observable
def _candidate(data, rng, f):
    """The auditor's candidate record: worst case, as privacy audits choose their neighbours.

    A key near one of the rarest topics (fewest holding shards: the smallest contributing
    sets, where global calibration is most wrong), placed on a shard that holds no
    record of that topic (so its presence changes that shard's receipt), with a random
    value of norm ``clip``. Returns ``(shard, key, value, topic)``.
    """
    n_topics = len(data.centers)
    if data.topics is not None:
        holders = np.array([[c in set(t.tolist()) for c in range(n_topics)] for t in data.topics])
        prevalence = holders.sum(axis=0)
        rare = np.argsort(prevalence, kind="stable")[: max(1, n_topics // 4)]
        c = int(rare[rng.integers(0, rare.size)])
        free = np.flatnonzero(~holders[:, c])
        shard = int(free[rng.integers(0, free.size)]) if free.size else int(rng.integers(0, f.shards))
    else:
        c, shard = int(rng.integers(0, n_topics)), int(rng.integers(0, f.shards))
    key = data.centers[c] + 0.1 * rng.standard_normal(f.key_dim) / math.sqrt(f.key_dim)
    key /= np.linalg.norm(key)
    v = rng.standard_normal(f.value_dim)
    v *= f.clip / np.linalg.norm(v)
    return shard, key, v, c


def _ask_trials(fed, qs, per_trial: int, max_batch: int):
    """Ask ``qs`` in trials of ``per_trial`` consecutive queries, each trial from its own fresh
    principal, batched across principals. Returns (observations, epsilon booked per trial), the
    latter read from the federation's own per-principal accountant (what it charged, not what
    the responses claim)."""
    from fedmem.attacks.observable import observations

    qs = np.asarray(qs, dtype=np.float64)
    n_trials = qs.shape[0] // per_trial
    pids = [fed.connect().principal for _ in range(n_trials)]
    plist = [pids[i // per_trial] for i in range(n_trials * per_trial)]
    obs = []
    for i in range(0, len(plist), max_batch):
        t0 = time.perf_counter()
        got = fed.retrieve_many(qs[i:i + max_batch], principal=plist[i:i + max_batch])
        obs += observations(got, (time.perf_counter() - t0) / max(1, len(got)))
    return obs, [fed.gateway.principal_spent(p) for p in pids]


def _count_fn(data, f):
    """The adversary's offline count of selected records for a query (it knows this dataset)."""
    def count(q):
        if _broadcast(f):
            return f.shards * f.k_local
        if f.selection == "topk":
            return f.k
        return relevant_selection(data, q, f)[2]
    return count


def _topic_directions(centers) -> np.ndarray:
    """Directions the admission-oracle search moves the query toward: every topic centre and
    every pair of them (the adversary knows the dataset in the DP game)."""
    import itertools

    c = np.asarray(centers, dtype=np.float64)
    pairs = [c[i] + c[j] for i, j in itertools.combinations(range(len(c)), 2)]
    return np.array(pairs + list(c)) if pairs else c


def game_config(cfg):
    """The scenario's federation with every budget lifted (``math.inf``).

    Budget refusals are decided from public state, so they cannot separate the worlds;
    lifting them only gives the adversary more answers, which makes the audit
    conservative (it can find more leakage, never less).
    """
    import dataclasses

    config = federation_config(cfg)
    lifted = {k: math.inf for k in ("epsilon_budget", "total_epsilon_budget", "support_budget_bits",
                                     "total_support_budget_bits") if hasattr(config, k)}
    return dataclasses.replace(config, **lifted) if dataclasses.is_dataclass(config) else config


def run_games(cfg, ctx, data, world_accountant, parties=None) -> dict:
    """Membership games: for each target, a world with and a world without the record.

    Both worlds run at once (so the timing attack can interleave them). Per world each
    attack gets ``repeats`` trials from its own principal; the adversary's reference runs
    (its knowledge of the neighbour without the record, as in the DP game) come from a
    separate principal on that world. Returns per attack the positive/negative scores
    and the epsilon booked for one trial.
    """
    from fedmem.attacks import observable as O
    from fedmem.attacks.support import differencing_score, value_score
    from fedmem.bench.shards import with_record

    f, a = cfg.federation, cfg.attack
    want = [x for x in GAME_ATTACKS if x in a.attacks]
    trng = ctx.rng("targets")
    out: dict = {name: {"pos": [], "neg": [], "booked": []} for name in want}
    out.update({"queries": 0, "refused": {"with": 0, "without": 0}, "eps_one": [], "n_target": [],
                "boundary_found": 0})
    config = game_config(cfg)
    mb = getattr(config, "max_batch", 1024)
    R, T = a.repeats, a.r

    for t in ctx.progress(range(a.targets), a.targets, "membership targets"):
        shard, key, value, _ = _candidate(data, trng, f)
        worlds = {"with": with_record(data, shard, key, value), "without": data}
        feds = {}
        try:
            for w, wdata in worlds.items():
                feds[w] = make_federation(config, wdata, accountant=world_accountant(f"target{t}-{w}"),
                                          rng=ctx.rng("engine", t, w), ray_address=ctx.ray_address, parties=parties)
            bq, with_answered = key, True
            if "admission_oracle" in want:
                bq, _, n_with, found = O.search_boundary_query(
                    _count_fn(worlds["without"], f), _count_fn(worlds["with"], f), key,
                    O.tolerance_boundary(f.n_bound, a.boundary_tolerance), ctx.rng("boundary", t),
                    directions=_topic_directions(worlds["without"].centers), steps=30)
                out["boundary_found"] += int(found)
                with_answered = abs(n_with - f.n_bound) <= a.boundary_tolerance   # the hypothesised rule
            refs, _ = _ask_trials(feds["without"], np.repeat(key[None], a.references, axis=0), 1, mb)
            ref_fps = {O.fingerprint(o) for o in refs}
            reference = refs[0].response
            for w, fed in feds.items():
                tag = "pos" if w == "with" else "neg"
                single, booked = _ask_trials(fed, np.repeat(key[None], R, axis=0), 1, mb)
                out["queries"] += len(single)
                out["refused"][w] += sum(not o.answered for o in single)
                out["eps_one"] += [e for o, e in zip(single, booked) if o.answered]
                if w == "with":
                    out["n_target"].append(int(fed.ground_truth(key).count))
                for o, e in zip(single, booked):
                    scores = {"differencing": lambda: differencing_score(o.response, reference, shard),
                              "noise_scale": lambda: value_score(o.response, value),
                              "refusal_content": lambda: O.category_score(o, ref_fps)}
                    for name, fn in scores.items():
                        if name in want:
                            out[name][tag].append(fn())
                            out[name]["booked"].append(e)
                if "admission_oracle" in want:
                    adm, booked = _ask_trials(fed, np.repeat(bq[None], R, axis=0), 1, mb)
                    out["queries"] += len(adm)
                    for o, e in zip(adm, booked):
                        out["admission_oracle"][tag].append(O.answered_score(o, with_answered))
                        out["admission_oracle"]["booked"].append(e)
                for name in ("retry_averaging", "near_duplicate"):
                    if name not in want:
                        continue
                    if name == "retry_averaging":
                        qs = np.repeat(key[None], R * T, axis=0)
                    else:
                        nrng = ctx.rng("near-duplicates", t)    # the same perturbations in both worlds
                        qs = np.concatenate([O.near_duplicates(key, T, a.near_duplicate_radius, nrng)
                                             for _ in range(R)])
                    obs, booked = _ask_trials(fed, qs, T, mb)
                    out["queries"] += len(obs)
                    for i in range(R):
                        out[name][tag].append(O.averaged_value_score(obs[i * T:(i + 1) * T], value))
                        out[name]["booked"].append(booked[i])
            if "timing" in want:
                order_rng = ctx.rng("timing-order", t)
                for _ in range(a.timing_trials):
                    for w in (("with", "without") if order_rng.random() < 0.5 else ("without", "with")):
                        client = feds[w].connect()
                        o = O.observe_one(client, key)
                        out["timing"]["pos" if w == "with" else "neg"].append(O.latency_score(o))
                        out["timing"]["booked"].append(client.epsilon_spent)
                        out["queries"] += 1
        finally:
            for fed in feds.values():
                fed.close()
    return out


def run_spreading(cfg, ctx, data, world_accountant, parties=None):
    """``principal_spreading``: a Sybil spreads one query over many principals (real budgets)."""
    from fedmem.attacks import observable as O
    from fedmem.bench.shards import sample_queries

    f, a = cfg.federation, cfg.attack
    q = sample_queries(data, 1, ctx.rng("spreading-query"))[0]
    config = federation_config(cfg)
    fed = make_federation(config, data, accountant=world_accountant("spreading"), rng=ctx.rng("engine", "spreading"),
                          ray_address=ctx.ray_address, parties=parties)
    try:
        clients = [fed.connect() for _ in range(a.sybils)]
        obs = []
        for i in range(a.sybil_queries):
            c = clients[i % len(clients)]
            obs += O.observe_batch(c, q[None], [f"label-{i}"])     # a fresh label every time, too
        unbooked = any(o.answered and o.response.selection != "broadcast" and
                       any(ch in o.response.channels for ch in ("receipts", "count", "count:implicit",
                                                                  "value:calibration"))
                       and not _has_support_event(o.response) for o in obs)
        rep = O.spreading_report(obs, a.sybils, f.delta, getattr(config, "total_support_budget_bits", math.inf),
                                 getattr(config, "total_epsilon_budget", math.inf), a.accountant)
        if unbooked:   # exact support channels: no finite bound on what they reveal
            rep = O.SpreadingReport(rep.principals, rep.queries, rep.answered, math.inf,
                                    rep.total_support_budget_bits, rep.epsilon_seen, rep.total_epsilon_budget,
                                    "EXCEEDS TOTAL BUDGET")
        return rep
    finally:
        fed.close()


def _has_support_event(resp) -> bool:
    """The response's booked event has a support part besides the value (aggregator plan order)."""
    from fedmem.attacks.observable import support_events

    return bool(support_events(resp))


# ------------------------------------------------------------------------ (d) retries
def run_retries(cfg, ctx, data, world_accountant, parties=None) -> list[list]:
    from fedmem.attacks.support import average_releases
    from fedmem.bench.shards import sample_queries
    from fedmem.errors import SupportPrivacyViolation

    f, a = cfg.federation, cfg.attack
    q = sample_queries(data, 1, ctx.rng("retry-query"))[0]
    rows = []
    config = federation_config(cfg)
    rmax = max(a.retry_counts)
    for mode in ("declared", "silent"):
        acc = world_accountant(f"retries-{mode}")
        fed = make_federation(config, data, accountant=acc, rng=ctx.rng("engine", "retries", mode),
                              ray_address=ctx.ray_address, parties=parties)
        try:
            client = fed.connect()
            exact = relevant_selection(data, q, f)[1] if _broadcast(f) else _exact_mean(fed.ground_truth(q))
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


# ------------------------------------------------------------------------------ run
def run(cfg, ctx) -> Result:
    from fedmem.dp import Accountant, DurableStore

    f, a = cfg.federation, cfg.attack
    store = DurableStore(ctx.out_dir / "ledger.sqlite")

    def world_accountant(name: str):
        return Accountant(a.accountant, store=store, name=name)

    data = make_data(cfg, ctx.rng("data"))
    metrics: dict = {"variant": _variant(f), "budgets": {k: f[k] for k in (
        "epsilon_budget", "total_epsilon_budget", "support_budget_bits", "total_support_budget_bits")}}
    tables: list[Table] = []
    sections: list[tuple[str, str]] = []
    attack_rows, eps_rows = [], []
    mrng = ctx.rng("audit")

    services = Services(cfg, ctx.ray_address)
    try:
        _run_attacks(cfg, ctx, data, services.parties, world_accountant, metrics, tables, attack_rows, eps_rows,
                     mrng)
    finally:
        services.close()
    verdicts = [r[-1] for r in attack_rows]
    overall = "LEAKS BEYOND BOOKED" if any(v.startswith(("LEAKS", "EXCEEDS")) for v in verdicts) else "within booked"
    metrics["verdict"] = overall
    tables.insert(0, Table("Attack metrics (what the adversary got vs what was booked for it)",
                           ["attack", "success rate", "n pos/neg", "AUC", "AUC 95% CI", "TPR@1%FPR",
                            "empirical eps (CP lower)", "booked eps (what it saw)", "verdict"], attack_rows,
                           note=f"Overall verdict: {overall}. Success rate: reconstruction within tolerance, or "
                                "balanced accuracy of the held-out threshold test. Empirical eps: Clopper-Pearson "
                                f"lower bound ({1 - a.alpha:.0%}), threshold chosen on a held-out half. Booked eps: "
                                "composed epsilon of the answers one trial of the attack saw (0 if it saw only "
                                "refusals)."))
    if eps_rows:
        _plot_eps(ctx, eps_rows)
    sections.append(("How to read this", _explain(cfg, metrics)))
    return Result(metrics=metrics, tables=tables, sections=sections)


def _game_row(name, label, game, f, a, mrng, metrics, attack_rows, eps_rows, roc):
    from fedmem.attacks import observable as O
    from fedmem.attacks.support import membership_report

    g = game[name]
    if len(g["pos"]) < 4 or len(g["neg"]) < 4:
        return
    booked = float(max(g["booked"])) if g["booked"] else 0.0
    rep = membership_report(g["pos"], g["neg"], delta=f.delta, rng=mrng,
                            epsilon_claim=booked if math.isfinite(booked) else math.inf, alpha=a.alpha)
    verdict = O.verdict(rep.eps_lower, booked, rep.ceiling_violations)
    d = rep.as_dict()
    d.update(eps_booked=booked, verdict=verdict)
    metrics.setdefault("attacks", {})[name] = d
    metrics[name] = d
    roc[name] = (g["pos"], g["neg"])
    attack_rows.append([label, rep.success_rate, f"{rep.n_pos}/{rep.n_neg}", rep.auc,
                        f"[{rep.auc_ci[0]:.3f}, {rep.auc_ci[1]:.3f}]", rep.tpr_at_1, rep.eps_lower, booked, verdict])
    eps_rows.append([name, booked, rep.eps_lower, rep.ceiling_violations, verdict])


GAME_LABELS = {
    "differencing": "(b) differencing (receipts)",
    "noise_scale": "(c) noise scale / value",
    "refusal_content": "refusal content & answer kind",
    "admission_oracle": "admission oracle (boundary query)",
    "timing": "timing",
    "retry_averaging": "silent-retry averaging",
    "near_duplicate": "near-duplicate averaging",
}


def _run_attacks(cfg, ctx, data, parties, world_accountant, metrics, tables, attack_rows, eps_rows, mrng):
    import time

    f, a = cfg.federation, cfg.attack
    phases = metrics.setdefault("phase_seconds", {})
    records: list[QueryRecord] = []
    t0 = time.perf_counter()
    if "reconstruction" in a.attacks:
        acc = world_accountant("main")
        fed = make_federation(federation_config(cfg), data, accountant=acc, rng=ctx.rng("engine", "main"),
                              ray_address=ctx.ray_address, parties=parties)
        try:
            records = run_reconstruction(cfg, ctx, data, fed, acc)
        finally:
            fed.close()
        metrics.update(_reconstruction_tables(records, cfg, tables, attack_rows, ctx))
        costs = [(r.mpc_rounds, r.mpc_bytes, r.mpc_batch) for r in getattr(fed, "audit", [])
                 if getattr(r, "mpc_rounds", None) is not None]
        if costs:   # public MPC cost (shapes only), into results.json
            metrics["mpc"] = {"queries": len(costs), "rounds_per_query": sorted({c[0] for c in costs}),
                              "bytes_per_query_median": float(np.median([c[1] / c[2] for c in costs])),
                              "bytes_per_query_max": float(max(c[1] / c[2] for c in costs))}
        _write_queries(ctx, records)
        phases["reconstruction"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    if set(GAME_ATTACKS) & set(a.attacks):
        game = run_games(cfg, ctx, data, world_accountant, parties)
        eps_one = float(np.median(game["eps_one"])) if game["eps_one"] else 0.0
        metrics["membership_queries"] = game["queries"]
        metrics["membership_refused"] = game["refused"]
        metrics["booked_epsilon_per_query"] = eps_one
        metrics["boundary_queries_found"] = game["boundary_found"]
        roc = {}
        for name in GAME_ATTACKS:
            if name in a.attacks:
                _game_row(name, GAME_LABELS[name], game, f, a, mrng, metrics, attack_rows, eps_rows, roc)
        if game["n_target"]:
            n_small = int(np.min(game["n_target"]))
            if f.calibration == "global" and not _broadcast(f) and f.selection == "threshold":
                from fedmem.federation.aggregator import delivered_epsilon

                eff = delivered_epsilon(f.noise, f.sigma * max(1, n_small) / f.n_bound, f.delta)
            else:
                eff = eps_one
            metrics["effective_epsilon_smallest_n"] = eff
            metrics["target_selected_counts"] = game["n_target"]
        _plot_roc(ctx, roc, eps_one, f.delta)
        phases["membership"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    if "principal_spreading" in a.attacks:
        rep = run_spreading(cfg, ctx, data, world_accountant, parties)
        metrics["principal_spreading"] = rep.as_dict()
        metrics.setdefault("attacks", {})["principal_spreading"] = rep.as_dict()
        tables.append(Table("Principal spreading: one adversary, many principals and fresh labels",
                            ["principals", "queries", "answered", "support bits seen (composed)",
                             "total support budget (bits)", "eps seen (composed)", "total eps budget", "verdict"],
                            [[rep.principals, rep.queries, rep.answered, rep.support_bits_seen,
                              rep.total_support_budget_bits, rep.epsilon_seen, rep.total_epsilon_budget,
                              rep.verdict]],
                            note="Budgets are charged per principal and in total, never per caller-chosen label; "
                                 "exact (unbooked) support channels count as infinitely many bits."))
        attack_rows.append(["principal spreading (budget)", "-", f"{rep.answered}/{rep.queries} answered", "-", "-",
                            "-", "-", rep.epsilon_seen, rep.verdict])
        phases["principal_spreading"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    if "retries" in a.attacks:
        rows = run_retries(cfg, ctx, data, world_accountant, parties)
        tables.append(Table("(d) Retry composition: averaging r releases of one query",
                            ["mode", "r asked", "released", "refused", "MSE of averaged mean",
                             "booked eps after 1", "booked eps after r"], rows,
                            note="Averaging r releases divides the noise variance by r; the booked epsilon "
                                 "must grow with r (declared: retry_of set; silent: re-asked as new queries)."))
        metrics["retries"] = [dict(zip(["mode", "r", "released", "refused", "mse", "eps_1", "eps_r"], r))
                              for r in rows]
        grew = all(r[6] >= r[5] - 1e-12 for r in rows) and any(r[6] > r[5] for r in rows if r[2] > 1)
        metrics["retries_booked"] = bool(grew) or all(r[2] <= 1 for r in rows)
        phases["retries"] = round(time.perf_counter() - t0, 2)
    ctx.log("phase wall seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))


def _variant(f) -> str:
    parts = [f"selection={f.selection}", f"receipts={f.receipts}", f"calibration={f.calibration}",
             f"gateway={'on' if f.gateway else 'off'}"]
    return ", ".join(parts)


def _reconstruction_tables(records, cfg, tables, attack_rows, ctx) -> dict:
    from fedmem.attacks.support import reconstruction_report

    f, a = cfg.federation, cfg.attack
    est = [r.estimate for r in records]
    tru = [r.true_n for r in records]
    rep = reconstruction_report(est, tru, a.tolerance, a.alpha)
    crep = reconstruction_report([r.count_est for r in records], [r.count_true for r in records], a.tolerance,
                                 a.alpha, rel_tolerance=0.1)
    released = [r for r in records if r.released]
    rejected = [r for r in records if not r.released]
    rerun = [r for r in released if r.reasons]
    leaky_fwd = [r for r in released if r.leaky]
    # every emitted channel covered: its DP events booked, and no exact (unbookable) support channel
    unbooked = [r for r in released if r.uncovered]
    mses = [r.mse for r in released if math.isfinite(r.mse)]
    channel_use = Counter(r.channel_used for r in records)
    reasons = Counter(reason for r in records for reason in r.reasons if not reason.startswith("("))
    rverdict = ("LEAKS BEYOND BOOKED" if unbooked else "at chance" if rep.at_chance
                else "beats chance (through booked channels)")
    attack_rows.append(["(a) cardinality reconstruction", rep.rate, f"{rep.queries} queries", "-", "-", "-", "-",
                        records[-1].eps_after if records else 0.0, rverdict])
    attacks_out = {"reconstruction": {"rate": rep.rate, "ci": list(rep.ci), "chance_rate": rep.chance_rate,
                                      "queries": rep.queries, "uncovered_answers": len(unbooked),
                                      "verdict": rverdict}}
    ctru = [r.count_true for r in records]
    tables.append(Table("(a) Cardinality reconstruction over the adaptive queries",
                        ["target", "queries", "hits", "rate", "95% CI", "chance rate (best constant)",
                         "chance CI", "MAE (released)", "channel used", "true range"],
                        [[f"contributing shards (within +-{a.tolerance})", rep.queries, rep.within, rep.rate,
                          f"[{rep.ci[0]:.3f}, {rep.ci[1]:.3f}]", rep.chance_rate,
                          f"[{rep.chance_ci[0]:.3f}, {rep.chance_ci[1]:.3f}]", rep.mae,
                          ", ".join(f"{k}: {v}" for k, v in channel_use.items()),
                          f"{min(tru)}..{max(tru)}" if tru else "-"],
                         [f"selected records n (within max({a.tolerance}, 10%))", crep.queries, crep.within,
                          crep.rate, f"[{crep.ci[0]:.3f}, {crep.ci[1]:.3f}]", crep.chance_rate,
                          f"[{crep.chance_ci[0]:.3f}, {crep.chance_ci[1]:.3f}]", crep.mae,
                          "receipt sum / count / noise scale", f"{min(ctru)}..{max(ctru)}" if ctru else "-"]],
                        note="Contributing shards: papers/003's cardinality. Selected records: the n that the "
                             "value noise is calibrated for. Rejected queries count as misses. Chance = the best "
                             "constant guess chosen with hindsight of the true sizes (conservative)."))
    tables.append(Table("Gateway and accounting over the adaptive queries",
                        ["queries", "forwarded", "rejected", "forwarded support-leaky",
                         "forwarded with an uncovered channel", "total bookings", "booked eps (total, at delta)"],
                        [[len(records), len(released), len(rejected), len(leaky_fwd), len(unbooked),
                          sum(r.bookings for r in records), records[-1].eps_after if records else 0.0]],
                        note="Support-leaky: exact data-dependent receipts or count (also as the exact "
                             "denominator of the mean), or global calibration with a realized n below n_bound "
                             "(papers/003 Conditions of Validity), judged from the ground truth. "
                             "Uncovered: a leaky channel, or fewer DP events booked than DP channels emitted."))
    if reasons:
        tables.append(Table("Refusals by reason (operator's audit log; the agent sees one uniform refusal)",
                            ["reason", "queries"], sorted(reasons.items()),
                            note=(f"{len(rerun)} queries were answered by the support-safe broadcast instead "
                                  "(on_reject='rerun_broadcast')." if rerun else "A query can fail several checks.")))
    tables.append(Table("Utility", ["variant", "released queries", "MSE of released mean vs exact mean",
                                    "median MSE"],
                        [[_variant(f), len(mses), float(np.mean(mses)) if mses else float("nan"),
                          float(np.median(mses)) if mses else float("nan")]],
                        note="Exact mean: of the records the selection picked; under broadcast, of the relevant "
                             "records (local top-k' with cosine >= threshold), since the broadcast mean also "
                             "averages irrelevant records and zero dummies."))
    _plot_reconstruction(ctx, records, a.tolerance)
    return {
        "attacks": attacks_out,
        "reconstruction": rep.as_dict(),
        "count_reconstruction": crep.as_dict(),
        "queries": len(records), "forwarded": len(released), "rejected": len(rejected),
        "forwarded_leaky": len(leaky_fwd), "forwarded_unbooked": len(unbooked),
        "rejections_by_reason": dict(reasons),
        "rerun_broadcast_admitted": len(rerun),
        "bookings_of_rejected": sum(r.bookings for r in rejected),
        "utility_mse": float(np.mean(mses)) if mses else float("nan"),
        "epsilon_spent_total": records[-1].eps_after if records else 0.0,
        "true_n_range": [int(min(tru)), int(max(tru))] if tru else None,
    }


def _write_queries(ctx, records) -> None:
    """Per-query log of the adaptive stream (``queries.csv`` in the run folder)."""
    import csv

    cols = ["index", "family", "retry_of", "released", "reasons", "channels", "estimate", "channel_used", "true_n",
            "count_est", "count_true", "mse", "leaky", "bookings", "booked_events", "uncovered", "eps_after"]
    with open(ctx.out_dir / "queries.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in records:
            w.writerow([";".join(v) if isinstance(v, tuple) else v for v in (getattr(r, c) for c in cols)])


# --------------------------------------------------------------------------- plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_reconstruction(ctx, records, tol):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    tru = np.array([r.true_n for r in records], dtype=float)
    est = np.array([r.estimate for r in records], dtype=float)
    ok = np.isfinite(est)
    jitter = np.random.default_rng(0).uniform(-0.25, 0.25, size=tru.size)   # display only: overlapping points
    ax.scatter(tru[ok] + jitter[ok], est[ok] + jitter[::-1][ok], s=8, alpha=0.35,
               label=f"released ({int(ok.sum())}, jittered)")
    if (~ok).any():
        ax.scatter(tru[~ok], np.zeros((~ok).sum()), s=10, marker="x", color="grey", label="rejected / no channel")
    hi = max(1.0, float(np.nanmax(np.r_[tru, est[ok]])) if ok.any() else float(tru.max()))
    xs = np.linspace(0, hi, 2)
    ax.plot(xs, xs, "k-", lw=1)
    ax.fill_between(xs, xs - tol, xs + tol, color="green", alpha=0.15, label=f"+-{tol}")
    ax.set_xlabel("true contributing shards")
    ax.set_ylabel("reconstructed")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Cardinality reconstruction")
    ctx.save_figure(fig, "reconstruction")


def _plot_roc(ctx, roc, eps, delta):
    from fedmem.attacks import audit

    if not roc:
        return
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for name, (pos, neg) in roc.items():
        fpr, tpr = audit.roc_curve(pos, neg)
        ax.plot(fpr, tpr, label=f"{name} (AUC {audit.roc_auc(pos, neg):.2f})")
    grid = np.linspace(0, 1, 201)
    if math.isfinite(eps):
        ax.plot(grid, audit.dp_roc_ceiling(grid, eps, delta), "r--", label=f"DP ceiling eps={eps:.2f}")
    ax.plot(grid, grid, "k:", lw=1, label="chance")
    ax.set_xlabel("FPR")
    ax.set_ylabel("TPR")
    ax.set_title("Membership ROC")
    ax.legend(fontsize=8)
    ctx.save_figure(fig, "membership_roc")


def _plot_eps(ctx, eps_rows):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = [r[0] for r in eps_rows]
    x = np.arange(len(names))
    booked = [r[1] if math.isfinite(r[1]) else 0.0 for r in eps_rows]
    ax.bar(x - 0.2, booked, 0.4, label="booked / query")
    ax.bar(x + 0.2, [r[2] for r in eps_rows], 0.4, label="empirical lower bound")
    ax.set_xticks(x, names)
    ax.set_ylabel("epsilon")
    ax.legend(fontsize=8)
    ax.set_title("Booked vs empirical epsilon")
    ctx.save_figure(fig, "epsilon")


def _explain(cfg, m) -> str:
    f = cfg.federation
    lines = [f"Variant: {m['variant']}. Overall verdict: **{m.get('verdict', '?')}**."]
    b = m.get("budgets", {})
    off = [k for k, v in b.items() if not math.isfinite(v)]
    lines.append("- Budgets: " + ", ".join(f"{k} = {v:g}" for k, v in b.items())
                 + (f" (disabled: {', '.join(off)})" if off else "") + ". The membership games lift them "
                 "(budget refusals are decided from public state; lifting them can only help the adversary).")
    if "reconstruction" in m:
        r = m["reconstruction"]
        lines.append(f"- Cardinality reconstruction: {r['within']}/{r['queries']} queries within "
                     f"+-{cfg.attack.tolerance} shards ({r['rate']:.0%}; best constant guess {r['chance_rate']:.0%}). "
                     "papers/003 saw 94%.")
        lines.append(f"- Forwarded {m['forwarded']}, refused {m['rejected']}; support-leaky responses forwarded: "
                     f"{m['forwarded_leaky']}; forwarded with a channel the accountant does not cover: "
                     f"{m['forwarded_unbooked']}.")
    for name, x in m.get("attacks", {}).items():
        if name == "reconstruction":
            continue      # described above
        if "auc" in x:
            lines.append(f"- {name}: AUC {x['auc']:.3f} (CI {x['auc_ci'][0]:.3f}..{x['auc_ci'][1]:.3f}, "
                         f"n = {x['n_pos']}/{x['n_neg']}), empirical eps >= {x['eps_lower']:.2f} vs booked "
                         f"{x['eps_booked']:.2f} for what it saw: {x['verdict']}.")
        else:
            lines.append(f"- {name}: {x['answered']}/{x['queries']} answered over {x['principals']} principals, "
                         f"support bits seen {x['support_bits_seen']:.3g} (total budget "
                         f"{x['total_support_budget_bits']:g}): {x['verdict']}.")
    if f.calibration == "global" and f.selection == "threshold":
        lines.append("- Global calibration books the epsilon of sigma for n_bound contributors; with fewer real "
                     "contributors one record moves the mean by more, so the true epsilon is larger "
                     f"(smallest target n gives eps ~ {m.get('effective_epsilon_smallest_n', float('nan')):.3g}).")
    lines.append("- A Clopper-Pearson bound from T trials per world (half held out) cannot exceed about "
                 "ln(T/7): a bound below the booked epsilon is not a proof of privacy, one above it is a proof "
                 "of a leak (at 95% confidence).")
    return "\n".join(lines)


EXPERIMENTS = {
    "federation.support_leak": Experiment(
        "federation.support_leak",
        "papers/003 support-leak scenario: the whole adversary library (reconstruction, differencing, noise "
        "scale, refusal content, admission oracle, timing, retry/near-duplicate averaging, principal "
        "spreading) against an undefended or defended federation, one verdict per attack.",
        SCHEMA, run, cross_checks),
}
