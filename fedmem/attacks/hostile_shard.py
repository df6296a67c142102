"""Hostile-shard attacks on the Ray engine: a contributor whose records are out of contract.

The engine books a value release with L2 sensitivity ``2C`` (``docs/federation-engine.md``): that
figure is a fact only if every record that reaches the sum is a finite value of norm at most
``C``, its key gives a score in ``[-1, 1]``, and the ring sum of the selected values cannot wrap
(``fedmem.federation.sharing``: 64-bit ring, 16 fractional bits). A hostile contributor (one
shard's records, chosen by the adversary, who also queries) tries to break one of these so that
an honest shard's record becomes visible beyond what was booked, or so that a refusal carries a
value. Every variant is a membership game on the honest shard's target record (replace-one
neighbours: the world without it holds a filler record in its slot), one fresh principal per trial,
both worlds interleaved, judged by :func:`fedmem.attacks.verdict.judge` against what the
federation booked for the trial:

* ``near_limit``: ``k - 1`` hostile records with the query's key and value ``C e_0`` (in contract)
  under the largest ``clip`` the configuration accepts, pushed towards the fixed-point limit
  (``k * C * 2^16`` around ``2^63``): with the target the ring sum wraps and the released mean's
  first coordinate changes sign (a shift far above the booked ``2C``). Score: ``-value[0]``.
* ``error_text``: the target record itself is out of contract (key norm ``2^50``: score beyond
  the fixed-point range); if the host's error reaches the querying agent, its text carries the
  record's exact score. Score: the observation's category (type, text, attributes, chain) unseen
  on the known neighbour (:func:`fedmem.attacks.observable.fingerprint` plus the chain).
* ``nonfinite``: hostile records with NaN/inf values and a NaN key; ``huge``: values ``1e300``
  and keys of norm ``1e10``; ``float32``: a hostile shard in float32 whose values exceed float32's
  range when stacked with its host's other shards. These must be clipped or neutralised by the
  host (the record counts, its value is finite and of norm <= C), never fail the query or the
  federation. Scores: the value ``value[0]`` and the category.

Each row reports the AUC, the Clopper-Pearson epsilon lower bound, the booked epsilon and mu, the
answered fraction per world and the verdict. :func:`run_hostile_shard` runs one variant against a
federation factory ``new_federation(config, data, accountant, rng)`` (the support-leak scenario's).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from fedmem import _validate as V
from fedmem.attacks.observable import Observation, fingerprint, observations
from fedmem.attacks.audit import roc_auc
from fedmem.attacks.verdict import judge

VARIANTS = ("near_limit", "error_text", "nonfinite", "huge", "float32")

SHARDS, RECORDS, DIM, K_LOCAL, K = 4, 6, 8, 3, 4
"""The game's federation: 4 shards x 6 records, 8-d keys and values, k' = 3, top-4, 2 hosts.
Shard 0 is the hostile contributor's, the target lives on shard 1 (the other host's first shard is
shard 2, so the hostile shard and the target share a host: ``float32`` needs it)."""

NEAR_LIMIT_CLIP = 1.1 * 2.0**45
"""The clip the ``near_limit`` adversary asks for: ``3 C < 2^47 <= 4 C``, so three hostile values
``C e_0`` do not wrap the ring and three plus the target's do."""


def full_chain(exc: BaseException | None) -> str:
    """Everything an exception object shows: type, str, repr, args, attributes, and the same for
    its ``__cause__`` / ``__context__`` chain (what a caller can read off a raised error)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        attrs = {k: v for k, v in sorted(vars(exc).items()) if k != "query_id"}
        parts.append(f"{type(exc).__module__}.{type(exc).__qualname__}|{exc!s}|{exc!r}|{exc.args!r}|{attrs!r}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)


def category(obs: Observation) -> str:
    """:func:`~fedmem.attacks.observable.fingerprint` plus the refusal's whole exception chain."""
    return fingerprint(obs) + ("" if obs.answered else "|" + full_chain(obs.refusal))


def _unit(rng, n: int, d: int, *, zero_first: bool) -> np.ndarray:
    x = rng.standard_normal((n, d))
    if zero_first:
        x[:, 0] = 0.0
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def game_config(config, variant: str):
    """The game's federation: the scenario's backend and noise settings (``mpc``, ``parties``,
    ``noise``, ``sigma``, ``delta``, ``sampling``) at the game's size, gateway on, budgets lifted; for
    ``near_limit`` the largest clip up to :data:`NEAR_LIMIT_CLIP` that the configuration accepts."""
    from fedmem.federation.config import FederationConfig

    base = dict(shards=SHARDS, records_per_shard=RECORDS + 1, key_dim=DIM, value_dim=DIM, k_local=K_LOCAL,
                selection="topk", k=K, hosts=2, receipts="suppress", calibration="realized", gateway=True,
                on_reject="raise", epsilon_budget=math.inf, total_epsilon_budget=math.inf,
                support_budget_bits=math.inf, total_support_budget_bits=math.inf, max_batch=1024)
    keep = {f: getattr(config, f) for f in ("mpc", "parties", "noise", "sigma", "delta", "sampling", "timeout_s")}
    if variant != "near_limit":
        return FederationConfig(**base, **keep, clip=1.0)
    clip = NEAR_LIMIT_CLIP
    for _ in range(200):   # the adversary backs off to what the configuration's own checks accept
        try:
            return FederationConfig(**base, **keep, clip=clip)
        except ValueError:
            clip /= 1.25
    raise ValueError(f"variant {variant!r}: no clip accepted by FederationConfig. Found none down to {clip!r}.")


def worlds(variant: str, clip: float, rng: np.random.Generator) -> tuple[dict, np.ndarray]:
    """``({"with": data, "without": data}, query)``: duck-typed shard data (the engine's ``data``
    interface: ``keys``, ``values``, sizes, dims) built from the variant's hostile shard 0, honest
    shards 1-3 (keys orthogonal to the query: score 0; values orthogonal to ``e_0``), and the target
    (key = the query, value ``C e_0``) or its filler on shard 1, record 0."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}. Found {variant!r}.")
    V.rng_check("rng", rng)
    q = np.zeros(DIM)
    q[0] = 1.0
    e0 = q.copy()
    keys = [_unit(rng, RECORDS, DIM, zero_first=True) for _ in range(SHARDS)]
    values = [clip * 0.9 * _unit(rng, RECORDS, DIM, zero_first=True) for _ in range(SHARDS)]
    hk, hv = keys[0].copy(), values[0].copy()
    if variant == "near_limit":
        hk[: K - 1] = q
        hv[: K - 1] = clip * e0
    elif variant == "nonfinite":
        hk[:2] = q
        hv[0] = np.nan
        hv[1] = 0.0
        hv[1, 0] = np.inf
        hk[2] = np.nan
    elif variant == "huge":
        hk[:2] = 1e10 * q
        hv[:2] = 1e300 * e0
    elif variant == "float32":
        hk = hk.astype(np.float32)
        hk[:2] = q
        hv[:2] = 1e39 * e0        # a float64 value beyond float32's range (3.4e38)
        keys = [k.astype(np.float32) for k in keys]
    keys[0], values[0] = hk, hv
    out = {}
    for w in ("with", "without"):
        k1, v1 = keys[1].copy(), values[1].copy()
        if w == "with":
            k1[0] = (2.0**50 if variant == "error_text" else 1.0) * q
            v1[0] = clip * e0
        kk, vv = list(keys), list(values)
        kk[1], vv[1] = k1.astype(keys[1].dtype), v1
        out[w] = HostileShards(kk, vv)
    return out, q


@dataclasses.dataclass(frozen=True)
class HostileShards:
    """Shard data as the engine reads it (``keys``, ``values``, ``n_shards``, ``key_dim``,
    ``value_dim``, ``sizes``), without :class:`fedmem.bench.shards.ShardData`'s checks: a hostile
    contributor does not run the driver's convenience validation."""

    keys: list
    values: list
    recipe = None

    n_shards = property(lambda self: len(self.keys))
    key_dim = property(lambda self: int(self.keys[0].shape[1]))
    value_dim = property(lambda self: int(self.values[0].shape[1]))
    sizes = property(lambda self: np.array([k.shape[0] for k in self.keys], dtype=np.int64))


def _observe(fed, q, n: int):
    pids = [fed.connect().principal for _ in range(n)]
    t0 = time.perf_counter()
    try:
        got = fed.retrieve_many(np.repeat(q[None], n, axis=0), principal=pids)
    except Exception as exc:  # noqa: BLE001 - whatever reaches the querying side is the observation
        got = [exc] * n
    obs = observations(got, (time.perf_counter() - t0) / max(1, n))
    return obs, [fed.gateway.principal_booked(p) for p in pids]


def run_hostile_shard(variant: str, config, new_federation, accountant_for, *, trials: int = 200,
                      batch: int = 50, rng: np.random.Generator, alpha: float = 0.05) -> dict:
    """One hostile-shard game: ``trials`` single queries per world (batches of ``batch``, worlds
    interleaved in random order), each from a fresh principal. Returns the row: per attack
    (``value``, ``category``) its AUC, epsilon lower bound and verdict (the booked epsilon of one
    trial; mu when Gaussian only), the answered counts per world, and the clip the game ran at.
    ``new_federation(config, data, accountant, rng)``; ``accountant_for(world)`` a fresh accountant."""
    V.rng_check("rng", rng)
    trials = V.positive_int("trials", trials, minimum=4)
    batch = V.positive_int("batch", batch)
    cfg = game_config(config, variant)
    data, q = worlds(variant, cfg.clip, rng)
    seeds = rng.integers(0, 2**63, size=2)
    feds, obs, booked = {}, {"with": [], "without": []}, {"with": [], "without": []}
    refs: set = set()
    try:
        for i, w in enumerate(("with", "without")):
            try:
                feds[w] = new_federation(cfg, data[w], accountant_for(w), np.random.default_rng(int(seeds[i])))
            except Exception as exc:  # noqa: BLE001 - a federation refused at construction: every query
                feds[w] = exc           # of that world observes the refusal to build it
        done = 0
        while done < trials:
            n = min(batch, trials - done)
            for w in (("with", "without") if rng.random() < 0.5 else ("without", "with")):
                f = feds[w]
                if isinstance(f, Exception):
                    o, b = observations([f] * n, 0.0), [(0.0, 0.0)] * n
                else:
                    o, b = _observe(f, q, n)
                obs[w] += o
                booked[w] += b
            done += n
        if not isinstance(feds["without"], Exception):   # the adversary's reference runs on the known neighbour
            refs = {category(o) for o in _observe(feds["without"], q, 5)[0]}
        else:
            refs = {category(o) for o in obs["without"][:5]}
    finally:
        for f in feds.values():
            if not isinstance(f, Exception):
                f.close()
    eps = max([e for w in booked for e, _ in booked[w]] + [0.0])
    mus = [m for w in booked for _, m in booked[w]]
    mu = None if any(m is None for m in mus) else max(mus + [0.0])
    sign = -1.0 if variant == "near_limit" else 1.0
    scores = {
        "value": {w: [sign * float(o.response.value[0]) if o.answered else 0.0 for o in obs[w]] for w in obs},
        "category": {w: [0.0 if category(o) in refs else 1.0 for o in obs[w]] for w in obs},
    }
    row = {"variant": variant, "clip": cfg.clip, "trials": trials, "eps_booked": eps, "mu_booked": mu,
           "answered": {w: sum(o.answered for o in obs[w]) for w in obs},
           "categories": {w: sorted({category(o) for o in obs[w]})[:3] for w in obs}, "attacks": {}}
    for name, s in scores.items():
        v = judge(s["with"], s["without"], eps, cfg.delta, alpha=alpha, rng=np.random.default_rng(0),
                  mu_booked=mu if mu else None)
        row["attacks"][name] = {"auc": float(roc_auc(np.array(s["with"]), np.array(s["without"]))),
                                "eps_lower": v.eps_lower, "verdict": v.label, "text": v.text}
    return row
