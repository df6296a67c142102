"""Neighbouring worlds found by search (in the manner of DP-Auditorium's dataset finders).

The adversary knows both neighbouring inputs (it may search them offline). The search here
builds candidates that are worst cases for the channels a federation has, from public
structure only (the data it knows, the public configuration, the sampler's public limits):

Engine (add/remove and replace-one of one record):

* ``replace``: a record whose key is the query is replaced by one with the opposite value
  (``-C u`` vs ``+C u``): the selected sum moves by ``2C``, the full booked sensitivity,
  while every count and tally stays the same (a value-only game at the boundary of what is
  booked);
* ``rare``: a record added on a direction no record is near (a rare topic): the query selects
  nothing without it and one record with it (the count, the admission bit and every
  count-dependent time or text differ);
* ``boundary``: a record added whose score sits exactly at the selection threshold, with its
  whole norm in one coordinate (``C e_1``: the fixed-point encoder's largest coordinate).

Flower (one honest target client, honest others, one hostile contributor; every reply is
chosen by the search):

* target ``0`` vs ``C e_1`` with the hostile contributor silent (0), at the sampler's range
  limit (``L - C/2`` with ``L = 2^52 g`` for the public grid ``g`` of the noise scale, so the
  sum crosses ``L`` in one world only), NaN, or a huge finite value;
* an out-of-contract target (``0`` vs ``64 C e_1``: a client that does not clip);
* target ``0`` vs a random norm-``C`` vector in a wide model (``d = 128``), the setting where a
  value-dependent summation time shows;

each at the scenario's public configuration and at public configurations the wrapper accepts
(a larger noise multiplier, so that what is booked is small and any unbooked channel stands out).
"""

from __future__ import annotations

import math

import numpy as np


def _unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def engine_worlds(data, fc: dict, rng: np.random.Generator, kinds=None) -> list[dict]:
    from fedmem.bench.shards import with_record, without_record

    kinds = tuple(kinds or ("replace", "rare"))
    C = float(fc.get("clip", 1.0))
    vd = data.value_dim
    out = []
    keys_all = np.concatenate(data.keys, axis=0)
    s = int(rng.integers(0, data.n_shards))
    u = _unit(rng.standard_normal(vd))
    if "replace" in kinds:
        i = 0
        q = _unit(data.keys[s][i])
        base = without_record(data, s, i)
        d0 = with_record(base, s, q, -C * u)
        d1 = with_record(base, s, q, C * u)
        out.append({"spec": {"name": "replace", "kind": "replace-one", "shard": s, "record": i,
                             "value": "+C u vs -C u"}, "data": (d0, d1), "query": q})
    # a direction far from every record (a rare topic): the lowest max-score of 64 random directions
    cands = np.stack([_unit(rng.standard_normal(data.key_dim)) for _ in range(64)])
    far = cands[int(np.argmin((cands @ keys_all.T).max(axis=1)))]
    if "rare" in kinds:
        d1 = with_record(data, s, far, C * u)
        out.append({"spec": {"name": "rare", "kind": "add/remove", "shard": s, "value": "C u",
                             "max_other_score": float((far @ keys_all.T).max())}, "data": (data, d1), "query": far})
    if "boundary" in kinds:
        thr = float(fc.get("threshold", 0.5))
        # a unit key at angle arccos(thr) from the query: its score is the threshold (to float rounding)
        z = _unit(rng.standard_normal(data.key_dim))
        z = _unit(z - (z @ far) * far)
        key = thr * far + math.sqrt(max(0.0, 1 - thr * thr)) * z
        e1 = np.zeros(vd)
        e1[0] = C
        d1 = with_record(data, s, key, e1)
        out.append({"spec": {"name": "boundary", "kind": "add/remove", "shard": s, "value": "C e_1",
                             "score": float(_unit(key) @ far)}, "data": (data, d1), "query": far})
    return out


def sampler_limit(noise_std: float) -> float:
    """``L = 2^52 g``: the largest magnitude the secure sampler's grid ``g`` (public, from the noise
    scale) represents exactly in a float64 (:mod:`fedmem.dp.samplers`)."""
    from fedmem.dp.samplers import grid_granularity

    return float(2.0 ** 52 * grid_granularity(noise_std))


def flower_configs(sigma: float, dim: int) -> list[dict]:
    """The scenario's public configuration and a wide, heavily noised one the wrapper also accepts."""
    out = [{"name": "scenario", "sigma": float(sigma), "dim": int(dim)}]
    out.append({"name": "wide", "sigma": 8.0, "dim": 128})
    return out


def flower_worlds(configs: list[dict], C: float, rng: np.random.Generator, m: int | None = None) -> list[dict]:
    out = []
    for cfg in configs:
        d = cfg["dim"]
        e1 = np.zeros(d)
        e1[0] = C
        zero = np.zeros(d)
        L = sampler_limit(cfg["sigma"] * C)
        if cfg["name"] == "scenario":
            hostile = {"silent": zero, "range_limit": np.r_[L - C / 2, np.zeros(d - 1)],
                       "nan": np.full(d, np.nan), "huge": np.r_[2.0 ** 1000, np.zeros(d - 1)]}
            for hname, h in hostile.items():
                out.append({"spec": {"name": f"{cfg['name']}:target e1:hostile {hname}", "config": cfg,
                                     "target": ["0", "C e_1"], "hostile": hname,
                                     "hostile_value0": repr(float(h[0])), "sampler_limit": L},
                            "cfg": cfg, "pair": (zero, e1), "hostile": h})
            out.append({"spec": {"name": f"{cfg['name']}:target 64C:hostile silent", "config": cfg,
                                 "target": ["0", "64 C e_1"], "hostile": "silent"},
                        "cfg": cfg, "pair": (zero, 64 * e1), "hostile": zero})
        else:
            v = rng.standard_normal(d)
            v = C * v / np.linalg.norm(v)
            out.append({"spec": {"name": f"{cfg['name']}:target random:hostile silent", "config": cfg,
                                 "target": ["0", "random norm C"], "hostile": "silent"},
                        "cfg": cfg, "pair": (zero, v), "hostile": zero})
    for wp in out:
        wp["m"] = m
    return out


def flower_replies(wp: dict, m: int) -> tuple[list, list]:
    """Per world, the m replies in sampling order: target, honest others (0), hostile last."""
    reps = []
    for t in wp["pair"]:
        r = [np.asarray(t, dtype=np.float64)] + [np.zeros_like(t) for _ in range(m - 2)] + [wp["hostile"]]
        reps.append(r)
    return reps[0], reps[1]
