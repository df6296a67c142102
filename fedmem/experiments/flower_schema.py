"""The ``flower.support_leak`` scenario keys (:data:`SCHEMA`) and their cross-field checks
(:func:`cross_checks`); the experiment itself is :mod:`fedmem.experiments.flower`."""

from __future__ import annotations

import math

from fedmem.scenario import Param, at_least, nonnegative, open_unit, positive

DP_CHOICES = ("fedmem", "flower")


def _dp_list(v) -> str | None:
    if not v or any(x not in DP_CHOICES for x in v) or len(set(v)) != len(v):
        return f"must be a non-empty list of distinct items from {list(DP_CHOICES)}, found {v!r}"
    return None


SCHEMA = {
    "federation": {
        "shards": Param(int, 20, "shards = Flower ClientApps (SuperNodes)", check=at_least(3)),
        "records_per_shard": Param(int, 20, "records per shard", check=at_least(1)),
        "key_dim": Param(int, 32, "key dimension", check=at_least(2)),
        "value_dim": Param(int, 16, "value dimension", check=at_least(1)),
        "clip": Param(float, 1.0, "values clipped to L2 norm <= clip", check=positive),
        "k_local": Param(int, 5, "k': local top-k' before the threshold (also the public num_examples)",
                         check=at_least(1)),
        "threshold": Param(float, 0.5, "cosine threshold of the local selection"),
        "dp": Param(list, help="required: central DP of the defended deployments, one Flower + gateway "
                    "deployment each: 'fedmem' (the wrapper's own noise) and/or 'flower' (Flower's "
                    "DifferentialPrivacyClientSideFixedClipping inside the wrapper)", item_type=str, check=_dp_list),
        "sigma": Param(float, help="required: fedmem noise multiplier (noise sigma * sensitivity on the sum)", check=positive),
        "flower_sigma": Param(float, help="required: Flower DP wrapper noise_multiplier", check=positive),
        "flower_clip": Param(float, help="required: Flower DP wrapper clipping_norm (fixedclipping_mod)", check=positive),
        "clipping_range": Param(float, 8.0, "SecAgg+ clipping_range (power of two >= k' * clip)", check=positive),
        "delta": Param(float, help="required: delta of every epsilon", check=open_unit),
        "epsilon_budget": Param(float, help="required: gateway epsilon budget of the querying principal (inf "
                                "disables; the audit needs every round answered)", check=positive, allow_inf=True),
        "total_epsilon_budget": Param(float, help="required: gateway total epsilon budget (inf disables)",
                                      check=positive, allow_inf=True),
        "num_shares": Param(int, 5, "SecAgg+ num_shares", check=at_least(3)),
        "reconstruction_threshold": Param(int, 3, "SecAgg+ reconstruction_threshold", check=at_least(2)),
        "num_cpus": Param(int, 2, "CPUs of the simulation's private local Ray", check=at_least(1)),
        "client_cpus": Param(float, 0.5, "Ray CPUs per ClientApp actor", check=positive),
        "timeout_s": Param(float, 1800.0, "wall-clock limit of one simulation", check=positive),
    },
    "ray_engine": {
        "enabled": Param(bool, True, "run the 'ray' engine column (fedmem's Ray + CrypTen federation, threshold "
                         "selection) on the same shards, queries and candidate"),
        "mpc": Param(str, "crypten", "its compute parties: crypten (real secret sharing) or plaintext (bit-identical "
                     "reference)", choices=("crypten", "plaintext")),
        "receipt_sigma": Param(float, 4.0, "noise multiplier of the defended column's noised receipts",
                               check=positive),
        "hosts": Param(int, 2, "shard-host Ray actors", check=at_least(1)),
    },
    "faults": {
        "fail_rounds": Param(int, 2, "rounds (after the attack rounds) in which one ClientApp raises in fit (the "
                             "masked-vector stage of SecAgg+)", check=nonnegative),
        "dropout_rounds": Param(int, 2, "rounds in which dropout_clients ClientApps reply after the round's "
                                "deadline (silent dropout)", check=nonnegative),
        "dropout_clients": Param(int, 2, "ClientApps that drop out silently in each dropout round",
                                 check=at_least(1)),
        "deadline_s": Param(float, 8.0, "SecAgg+ deadline (workflow timeout) of a dropout round", check=positive),
        "stall_s": Param(float, 4.0, "how much later than the deadline a dropped-out ClientApp replies",
                         check=positive),
    },
    "malicious": {
        "enabled": Param(bool, True, "run the hostile-ClientApp rows (fedmem.attacks.malicious_client) in this "
                         "process against both wrappers, each with its companion broken variant"),
        "attacks": Param(list, ["range_limit_oracle", "non_finite", "out_of_contract_norm", "release_timing"],
                         "which attacks of fedmem.attacks.malicious_client.ATTACKS", item_type=str,
                         check=lambda v: None if v and all(a in ("range_limit_oracle", "non_finite",
                                                                   "out_of_contract_norm", "release_timing")
                                                           for a in v) else
                         f"must be a non-empty list of range_limit_oracle, non_finite, out_of_contract_norm, "
                         f"release_timing, found {v!r}"),
        "trials": Param(int, 200, "rounds per world of each game", check=at_least(4)),
        "clients": Param(int, 3, "sampled clients m (one malicious, one target, the rest honest)", check=at_least(2)),
        "sensitivity": Param(float, 1.0, "C: sensitivity and per-reply clip norm", check=positive),
        "noise_multiplier": Param(float, 4.0, "noise multiplier of the games (issue 37: 4, 1.14 booked)",
                                  check=positive),
        "timing_noise_multiplier": Param(float, 8.0, "noise multiplier of the timing game (0.55 booked)",
                                         check=positive),
        "timing_dim": Param(int, 2048, "reply dimension of the timing game", check=at_least(1)),
        "timing_repeats": Param(int, 5, "aggregations per timing trial (the score is the smallest CPU time)",
                                check=at_least(1)),
    },
    "data": {
        "clusters": Param(int, 8, "topics", check=at_least(1)),
        "spread": Param(float, 0.35, "key spread around a topic centre", check=positive),
    },
    "attack": {
        "queries": Param(int, 30, "reconstruction queries (one round each)", check=at_least(1)),
        "tolerance": Param(int, 2, "a reconstruction is a hit within this many shards", check=at_least(0)),
        "targets": Param(int, 1, "membership candidates", check=at_least(1)),
        "repeats": Param(int, 40, "membership rounds per target and world", check=at_least(4)),
        "alpha": Param(float, 0.05, "confidence of CIs and epsilon lower bounds", check=open_unit),
    },
}


def cross_checks(cfg):
    f = cfg.federation
    out = []
    if f.k_local > f.records_per_shard:
        out.append(("federation.k_local", f"must be <= records_per_shard ({f.records_per_shard}), found {f.k_local}"))
    if f.k_local * f.clip > f.clipping_range or f.k_local > f.clipping_range:
        out.append(("federation.clipping_range", f"must be >= k_local * clip and >= k_local, found {f.clipping_range}"))
    m, e = math.frexp(f.clipping_range)
    if m != 0.5:
        out.append(("federation.clipping_range", f"must be a power of two, found {f.clipping_range}"))
    if cfg.faults.dropout_clients >= f.shards:
        out.append(("faults.dropout_clients", f"must be < shards ({f.shards}), found {cfg.faults.dropout_clients}"))
    if f.reconstruction_threshold >= f.num_shares:
        out.append(("federation.reconstruction_threshold", f"must be < num_shares ({f.num_shares}), found "
                                                           f"{f.reconstruction_threshold}"))
    return out

