"""The shards' private records and the public per-round query (deterministic from the run config)."""

from __future__ import annotations

import math

import numpy as np


def shard(run_config, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys (unit vectors) and values (L2 <= clip) of one shard: private to its ClientApp."""
    rng = np.random.default_rng([int(run_config["seed"]), int(partition_id)])
    n, kd, vd = int(run_config["records-per-shard"]), int(run_config["key-dim"]), int(run_config["value-dim"])
    keys = rng.standard_normal((n, kd))
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    vals = rng.standard_normal((n, vd))
    vals *= np.minimum(1.0, float(run_config["clip"]) / np.linalg.norm(vals, axis=1, keepdims=True))
    return keys, vals


def query(run_config, server_round: int) -> np.ndarray:
    """The public query of a round (the agent's question; here derived from the round number)."""
    rng = np.random.default_rng([int(run_config["seed"]), 10_000 + int(server_round)])
    q = rng.standard_normal(int(run_config["key-dim"]))
    return q / np.linalg.norm(q)


def sensitivity(run_config) -> float:
    """L2 change of the reply sum when one record is replaced: the top-k' value sum by <= 2 clip,
    the match count by <= 1."""
    return math.sqrt((2.0 * float(run_config["clip"])) ** 2 + 1.0)


def reply_bound(run_config) -> float:
    """Public L2 bound of one reply ``[top-k' value sum, match count]``: the sum of k' values of norm <= clip,
    the count <= k', plus the SecAgg+ grid's rounding of every coordinate (half a step each). The client
    clips to it (fixedclipping_mod) and the server enforces it (the gateway's clip_norm)."""
    k, clip = int(run_config["k-local"]), float(run_config["clip"])
    d = int(run_config["value-dim"]) + 1
    step = 2.0 * float(run_config["secagg-clipping-range"]) / 2 ** 22
    return math.sqrt((k * clip) ** 2 + k ** 2) + step * math.sqrt(d)
